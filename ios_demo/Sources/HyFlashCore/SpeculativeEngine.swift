import Foundation

/// The greedy speculative loop of hyflash/runtime/engine.py (and runtime_native's
/// engine.cpp), in Swift: prefill -> draft -> verify -> accept -> commit -> roll back.
///
/// Committed tokens are x_0 .. x_{n-1}; the target holds KV for all but the last and the
/// drafter holds the features of exactly those. One round drafts d_1..d_r from the anchor
/// x_{n-1} at pos = n-1, verifies [anchor, d_1..d_r] in ONE target call, keeps the longest
/// prefix equal to the target's argmax plus the target's next token (the bonus), commits
/// the features of the anchor and the accepted drafts (a rejected draft's are dropped, so
/// the drafter state never rolls back) and moves the target's write position back to
/// pos + k + 1. The output is the target's own greedy decode whatever the drafter proposes.
/// Without a drafter r is 0: plain decoding through the same loop.
public final class SpeculativeEngine {
    public let target: TargetModel
    public let drafter: DrafterModel?

    public init(target: TargetModel, drafter: DrafterModel?) throws {
        self.target = target
        self.drafter = drafter
        guard let d = drafter else { return }
        if d.vocabSize != target.vocabSize {
            throw HyFlashError("drafter vocabulary \(d.vocabSize) != target vocabulary "
                + "\(target.vocabSize): the drafter was trained for another target")
        }
        if d.featureSize != target.featureSize {
            throw HyFlashError("drafter feature size \(d.featureSize) != target feature size "
                + "\(target.featureSize): the drafter was trained for another target")
        }
        if d.blockSize < 2 {
            throw HyFlashError("drafter block size \(d.blockSize) < 2: a block is the anchor "
                + "plus at least one drafted token")
        }
    }

    public var blockSize: Int { drafter?.blockSize ?? 1 }

    /// Greedy generation of up to `maxNewTokens`; stops after a token in `eosIds` or when
    /// the context is full. `onToken` sees each token as it commits. Bad input throws
    /// before anything runs.
    public func generate(prompt: [Int32], maxNewTokens: Int, eosIds: Set<Int32> = [],
                         onToken: ((Int32) -> Void)? = nil) throws -> Generation {
        try checkPrompt(prompt, maxNewTokens: maxNewTokens)
        let B = blockSize, V = target.vocabSize
        var s = GenerationStats()
        s.blockSize = B
        s.promptTokens = prompt.count
        s.positionProposed = Array(repeating: 0, count: B - 1)
        s.positionAccepted = Array(repeating: 0, count: B - 1)
        let start = DispatchTime.now()
        var paused = 0.0
        var tokens = prompt
        var new: [Int32] = []
        var reason = ""

        /// Commits tokens of block in order until a stop rule fires after one; -> how many.
        func emit(_ block: [Int32]) -> Int {
            var n = 0
            for tok in block {
                tokens.append(tok)
                new.append(tok)
                n += 1
                if let onToken = onToken {
                    let t = DispatchTime.now()
                    onToken(tok)
                    paused += seconds(since: t)
                }
                if eosIds.contains(tok) {
                    reason = "eos"
                } else if new.count >= maxNewTokens {
                    reason = "max_new_tokens"
                } else if tokens.count >= target.maxSeqLen {
                    reason = "context_full"
                }
                if !reason.isEmpty { break }
            }
            return n
        }

        // prefill: the prompt in one pass; its features go to the drafter
        try target.reset()
        var t = DispatchTime.now()
        var (logits, features) = try target.forward(tokens: prompt, startPos: 0)
        s.prefillSeconds += seconds(since: t)
        s.targetCalls += 1
        if let d = drafter {
            t = DispatchTime.now()
            try d.reset()
            try d.commit(features: features[...], rows: prompt.count)
            s.draftSeconds += seconds(since: t)
        }
        _ = emit([argmax(logits, row: prompt.count - 1, width: V)])

        while reason.isEmpty {
            let pos = tokens.count - 1, anchor = tokens[tokens.count - 1]
            let r = min(B - 1, target.maxSeqLen - tokens.count - 1)  // drafts that still fit

            // draft
            var block: [Int32] = [anchor]
            if r > 0, let d = drafter {
                t = DispatchTime.now()
                let q = try d.draft(anchor: anchor, pos: pos)
                guard q.count == (B - 1) * V else {
                    throw HyFlashError("drafter returned \(q.count) logits, expected "
                        + "\((B - 1) * V) (block size - 1, vocabulary)")
                }
                let rows = distributionRows(q, rows: r, width: V)
                for i in 0..<rows { block.append(argmax(q, row: i, width: V)) }
                s.draftSeconds += seconds(since: t)
                s.drafterCalls += 1
                s.droppedDraftRows += r - rows
            }

            // verify: one target call over [anchor, d_1..d_r] at pos
            t = DispatchTime.now()
            (logits, features) = try target.forward(tokens: block, startPos: pos)
            s.verifySeconds += seconds(since: t)
            s.targetCalls += 1
            s.rounds += 1

            // accept: the longest prefix equal to the target's argmax, then its bonus
            let drafted = block.count - 1
            var k = 0
            while k < drafted && block[k + 1] == argmax(logits, row: k, width: V) { k += 1 }
            let bonus = argmax(logits, row: k, width: V)
            s.acceptedDrafts += k
            for i in 0..<max(r, 0) {
                s.positionProposed[i] += 1
                s.positionAccepted[i] += i < k ? 1 : 0
            }
            let n = emit(Array(block[1..<(1 + k)]) + [bonus])

            // commit the verified features (anchor + accepted drafts that were emitted)
            if let d = drafter {
                t = DispatchTime.now()
                try d.commit(features: features[0..<(n * target.featureSize)], rows: n)
                s.draftSeconds += seconds(since: t)
            }
            // roll back: everything after the last committed-and-processed token is dead
            try target.rollback(to: pos + n)
        }

        s.newTokens = new.count
        s.stopReason = reason
        s.totalSeconds = seconds(since: start) - paused
        return Generation(prompt: prompt, tokens: new, stats: s)
    }

