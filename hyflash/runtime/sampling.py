"""Turning logits into the distribution we sample from: temperature, top-k, top-p.

Rejection sampling is lossless with respect to whatever distribution the target's
logits are warped into, *provided* the drafter's logits go through exactly the same
warp: ``Sampling.probs`` is that one function, applied to both p and q.
Temperature 0 means greedy (argmax), where top-k and top-p change nothing.

A drafter's logits are not trusted to be a distribution (an fp16 drafter can overflow):
``distribution_rows`` says how many of its rows are one, and the engine drafts from
those only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyflash.errors import HyflashError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0            # 0 = off
    top_p: float = 1.0        # 1 = off

    def __post_init__(self):
        if not self.temperature >= 0:
            raise HyflashError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise HyflashError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise HyflashError(f"top-p must be in (0, 1] (1 = off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [N, V] -> probabilities [N, V] after temperature, top-k, top-p."""
        x = logits.float() / self.temperature
        if 0 < self.top_k < x.shape[-1]:
            kth = x.topk(self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p < 1:
            # keep the smallest set of most likely tokens whose mass reaches top_p: a token
            # is dropped when the tokens ranked above it already hold top_p
            srt, idx = x.sort(dim=-1, descending=True)
            p = srt.softmax(-1)
            drop = (p.cumsum(-1) - p) >= self.top_p
            x = x.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
        return x.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs [N, V] -> LongTensor [N]."""
    return torch.multinomial(probs, 1, generator=generator).reshape(-1)


def distribution_rows(x: torch.Tensor) -> int:
    """How many rows of x [N, V] (logits, or probabilities from ``Sampling.probs``), from
    the first, define a distribution: no NaN, no +inf, and some value above -inf.

    A row that fails (NaN, +inf, or all -inf logits; NaN probabilities) proposes nothing,
    and neither can the rows after it, since they were drafted as its continuation.
    """
    inf = float("inf")
    return leading(~(x.isnan() | (x == inf)).any(-1) & (x > -inf).any(-1))


def leading(mask: torch.Tensor) -> int:
    """Length of the leading run of True in a 1-D bool tensor."""
    return int(mask.long().cumprod(0).sum())
