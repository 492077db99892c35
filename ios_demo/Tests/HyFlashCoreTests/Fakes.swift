import HyFlashCore

/// A deterministic target: the greedy next token after position p is
/// (7 * x_p + 3 * x_{p-1} + p + 1) mod V, with x_{p-1} read from its own KV cache, so a
/// stale cache entry (a rollback the engine got wrong) changes the output. Its feature
/// row for position p is [x_p, p]: a drafter can tell exactly which tokens it was given.
final class FakeTarget: TargetModel {
    let vocabSize: Int
    let featureSize = 2
    let maxSeqLen: Int
    private(set) var cache: [Int32] = []  // token at each position; count = valid length
    private(set) var calls: [(start: Int, count: Int)] = []

    init(vocab: Int = 50, maxSeqLen: Int = 256) {
        vocabSize = vocab
        self.maxSeqLen = maxSeqLen
    }

    static func next(_ token: Int32, previous: Int32, pos: Int, vocab: Int) -> Int32 {
        Int32((7 * Int(token) + 3 * Int(previous) + pos + 1) % vocab)
    }

    /// What the target decodes greedily on its own: the reference for every test.
    static func greedy(_ prompt: [Int32], count: Int, vocab: Int = 50) -> [Int32] {
        var seq = prompt
        for _ in 0..<count {
            let p = seq.count - 1
            seq.append(next(seq[p], previous: p > 0 ? seq[p - 1] : 0, pos: p, vocab: vocab))
        }
        return Array(seq[prompt.count...])
    }

    func reset() throws { cache = [] }

    func forward(tokens: [Int32], startPos: Int) throws -> (logits: [Float], features: [Float]) {
        guard startPos <= cache.count else { throw HyFlashError("gap in the KV cache") }
        guard startPos + tokens.count <= maxSeqLen else { throw HyFlashError("past the context") }
        calls.append((start: startPos, count: tokens.count))
        cache = Array(cache[0..<startPos]) + tokens
        var logits = [Float](repeating: 0, count: tokens.count * vocabSize)
        var features: [Float] = []
        for (i, tok) in tokens.enumerated() {
            let p = startPos + i
            let want = Self.next(tok, previous: p > 0 ? cache[p - 1] : 0, pos: p, vocab: vocabSize)
            logits[i * vocabSize + Int(want)] = 1
            features += [Float(tok), Float(p)]
        }
        return (logits, features)
    }

    func rollback(to pos: Int) throws {
        guard pos <= cache.count else { throw HyFlashError("rollback past the cache") }
        cache = Array(cache[0..<pos])
    }
}

/// A drafter that knows the target's rule and reads the committed tokens back from the
/// feature rows it was given ([x_p, p]). `correct` leading positions propose the target's
/// continuation, later ones a wrong token; `broken` rows are NaN. It checks the engine's
/// side of the contract: draft(anchor, pos) only after the features of x_0 .. x_{pos-1}.
final class ScriptedDrafter: DrafterModel {
    let vocabSize: Int
    let featureSize = 2
    let blockSize: Int
    let correct: Int
    let brokenFrom: Int?
    private(set) var committed: [(token: Int32, pos: Int)] = []
    private(set) var violations: [String] = []

    init(block: Int, correct: Int, brokenFrom: Int? = nil, vocab: Int = 50) {
        blockSize = block
        self.correct = correct
        self.brokenFrom = brokenFrom
        vocabSize = vocab
    }

    func reset() throws { committed = [] }

    func commit(features: ArraySlice<Float>, rows: Int) throws {
        let f = Array(features)
        for r in 0..<rows {
            let pos = Int(f[2 * r + 1])
            if pos != committed.count { violations.append("row for position \(pos) out of order") }
            committed.append((token: Int32(f[2 * r]), pos: pos))
        }
    }

    func draft(anchor: Int32, pos: Int) throws -> [Float] {
        if committed.count != pos {
            violations.append("draft at \(pos) with \(committed.count) committed rows")
        }
        var seq = committed.map { $0.token } + [anchor]
        var logits = [Float](repeating: 0, count: (blockSize - 1) * vocabSize)
        for i in 0..<(blockSize - 1) {
            let p = seq.count - 1
            var tok = FakeTarget.next(seq[p], previous: p > 0 ? seq[p - 1] : 0, pos: p,
                                      vocab: vocabSize)
            if i >= correct { tok = (tok + 1) % Int32(vocabSize) }
            seq.append(tok)
            if let from = brokenFrom, i >= from {
                for j in 0..<vocabSize { logits[i * vocabSize + j] = .nan }
            } else {
                logits[i * vocabSize + Int(tok)] = 1
            }
        }
        return logits
    }
}
