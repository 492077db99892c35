import CoreML
import Foundation
import HyFlashCore
import HyFlashCoreML
import Tokenizers

/// The app's state: a bundle copied into the app's Documents folder (Finder / Files, see
/// README), its tokenizer (swift-transformers reads the bundle's tokenizer.json), and one
/// generation at a time off the main thread.
@MainActor
final class GenerationModel: ObservableObject {
    @Published var bundles: [URL] = []
    @Published var selected: URL?
    @Published var prompt = "def read_config(path):\n"
    @Published var speculative = true
    @Published var completion = ""
    @Published var status = "Copy a Core ML bundle folder into the app's Documents."
    @Published var running = false

    private var opened: (url: URL, bundle: CoreMLBundle, tokenizer: Tokenizer)?

    func refresh() {
        let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        let items = (try? FileManager.default.contentsOfDirectory(
            at: docs, includingPropertiesForKeys: nil)) ?? []
        bundles = items.filter {
            FileManager.default.fileExists(atPath: $0.appendingPathComponent("manifest.json").path)
        }.sorted { $0.lastPathComponent < $1.lastPathComponent }
        if selected == nil || !bundles.contains(selected!) { selected = bundles.first }
    }

    func generate() {
        guard let url = selected, !running else { return }
        running = true
        status = "Generating…"
        let text = prompt, draft = speculative
        Task {
            do {
                if opened?.url != url {
                    status = "Compiling the bundle for this device…"
                    let bundle = try await CoreMLBundle.open(folder: url)
                    let tokenizer = try await AutoTokenizer.from(modelFolder: url)
                    opened = (url, bundle, tokenizer)
                }
                let (bundle, tokenizer) = (opened!.bundle, opened!.tokenizer)
                let ids = tokenizer.encode(text: text).map { Int32($0) }
                let result = try await Task.detached(priority: .userInitiated) {
                    try bundle.engine(draft: draft).generate(
                        prompt: ids, maxNewTokens: 128, eosIds: bundle.manifest.eosIds)
                }.value
                completion = tokenizer.decode(tokens: result.tokens.map { Int($0) })
                status = Self.summary(result.stats)
            } catch let error as HyFlashError {
                status = "Error: \(error.message)"
            } catch {
                status = "Error: \(error.localizedDescription)"
            }
            running = false
        }
    }

    static func summary(_ s: GenerationStats) -> String {
        let rates = s.acceptanceRates.map { $0.isNaN ? "-" : String(format: "%.2f", $0) }
        let tau = s.tau.isNaN ? "-" : String(format: "%.2f", s.tau)
        return String(format: "%ld tokens · %.1f tokens/s · tau %@ · accepted by position %@ · "
                      + "stop: %@", s.newTokens, s.tokensPerSecond, tau,
                      rates.isEmpty ? "-" : rates.joined(separator: " "), s.stopReason)
    }
}
