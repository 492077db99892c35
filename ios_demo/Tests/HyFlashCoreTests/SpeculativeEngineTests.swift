import XCTest
@testable import HyFlashCore

/// The loop's accept / rollback logic, mirrored from the Python engine's tests
/// (tests/test_runtime_engine.py): lossless output for any drafter, tau and acceptance by
/// position, only verified features reach the drafter, the stop rules, bad input.
final class SpeculativeEngineTests: XCTestCase {
    let prompt: [Int32] = [3, 14, 15, 9, 26]

    func run(_ drafter: ScriptedDrafter?, maxNew: Int = 40, maxSeqLen: Int = 256,
             eos: Set<Int32> = [], prompt: [Int32]? = nil) throws -> (Generation, FakeTarget) {
        let target = FakeTarget(maxSeqLen: maxSeqLen)
        let engine = try SpeculativeEngine(target: target, drafter: drafter)
        return (try engine.generate(prompt: prompt ?? self.prompt, maxNewTokens: maxNew,
                                    eosIds: eos), target)
    }

    func testOutputIsTheTargetsOwnGreedyDecodeForAnyDrafter() throws {
        let want = FakeTarget.greedy(prompt, count: 40)
        let drafters: [ScriptedDrafter?] = [
            nil, ScriptedDrafter(block: 8, correct: 7), ScriptedDrafter(block: 8, correct: 0),
            ScriptedDrafter(block: 4, correct: 2), ScriptedDrafter(block: 8, correct: 7,
                                                                   brokenFrom: 3),
        ]
        for drafter in drafters {
            let (g, _) = try run(drafter)
            XCTAssertEqual(g.tokens, want)
            XCTAssertEqual(g.stats.stopReason, "max_new_tokens")
            XCTAssertEqual(drafter?.violations ?? [], [])
        }
    }

    func testAnOracleDrafterGivesTauEqualToTheBlockSize() throws {
        let (g, target) = try run(ScriptedDrafter(block: 8, correct: 7), maxNew: 41)
        XCTAssertEqual(g.stats.tau, 8)
        XCTAssertEqual(g.stats.acceptanceRates, Array(repeating: 1.0, count: 7))
        XCTAssertEqual(g.stats.rounds, 5)  // 1 token from the prefill, then 5 x 8
        XCTAssertEqual(target.calls.count, 6)
        XCTAssertTrue(target.calls.dropFirst().allSatisfy { $0.count == 8 })
    }

    func testAWrongDrafterGivesTau1AndTheTargetStillDecides() throws {
        let (g, target) = try run(ScriptedDrafter(block: 8, correct: 0), maxNew: 20)
        XCTAssertEqual(g.stats.tau, 1)
        XCTAssertEqual(g.stats.acceptedDrafts, 0)
        XCTAssertEqual(g.stats.acceptanceRates, Array(repeating: 0.0, count: 7))
        // every verify rolled back to one past its anchor: the next call starts there
        for (a, b) in zip(target.calls.dropFirst(), target.calls.dropFirst(2)) {
            XCTAssertEqual(b.start, a.start + 1)
        }
    }

    func testAcceptanceByPositionStopsAtTheFirstWrongDraft() throws {
        let (g, _) = try run(ScriptedDrafter(block: 6, correct: 2), maxNew: 31)
        XCTAssertEqual(g.stats.acceptanceRates, [1, 1, 0, 0, 0])
        XCTAssertEqual(g.stats.tau, 3)
    }

    func testBrokenDraftRowsProposeNothingAndAreCountedAsRejected() throws {
        let drafter = ScriptedDrafter(block: 8, correct: 7, brokenFrom: 3)
        let (g, _) = try run(drafter, maxNew: 33)
        XCTAssertEqual(g.stats.tau, 4)  // 3 good drafts + the bonus per round
        XCTAssertEqual(g.stats.droppedDraftRows, 4 * g.stats.rounds)
        XCTAssertEqual(g.stats.acceptanceRates, [1, 1, 1, 0, 0, 0, 0])
    }

