"""Sampling is lossless: with any drafter, the committed tokens are distributed exactly
as the target's (warped) distribution. Checked by chi-square tests at a fixed seed and
significance level ALPHA, with negative controls showing the same tests reject a
distribution that is only close to right: test drafters (random, one-hot, broken with
NaN), the shipped pocket drafter, and an exported pair run by ONNX Runtime."""

from collections import Counter

import numpy as np
import pytest
import torch
from onnx_pairs import prompts
from runtime_drafters import BrokenDrafter, OracleDrafter, RandomDrafter, tiny_target, uncached
from scipy.stats import chisquare

from hyflash.errors import HyflashError
from hyflash.models import pocket
from hyflash.models.target import Target
from hyflash.models.tokenizer import load_tokenizer
from hyflash.runtime import Sampling, SpeculativeEngine, TorchTarget
from hyflash.runtime.drafter_backend import load_torch_drafter
from hyflash.runtime.lookup import ContextLookup
from hyflash.runtime.onnx_backend import load_onnx_pair
from hyflash.runtime.sampling import distribution_rows, sample
from hyflash.runtime.verify import verify_greedy, verify_sampled

ALPHA = 1e-3  # a correct sampler fails one of these tests with probability ~ALPHA per seed


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit; cells expected below 5 are pooled, impossible cells must be empty."""
    counts, probs = counts.ravel().astype(np.float64), probs.ravel().astype(np.float64)
    probs = probs / probs.sum()
    assert counts[probs == 0].sum() == 0, "a token the target cannot produce was produced"
    n = counts.sum()
    big = probs * n >= 5
    f_obs = np.append(counts[big], counts[~big].sum())
    f_exp = np.append(probs[big], probs[~big].sum()) * n
    keep = f_exp > 0
    return chisquare(f_obs[keep], f_exp[keep]).pvalue


# ------------------------------------------------------------------------ warping

def test_temperature_top_k_top_p_warp():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    torch.testing.assert_close(Sampling(1.0).probs(logits), torch.tensor([[.5, .3, .15, .05]]))
    torch.testing.assert_close(Sampling(1.0, top_k=2).probs(logits),
                               torch.tensor([[.625, .375, 0, 0]]))
    # top-p keeps the smallest head reaching p: 0.5 + 0.3 >= 0.75, but not >= 0.85
    torch.testing.assert_close(Sampling(1.0, top_p=0.75).probs(logits),
                               torch.tensor([[.625, .375, 0, 0]]))
    torch.testing.assert_close(Sampling(1.0, top_p=0.85).probs(logits),
                               torch.tensor([[.5, .3, .15, 0]]) / 0.95)
    torch.testing.assert_close(Sampling(1.0, top_p=0.1).probs(logits),
                               torch.tensor([[1.0, 0, 0, 0]]))
    flat = Sampling(1e6).probs(logits)
    torch.testing.assert_close(flat, torch.full((1, 4), 0.25), atol=1e-5, rtol=0)
    assert Sampling(0.0).greedy and not Sampling(0.5).greedy


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(top_k=-2), dict(top_p=0.0),
                                dict(top_p=1.5)])
def test_bad_sampling_options_are_refused(kw):
    with pytest.raises(HyflashError):
        Sampling(**kw)


def test_a_row_is_a_distribution_unless_nan_plus_inf_or_all_minus_inf():
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor([[0.0, 1.0], [-inf, 3.0], [1e30, -1e30], [nan, 1.0], [0.0, 1.0]])
    assert distribution_rows(rows) == 3  # the valid last row follows a broken one
    for bad in ([inf, 0.0], [-inf, -inf], [nan, nan]):
        assert distribution_rows(torch.tensor([bad, [0.0, 1.0]])) == 0
    assert distribution_rows(Sampling(1.0, top_k=1).probs(rows[:3])) == 3
    assert distribution_rows(Sampling(1.0).probs(rows[3:])) == 0  # NaN survives the warp
    assert distribution_rows(torch.empty(0, 4)) == 0


def test_greedy_verification_keeps_the_longest_matching_prefix():
    logits = torch.nn.functional.one_hot(torch.tensor([4, 2, 7, 1]), 8).float()
    assert verify_greedy(torch.tensor([4, 2, 7]), logits) == (3, 1)
    assert verify_greedy(torch.tensor([4, 3, 7]), logits) == (1, 2)  # a later match is no use
    assert verify_greedy(torch.tensor([5, 2, 7]), logits) == (0, 4)
    assert verify_greedy(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 4)


# --------------------------------------------------- one rejection-sampling step

P = torch.tensor([0.30, 0.25, 0.15, 0.10, 0.08, 0.07, 0.05, 0.00])
Q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.20, 0.00, 0.10, 0.10])


def first_tokens(rule, n=20000, seed=0) -> np.ndarray:
    """Counts of the token committed at the first draft position under a rule."""
    gen = torch.Generator().manual_seed(seed)
    p2 = torch.stack([P, torch.full((8,), 1 / 8)])
    counts = np.zeros(8)
    for _ in range(n):
        d = sample(Q[None], gen)
        k, bonus = rule(d, Q[None], p2, gen)
        counts[int(d[0]) if k else bonus] += 1
    return counts


def test_rejection_step_commits_tokens_distributed_as_p():
    assert chi2_pvalue(first_tokens(verify_sampled), P.numpy()) > ALPHA


def test_rejection_step_test_rejects_a_subtly_wrong_rule():
    def resample_from_p(drafts, q, p, gen):  # a classic bug: p instead of max(0, p - q)
        d = int(drafts[0])
        if float(torch.rand((), generator=gen)) * float(q[0, d]) < float(p[0, d]):
            return 1, -1
        return 0, int(sample(p[:1], gen))

    assert chi2_pvalue(first_tokens(resample_from_p), P.numpy()) < ALPHA


# ------------------------------------------------------ end to end: the whole engine

def warp_reference(logits: np.ndarray, temperature, top_k, top_p) -> np.ndarray:
    """The warp, written again independently (numpy, one row at a time)."""
    out = []
    for row in logits / temperature:
        if top_k:
            row = np.where(row < np.sort(row)[-top_k], -np.inf, row)
        p = np.exp(row - row.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        p[order[before >= top_p]] = 0
        out.append(p / p.sum())
    return np.array(out)


@torch.no_grad()
def exact_joint(model: Target, prompt: list[int], sampling: dict) -> dict[tuple, float]:
    """P(x_n, x_n+1, x_n+2 | prompt) of every triple the warped target can produce, from
    uncached passes over each continuation (no KV cache, no verify blocks, no drafter)."""
    def warped(seqs: list[list[int]]) -> np.ndarray:
        logits = model(torch.tensor(seqs), 0)[0][:, -1].double().numpy()
        return warp_reference(logits, **sampling)

    joint = {}
    p0 = warped([prompt])[0]
    for a in np.flatnonzero(p0).tolist():
        p1 = warped([prompt + [a]])[0]
        after_a = np.flatnonzero(p1).tolist()
        for b, p2 in zip(after_a, warped([prompt + [a, b] for b in after_a]), strict=True):
            for c in np.flatnonzero(p2).tolist():
                joint[a, b, c] = p0[a] * p1[b] * p2[c]
    return joint


def engine_counts(engine: SpeculativeEngine, prompt: list[int], runs: int,
                  sampling: dict) -> Counter:
    """How often the engine generated each (x_n, x_n+1, x_n+2), over seeds 0..runs-1."""
    return Counter(tuple(engine.generate(prompt, max_new_tokens=3, seed=seed,
                                         **sampling).tokens) for seed in range(runs))


def pvalues(counts: Counter, joint: dict) -> list[float]:
    """Goodness of fit of the (x_n, x_n+1) and (x_n+1, x_n+2) marginals: x_n comes from
    the prefill, x_n+1 and x_n+2 from the first speculative round."""
    out = []
    for cut in (slice(0, 2), slice(1, 3)):
        got, want = Counter(), Counter()
        for key, n in counts.items():
            got[key[cut]] += n
        for key, p in joint.items():
            want[key[cut]] += p
        keys = sorted(got.keys() | want.keys())
        out.append(chi2_pvalue(np.array([got[k] for k in keys]),
                               np.array([want[k] for k in keys])))
    return out


V, PROMPT, RUNS = 8, [1, 2, 3], 4000
TARGET = tiny_target(vocab=V, hidden=16, layers=2, max_seq_len=16, seed=4,
                     dtype=torch.float32)
F = TARGET.cfg.feature_size

SCENARIOS = {  # name -> (drafter, sampling, runs)
    # q random and broad: many rejections and residual draws
    "random drafter, temperature 1": (
        lambda: RandomDrafter(V, F, 3, seed=1), dict(temperature=1.0, top_k=0, top_p=1.0),
        RUNS),
    # q one-hot on the target's greedy token; warped p with zeroed tail
    "oracle drafter, top-k and top-p": (
        lambda: OracleDrafter(TARGET, 3, PROMPT), dict(temperature=0.8, top_k=6, top_p=0.9),
        RUNS),
    # position 1 from a random q, position 2 (NaN in one entry) from the target alone;
    # the rejection step itself is tested above, so fewer runs
    "random drafter with a NaN in its second row": (
        lambda: BrokenDrafter(RandomDrafter(V, F, 4, seed=1), float("nan"), 1, 5),
        dict(temperature=1.0, top_k=0, top_p=1.0), RUNS // 4),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_first_generated_tokens_follow_the_target_distribution(scenario):
    make, sampling, runs = SCENARIOS[scenario]
    counts = engine_counts(SpeculativeEngine(TorchTarget(TARGET), make()), PROMPT, runs,
                           sampling)
    assert min(pvalues(counts, exact_joint(uncached(TARGET), PROMPT, sampling))) > ALPHA


@pytest.mark.parametrize("prompt,with_drafter", [
    ([0, 1, 2, 3, 4, 5, 6, 7], False),  # every first token was seen: always a copy
    ([1, 2, 3, 1], True),  # copies when the token was seen, the drafter otherwise
])
def test_drafts_copied_from_the_context_keep_the_target_distribution(prompt, with_drafter):
    sampling = dict(temperature=1.0, top_k=0, top_p=1.0)
    engine = SpeculativeEngine(TorchTarget(TARGET),
                               RandomDrafter(V, F, 3, seed=1) if with_drafter else None,
                               ContextLookup(2, 1, block_size=3))
    counts = engine_counts(engine, prompt, RUNS, sampling)
    stats = [engine.generate(prompt, max_new_tokens=3, seed=s, **sampling).stats
             for s in range(30)]
    assert any(s.lookup_rounds for s in stats)  # both ways of drafting were tested
    assert any(s.drafter_calls for s in stats) == with_drafter
    assert min(pvalues(counts, exact_joint(uncached(TARGET), prompt, sampling))) > ALPHA


def test_end_to_end_test_rejects_sampling_from_the_drafter():
    """Negative control: committing q's samples unverified is caught at the same N."""
    drafter = RandomDrafter(V, F, 3, seed=1)
    drafter.reset()
    q = torch.softmax(drafter.propose(0, 0), -1)  # the q the engine sees in round one
    gen = torch.Generator().manual_seed(0)
    counts = Counter((0, *sample(q, gen).tolist()) for _ in range(RUNS))  # x_n: any
    joint = exact_joint(uncached(TARGET), PROMPT, dict(temperature=1.0, top_k=0, top_p=1.0))
    assert pvalues(counts, joint)[1] < ALPHA  # the (x_n+1, x_n+2) marginal


