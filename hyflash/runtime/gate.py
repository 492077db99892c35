"""Which proposer a round uses, by what each has earned: tokens per second, measured.

A round can copy drafts from the context (``lookup.py``), ask the drafter, or propose
nothing (a plain decode: one target call of one token). Which pays depends on the
bundle and the text: a drafter whose drafts are mostly rejected costs a drafter call and
a verify of B tokens for little more than the one token a plain decode gives, and an
int4 target's verify can cost several decodes. ``RateGate`` keeps, per proposer, a
running mean of the tokens a round committed and of the wall time it took (drafting and
verifying), and picks the proposer with the highest tokens per second among those that
can run this round. A proposer it has not yet measured ``warmup`` times is tried first;
every ``explore_every`` rounds the runner-up is taken once, so an estimate that went
stale (the text changed, a lookup got better) can recover.

The gate changes only which drafts are proposed, never how they are verified: the output
stays the target's own (greedy) or exactly its distribution (sampling), whatever it picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROPOSERS = ("lookup", "drafter", "plain")


@dataclass
class Rate:
    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0

    def add(self, tokens: int, seconds: float, keep: float) -> None:
        """Exponentially weighted sums: the newest round weighs 1, older ones keep^age."""
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
        self.rounds += 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class RateGate:
    warmup: int = 4  # rounds of a proposer measured before it competes on its rate
    explore_every: int = 16  # rounds between two forced tries of the runner-up
    keep: float = 0.9  # weight of the past in the running sums (about 10 rounds)
    rates: dict[str, Rate] = field(default_factory=lambda: {p: Rate() for p in PROPOSERS})
    decisions: int = 0

    def __post_init__(self):
        if self.warmup < 1 or self.explore_every < 2 or not 0 < self.keep < 1:
            raise ValueError(f"RateGate(warmup={self.warmup}, explore_every="
                             f"{self.explore_every}, keep={self.keep}): need warmup >= 1, "
                             "explore_every >= 2, 0 < keep < 1")

    def reset(self) -> None:
        """A new sequence keeps what was learned about the bundle's costs; only the
        decision counter restarts."""
        self.decisions = 0

    def choose(self, available: list[str]) -> str:
        """The proposer for this round, among those that can run (``PROPOSERS`` order)."""
        if not available:
            raise ValueError("no proposer available")
        self.decisions += 1
        for p in available:
            if self.rates[p].rounds < self.warmup:
                return p
        ranked = sorted(available, key=lambda p: self.rates[p].per_second, reverse=True)
        if len(ranked) > 1 and self.decisions % self.explore_every == 0:
            return ranked[1]
        return ranked[0]

    def record(self, proposer: str, tokens: int, seconds: float) -> None:
        self.rates[proposer].add(tokens, seconds, self.keep)