    func testOnlyVerifiedFeaturesReachTheDrafter() throws {
        let drafter = ScriptedDrafter(block: 8, correct: 3)
        let (g, _) = try run(drafter, maxNew: 40)
        let sequence = prompt + g.tokens
        // everything but the last token (the target never ran it), in order, nothing else
        XCTAssertEqual(drafter.committed.map { $0.token }, Array(sequence.dropLast()))
        XCTAssertEqual(drafter.committed.map { $0.pos }, Array(0..<(sequence.count - 1)))
        XCTAssertEqual(drafter.violations, [])
    }

    func testAFullContextStopsWithContextFullAndShrinksTheLastDrafts() throws {
        let (g, target) = try run(ScriptedDrafter(block: 8, correct: 7), maxNew: 100,
                                  maxSeqLen: 24)
        XCTAssertEqual(g.stats.stopReason, "context_full")
        XCTAssertEqual(g.tokens, FakeTarget.greedy(prompt, count: 24 - prompt.count))
        XCTAssertTrue(target.calls.allSatisfy { $0.start + $0.count <= 24 })
    }

    func testEosStopsRightAfterTheEosTokenEvenInsideAnAcceptedBlock() throws {
        let want = FakeTarget.greedy(prompt, count: 40)
        let eos = want[10]
        let first = want.firstIndex(of: eos)!
        let (g, _) = try run(ScriptedDrafter(block: 8, correct: 7), eos: [eos])
        XCTAssertEqual(g.tokens, Array(want[...first]))
        XCTAssertEqual(g.stats.stopReason, "eos")
    }

    func testMaxNewTokensIsExact() throws {
        for n in [1, 2, 7, 8, 9, 17] {
            let (g, _) = try run(ScriptedDrafter(block: 8, correct: 7), maxNew: n)
            XCTAssertEqual(g.tokens.count, n)
        }
    }

    func testStreamingSeesEachTokenAsItCommits() throws {
        var seen: [Int32] = []
        let engine = try SpeculativeEngine(target: FakeTarget(),
                                           drafter: ScriptedDrafter(block: 8, correct: 5))
        let g = try engine.generate(prompt: prompt, maxNewTokens: 30) { seen.append($0) }
        XCTAssertEqual(seen, g.tokens)
    }

    func testBadInputIsOneClearErrorBeforeAnythingRuns() throws {
        let cases: [([Int32], Int, String)] = [
            ([], 8, "empty prompt"),
            ([1, 50], 8, "prompt token id 50 is outside the target's vocabulary 0..49"),
            ([1, -2], 8, "prompt token id -2 is outside"),
            (Array(repeating: 1, count: 20), 8, "block size 8 exceeds the remaining context"),
            (Array(repeating: 1, count: 24), 8, "leaves no room in the target's context of 24"),
            ([1], 0, "max new tokens must be >= 1"),
        ]
        for (ids, maxNew, needle) in cases {
            let target = FakeTarget(maxSeqLen: 24)
            let engine = try SpeculativeEngine(target: target,
                                               drafter: ScriptedDrafter(block: 8, correct: 7))
            XCTAssertThrowsError(try engine.generate(prompt: ids, maxNewTokens: maxNew)) {
                XCTAssertTrue(($0 as? HyFlashError)?.message.contains(needle) ?? false,
                              "\($0) lacks \(needle)")
            }
            XCTAssertTrue(target.calls.isEmpty)
        }
    }

    func testADrafterForAnotherTargetIsRefused() {
        XCTAssertThrowsError(try SpeculativeEngine(
            target: FakeTarget(vocab: 50), drafter: ScriptedDrafter(block: 8, correct: 7,
                                                                   vocab: 60))) {
            XCTAssertTrue("\($0)".contains("drafter vocabulary 60 != target vocabulary 50"))
        }
    }

    func testArgmaxTakesTheFirstMaximumAndDistributionRowsStopAtABrokenRow() {
        XCTAssertEqual(argmax([0, 2, 2, 1], row: 0, width: 4), 1)
        XCTAssertEqual(argmax([1, .nan, 3], row: 0, width: 3), 1)
        let inf = Float.infinity
        XCTAssertEqual(distributionRows([0, 1, -inf, -inf, 2, 3], rows: 3, width: 2), 1)
        XCTAssertEqual(distributionRows([0, inf, 1, 1], rows: 2, width: 2), 0)
        XCTAssertEqual(distributionRows([-inf, 1, 1, 1], rows: 2, width: 2), 2)
    }
}
