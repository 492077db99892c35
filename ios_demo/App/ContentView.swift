import SwiftUI

/// One screen: pick a bundle, edit the prompt, generate; the completion appears under the
/// prompt with tau, acceptance by draft position and tokens/s.
struct ContentView: View {
    @StateObject private var model = GenerationModel()

    var body: some View {
        NavigationStack {
            Form {
                Section("Bundle (Core ML, in Documents)") {
                    if model.bundles.isEmpty {
                        Text("None yet: see README, step 4.").foregroundStyle(.secondary)
                    } else {
                        Picker("Bundle", selection: $model.selected) {
                            ForEach(model.bundles, id: \.self) { url in
                                Text(url.lastPathComponent).tag(Optional(url))
                            }
                        }
                    }
                    Toggle("Speculative decoding (HyFlash drafter)", isOn: $model.speculative)
                }
                Section("Prompt") {
                    TextEditor(text: $model.prompt)
                        .font(.system(.body, design: .monospaced))
                        .frame(minHeight: 80)
                    Button(model.running ? "Generating…" : "Generate") { model.generate() }
                        .disabled(model.running || model.selected == nil)
                }
                Section("Completion") {
                    Text(model.status).font(.footnote.bold())
                    Text(model.prompt + model.completion)
                        .font(.system(.body, design: .monospaced))
                        .textSelection(.enabled)
                }
            }
            .navigationTitle("HyFlash")
            .onAppear { model.refresh() }
            .refreshable { model.refresh() }
        }
    }
}
