"""The speculative engine: lossless greedy decoding with any drafter, tau and acceptance
as the drafter deserves, exact stop rules, streaming, and one-line errors on bad input."""

import math
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_drafters import (
    BrokenDrafter,
    ContractDrafter,
    OracleDrafter,
    RandomDrafter,
    Stopwatch,
    WrongDrafter,
    features_of,
    one_hot_logits,
    plain_greedy,
    tiny_target,
    uncached,
)

from hyflash.errors import HyflashError
from hyflash.runtime import Sampling, SpeculativeEngine, TorchTarget, format_stats
from hyflash.runtime.lookup import ContextLookup

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


class PathDrafter(ContractDrafter):
    """Proposes the target's greedy path after pos (oracle), or that +1 (wrong): it reads
    the path, not its own history, since rounds drafted by the lookup skip it."""

    def __init__(self, prompt, block, kind):
        self.path = prompt + plain_greedy(REFERENCE, prompt, L - len(prompt))
        self.shift = int(kind == "wrong")
        super().__init__(V, F, block)

    def propose(self, anchor, pos):
        assert self.path[pos] == anchor
        drafts = self.path[pos + 1:pos + self.block_size] + [0] * self.block_size
        return one_hot_logits([(t + self.shift) % V for t in drafts[:self.block_size - 1]], V)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       max_new=st.integers(1, 30), block=st.integers(2, 5),
       kind=st.sampled_from(["oracle", "wrong", "random", "none"]),
       ngrams=st.sampled_from([(1, 1), (3, 1), (4, 2)]), seed=st.integers(0, 1000))
def test_greedy_output_with_context_lookup_is_the_targets_own(prompt, max_new, block, kind,
                                                              ngrams, seed):
    """Copied drafts (a small alphabet: the prompt repeats itself) verify like any other,
    and rounds without a drafter call still commit every verified feature."""
    drafter = PathDrafter(prompt, block, kind) if kind in ("oracle", "wrong") else \
        make_drafter(kind, block, prompt, seed)
    engine = SpeculativeEngine(BACKEND, drafter, ContextLookup(*ngrams, block_size=block))
    out = engine.generate(prompt, max_new_tokens=max_new)
    want, reason = expected(prompt, max_new)
    assert out.tokens == want and out.stats.stop_reason == reason
    s = out.stats
    assert s.drafter_calls + s.lookup_rounds <= s.rounds
    if drafter is not None:
        check_only_verified_features_reached(drafter, prompt, out)


def test_context_lookup_copies_a_repeating_continuation():
    """The tiny target's greedy continuation repeats: the lookup drafts most rounds, and
    copies accepted drafts, so tau is above 1 with no drafter at all."""
    prompt = [3, 1, 4, 1, 5]
    out = SpeculativeEngine(BACKEND, None, ContextLookup(3, 1, block_size=4)).generate(
        prompt, max_new_tokens=20)
    assert out.tokens == expected(prompt, 20)[0]
    assert out.stats.lookup_rounds > 0 and out.stats.block_size == 4
    assert out.stats.drafter_calls == 0
    assert out.stats.tau > 1


def test_lookup_and_drafter_must_share_the_block_size():
    with pytest.raises(HyflashError, match="lookup block size 4 != drafter block size 3"):
        SpeculativeEngine(BACKEND, RandomDrafter(V, F, 3), ContextLookup(block_size=4))


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


def test_stats_time_split_agrees_with_the_backends_own_clocks():
    """prefill / verify / draft are the time the backends spent in those calls; rollbacks
    are overhead, with the engine's own arithmetic (argmax, acceptance: 0.5-1 ms a round
    measured here while two other processes held both cores); a streaming consumer's time
    is not counted. Every call waits 50 ms, so a call booked to the wrong phase moves it
    by twice the tolerance."""
    target = Stopwatch(TorchTarget(tiny_target(vocab=V, max_seq_len=L, seed=2)))
    drafter = Stopwatch(RandomDrafter(V, F, 4))
    consumer = []

    def slow_consumer(tok):
        t = time.perf_counter()
        time.sleep(Stopwatch.SLEEP_S)
        consumer.append(time.perf_counter() - t)

    start = time.perf_counter()
    s = SpeculativeEngine(target, drafter).generate([1, 1, 2, 3], max_new_tokens=8,
                                                    on_token=slow_consumer).stats
    wall = time.perf_counter() - start - sum(consumer)
    tol = Stopwatch.SLEEP_S / 2
    t, d = target.spent, drafter.spent
    assert s.rounds >= 3 and len(consumer) == 8
    for engine_s, own_s in [(s.prefill_s, t["prefill"]), (s.verify_s, t["forward"]),
                            (s.draft_s, d["reset"] + d["commit"] + d["draft"]),
                            (s.overhead_s, t["rollback"]), (s.total_s, wall)]:
        assert own_s - tol <= engine_s <= own_s + tol, (engine_s, own_s)


