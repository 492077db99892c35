"""Sampling is lossless: with any drafter, the committed tokens are distributed exactly
as the target's (warped) distribution. Checked by chi-square tests at a fixed seed and
significance level ALPHA, each with a negative control showing the same test rejects a
distribution that is only close to right."""

import numpy as np
import pytest
import torch
from runtime_drafters import OracleDrafter, RandomDrafter, tiny_target, uncached
from scipy.stats import chisquare

from hyflash.errors import HyflashError
from hyflash.runtime import Sampling, SpeculativeEngine, TorchTarget
from hyflash.runtime.sampling import sample
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


# ------------------------------------------------------------- end to end, V = 8

V, PROMPT, RUNS = 8, [1, 2, 3], 4000
TARGET = tiny_target(vocab=V, hidden=16, layers=2, max_seq_len=16, seed=4,
                     dtype=torch.float32)


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


def exact_joint(temperature, top_k, top_p) -> np.ndarray:
    """P(x_n, x_n+1, x_n+2 | prompt) from one uncached pass over all V^2 continuations."""
    pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    seqs = torch.cat([torch.tensor(PROMPT).expand(V * V, -1), pairs], dim=1)
    with torch.no_grad():
        logits = uncached(TARGET)(seqs, 0)[0].double().numpy()
    w = lambda x: warp_reference(x, temperature, top_k, top_p)  # noqa: E731
    p0 = w(logits[:1, -3])[0]                       # [V]
    p1 = w(logits[::V, -2])                         # [V(a), V(b)]
    p2 = w(logits[:, -1]).reshape(V, V, V)          # [a, b, c]
    return p0[:, None, None] * p1[:, :, None] * p2


def engine_joint(drafter, **sampling) -> np.ndarray:
    engine = SpeculativeEngine(TorchTarget(TARGET), drafter)
    counts = np.zeros((V, V, V))
    for seed in range(RUNS):
        a, b, c = engine.generate(PROMPT, max_new_tokens=3, seed=seed, **sampling).tokens
        counts[a, b, c] += 1
    return counts


SCENARIOS = {
    # q random and broad: many rejections and residual draws
    "random drafter, temperature 1": (
        lambda: RandomDrafter(V, TARGET.cfg.feature_size, 3, seed=1),
        dict(temperature=1.0, top_k=0, top_p=1.0)),
    # q one-hot on the target's greedy token; warped p with zeroed tail
    "oracle drafter, top-k and top-p": (
        lambda: OracleDrafter(TARGET, 3, PROMPT),
        dict(temperature=0.8, top_k=6, top_p=0.9)),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_first_generated_tokens_follow_the_target_distribution(scenario):
    make, sampling = SCENARIOS[scenario]
    counts = engine_joint(make(), **sampling)
    joint = exact_joint(**sampling)
    # x_n comes from the prefill; x_n+1 and x_n+2 from the first speculative round
    assert chi2_pvalue(counts.sum(2), joint.sum(2)) > ALPHA
    assert chi2_pvalue(counts.sum(0), joint.sum(0)) > ALPHA


def test_end_to_end_test_rejects_sampling_from_the_drafter():
    """Negative control: committing q's samples unverified is caught at the same N."""
    drafter = RandomDrafter(V, TARGET.cfg.feature_size, 3, seed=1)
    drafter.reset()
    q = torch.softmax(drafter.propose(0, 0), -1)  # the q the engine sees in round one
    joint = exact_joint(1.0, 0, 1.0)
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros((V, V))
    for _ in range(RUNS):
        b, c = sample(q, gen).tolist()
        counts[b, c] += 1
    assert chi2_pvalue(counts, joint.sum(0)) < ALPHA
