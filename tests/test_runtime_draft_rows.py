"""Proposing only some of the drafter's rows: the policies keep the rows they should, and
whatever they keep, greedy output stays the target's own and sampled output keeps the
target's distribution."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_drafters import RandomDrafter, tiny_target, uncached
from test_runtime_engine import BACKEND, PathDrafter, expected, make_drafter
from test_runtime_sampling import ALPHA, engine_counts, exact_joint, pvalues

from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.draft_rows import Cutoff, ExpectedRate, confidences, parse_policy
from hyflash.runtime.lookup import ContextLookup


class RandomRows:
    """Keeps a random number of rows, by its own generator: every length gets verified."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def choose(self, conf):
        return self.rng.randint(0, conf.numel())

    def record_verify(self, tokens, seconds):
        pass

    def record_overhead(self, seconds):
        pass

    def record_accepted(self, accepted):
        pass


def conf(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_confidence_is_the_probability_of_each_rows_best_token():
    logits = torch.tensor([[0.0, 0.0], [0.0, -float("inf")], [float("nan"), 0.0]])
    c = confidences(logits)
    assert c[:2].tolist() == [0.5, 1.0] and torch.isnan(c[2])


def test_cutoff_keeps_the_leading_rows_at_or_above_it():
    assert Cutoff(0.3).choose(conf(0.9, 0.3, 0.2, 0.8)) == 2  # a sure row after a doubt: cut
    assert Cutoff(0.3).choose(conf(0.1, 0.9)) == 0
    assert Cutoff(0.0).choose(conf(0.1, 0.0)) == 2
    assert Cutoff(0.5).choose(conf(0.9, float("nan"), 0.9)) == 1


def measured(policy, cost_of_tokens, draft_s=0.002):
    """The policy after its exploration rounds, with verify costs from cost_of_tokens."""
    for _ in range(policy.explore):
        k = policy.choose(conf(*[0.9] * 7))
        policy.record_overhead(draft_s)
        policy.record_verify(k + 1, cost_of_tokens(k + 1))
    return policy


def test_exploration_measures_several_lengths_first_then_every_row_now_and_then():
    policy = ExpectedRate(explore=6, explore_every=8)
    picks = [policy.choose(conf(*[0.9] * 7)) for _ in range(6)]
    assert picks == [7, 3, 0, 7, 3, 0]
    for T in (1, 4, 8):
        policy.record_verify(T, 0.010 + 0.001 * (T - 1))  # unsure rows do not pay
    picks = [policy.choose(conf(0.9, *[0.1] * 6)) for _ in range(10)]
    assert picks == [1, 7] + [1] * 7 + [7]  # rounds 7..16: every 8th proposes all


def test_expected_rate_keeps_every_row_when_verify_cost_does_not_grow():
    policy = measured(ExpectedRate(), lambda t: 0.020)
    assert policy.choose(conf(0.6, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1)) == 7


def test_expected_rate_keeps_fewer_rows_when_each_row_costs_a_lot():
    policy = measured(ExpectedRate(), lambda t: 0.010 + 0.005 * (t - 1))  # a row: half a decode
    assert policy.choose(conf(0.95, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2)) == 2
    assert policy.choose(conf(0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3)) == 0  # a plain decode pays
    assert policy.choose(conf(*[0.99] * 7)) >= 6  # sure rows: (nearly) all pay


def test_unmeasured_lengths_are_interpolated_between_measured_ones():
    policy = ExpectedRate(explore=0)
    assert policy.verify_cost(4) is None
    policy.record_verify(1, 0.010)
    policy.record_verify(8, 0.024)
    assert policy.verify_cost(4) == pytest.approx(0.016)
    assert policy.verify_cost(9) == pytest.approx(0.024)  # beyond: the nearest measured


def test_expected_rate_stops_at_a_broken_row():
    policy = measured(ExpectedRate(), lambda t: 0.020)
    assert policy.choose(conf(0.9, float("nan"), 0.9)) == 1
    assert policy.choose(conf(float("nan"), 0.9)) == 0


def test_policy_names_parse_and_bad_ones_are_one_error():
    assert parse_policy("all") is None
    assert isinstance(parse_policy("auto"), ExpectedRate)
    assert parse_policy("0.25").p == 0.25
    for bad, message in (("most", "all, auto or a probability"), ("1.5", "0 <= p < 1")):
        with pytest.raises(ValueError, match=message):
            parse_policy(bad)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, 60), min_size=1, max_size=12),
       max_new=st.integers(1, 30), block=st.integers(2, 5),
       kind=st.sampled_from(["oracle", "wrong", "random"]),
       policy=st.sampled_from(["random", "cutoff", "auto"]), lookup=st.booleans(),
       seed=st.integers(0, 1000))