def test_peak_rss_is_at_least_the_resident_set_before_the_run():
    """Read independently from /proc: catches a wrong unit (KiB vs bytes) either way. The
    kernel syncs the peak lazily, so it may trail VmRSS by a little."""
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.skip("no /proc on this system")
    rss_kib = int(next(line.split()[1] for line in status.read_text().splitlines()
                       if line.startswith("VmRSS:")))
    s = SpeculativeEngine(BACKEND).generate([1, 2], max_new_tokens=2).stats
    assert 0.9 * rss_kib / 1024 <= s.peak_rss_mib < 64 * rss_kib / 1024


def test_sampling_is_reproducible_for_a_seed():
    prompt = [3, 3]
    engine = SpeculativeEngine(BACKEND, RandomDrafter(V, F, 4, scale=3.0))
    kw = dict(max_new_tokens=20, temperature=1.5, top_k=20, top_p=0.95)
    a = engine.generate(prompt, seed=7, **kw).tokens
    assert engine.generate(prompt, seed=7, **kw).tokens == a
    assert engine.generate(prompt, seed=8, **kw).tokens != a


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


# ------------------------------------------- drafters returning non-finite logits

NAN, INF = float("nan"), float("inf")
BROKEN = {  # name -> (value, rows, columns) written into the drafter's logits
    "NaN everywhere": (NAN, slice(None), slice(None)),
    "+inf everywhere": (INF, slice(None), slice(None)),
    "-inf everywhere": (-INF, slice(None), slice(None)),
    "NaN in one entry of row 2": (NAN, 1, 7),
    "+inf in one entry of row 2": (INF, 1, 7),
    "-inf across row 2": (-INF, 1, slice(None)),
}


def broken(case, inner):
    value, rows, cols = BROKEN[case]
    return BrokenDrafter(inner, value, rows, cols)


@pytest.mark.parametrize("case", list(BROKEN))
def test_non_finite_draft_rows_propose_nothing_and_greedy_stays_lossless(case):
    """Rows before the broken one are still drafted (the oracle's are all accepted); the
    broken row and the rows after it are dropped, and the target decides there."""
    prompt = [6, 2, 9]
    drafter = broken(case, OracleDrafter(TARGET, 4, prompt))
    out = SpeculativeEngine(BACKEND, drafter).generate(prompt, max_new_tokens=16)
    s = out.stats
    assert out.tokens == expected(prompt, 16)[0]
    check_only_verified_features_reached(drafter, prompt, out)
    first_ok = "everywhere" not in case
    assert s.position_accepted == [s.position_proposed[0] * first_ok, 0, 0]
    assert s.dropped_draft_rows == sum(s.position_proposed[first_ok:])


def test_minus_inf_entries_are_a_distribution_not_a_broken_row():
    """A drafter may rule tokens out with -inf (a hard one-hot): nothing is dropped."""
    class HardOracle(OracleDrafter):
        def propose(self, anchor, pos):
            logits = super().propose(anchor, pos)
            return logits.masked_fill(logits < 0, -INF)

    prompt = [6, 2, 9]
    out = SpeculativeEngine(BACKEND, HardOracle(TARGET, 4, prompt)).generate(
        prompt, max_new_tokens=13)
    assert out.stats.tau == 4 and out.stats.dropped_draft_rows == 0
    sampled = SpeculativeEngine(BACKEND, HardOracle(TARGET, 4, prompt)).generate(
        prompt, max_new_tokens=13, temperature=1.0)
    assert sampled.stats.dropped_draft_rows == 0


def can_sample(prompt, tokens, sampling):
    """Whether the target gives each token a nonzero probability after its prefix."""
    logits = REFERENCE(torch.tensor([prompt + tokens]), 0)[0][0]
    rows = sampling.probs(logits[len(prompt) - 1:-1])
    return bool((rows[torch.arange(len(tokens)), torch.tensor(tokens)] > 0).all())


@pytest.mark.parametrize("case", list(BROKEN))
def test_non_finite_draft_rows_are_safe_when_sampling(case):
    """No crash, only tokens the warped target can produce, and a drafter broken
    everywhere samples exactly what plain decoding samples with the same seed."""
    prompt, kw = [6, 2, 9], dict(max_new_tokens=16, temperature=1.0, top_k=3)
    engine = SpeculativeEngine(BACKEND, broken(case, RandomDrafter(V, F, 4, seed=2,
                                                                   scale=4.0)))
    plain = SpeculativeEngine(BACKEND)
    for seed in range(5):
        out = engine.generate(prompt, seed=seed, **kw)
        assert len(out.tokens) == 16 and out.stats.dropped_draft_rows > 0
        with torch.no_grad():
            assert can_sample(prompt, out.tokens, Sampling(1.0, top_k=3))
        if "everywhere" in case:
            assert out.tokens == plain.generate(prompt, seed=seed, **kw).tokens
