"""The speculative engine: lossless greedy decoding with any drafter, tau and acceptance
as the drafter deserves, exact stop rules, streaming, and one-line errors on bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_drafters import (
    OracleDrafter,
    RandomDrafter,
    WrongDrafter,
    features_of,
    one_hot_logits,
    plain_greedy,
    tiny_target,
    uncached,
)

from hyflash.errors import HyflashError
from hyflash.runtime import (
    DrafterBackend,
    SpeculativeEngine,
    TargetBackend,
    TorchTarget,
    format_stats,
)

V, L = 61, 32
TARGET = tiny_target(vocab=V, max_seq_len=L)
REFERENCE = uncached(TARGET)
BACKEND = TorchTarget(TARGET)
F = TARGET.cfg.feature_size


class NoisyOracleDrafter(OracleDrafter):
    """The oracle with seeded corruptions: accepts a varying prefix (0 < k < B-1 too)."""

    def __init__(self, *args, seed=0, **kw):
        self.seed = seed
        super().__init__(*args, **kw)

    def reset(self):
        super().reset()
        self.gen = torch.Generator().manual_seed(self.seed)

    def propose(self, anchor, pos):
        super().propose(anchor, pos)
        wrong = torch.rand(len(self.proposal), generator=self.gen) < 0.3
        self.proposal = [(t + 1) % V if w else t for t, w in zip(self.proposal, wrong.tolist(),
                                                                 strict=True)]
        return one_hot_logits(self.proposal, V)


def make_drafter(kind, block, prompt, seed=0):
    if kind == "oracle":
        return OracleDrafter(TARGET, block, prompt)
    if kind == "wrong":
        return WrongDrafter(TARGET, block, prompt)
    if kind == "noisy":
        return NoisyOracleDrafter(TARGET, block, prompt, seed=seed)
    if kind == "random":
        return RandomDrafter(V, F, block, seed=seed)
    return None


def expected(prompt, max_new, eos=None):
    """What plain greedy decoding with the same stop rules produces, and why it stops."""
    ref = plain_greedy(REFERENCE, prompt, min(max_new, L - len(prompt)))
    if eos is not None and eos in ref:
        return ref[: ref.index(eos) + 1], "eos"
    return ref, "max_new_tokens" if len(ref) == max_new else "context_full"


def check_only_verified_features_reached(drafter, prompt, out):
    """The drafter saw the target's features of exactly x_0..x_{n-2}, in order."""
    seq = prompt + out.tokens
    torch.testing.assert_close(drafter.committed_features(), features_of(REFERENCE, seq)[:-1])


# ------------------------------------------------------------------- lossless greedy

@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=12),
       max_new=st.integers(1, 30), block=st.integers(2, 5),
       kind=st.sampled_from(["oracle", "wrong", "noisy", "random", "none"]),
       eos=st.none() | st.integers(0, V - 1), seed=st.integers(0, 1000))
def test_greedy_output_is_the_targets_own_greedy_decode(prompt, max_new, block, kind, eos,
                                                        seed):
    drafter = make_drafter(kind, block, prompt, seed)
    out = SpeculativeEngine(BACKEND, drafter).generate(
        prompt, max_new_tokens=max_new, eos_ids=() if eos is None else (eos,))
    want, reason = expected(prompt, max_new, eos)
    assert out.tokens == want
    assert out.stats.stop_reason == reason
    s = out.stats
    assert s.target_calls == s.rounds + 1 and s.new_tokens == len(want)
    if drafter is not None:
        check_only_verified_features_reached(drafter, prompt, out)
        assert s.drafter_calls <= s.rounds
    if kind == "oracle":  # all proposed positions accepted, even in shrunk blocks
        assert s.position_accepted == s.position_proposed
    if kind in ("wrong", "none"):
        assert s.accepted_drafts == 0


# ------------------------------------------------------------------ tau, acceptance

@pytest.mark.parametrize("block", [2, 3, 5])
def test_oracle_drafter_gives_tau_equal_block_size(block):
    prompt = [3, 1, 4, 1, 5]
    out = SpeculativeEngine(BACKEND, OracleDrafter(TARGET, block, prompt)).generate(
        prompt, max_new_tokens=1 + 3 * block)
    s = out.stats
    assert s.tau == block and s.rounds == 3
    assert s.acceptance_rates == [1.0] * (block - 1)
    assert s.drafter_calls == 3 and s.target_calls == 4


