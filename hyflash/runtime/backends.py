"""The backend interface: the least a runtime must offer to run the speculative loop.

Two protocols, kept deliberately small so that ONNX Runtime, ExecuTorch and Core ML
backends can implement them on top of graphs with static shapes:

- a *target* runs tokens at a position and returns logits plus the tap-layer features;
  prefill and verify are the same call. Its KV cache is addressed by position, so
  rolling back a rejected draft is only "remember a shorter length".
- a *drafter* absorbs the features of verified tokens (``commit``) and proposes one block
  from the last committed token (``draft``). It never sees unverified context, so it
  never has to roll its state back.

``TorchTarget`` is the reference implementation on top of
``hyflash.models.target.Target``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from hyflash.errors import HyflashError


@runtime_checkable
class TargetBackend(Protocol):
    """The target LLM with its own KV cache (batch 1).

    ``forward(tokens [T], start_pos, logits_rows=None)`` writes the cache at ``start_pos ..
    start_pos+T-1`` and returns ``(logits float32 [R, V], features [T, F])``: features row
    ``i`` are the features of the token at ``start_pos+i``, and the logits are those of the
    last R = ``logits_rows`` tokens (None: all T), row ``j`` the distribution over the
    token after the call's token ``T-R+j``. A prefill asks for one row (a backend whose
    graph can skip the LM head over the others does). ``rollback(pos)`` makes ``pos`` the
    cache length again; entries beyond it are dead and get overwritten by the next forward.
    """

    vocab_size: int
    max_seq_len: int
    feature_size: int

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def rollback(self, pos: int) -> None:
        ...


@runtime_checkable
class DrafterBackend(Protocol):
    """A parallel block drafter conditioned on verified target features.

    ``reset()`` forgets everything (a new sequence). ``commit(features [N, F])`` absorbs
    the features of the next N verified tokens, in order; N may be anything (the prompt
    at prefill, ``k+1`` rows after a verify). ``draft(anchor, pos)`` reads the block
    ``[anchor, MASK * (B-1)]`` with the anchor at position ``pos`` (its features are not
    committed yet: the target has not run it) and returns float32 logits ``[B-1, V]``
    for positions ``pos+1 .. pos+B-1``.
    """

    block_size: int
    feature_size: int
    vocab_size: int

    def reset(self) -> None:
        ...

    def commit(self, features: torch.Tensor) -> None:
        ...

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        ...


def check_span(start_pos: int, count: int, length: int, max_seq_len: int) -> int:
    """A target call writes count positions at start_pos: it must continue the cache
    (no gap after its ``length`` valid positions) and fit the context. -> end position."""
    end = start_pos + count
    if not 0 <= start_pos <= length:
        raise ValueError(f"forward at position {start_pos} would leave a gap in the KV "
                         f"cache, which holds {length} positions")
    if end > max_seq_len:
        raise HyflashError(f"positions {start_pos}..{end - 1} do not fit the target's "
                           f"context of {max_seq_len} tokens")
    return end


def logits_row_count(logits_rows: int | None, tokens: int) -> int:
    """How many rows' logits a call of ``tokens`` tokens returns (None: all)."""
    r = tokens if logits_rows is None else logits_rows
    if not 1 <= r <= tokens:
        raise ValueError(f"logits_rows {r} is not within 1..{tokens}, the call's tokens")
    return r


def last_rows(logits, logits_rows: int | None):
    """The logits of a call's last ``logits_rows`` tokens (None: all), for a backend that
    computes every row's."""
    return logits[-logits_row_count(logits_rows, logits.shape[0]):]


def pad_rows(tokens, rows: int):
    """tokens [T] (numpy int64) with pad ids (0) appended up to ``rows``. The caller
    drops the pad rows' outputs; their cache rows lie past the valid length, so the next
    call overwrites them (the lean graph's buffers) or slices them off (optimum's
    presents)."""
    import numpy as np

    if tokens.shape[0] >= rows:
        return tokens
    return np.concatenate([tokens, np.zeros(rows - tokens.shape[0], np.int64)])


def rolled_back(pos: int, length: int) -> int:
    """The cache length after a rollback to pos, which must keep 0..length positions."""
    if not 0 <= pos <= length:
        raise ValueError(f"cannot roll back to {pos}: the cache holds {length} positions")
    return pos


class TorchTarget:
    """``hyflash.models.target.Target`` behind the TargetBackend protocol (plain torch).

    The static KV cache is allocated once (batch 1, ``max_seq_len`` positions). Since
    ``Target`` masks keys by position, rollback only records the new length: the next
    forward at that start position overwrites the stale entries before reading them.
    Features come back as float32 too, so a drafter never depends on the target's dtype.
    """

    def __init__(self, target):
        cfg = target.cfg
        self.model = target.eval()
        self.vocab_size = cfg.vocab_size
        self.max_seq_len = cfg.max_seq_len
        self.feature_size = cfg.feature_size
        self.eos_token_ids = tuple(cfg.eos_token_ids)
        if target.cache_batch != 1:
            target.setup_cache(1)
        self.length = 0  # positions of the cache that hold valid keys/values

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        end = check_span(start_pos, tokens.numel(), self.length, self.max_seq_len)
        with torch.inference_mode():
            if start_pos == 0:  # a prefill attends to the prompt, not the whole cache
                logits, features = self.model.prefill(tokens[None])
            else:
                logits, features = self.model(tokens[None], start_pos)
        self.length = end
        return last_rows(logits[0], logits_rows).float(), features[0].float()

    def rollback(self, pos: int) -> None:
        self.length = rolled_back(pos, self.length)
