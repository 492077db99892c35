#if canImport(CoreML)
import CoreML
import HyFlashCore

/// drafter.mlpackage (commit + draft) and drafter_commit.mlpackage (commit only) behind
/// DrafterModel. Every window and memory tensor is an input `state_X` and an output
/// `new_state_X` of fixed shape; this class owns them and feeds each call's outputs to the
/// next call. Verified feature rows wait in `pending` until the next draft: rows beyond one
/// step's go through the commit-only package first (a prompt), then the step package takes
/// up to B rows with the anchor, so a round is one drafter call (as the Python and C++
/// runtimes do, hyflash/runtime/executorch_backend.py).
public final class CoreMLDrafter: DrafterModel {
    public let vocabSize: Int
    public let featureSize: Int
    public let blockSize: Int
    private let step: MLModel
    private let commitOnly: MLModel
    private let specs: [BundleManifest.StateSpec]
    private let stepRows: Int
    private let commitRows: Int
    private var state: [String: MLMultiArray] = [:]
    private var pending: [Float] = []
    private var absorbed = 0

    public init(step: MLModel, commitOnly: MLModel, manifest: BundleManifest) throws {
        self.step = step
        self.commitOnly = commitOnly
        vocabSize = manifest.vocabSize
        featureSize = manifest.featureSize
        blockSize = manifest.blockSize
        specs = manifest.state
        stepRows = manifest.rows["drafter_step"] ?? manifest.blockSize
        commitRows = manifest.rows["drafter_commit"] ?? manifest.blockSize
        try reset()
    }

    public func reset() throws {
        for s in specs { state[s.input] = try MultiArrays.make(s.shape, s.dtype) }
        pending = []
        absorbed = 0
    }

    public func commit(features: ArraySlice<Float>, rows: Int) throws {
        pending += features.prefix(rows * featureSize)
    }

    public func draft(anchor: Int32, pos: Int) throws -> [Float] {
        let held = absorbed + pending.count / featureSize
        guard pos == held else {
            throw HyFlashError("draft at position \(pos) but the drafter holds \(held) context "
                + "features: the engine and drafter are out of step")
        }
        while pending.count / featureSize > stepRows {
            let (rows, valid) = try take(pending.count / featureSize - stepRows, width: commitRows)
            _ = try run(commitOnly, ["features": rows, "n_valid": valid])
        }
        let (rows, valid) = try take(stepRows, width: stepRows)
        let out = try run(step, ["anchor": try MultiArrays.int32([anchor], shape: [1]),
                                 "features": rows, "n_valid": valid])
        guard let logits = out.featureValue(for: "logits")?.multiArrayValue else {
            throw HyFlashError("the drafter package returned no logits: re-export the bundle")
        }
        return try MultiArrays.floats(logits, rows: blockSize - 1, width: vocabSize)
    }

    /// The next up to n pending rows, zero-padded to width rows, and how many are real.
    private func take(_ n: Int, width: Int) throws -> (MLMultiArray, MLMultiArray) {
        let k = min(n, width, pending.count / featureSize)
        let rows = try MultiArrays.float16(pending.prefix(k * featureSize), rows: width,
                                           width: featureSize)
        pending.removeFirst(k * featureSize)
        absorbed += k
        return (rows, try MultiArrays.int32([Int32(k)], shape: [1]))
    }

    /// One prediction with the state as inputs; its new state replaces the old.
    private func run(_ model: MLModel, _ inputs: [String: Any]) throws -> MLFeatureProvider {
        var all = inputs
        for s in specs { all[s.input] = state[s.input] }
        let out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: all))
        for s in specs {
            guard let next = out.featureValue(for: s.output)?.multiArrayValue else {
                throw HyFlashError("the drafter package returned no \(s.output): re-export the "
                    + "bundle with `hyflash export --backend coreml`")
            }
            state[s.input] = next
        }
        return out
    }
}
#endif