@pytest.mark.parametrize("block", [2, 4])
def test_always_wrong_drafter_gives_tau_1(block):
    prompt = [2, 7, 1, 8]
    out = SpeculativeEngine(BACKEND, WrongDrafter(TARGET, block, prompt)).generate(
        prompt, max_new_tokens=10)
    s = out.stats
    assert s.tau == 1.0 and s.rounds == 9 and s.drafter_calls == 9
    assert s.acceptance_rates == [0.0] * (block - 1)
    assert out.tokens == expected(prompt, 10)[0]


def test_acceptance_by_position_never_increases_with_position():
    prompt = [9, 9, 8]
    drafter = NoisyOracleDrafter(TARGET, 5, prompt, seed=3)
    s = SpeculativeEngine(BACKEND, drafter).generate(prompt, max_new_tokens=25).stats
    rates = s.acceptance_rates
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert 0 < rates[-1] < rates[0] < 1
    assert s.accepted_drafts == s.position_accepted[0] + sum(s.position_accepted[1:])
    assert math.isclose(s.tau, 1 + s.accepted_drafts / s.rounds)


def test_plain_decoding_runs_through_the_same_loop():
    prompt = [5, 6, 7]
    out = SpeculativeEngine(BACKEND).generate(prompt, max_new_tokens=12)
    s = out.stats
    assert out.tokens == expected(prompt, 12)[0]
    assert s.tau == 1.0 and s.drafter_calls == 0 and s.target_calls == 12
    assert s.block_size == 1 and s.acceptance_rates == []


# ---------------------------------------------------------------------- stop rules

@pytest.mark.parametrize("kind", ["oracle", "wrong", "none"])
def test_context_limit_ends_with_context_full_and_a_full_context(kind):
    prompt = list(range(9))  # 10 tokens after prefill, then blocks of 4: 30, then room for 2
    drafter = make_drafter(kind, 4, prompt)
    out = SpeculativeEngine(BACKEND, drafter).generate(prompt, max_new_tokens=100)
    assert out.stats.stop_reason == "context_full"
    assert len(prompt) + len(out.tokens) == L
    assert out.tokens == expected(prompt, 100)[0]
    if drafter is not None:  # the last blocks shrank instead of overrunning the cache
        assert out.stats.position_proposed[-1] < out.stats.position_proposed[0]


def test_prompt_one_short_of_the_context_gives_one_token():
    out = SpeculativeEngine(BACKEND).generate(list(range(L - 1)), max_new_tokens=5)
    assert len(out.tokens) == 1 and out.stats.stop_reason == "context_full"
    assert out.stats.rounds == 0 and math.isnan(out.stats.tau)
    assert "tau (tokens per verify)  -" in format_stats(out.stats)


def test_eos_stops_right_after_the_eos_token():
    prompt = [11, 5, 7, 23]
    ref = expected(prompt, 20)[0]
    j = next(i for i in range(6, len(ref)) if ref[i] not in ref[:i])  # mid-block
    assert j % 4 != 0
    drafter = OracleDrafter(TARGET, 4, prompt)
    out = SpeculativeEngine(BACKEND, drafter).generate(prompt, max_new_tokens=20,
                                                       eos_ids=[ref[j]])
    assert out.tokens == ref[: j + 1] and out.stats.stop_reason == "eos"
    check_only_verified_features_reached(drafter, prompt, out)


def test_eos_as_the_first_token_stops_after_prefill():
    prompt = [4, 4, 2]
    first = expected(prompt, 1)[0][0]
    out = SpeculativeEngine(BACKEND, OracleDrafter(TARGET, 3, prompt)).generate(
        prompt, max_new_tokens=20, eos_ids=[first])
    assert out.tokens == [first] and out.stats.stop_reason == "eos"
    assert out.stats.target_calls == 1 and out.stats.drafter_calls == 0


@pytest.mark.parametrize("max_new", range(1, 10))
def test_max_new_tokens_is_exact(max_new):
    prompt = [1, 2]
    drafter = OracleDrafter(TARGET, 4, prompt)
    out = SpeculativeEngine(BACKEND, drafter).generate(prompt, max_new_tokens=max_new)
    assert out.tokens == expected(prompt, max_new)[0]
    assert len(out.tokens) == max_new and out.stats.stop_reason == "max_new_tokens"
    check_only_verified_features_reached(drafter, prompt, out)


# ------------------------------------------------------------- streaming and stats

