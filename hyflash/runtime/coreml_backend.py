"""Core ML backends for the speculative engine: the bundle's packages run by Core ML
itself through coremltools' ``MLModel.predict``, which exists on macOS only.

``CoreMLTarget`` (TargetBackend): one ``predict`` per call returns logits and features.
With ``kv_cache.form = state`` the KV cache is the model's Core ML state (an ``MLState``
from ``make_state``, handed to every predict); with ``static_io`` this backend holds the
cache as float16 arrays, passes them in and keeps the present outputs. A call's token
count must be one of the package's enumerated counts (decode 1, verify B, prefill chunk
C): ``call_plan`` cuts a call into chunks of C and pads the rest up to the next count.
Padded rows write KV rows past the end, which no query attends to before the next call
overwrites them, and their outputs are dropped; where padding would run past the context,
the rest goes in smaller counts. A rollback only moves the valid length back.

``CoreMLDrafter`` (DrafterBackend) is ExecuTorch's drafter loop (buffer verified features,
commit a surplus with the commit package, then commit + draft in one step call) with each
package's predict behind the same ``execute`` interface.

Opening a bundle checks what every reader checks (``hyflash.bundle``), then, before
loading, each package's declared I/O, states, token counts and format against the manifest
(``check_packages``, which runs on any OS). Off macOS it stops there with one line.
"""

from __future__ import annotations

import platform
import sys
from itertools import zip_longest
from pathlib import Path

import numpy as np
import torch

from hyflash.bundle import REEXPORT, Bundle, read_bundle
from hyflash.errors import HyflashError
from hyflash.runtime.backends import check_span, last_rows, rolled_back
from hyflash.runtime.executorch_backend import ExecuTorchDrafter

PACKAGE_FORMAT = "1"  # hyflash.export.coreml.FORMAT of the packages this reads
NUMPY = {"float16": np.float16, "float32": np.float32, "int32": np.int32}


def call_plan(counts: tuple[int, ...], start: int, n: int, context: int) -> list[tuple[int, int]]:
    """-> [(tokens per call, real tokens)] covering n tokens from position start with
    enumerated counts only: chunks of the largest, then the rest padded up to the next
    count unless that would write past the context."""
    plan = []
    while n:
        size = counts[-1] if n >= counts[-1] else min(c for c in counts if c >= n)
        if start + size > context:
            size = max(c for c in counts if c <= n)
        plan.append((size, min(size, n)))
        start, n = start + min(size, n), n - min(size, n)
    return plan


def check_packages(bundle: Bundle) -> None:
    """Every package declares exactly its manifest contract (names, shapes, dtypes), the
    target its states (state form) and token counts, and each is a package of the format
    this hyflash reads: a package replaced or edited after export is one line."""
    from hyflash.runtime.coreml_spec import read_package

    m = bundle.manifest
    for role, c in m.models.items():
        io = read_package(bundle.folder / c.file)

        def mismatch(what: str, file=c.file) -> HyflashError:
            return HyflashError(f"{file} does not match manifest.json: {what}; the package "
                                f"was replaced or edited after export: {REEXPORT}")

        if io.metadata.get("format") != PACKAGE_FORMAT or io.metadata.get("role") != role:
            raise mismatch(f"it is not a hyflash {role} package of format {PACKAGE_FORMAT}")
        for kind, real, recorded in (("inputs", io.inputs, c.inputs),
                                     ("outputs", io.outputs, c.outputs)):
            if real != recorded:
                i = next(i for i, (a, b) in enumerate(zip_longest(real, recorded)) if a != b)
                bad = real[i] if i < len(real) else recorded[i]
                raise mismatch(f"its {kind} differ at {bad.name!r}")
        if role == "target":
            states = [s.name for s in io.states]
            want = m.kv_names()[0] if m.kv_cache.form == "state" else []
            if states != want:
                raise mismatch(f"it holds states {states[:2]}..., the manifest {want[:2]}...")
            counts = tuple(sorted({1, m.block_size, c.commit_rows}))
            if io.token_counts != counts:
                raise mismatch(f"its token counts are {list(io.token_counts)}, not "
                               f"{list(counts)}")


def load_models(bundle: Bundle, compute_units: str):
    """role -> MLModel (compiled and loaded by Core ML: macOS only)."""
    from hyflash.runtime.coreml_spec import import_coremltools, quiet

    if sys.platform != "darwin":
        raise HyflashError(f"Core ML predicts on macOS only, and this is {platform.system()}: "
                           f"run bundle {bundle.folder} on a Mac, or export --backend onnx or "
                           "executorch to simulate here (`hyflash inspect` reads it anywhere)")
    ct = import_coremltools("running a Core ML bundle")
    units = getattr(ct.ComputeUnit, compute_units.upper())
    with quiet():
        return {role: ct.models.MLModel(str(bundle.folder / c.file), compute_units=units)
                for role, c in bundle.manifest.models.items()}


