import Foundation

/// What a run reports, with the meaning of hyflash/runtime/stats.py: tau is the mean
/// number of tokens committed per verify call (accepted drafts + the target's bonus);
/// `positionAccepted[i] / positionProposed[i]` is how often draft position i+1 was kept.
public struct GenerationStats: Equatable {
    public var blockSize = 1
    public var promptTokens = 0
    public var newTokens = 0
    public var rounds = 0          // verify calls
    public var targetCalls = 0     // prefill + verify calls
    public var drafterCalls = 0
    public var acceptedDrafts = 0
    public var droppedDraftRows = 0  // draft rows that were no distribution
    public var positionProposed: [Int] = []
    public var positionAccepted: [Int] = []
    public var prefillSeconds = 0.0
    public var draftSeconds = 0.0
    public var verifySeconds = 0.0
    public var totalSeconds = 0.0
    public var stopReason = ""

    public init() {}

    public var tau: Double {
        rounds > 0 ? Double(acceptedDrafts + rounds) / Double(rounds) : .nan
    }

    public var acceptanceRates: [Double] {
        zip(positionAccepted, positionProposed).map { a, n in n > 0 ? Double(a) / Double(n) : .nan }
    }

    /// New tokens per second of the whole call, prefill included.
    public var tokensPerSecond: Double {
        totalSeconds > 0 ? Double(newTokens) / totalSeconds : .nan
    }
}

public struct Generation {
    public let prompt: [Int32]
    public let tokens: [Int32]  // the new tokens, stop token included
    public let stats: GenerationStats
}
