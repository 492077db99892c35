"""The target's own next-token distribution at the drafter's block positions, for a KL
term in the loss (``hyflash train --kl W``).

Cross-entropy on the target's greedy tokens teaches the drafter the target's argmax only.
Sampled drafting is accepted with probability min(1, p/q), so a drafter that also knows
how the target spreads its mass keeps more of its drafts at temperature 1, and the soft
targets say which wrong guesses are nearly right.

The data holds the target's tap features, not its logits (49152 floats per token for
SmolLM2 would be 28x the features). The last tap layer sits near the top (SmolLM2: layer
28 of 30), so the rest of the target is cheap to run again: its layers after the last
tap, its final norm and the LM head rows the drafter scores (its draft vocabulary, or all)
turn the last tap's features back into the target's logits. The result is exact up to
the features' storage precision (float16 in a cached data set).

Block position k of anchor p predicts the token at p + k, so its target distribution is
the LM head at position p + k - 1, conditioned on the text up to there: in the target's
greedy continuation that text is what the target wrote after p, so the distribution is
the one a verify would compute for that draft.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyflash.errors import HyflashError
from hyflash.train.features import causal_layers


class Teacher:
    """The target's logits over the drafter's output vocabulary at block positions.
    Frozen; runs the target's layers above its last tap and the LM head rows the drafter
    scores (no copy: the target's head, or the drafter's draft-vocabulary rows of it)."""

    def __init__(self, target, drafter):
        cfg = target.cfg
        if tuple(cfg.tap_layers) != tuple(sorted(cfg.tap_layers)):
            raise HyflashError(f"tap layers {cfg.tap_layers} are not in order: the last "
                               "tap's features must be the features' last columns")
        if drafter.cfg.feature_size != cfg.feature_size:
            raise HyflashError(f"drafter features {drafter.cfg.feature_size} != the "
                               f"target's {cfg.feature_size}")
        self.target = target
        self.hidden = cfg.hidden_size
        self.first = max(cfg.tap_layers) + 1  # the first layer above the last tap
        # the target's LM head, or the drafter's frozen copy of its draft-vocabulary rows
        self.project = target.lm_head if drafter.draft_head is None else drafter.draft_head.proj

    @torch.no_grad()
    def logits(self, features: torch.Tensor, anchors: torch.Tensor, bsz: int) -> torch.Tensor:
        """features [N, T, F], anchors [N, A] -> logits [N, A, B-1, V] (V: the drafter's
        output vocabulary), row k-1 being the target's distribution of the token at
        anchor + k."""
        n, a = anchors.shape
        rows = anchors[..., None] + torch.arange(bsz - 1, device=anchors.device)  # [N,A,B-1]
        end = int(rows.max()) + 1  # later positions cannot change these (causal)
        if end > features.shape[1]:
            raise HyflashError(f"a block reaches position {end - 1}, past the {features.shape[1]}"
                               " positions of its features")
        x = features[:, :end, -self.hidden:]
        t = self.target
        x, _ = causal_layers(t, x.to(t.rope_cos.dtype), self.first, len(t.layers))
        h = x.gather(1, rows.reshape(n, -1, 1).expand(-1, -1, x.shape[-1]))
        h = t.norm(h.view(n, a, bsz - 1, -1))
        return self.project(h)


def kl_to_teacher(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, float32: p = softmax(teacher), q = softmax(logits), both over
    the drafter's output vocabulary ([..., V] -> [...])."""
    logp = F.log_softmax(teacher.float(), -1)
    logq = F.log_softmax(logits.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)
