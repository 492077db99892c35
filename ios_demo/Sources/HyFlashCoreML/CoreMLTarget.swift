#if canImport(CoreML)
import CoreML
import HyFlashCore

/// target.mlpackage behind TargetModel: `tokens [1, T]` int32 and `input_pos [1]` int32 ->
/// `logits [1, T, V]`, `features [1, T, F]` (float16), T one of the package's enumerated
/// counts (decode 1, verify B, prefill chunk). A call of another length goes in pieces: each
/// piece takes the smallest count that holds the rest of the call when that still fits the
/// context (the tail padded with the last token: its rows are dead positions, overwritten
/// by the next call before any query reads them), else the largest count that fits in it.
///
/// The KV cache is Core ML state (iOS 18: `MLState`, kv_cache.form "state") or, for iOS
/// 17, explicit inputs and outputs (kv_cache.form "static_io") that this class carries from
/// call to call. Either way a rollback only moves the valid length back.
public final class CoreMLTarget: TargetModel {
    public let vocabSize: Int
    public let featureSize: Int
    public let maxSeqLen: Int
    private let model: MLModel
    private let counts: [Int]
    private let manifest: BundleManifest
    private var state: AnyObject?  // MLState, iOS 18
    private var caches: [String: MLMultiArray] = [:]  // static_io: past input -> array
    private var length = 0

    public init(model: MLModel, manifest: BundleManifest) throws {
        self.model = model
        self.manifest = manifest
        vocabSize = manifest.vocabSize
        featureSize = manifest.featureSize
        maxSeqLen = manifest.maxSeqLen
        let shapes = model.modelDescription.inputDescriptionsByName["tokens"]?
            .multiArrayConstraint?.shapeConstraint.enumeratedShapes ?? []
        counts = Set(shapes.compactMap { $0.last?.intValue }).sorted()
        guard counts.first == 1 else {
            throw HyFlashError("target package has token counts \(counts), expected 1 among "
                + "them: re-export the bundle with `hyflash export --backend coreml`")
        }
        try reset()
    }

    public func reset() throws {
        length = 0
        if manifest.kvForm == "state" {
            guard #available(iOS 18.0, macOS 15.0, *) else {
                throw HyFlashError("this bundle keeps the KV cache as Core ML state, which "
                    + "needs iOS 18: re-export it with --coreml-kv io for iOS 17")
            }
            state = model.makeState()
        } else {
            let shape = model.modelDescription.inputDescriptionsByName[
                manifest.pastInputs[0]]?.multiArrayConstraint?.shape.map { $0.intValue } ?? []
            for name in manifest.pastInputs { caches[name] = try MultiArrays.make(shape, "float16") }
        }
    }

    public func forward(tokens: [Int32], startPos: Int) throws
        -> (logits: [Float], features: [Float]) {
        let end = startPos + tokens.count
        guard startPos >= 0, startPos <= length else {
            throw HyFlashError("forward at position \(startPos) would leave a gap in the KV "
                + "cache, which holds \(length) positions")
        }
        guard end <= maxSeqLen else {
            throw HyFlashError("positions \(startPos)..\(end - 1) do not fit the target's "
                + "context of \(maxSeqLen) tokens")
        }
        var logits: [Float] = [], features: [Float] = []
        var at = 0
        while at < tokens.count {
            let rest = tokens.count - at, pos = startPos + at
            let count = counts.first { $0 >= rest && pos + $0 <= maxSeqLen }
                ?? counts.last { $0 <= rest }!
            let real = min(count, rest)
            var piece = Array(tokens[at..<(at + real)])
            piece += Array(repeating: piece[piece.count - 1], count: count - real)
            let out = try predict(piece, pos: pos)
            logits += try MultiArrays.floats(out.logits, rows: real, width: vocabSize)
            features += try MultiArrays.floats(out.features, rows: real, width: featureSize)
            at += real
        }
        length = end
        return (logits, features)
    }

    public func rollback(to pos: Int) throws {
        guard pos >= 0, pos <= length else {
            throw HyFlashError("cannot roll back to \(pos): the cache holds \(length) positions")
        }
        length = pos
    }

    private func predict(_ tokens: [Int32], pos: Int) throws
        -> (logits: MLMultiArray, features: MLMultiArray) {
        var inputs: [String: Any] = [
            "tokens": try MultiArrays.int32(tokens, shape: [1, tokens.count]),
            "input_pos": try MultiArrays.int32([Int32(pos)], shape: [1]),
        ]
        for (name, array) in caches { inputs[name] = array }
        let provider = try MLDictionaryFeatureProvider(dictionary: inputs)
        let out: MLFeatureProvider
        if #available(iOS 18.0, macOS 15.0, *), let state = state as? MLState {
            out = try model.prediction(from: provider, using: state)
        } else {
            out = try model.prediction(from: provider)
            for (past, present) in zip(manifest.pastInputs, manifest.presentOutputs) {
                caches[past] = out.featureValue(for: present)?.multiArrayValue
            }
        }
        guard let logits = out.featureValue(for: "logits")?.multiArrayValue,
              let features = out.featureValue(for: "features")?.multiArrayValue else {
            throw HyFlashError("the target package returned no logits or features: re-export "
                + "the bundle with `hyflash export --backend coreml`")
        }
        return (logits, features)
    }
}
#endif