    private func checkPrompt(_ ids: [Int32], maxNewTokens: Int) throws {
        let limit = target.maxSeqLen, vocab = target.vocabSize
        if maxNewTokens < 1 {
            throw HyFlashError("max new tokens must be >= 1, got \(maxNewTokens)")
        }
        if ids.isEmpty { throw HyFlashError("empty prompt: pass at least one token") }
        if let bad = ids.first(where: { $0 < 0 || Int($0) >= vocab }) {
            throw HyFlashError("prompt token id \(bad) is outside the target's vocabulary "
                + "0..\(vocab - 1)")
        }
        if ids.count >= limit {
            throw HyFlashError("prompt of \(ids.count) tokens leaves no room in the target's "
                + "context of \(limit) tokens: shorten it below \(limit)")
        }
        if blockSize > limit - ids.count {
            throw HyFlashError("block size \(blockSize) exceeds the remaining context: the "
                + "\(ids.count)-token prompt leaves \(limit - ids.count) of \(limit) positions; "
                + "shorten the prompt or decode without the drafter")
        }
    }
}

/// Index of the first maximum of row `row` of x [rows, width] (torch.argmax's rule, NaN
/// counting as the maximum).
public func argmax(_ x: [Float], row: Int, width: Int) -> Int32 {
    let base = row * width
    var best = 0
    for i in 1..<width {
        let v = x[base + i], b = x[base + best]
        if v > b || (v.isNaN && !b.isNaN) { best = i }
    }
    return Int32(best)
}

/// How many leading rows of x [rows, width] are a distribution: no NaN, no +inf, something
/// above -inf. A later row proposes nothing (it was drafted as a broken row's continuation).
public func distributionRows(_ x: [Float], rows: Int, width: Int) -> Int {
    for r in 0..<rows {
        var some = false
        for v in x[(r * width)..<((r + 1) * width)] {
            if v.isNaN || v == .infinity { return r }
            if v > -.infinity { some = true }
        }
        if !some { return r }
    }
    return rows
}

private func seconds(since t: DispatchTime) -> Double {
    Double(DispatchTime.now().uptimeNanoseconds - t.uptimeNanoseconds) / 1e9
}