def test_streaming_yields_the_tokens_as_they_commit():
    prompt = [8, 6, 7]
    engine = SpeculativeEngine(BACKEND, OracleDrafter(TARGET, 3, prompt))
    seen = []
    out = engine.generate(prompt, max_new_tokens=9, on_token=seen.append)
    assert seen == out.tokens
    stream = engine.stream(prompt, max_new_tokens=9)
    assert [next(stream) for _ in range(4)] == out.tokens[:4]
    rest = []
    try:
        while True:
            rest.append(next(stream))
    except StopIteration as done:
        assert done.value.tokens == out.tokens
    assert out.tokens[:4] + rest == out.tokens


def test_stats_time_split_adds_up():
    prompt = [1, 1, 2, 3]
    s = SpeculativeEngine(BACKEND, RandomDrafter(V, F, 4)).generate(
        prompt, max_new_tokens=10).stats
    assert s.total_s > 0 and s.prefill_s > 0 and s.draft_s > 0 and s.verify_s > 0
    assert math.isclose(s.prefill_s + s.draft_s + s.verify_s + s.overhead_s, s.total_s)
    assert s.tokens_per_s > 0 and s.peak_rss_mib > 10


def test_sampling_is_reproducible_for_a_seed():
    prompt = [3, 3]
    engine = SpeculativeEngine(BACKEND, RandomDrafter(V, F, 4, scale=3.0))
    kw = dict(max_new_tokens=20, temperature=1.5, top_k=20, top_p=0.95)
    a = engine.generate(prompt, seed=7, **kw).tokens
    assert engine.generate(prompt, seed=7, **kw).tokens == a
    assert engine.generate(prompt, seed=8, **kw).tokens != a


def test_backends_implement_the_protocols():
    assert isinstance(BACKEND, TargetBackend)
    for d in (OracleDrafter(TARGET, 3), WrongDrafter(TARGET, 3), RandomDrafter(V, F, 3)):
        assert isinstance(d, DrafterBackend)


def test_torch_target_rolls_back_by_position():
    target = TorchTarget(tiny_target(vocab=V, max_seq_len=L, seed=1))
    target.forward(torch.tensor([1, 2, 3, 4, 5, 6]), 0)
    target.rollback(3)
    logits, features = target.forward(torch.tensor([9, 9]), 3)
    ref_logits, ref_features = uncached(target.model)(torch.tensor([[1, 2, 3, 9, 9]]), 0)
    torch.testing.assert_close(logits, ref_logits[0, 3:].float())
    torch.testing.assert_close(features, ref_features[0, 3:].float())
    with pytest.raises(ValueError, match="gap"):
        target.forward(torch.tensor([1]), 7)


# ------------------------------------------------------------------------ bad input

BAD_CALLS = {
    "empty prompt": (dict(prompt=[]), "empty prompt"),
    "prompt fills the context": (dict(prompt=[1] * L), "leaves no room"),
    "prompt longer than the context": (dict(prompt=[1] * (L + 5)), "leaves no room"),
    "token outside the vocabulary": (dict(prompt=[1, V]), "outside the target's vocabulary"),
    "block larger than the room left": (dict(prompt=[1] * (L - 3)), "exceeds the remaining"),
    "no new tokens": (dict(prompt=[1], max_new_tokens=0), "max_new_tokens must be"),
    "negative temperature": (dict(prompt=[1], temperature=-1.0), "temperature"),
    "top-p zero": (dict(prompt=[1], temperature=1.0, top_p=0.0), "top-p"),
    "negative top-k": (dict(prompt=[1], temperature=1.0, top_k=-1), "top-k"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_one_line_and_leaves_the_engine_working(case):
    kw, message = BAD_CALLS[case]
    engine = SpeculativeEngine(BACKEND, OracleDrafter(TARGET, 4, [1]))
    with pytest.raises(HyflashError, match=message) as e:
        engine.generate(**kw)
    assert "\n" not in str(e.value)
    out = engine.generate([1], max_new_tokens=6)
    assert out.tokens == expected([1], 6)[0]


@pytest.mark.parametrize("vocab,features,message", [(V + 1, F, "vocabulary"),
                                                    (V, F + 8, "feature size")])
def test_drafter_for_another_target_is_refused(vocab, features, message):
    with pytest.raises(HyflashError, match=f"{message}.*another target"):
        SpeculativeEngine(BACKEND, RandomDrafter(vocab, features, 4))


def test_drafter_returning_the_wrong_shape_is_a_clear_error():
    class Short(RandomDrafter):
        def propose(self, anchor, pos):
            return torch.zeros(self.block_size - 2, self.vocab_size)

    engine = SpeculativeEngine(BACKEND, Short(V, F, 4))
    with pytest.raises(HyflashError, match=r"drafter returned logits of shape \(2, 61\)"):
        engine.generate([1, 2], max_new_tokens=5)