def test_greedy_output_is_the_targets_own_whatever_rows_are_kept(prompt, max_new, block,
                                                                 kind, policy, lookup, seed):
    rows = {"random": RandomRows(seed), "cutoff": Cutoff(0.5),
            "auto": ExpectedRate(explore=2)}[policy]
    # PathDrafter reads the target's path, so rounds the lookup drafted do not confuse it
    drafter = PathDrafter(prompt, block, kind) if kind != "random" else \
        make_drafter(kind, block, prompt, seed)
    engine = SpeculativeEngine(BACKEND, drafter,
                               ContextLookup(3, 1, block_size=block) if lookup else None,
                               draft_rows=rows)
    out = engine.generate(prompt, max_new_tokens=max_new)
    want, reason = expected(prompt, max_new)
    assert out.tokens == want and out.stats.stop_reason == reason
    s = out.stats
    assert sum(s.position_proposed) + s.cut_draft_rows <= s.rounds * (block - 1)


def test_rows_left_out_are_counted_and_not_proposed():
    prompt = [1, 2, 3]
    engine = SpeculativeEngine(BACKEND, make_drafter("oracle", 5, prompt),
                               draft_rows=Cutoff(1 - 1e-6))
    s = engine.generate(prompt, max_new_tokens=12).stats
    # the oracle's one-hot rows are sure (probability 1 up to rounding)
    assert s.cut_draft_rows == 0 and s.tau == pytest.approx(5, abs=1.0)
    random_rows = SpeculativeEngine(BACKEND, make_drafter("random", 5, prompt, 1),
                                    draft_rows=Cutoff(0.9))
    s = random_rows.generate(prompt, max_new_tokens=12).stats
    assert s.cut_draft_rows == 4 * s.drafter_calls and sum(s.position_proposed) == 0


V, PROMPT, RUNS = 8, [1, 2, 3], 2000
SMALL = tiny_target(vocab=V, hidden=16, layers=2, max_seq_len=16, seed=4, dtype=torch.float32)


@pytest.mark.parametrize("rows", ["random", "cutoff"])
def test_sampled_output_keeps_the_target_distribution_whatever_rows_are_kept(rows):
    sampling = dict(temperature=1.0, top_k=0, top_p=1.0)
    # seed 0's first block has confidences 0.32, 0.27: a cutoff of 0.3 keeps one row of two
    policy = RandomRows(3) if rows == "random" else Cutoff(0.3)
    engine = SpeculativeEngine(TorchTarget(SMALL),
                               RandomDrafter(V, SMALL.cfg.feature_size, 3, seed=0),
                               draft_rows=policy)
    stats = [engine.generate(PROMPT, max_new_tokens=3, seed=s, **sampling).stats
             for s in range(20)]
    assert sum(s.cut_draft_rows for s in stats) > 0  # rows were left out
    assert sum(sum(s.position_proposed) for s in stats) > 0  # and some were proposed
    counts = engine_counts(engine, PROMPT, RUNS, sampling)
    assert min(pvalues(counts, exact_joint(uncached(SMALL), PROMPT, sampling))) > ALPHA


def test_an_underconfident_drafter_is_calibrated_by_what_the_verify_accepts():
    policy = measured(ExpectedRate(explore_every=1000), lambda t: 0.010 + 0.005 * (t - 1))
    shy = conf(*[0.3] * 7)
    assert policy.choose(shy) == 0  # taken at its word, 0.3 per row does not pay
    for _ in range(30):  # but every row it proposes is accepted
        policy.last = shy.tolist()
        policy.record_accepted(7)
    assert policy.choose(shy) == 7
