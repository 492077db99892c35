"""ONNX Runtime backends for the speculative engine: the bundle's graphs, run the way a
phone runtime runs them.

``OnnxTarget`` (TargetBackend) runs ``model.onnx``, whose KV cache is explicit I/O in
optimum's layout: ``past_key_values.N.key/value [1, kv_heads, P, head_dim]`` in,
``present.N.key/value [1, kv_heads, P+T, head_dim]`` out. The backend keeps the presents
as numpy arrays and feeds them back as the next call's past:

- IO binding, with every output bound to a numpy buffer allocated here at its known
  shape: ONNX Runtime writes logits, features and presents straight into memory this
  backend owns, and binding a contiguous numpy input does not copy it either;
- rollback only records the new length. The next forward slices the presents to it;
  the slice is the whole array (no copy) unless a verify rejected drafts, and then only
  the kept positions are copied (a [1, kv_heads, P, head_dim] slice along P is not
  contiguous, and ONNX Runtime takes contiguous inputs only).

The graph itself concatenates past and new keys into the present, so every call moves
the cache once; that is the price of optimum's explicit-KV format (a static-cache graph
with in-place updates would avoid it, see ExecuTorch).

``OnnxDrafter`` (DrafterBackend) runs ``drafter.onnx`` (commit + draft in one call) and
``drafter_commit.onnx`` (commit only). ``commit`` just buffers the verified features;
``draft`` hands the buffered rows to the step graph together with the anchor, so the
usual round costs one drafter call. When more rows are pending than the step graph
takes (after the prefill), commit-only calls absorb them first. The state tensors come
out of each call and go into the next one unchanged.

Both read the bundle only through ``hyflash.bundle``'s records: every I/O name (the KV
cache's, the state's) comes from the manifest, and each session's real inputs and
outputs are checked against the recorded contract when it opens (``onnx_session``), so a
graph that does not match its manifest stops with one line instead of failing inside ONNX
Runtime. Sessions never spin: the target's and the drafter's run one after the other, and idle
threads spinning in one session's pool would take the cores from the other's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hyflash.bundle import Bundle, read_bundle
from hyflash.errors import HyflashError
from hyflash.runtime.backends import (
    TargetBackend,
    check_span,
    last_rows,
    pad_rows,
    rolled_back,
)
from hyflash.runtime.onnx_session import make_session

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64,
             "int32": np.int32, "bool": np.bool_}
class OnnxTarget:
    """The bundle's target graph behind the TargetBackend protocol (batch 1)."""

    def __init__(self, bundle: Bundle, threads: int = 0):
        m = bundle.manifest
        cfg = m.target.config
        self.session = make_session(bundle, "target", threads)
        self.vocab_size = cfg.vocab_size
        self.min_rows = m.quantization.min_rows()  # 2 with int8 activations: a pad row
        self.max_seq_len = cfg.max_seq_len - (self.min_rows - 1)
        self.feature_size = cfg.feature_size
        self.eos_token_ids = tuple(cfg.eos_token_ids)
        self.kv_shape = (1, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_dtype = NP_DTYPES[m.kv_cache.dtype]
        self.past_names, self.present_names = m.kv_names()
        self.io = self.session.io_binding()
        self.reset()

    def reset(self) -> None:
        b, h, d = self.kv_shape
        self.kv = [np.zeros((b, h, 0, d), self.kv_dtype) for _ in self.past_names]
        self.length = 0  # positions of the cache that hold valid keys/values

    def run(self, tokens: np.ndarray, start_pos: int) -> dict[str, np.ndarray]:
        """One graph call over tokens [T] at start_pos; returns the output arrays, whose
        rows past T are a pad's (a call shorter than ``min_rows`` is padded to it; the
        pad's cache rows lie past ``length`` and are sliced off by the next call)."""
        t = tokens.shape[0]
        end = check_span(start_pos, t, self.length, self.max_seq_len)
        ids = pad_rows(np.ascontiguousarray(tokens, np.int64), self.min_rows)
        rows = ids.shape[0]
        io = self.io
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        io.bind_cpu_input("input_ids", ids.reshape(1, rows))
        io.bind_cpu_input("attention_mask", np.ones((1, start_pos + rows), np.int64))
        io.bind_cpu_input("position_ids",
                          np.arange(start_pos, start_pos + rows, dtype=np.int64)[None])
        for name, cache in zip(self.past_names, self.kv, strict=True):
            past = cache if cache.shape[2] == start_pos else cache[:, :, :start_pos]
            io.bind_cpu_input(name, np.ascontiguousarray(past))
        b, h, d = self.kv_shape
        out = {"logits": np.empty((1, rows, self.vocab_size), np.float32),
               "features": np.empty((1, rows, self.feature_size), np.float32),
               "argmax": np.empty((1, rows), np.int64)}
        out.update({n: np.empty((b, h, start_pos + rows, d), self.kv_dtype)
                    for n in self.present_names})
        for name, buf in out.items():
            io.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        self.session.run_with_iobinding(io)
        self.kv = [out[n] for n in self.present_names]
        self.length = end
        return out

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1).numpy()
        out, t = self.run(ids, start_pos), ids.shape[0]
        return (torch.from_numpy(last_rows(out["logits"][0, :t], logits_rows)),
                torch.from_numpy(out["features"][0, :t]))

    def rollback(self, pos: int) -> None:
        self.length = rolled_back(pos, self.length)

    def kv_bytes(self) -> int:
        return sum(c[:, :, :self.length].nbytes for c in self.kv)