# A trained drafter's q is neither random nor one-hot: the shipped pocket pair, at a
# prompt where the next three tokens each have several likely values (top-4 entropy
# about 1.3 nats), and the exported tiny pair through ONNX Runtime. Fewer runs than
# above (a pocket run costs ~40 ms): at these N, accepting every draft, or resampling a
# rejection from p instead of max(0, p - q), still fails each of them (p < 1e-5).
POCKET_PROMPT, POCKET_RUNS, ONNX_RUNS = "    for i in range(", 300, 1000
TOP_K = dict(temperature=1.0, top_k=4, top_p=1.0)


def test_the_shipped_pocket_drafter_keeps_the_target_distribution():
    target = Target.from_pretrained(pocket.path(), max_seq_len=16)
    prompt = load_tokenizer(pocket.path())(POCKET_PROMPT)["input_ids"]
    engine = SpeculativeEngine(TorchTarget(target), load_torch_drafter("pocket", target))
    counts = engine_counts(engine, prompt, POCKET_RUNS, TOP_K)
    joint = exact_joint(uncached(target), prompt, TOP_K)
    assert min(pvalues(counts, joint)) > ALPHA


def test_an_onnx_bundle_keeps_the_target_distribution(onnx_bundles):
    folder, _, bundles = onnx_bundles
    _, ort_target, ort_drafter = load_onnx_pair(bundles["hyflash"], threads=1)
    prompt = prompts(1, seed=6, lo=20, hi=21)[0]  # longer than the window: memory in use
    sampling = dict(temperature=1.0, top_k=8, top_p=1.0)
    counts = engine_counts(SpeculativeEngine(ort_target, ort_drafter), prompt, ONNX_RUNS,
                           sampling)
    joint = exact_joint(uncached(Target.from_pretrained(folder)), prompt, sampling)
    assert min(pvalues(counts, joint)) > ALPHA