class PackageCall:
    """A package's predict with positional torch tensors in and out, in contract order
    (the interface ``ExecuTorchDrafter`` calls ``execute`` on)."""

    def __init__(self, model, contract):
        self.model, self.contract = model, contract

    def execute(self, args: list, state=None) -> list[torch.Tensor]:
        feed = {s.name: np.asarray(torch.as_tensor(a).numpy(), dtype=NUMPY[s.dtype])
                for s, a in zip(self.contract.inputs, args, strict=True)}
        out = self.model.predict(feed, state=state)
        return [torch.from_numpy(np.asarray(out[s.name])) for s in self.contract.outputs]


class CoreMLTarget:
    """The target package behind the TargetBackend protocol (batch 1)."""

    def __init__(self, model, bundle: Bundle):
        m = bundle.manifest
        cfg = m.target.config
        self.call = PackageCall(model, bundle.contract("target"))
        self.model = model
        self.form = m.kv_cache.form
        self.counts = tuple(sorted({1, m.block_size, bundle.contract("target").commit_rows}))
        self.vocab_size = cfg.vocab_size
        self.max_seq_len = cfg.max_seq_len
        self.feature_size = cfg.feature_size
        self.eos_token_ids = tuple(cfg.eos_token_ids)
        self.bytes_per_token = m.kv_bytes_per_token
        self.kv_specs = bundle.contract("target").inputs[2:]  # static_io: the past inputs
        self.reset()

    def reset(self) -> None:
        self.length = 0
        if self.form == "state":
            self.state = self.model.make_state()
        else:
            self.kv = [torch.zeros(s.shape, dtype=torch.float16) for s in self.kv_specs]

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        end = check_span(start_pos, ids.numel(), self.length, self.max_seq_len)
        logits, features, at = [], [], 0
        for size, real in call_plan(self.counts, start_pos, ids.numel(), self.max_seq_len):
            chunk = torch.zeros(1, size, dtype=torch.long)
            chunk[0, :real] = ids[at:at + real]
            args = [chunk, torch.tensor([start_pos + at])]
            if self.form == "state":
                out = self.call.execute(args, self.state)
            else:
                out = self.call.execute(args + self.kv)
                self.kv = out[2:]
            logits.append(out[0][0, :real].float())
            features.append(out[1][0, :real].float())
            at += real
        self.length = end
        return last_rows(torch.cat(logits), logits_rows), torch.cat(features)

    def rollback(self, pos: int) -> None:
        self.length = rolled_back(pos, self.length)

    def kv_bytes(self) -> int:
        """Bytes of the cache positions in use (the cache holds max_seq_len positions)."""
        return self.length * self.bytes_per_token


class CoreMLDrafter(ExecuTorchDrafter):
    """The drafter packages behind the DrafterBackend protocol: ExecuTorch's loop, each
    package's predict as its methods."""

    def __init__(self, models: dict, bundle: Bundle):  # not super(): that loads .pte methods
        m = bundle.manifest
        cfg = m.drafter.config
        self.block_size = cfg.block_size
        self.feature_size = cfg.feature_size
        self.vocab_size = cfg.vocab_size
        self.step = PackageCall(models["drafter_step"], bundle.contract("drafter_step"))
        self.commit_only = PackageCall(models["drafter_commit"], bundle.contract("drafter_commit"))
        self.step_rows = bundle.contract("drafter_step").commit_rows
        self.commit_rows = bundle.contract("drafter_commit").commit_rows
        self.specs = m.drafter.state
        self.calls = {"step": 0, "commit": 0}
        self.reset()

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        return super().draft(anchor, pos).float()


def load_coreml_pair(folder: str | Path, threads: int = 0, verify_hashes: bool = True,
                     compute_units: str = "all") -> tuple[Bundle, CoreMLTarget, CoreMLDrafter]:
    """Validate a Core ML bundle and open its packages (macOS). ``threads`` is accepted for
    the common interface: Core ML schedules its own work. ``compute_units``: all,
    cpu_only, cpu_and_gpu or cpu_and_ne."""
    bundle = read_bundle(folder, verify_hashes)
    if bundle.manifest.backend != "coreml":
        raise HyflashError(f"bundle {folder} is for {bundle.manifest.backend}, not coreml: this "
                           "runs Core ML bundles (`hyflash export --backend coreml`)")
    check_packages(bundle)
    models = load_models(bundle, compute_units)
    return bundle, CoreMLTarget(models["target"], bundle), CoreMLDrafter(models, bundle)