class OnnxDrafter:
    """The bundle's drafter graphs behind the DrafterBackend protocol."""

    def __init__(self, bundle: Bundle, threads: int = 0):
        m = bundle.manifest
        cfg = m.drafter.config
        self.block_size = cfg.block_size
        self.feature_size = cfg.feature_size
        self.vocab_size = cfg.vocab_size
        self.step = make_session(bundle, "drafter_step", threads)
        self.commit_only = make_session(bundle, "drafter_commit", threads)
        self.step_rows = bundle.contract("drafter_step").commit_rows
        self.commit_rows = bundle.contract("drafter_commit").commit_rows
        self.specs = m.drafter.state
        self.step_outputs = ["logits"] + [s.output for s in self.specs]
        self.commit_outputs = [s.output for s in self.specs]
        self.calls = {"step": 0, "commit": 0}
        self.reset()

    def reset(self) -> None:
        self.state = {s.input: np.zeros(s.shape, NP_DTYPES[s.dtype]) for s in self.specs}
        self.pending: list[np.ndarray] = []
        self.n_pending = 0
        self.count = 0  # features absorbed into the state

    def commit(self, features: torch.Tensor) -> None:
        rows = torch.as_tensor(features).detach().float().numpy()
        if rows.ndim != 2 or rows.shape[1] != self.feature_size:
            raise HyflashError(f"commit of features {tuple(rows.shape)}: expected [N, "
                               f"{self.feature_size}]")
        self.pending.append(rows)
        self.n_pending += rows.shape[0]

    def take(self, n: int, width: int) -> tuple[np.ndarray, int]:
        """The next up to n pending rows, zero-padded to width rows, and how many are real."""
        rows = np.concatenate(self.pending) if len(self.pending) > 1 else (
            self.pending[0] if self.pending else np.zeros((0, self.feature_size), np.float32))
        k = min(n, width, rows.shape[0])
        rest = rows[k:]
        self.pending = [rest] if rest.shape[0] else []
        self.n_pending = rest.shape[0]
        chunk = np.zeros((width, self.feature_size), np.float32)
        chunk[:k] = rows[:k]
        self.count += k
        return chunk, k

    def _absorb(self, outputs: list[np.ndarray]) -> None:
        self.state = {s.input: v for s, v in zip(self.specs, outputs, strict=True)}

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        if pos != self.count + self.n_pending:
            raise HyflashError(f"draft at position {pos} but the drafter holds "
                               f"{self.count + self.n_pending} context features: the engine "
                               "and drafter are out of step")
        while self.n_pending > self.step_rows:
            chunk, k = self.take(self.n_pending - self.step_rows, self.commit_rows)
            out = self.commit_only.run(self.commit_outputs, {
                "features": chunk, "n_valid": np.array([k], np.int64), **self.state})
            self.calls["commit"] += 1
            self._absorb(out)
        chunk, k = self.take(self.step_rows, self.step_rows)
        out = self.step.run(self.step_outputs, {
            "anchor": np.array([anchor], np.int64), "features": chunk,
            "n_valid": np.array([k], np.int64), **self.state})
        self.calls["step"] += 1
        self._absorb(out[1:])
        return torch.from_numpy(out[0])

    def state_bytes(self) -> int:
        """Draft-side memory: the fixed state plus the commit buffer (up to ``step_rows``
        fp32 feature rows waiting for the next call)."""
        return sum(v.nbytes for v in self.state.values()) + self.step_rows * self.feature_size * 4


def load_onnx_pair(folder: str | Path, threads: int = 0,
                   verify_hashes: bool = True) -> tuple[Bundle, TargetBackend, OnnxDrafter]:
    """Validate a bundle and open its target (the backend for the form of its target
    graph: ``OnnxTarget``, or ``OnnxLeanTarget`` for the lean graph) and drafter."""
    bundle = read_bundle(folder, verify_hashes)
    if bundle.manifest.backend != "onnx":
        raise HyflashError(f"bundle {folder} is for {bundle.manifest.backend}, not onnx: "
                           "this runs ONNX bundles (`hyflash export --backend onnx`)")
    if bundle.manifest.kv_cache.form == "in_place":
        from hyflash.runtime.onnx_lean import open_lean_target

        target = open_lean_target(bundle, threads)
    else:
        target = OnnxTarget(bundle, threads)
    return bundle, target, OnnxDrafter(bundle, threads)
