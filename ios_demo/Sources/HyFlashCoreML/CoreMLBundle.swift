#if canImport(CoreML)
import CoreML
import Foundation
import HyFlashCore

/// A Core ML bundle folder (`hyflash export --backend coreml`) opened for the loop: its
/// manifest, the three packages compiled for this device and loaded, and the engine.
/// hyflash.export.coreml.FORMAT of the packages this reads.
public let packageFormat = "1"

public final class CoreMLBundle {
    public let folder: URL
    public let manifest: BundleManifest
    public let target: CoreMLTarget
    public let drafter: CoreMLDrafter

    private init(folder: URL, manifest: BundleManifest, target: CoreMLTarget,
                 drafter: CoreMLDrafter) {
        self.folder = folder
        self.manifest = manifest
        self.target = target
        self.drafter = drafter
    }

    /// Compiles each .mlpackage (Core ML compiles on the device; a few seconds for the
    /// pocket pair) and loads it with the given compute units.
    public static func open(folder: URL, computeUnits: MLComputeUnits = .all) async throws
        -> CoreMLBundle {
        let manifest = try BundleManifest.read(folder: folder)
        let config = MLModelConfiguration()
        config.computeUnits = computeUnits
        func load(_ role: String) async throws -> MLModel {
            let url = folder.appendingPathComponent(manifest.files[role] ?? "")
            guard FileManager.default.fileExists(atPath: url.path) else {
                throw HyFlashError("bundle \(folder.lastPathComponent) has no "
                    + "\(url.lastPathComponent): copy the whole bundle folder")
            }
            let compiled = try await MLModel.compileModel(at: url)
            let model = try MLModel(contentsOf: compiled, configuration: config)
            // hyflash.export.coreml writes these (FORMAT); the Python reader checks them too
            let meta = model.modelDescription.metadata[.creatorDefinedKey] as? [String: String]
            guard meta?["hyflash.format"] == packageFormat, meta?["hyflash.role"] == role else {
                throw HyFlashError("\(url.lastPathComponent) is not a hyflash \(role) package of "
                    + "format \(packageFormat): re-export the bundle with `hyflash export "
                    + "--backend coreml`")
            }
            return model
        }
        let target = try CoreMLTarget(model: try await load("target"), manifest: manifest)
        let drafter = try CoreMLDrafter(step: try await load("drafter_step"),
                                        commitOnly: try await load("drafter_commit"),
                                        manifest: manifest)
        return CoreMLBundle(folder: folder, manifest: manifest, target: target, drafter: drafter)
    }

    /// The speculative engine over this bundle (draft: false decodes with the target alone).
    public func engine(draft: Bool = true) throws -> SpeculativeEngine {
        try SpeculativeEngine(target: target, drafter: draft ? drafter : nil)
    }
}
#endif
