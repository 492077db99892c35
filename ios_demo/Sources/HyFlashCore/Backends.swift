// The two models the loop drives, as protocols: Core ML implements them on the phone
// (HyFlashCoreML), the tests with deterministic fakes. The same contract as the Python
// engine's TargetBackend / DrafterBackend (hyflash/runtime/backends.py) and the C++
// runtime's (runtime_native/src/engine.h).

/// A problem the user can fix, as one line naming it and the fix.
public struct HyFlashError: Error, CustomStringConvertible, Equatable {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The target: writes its KV cache at `startPos` and returns, row-major, the logits
/// [T, V] and the tap features [T, F] of the T tokens. Positions >= the last call's end
/// are dead after `rollback(to:)`; the next call overwrites them before any query reads.
public protocol TargetModel: AnyObject {
    var vocabSize: Int { get }
    var featureSize: Int { get }
    var maxSeqLen: Int { get }
    func reset() throws
    func forward(tokens: [Int32], startPos: Int) throws -> (logits: [Float], features: [Float])
    func rollback(to pos: Int) throws
}

/// The drafter, owning its window and memory state: `commit` absorbs verified feature
/// rows (only ever verified ones, so the state never rolls back), `draft` returns the
/// logits [B-1, V] of the positions after the anchor at `pos`.
public protocol DrafterModel: AnyObject {
    var vocabSize: Int { get }
    var featureSize: Int { get }
    var blockSize: Int { get }
    func reset() throws
    func commit(features: ArraySlice<Float>, rows: Int) throws
    func draft(anchor: Int32, pos: Int) throws -> [Float]
}
