"""ONNX Runtime backend for the lean target graph (``hyflash.export.onnx_lean``).

The graph's KV cache is one static buffer per layer and per key/value,
``[1, kv_heads, max_seq_len, head_dim]``, that GroupQueryAttention updates in place.
This backend allocates those buffers once and binds each to BOTH the graph's
``past_key_values.N.*`` input and its ``present.N.*`` output (ONNX Runtime IO binding,
one OrtValue over numpy memory for both), so a call moves no cache at all: the kernel
writes the T new rows and reads the first ``start_pos + T`` rows.

- rollback only records the new length: the next call passes ``seqlens_k = start_pos +
  T - 1``, GroupQueryAttention never reads past it, and the new rows overwrite stale
  ones. Nothing is sliced or copied.
- a call binds its three small inputs (``input_ids``, ``seqlens_k``,
  ``total_sequence_length``) and its outputs; logits, argmax and features go straight
  into numpy buffers owned here, reused while T fits them (decode and verify), so the
  steady state allocates nothing. ``forward`` returns copies of those rows (the
  TargetBackend contract hands out tensors the caller may keep): for a verify of 8 rows
  of SmolLM2's 49152-token vocabulary, copy plus the engine's argmax cost ~0.5 ms of a
  ~40 ms call, so the graph's own ``argmax`` output is not worth a second protocol method.
"""

from __future__ import annotations

import numpy as np
import torch

from hyflash.runtime.backends import (
    check_span,
    logits_row_count,
    pad_rows,
    rolled_back,
)
from hyflash.runtime.onnx_session import make_session

REUSE_ROWS = 16  # output buffers are kept for calls of up to this many tokens


class OnnxLeanTarget:
    """The lean target graph behind the TargetBackend protocol (batch 1)."""

    def __init__(self, session, cfg, kv_names: tuple[list[str], list[str]], min_rows: int = 1):
        """session: an InferenceSession of the lean graph; cfg: the target's TargetConfig;
        kv_names: the graph's past inputs and present outputs, layer by layer; min_rows:
        the graph's fewest rows per call (``Quantization.min_rows``): a shorter call is padded
        to it, and the last ``min_rows - 1`` cache positions are kept for the pad."""
        import onnxruntime as ort

        self.session = session
        self.vocab_size = cfg.vocab_size
        self.min_rows = min_rows
        self.max_seq_len = cfg.max_seq_len - (min_rows - 1)
        self.feature_size = cfg.feature_size
        self.eos_token_ids = tuple(cfg.eos_token_ids)
        past, present = kv_names
        shape = (1, cfg.num_key_value_heads, cfg.max_seq_len, cfg.head_dim)
        self.kv = [np.zeros(shape, np.float32) for _ in past]
        self.bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads \
            * cfg.head_dim * 4
        self.io = self.session.io_binding()
        for name_in, name_out, buf in zip(past, present, self.kv, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buf)  # shares buf's memory
            self.io.bind_ortvalue_input(name_in, value)
            self.io.bind_ortvalue_output(name_out, value)
        # bundles exported before the graph took logits_rows return every row's logits
        self.takes_rows = "logits_rows" in {i.name for i in session.get_inputs()}
        self.out: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        """A new sequence: length 0. The buffers keep stale rows that are never read."""
        self.length = 0

    def _buffers(self, rows: int, logit_rows: int) -> tuple[dict[str, np.ndarray], bool]:
        """Output arrays for a call of ``rows`` tokens whose last ``logit_rows`` get logits
        -> (arrays, whether they are kept and reused by the next call). Calls of up to
        REUSE_ROWS tokens (decode, verify) reuse one set; a longer call (a prefill) gets
        its own."""
        if rows > REUSE_ROWS:
            return self._alloc(rows, logit_rows), False
        if not self.out:
            self.out = self._alloc(REUSE_ROWS, REUSE_ROWS)
        return {"logits": self.out["logits"][:, :logit_rows],
                "argmax": self.out["argmax"][:, :logit_rows],
                "features": self.out["features"][:, :rows]}, True

    def _alloc(self, rows: int, logit_rows: int) -> dict[str, np.ndarray]:
        return {"logits": np.empty((1, logit_rows, self.vocab_size), np.float32),
                "argmax": np.empty((1, logit_rows), np.int64),
                "features": np.empty((1, rows, self.feature_size), np.float32)}

    def run(self, tokens: np.ndarray, start_pos: int,
            logits_rows: int | None = None) -> tuple[dict[str, np.ndarray], bool]:
        """One graph call over tokens [T] at start_pos -> (logits [R, V] and argmax [R]
        of the last R = logits_rows tokens (None: all T), features [T, F], and whether
        they are this backend's kept buffers, which the next call overwrites)."""
        t = tokens.shape[0]
        r = logits_row_count(logits_rows, t)
        end = check_span(start_pos, t, self.length, self.max_seq_len)
        ids = pad_rows(np.ascontiguousarray(tokens, np.int64), self.min_rows)
        rows = ids.shape[0]
        pad = rows - t  # pad rows come last; the graph computes at least min_rows rows'
        k = min(rows, max(r + pad, self.min_rows)) if self.takes_rows else rows  # logits
        io = self.io
        io.bind_cpu_input("input_ids", ids.reshape(1, rows))
        io.bind_cpu_input("seqlens_k", np.array([start_pos + rows - 1], np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(start_pos + rows, np.int32))
        if self.takes_rows:
            io.bind_cpu_input("logits_rows", np.array([k], np.int64))
        bufs, kept = self._buffers(rows, k)
        for name, buf in bufs.items():  # all three: a bound output stays bound
            io.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        self.session.run_with_iobinding(io)
        self.length = end
        lo = k - pad - r  # the last r real rows of the k computed
        return {"logits": bufs["logits"][0, lo:lo + r], "argmax": bufs["argmax"][0, lo:lo + r],
                "features": bufs["features"][0, :t]}, kept

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1).numpy()
        out, kept = self.run(ids, start_pos, logits_rows)
        return own(out["logits"], kept), own(out["features"], kept)

    def rollback(self, pos: int) -> None:
        self.length = rolled_back(pos, self.length)

    def kv_bytes(self) -> int:
        """Bytes of the cache positions in use (the buffers hold max_seq_len positions)."""
        return self.length * self.bytes_per_token


def open_lean_target(bundle, threads: int = 0) -> OnnxLeanTarget:
    """The target of a bundle whose KV cache form is ``in_place``."""
    m = bundle.manifest
    return OnnxLeanTarget(make_session(bundle, "target", threads), m.target.config,
                          m.kv_names(), m.quantization.min_rows())


def own(array: np.ndarray, kept: bool) -> torch.Tensor:
    """A tensor the caller may keep: a copy of a kept buffer, else the array itself."""
    return torch.from_numpy(array.copy() if kept else array)
