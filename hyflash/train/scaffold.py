"""What every training run here shares: the learning-rate schedule and checkpoints.

The drafter loop (``train/loop.py``) and the pocket model's build
(``train/pocket_target.py``) both warm up linearly, decay on a cosine to a floor, and
checkpoint atomically so that an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from hyflash.errors import HyflashError


def warmup_cosine(step: int, steps: int, peak: float, warmup: int, floor: float) -> float:
    """Learning rate at `step`: linear warmup to `peak` over `warmup` steps, then a cosine
    from `peak` down to `floor * peak` at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save into a temp file, then rename: a crash leaves the old checkpoint whole."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, or None if there is none yet."""
    if not path.exists():
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception as e:  # a truncated or foreign file: unpickling fails in many ways
        raise HyflashError(f"checkpoint {path} is damaged ({type(e).__name__}): delete it to "
                           "start that run over") from None
