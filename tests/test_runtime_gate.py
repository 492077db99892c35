"""The rate gate: it picks what has paid most, tries what it has not measured, explores
the runner-up now and then, and whatever it picks the output stays the target's own."""

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_engine import BACKEND, PathDrafter, expected, make_drafter

from hyflash.runtime import SpeculativeEngine
from hyflash.runtime.gate import RateGate
from hyflash.runtime.lookup import ContextLookup


def test_unmeasured_proposers_are_tried_first_then_the_fastest_wins():
    gate = RateGate(warmup=2, explore_every=100)
    picks = []
    for _ in range(4):
        picks.append(gate.choose(["drafter", "plain"]))
        gate.record(picks[-1], 3 if picks[-1] == "drafter" else 1, 0.010)
    assert picks == ["drafter", "drafter", "plain", "plain"]
    assert gate.choose(["drafter", "plain"]) == "drafter"  # 300 tokens/s vs 100
    gate.record("drafter", 1, 0.100)  # the drafter stopped paying
    gate.record("drafter", 1, 0.100)
    assert gate.choose(["drafter", "plain"]) == "plain"


def test_the_runner_up_is_explored_every_n_rounds_and_only_among_the_available():
    gate = RateGate(warmup=1, explore_every=4)
    for p, tokens in (("lookup", 5), ("drafter", 2), ("plain", 1)):
        gate.record(p, tokens, 0.010)
    picks = [gate.choose(["lookup", "drafter", "plain"]) for _ in range(8)]
    assert picks == ["lookup"] * 3 + ["drafter"] + ["lookup"] * 3 + ["drafter"]
    assert {gate.choose(["drafter", "plain"]) for _ in range(8)} == {"drafter", "plain"}
    assert gate.choose(["plain"]) == "plain"


def test_bad_gate_settings_are_one_error():
    with pytest.raises(ValueError, match="explore_every >= 2"):
        RateGate(explore_every=1)
    with pytest.raises(ValueError, match="no proposer"):
        RateGate().choose([])


class RandomGate(RateGate):
    """Picks at random among the available proposers: every mix of round kinds."""

    def __init__(self, seed):
        super().__init__()
        self.rng = random.Random(seed)

    def choose(self, available):
        return self.rng.choice(available)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       max_new=st.integers(1, 30), block=st.integers(2, 5),
       kind=st.sampled_from(["oracle", "wrong", "random", "none"]),
       lookup=st.booleans(), seed=st.integers(0, 1000))
def test_greedy_output_is_the_targets_own_whatever_the_gate_picks(prompt, max_new, block,
                                                                   kind, lookup, seed):
    drafter = PathDrafter(prompt, block, kind) if kind in ("oracle", "wrong") else \
        make_drafter(kind, block, prompt, seed)
    engine = SpeculativeEngine(BACKEND, drafter,
                               ContextLookup(3, 1, block_size=block) if lookup else None,
                               gate=RandomGate(seed))
    out = engine.generate(prompt, max_new_tokens=max_new)
    want, reason = expected(prompt, max_new)
    assert out.tokens == want and out.stats.stop_reason == reason
    s = out.stats
    assert s.drafter_calls + s.lookup_rounds + s.plain_rounds == s.rounds
    assert sum(s.position_proposed) <= (s.rounds - s.plain_rounds) * (block - 1)


class SlowWrongDrafter(PathDrafter):
    """Every draft rejected, and each costs 20 ms: a drafter that only loses time."""

    def __init__(self, prompt, block):
        super().__init__(prompt, block, "wrong")

    def propose(self, anchor, pos):
        time.sleep(0.02)
        return super().propose(anchor, pos)


def test_a_drafter_that_only_costs_is_gated_off_and_an_oracle_is_kept(monkeypatch):
    prompt = [3, 1, 4, 1, 5]
    want = expected(prompt, 24)[0]
    slow = SpeculativeEngine(BACKEND, SlowWrongDrafter(prompt, 4),
                             gate=RateGate(warmup=2, explore_every=8))
    out = slow.generate(prompt, max_new_tokens=24)
    assert out.tokens == want
    assert out.stats.plain_rounds > 2 * out.stats.drafter_calls  # warmup + exploration only
    # The oracle's rounds cost about what a plain decode does here, so one round stalled by
    # a busy machine could make plain look faster for good: the engine's clock ticks 1 ms
    # per reading instead, and a round costs what it does, not what the machine did.
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 0.001)
    oracle = SpeculativeEngine(BACKEND, PathDrafter(prompt, 4, "oracle"),
                               gate=RateGate(warmup=2, explore_every=100))
    out = oracle.generate(prompt, max_new_tokens=24)
    assert out.tokens == want and out.stats.plain_rounds == 2  # its warmup only
