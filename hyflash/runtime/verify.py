"""Verification: which drafted tokens the target keeps, and the one it adds.

Both rules take the drafted tokens ``d_1..d_r`` and the target's logits for positions
``pos+1 .. pos+r+1`` (one verify pass over ``[anchor, d_1..d_r]``) and return
``(k, bonus)``: the first k drafts are accepted and ``bonus`` is the target's token right
after them. Either way every verify call commits ``k+1`` tokens, at least one.

- Greedy: accept the longest prefix where the draft equals the target's argmax; the
  bonus is the target's argmax after it. The output is the target's greedy decode, for
  any drafter.
- Sampling (Leviathan et al. 2023; Chen et al. 2023): accept ``d_i`` with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; on the first rejection resample from
  ``norm(max(0, p_i - q_i))``; if everything is accepted, draw the bonus from
  ``p_{r+1}``. Each committed token is then distributed exactly as the target's p.
  Every row of q must be a distribution: the engine drafts only from rows that are
  (``sampling.distribution_rows``), so a drafter's NaN never reaches ``p/q``.
"""

from __future__ import annotations

import torch

from hyflash.runtime.sampling import sample


def verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """drafts [r], target_logits [r+1, V] -> (k accepted, bonus token)."""
    want = target_logits.argmax(-1)
    r = drafts.numel()
    match = (drafts == want[:r]).long()
    k = int(match.cumprod(0).sum()) if r else 0
    return k, int(want[k])


def verify_sampled(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                   generator: torch.Generator) -> tuple[int, int]:
    """drafts [r] sampled from q [r, V]; p [r+1, V] the target's probabilities."""
    for i in range(drafts.numel()):
        d = int(drafts[i])
        u = float(torch.rand((), generator=generator))
        if u * float(q[i, d]) < float(p[i, d]):  # u < p/q without dividing by q
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: the residual is p itself
            residual = p[i]
        return i, int(sample(residual[None] / residual.sum(), generator))
    k = drafts.numel()
    return k, int(sample(p[k][None], generator))
