"""ExecuTorch backends for the speculative engine: the bundle's one program, run through
``executorch.runtime`` (the Python face of the runtime a phone app links).

``ExecuTorchTarget`` (TargetBackend) calls the program's ``forward`` (the stock runner's
method: logits) and then ``features`` (the tap features ``forward`` left in the program's
feature ring), so the target graph exists once in the program. A call of more tokens
than the ring holds (a long prompt) goes in chunks of the ring's rows. The KV cache is
mutable buffers inside the program, written at ``input_pos``; so this backend only tracks
the valid length, and a rollback is free: the next call at an earlier position
overwrites stale rows before any query attends to them.

``ExecuTorchDrafter`` (DrafterBackend) calls ``draft`` (commit + draft in one call) and
``commit`` (commit only, for the prompt after a prefill). Every window and memory tensor
is an explicit input and output, owned here as torch tensors: ``commit`` buffers verified
features, ``draft`` hands them to the step method with the anchor, so a round is one call.

Opening checks what the bundle's readers check (``hyflash.bundle``) plus the program
itself: its ``get_hyflash_format`` (a program from another hyflash is refused) and every
method's real input / output count, dtypes, ranks and fixed dims against the manifest.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hyflash.bundle import REEXPORT, Bundle, read_bundle
from hyflash.bundle.records import ModelContract
from hyflash.errors import HyflashError
from hyflash.runtime.backends import check_span, last_rows, rolled_back

PROGRAM_FORMAT = 2  # hyflash.export.executorch.FORMAT of the programs this reads
SCALAR_TYPES = {4: "int64", 6: "float32", 3: "int32", 11: "bool", 5: "float16", 15: "bfloat16"}


def load_program(bundle: Bundle, threads: int = 0):
    """The bundle's ExecuTorch program, its format checked; threads > 0 sizes the
    XNNPACK thread pool (process-wide in ExecuTorch's Python runtime)."""
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        from executorch.runtime import Runtime
    except ImportError as e:
        raise HyflashError("running an ExecuTorch bundle needs the executorch extra: "
                           "pip install 'hyflash[executorch]'") from e
    if threads > 0:
        _unsafe_reset_threadpool(threads)
    path = bundle.folder / bundle.contract("target").file
    try:
        program = Runtime.get().load_program(path)
    except RuntimeError as e:
        raise HyflashError(f"ExecuTorch cannot load {path} ({e}): the file is damaged; "
                           f"{REEXPORT}") from e
    if "get_hyflash_format" not in program.method_names:
        raise HyflashError(f"{path} is not a hyflash ExecuTorch program (no "
                           f"get_hyflash_format method): {REEXPORT}")
    version = program.load_method("get_hyflash_format").execute([])[0]
    if version != PROGRAM_FORMAT:
        raise HyflashError(f"{path} has program format {version}, this hyflash reads "
                           f"{PROGRAM_FORMAT}: {REEXPORT} with this hyflash")
    return program


def load_method(program, bundle: Bundle, role: str):
    """A method of the program, its real I/O checked against the role's contract."""
    contract = bundle.contract(role)
    if contract.method not in program.method_names:
        raise mismatch(contract, f"it has no method {contract.method!r}")
    meta = program.metadata(contract.method)
    check_io(contract, "input", [meta.input_tensor_meta(i) for i in range(meta.num_inputs())],
             contract.inputs)
    check_io(contract, "output",
             [meta.output_tensor_meta(i) for i in range(meta.num_outputs())], contract.outputs)
    return program.load_method(contract.method)


def mismatch(contract: ModelContract, what: str) -> HyflashError:
    return HyflashError(f"{contract.file} does not match manifest.json: {what}; the program "
                        f"was replaced or edited after export: {REEXPORT}")


def check_io(contract: ModelContract, kind: str, real: list, recorded) -> None:
    """ExecuTorch I/O is positional: count, then per position dtype, rank, fixed dims
    (a dynamic dim's real size is its upper bound)."""
    if len(real) != len(recorded):
        raise mismatch(contract, f"method {contract.method} has {len(real)} {kind}s, the "
                                 f"manifest records {len(recorded)}")
    for info, spec in zip(real, recorded, strict=True):
        dtype = SCALAR_TYPES.get(info.dtype(), str(info.dtype()))
        sizes = tuple(info.sizes())
        fixed = all(a == b for a, b in zip(sizes, spec.shape, strict=False) if isinstance(b, int))
        if dtype != spec.dtype or len(sizes) != len(spec.shape) or not fixed:
            raise mismatch(contract, f"{kind} {spec.name!r} of {contract.method} is "
                                     f"{list(sizes)} {dtype}, the manifest records "
                                     f"{list(spec.shape)} {spec.dtype}")


class ExecuTorchTarget:
    """The program's ``forward`` and ``features`` methods behind the TargetBackend
    protocol (batch 1)."""

    def __init__(self, program, bundle: Bundle):
        cfg = bundle.manifest.target.config
        self.logits = load_method(program, bundle, "forward")
        self.features = load_method(program, bundle, "target")
        self.rows = bundle.contract("target").commit_rows
        if not self.rows:
            raise mismatch(bundle.contract("target"), "the target records no feature rows")
        self.vocab_size = cfg.vocab_size
        self.max_seq_len = cfg.max_seq_len
        self.feature_size = cfg.feature_size
        self.eos_token_ids = tuple(cfg.eos_token_ids)
        self.bytes_per_token = bundle.manifest.kv_bytes_per_token
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def forward(self, tokens: torch.Tensor, start_pos: int,
                logits_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1)
        end = check_span(start_pos, ids.shape[1], self.length, self.max_seq_len)
        logits, features = [], []
        for at in range(0, ids.shape[1], self.rows):  # the ring holds `rows` positions
            args = [ids[:, at:at + self.rows], torch.tensor([start_pos + at])]
            logits.append(self.logits.execute(args)[0][0])
            features.append(self.features.execute(args)[0][0])
        self.length = end
        if len(logits) == 1:
            return last_rows(logits[0], logits_rows), features[0]
        return last_rows(torch.cat(logits), logits_rows), torch.cat(features)

    def rollback(self, pos: int) -> None:
        self.length = rolled_back(pos, self.length)

    def kv_bytes(self) -> int:
        """Bytes of the cache positions in use (the buffers hold max_seq_len positions)."""
        return self.length * self.bytes_per_token


class ExecuTorchDrafter:
    """The program's ``draft`` and ``commit`` methods behind the DrafterBackend protocol."""

    def __init__(self, program, bundle: Bundle):
        m = bundle.manifest
        cfg = m.drafter.config
        self.block_size = cfg.block_size
        self.feature_size = cfg.feature_size
        self.vocab_size = cfg.vocab_size
        self.step = load_method(program, bundle, "drafter_step")
        self.commit_only = load_method(program, bundle, "drafter_commit")
        self.step_rows = bundle.contract("drafter_step").commit_rows
        self.commit_rows = bundle.contract("drafter_commit").commit_rows
        self.specs = m.drafter.state
        self.calls = {"step": 0, "commit": 0}
        self.reset()

    def reset(self) -> None:
        self.state = [torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.specs]
        self.pending = torch.zeros(0, self.feature_size)
        self.count = 0  # features absorbed into the state

    def commit(self, features: torch.Tensor) -> None:
        rows = torch.as_tensor(features).detach().float()
        if rows.ndim != 2 or rows.shape[1] != self.feature_size:
            raise HyflashError(f"commit of features {tuple(rows.shape)}: expected [N, "
                               f"{self.feature_size}]")
        self.pending = torch.cat([self.pending, rows])

    def take(self, n: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next up to n pending rows zero-padded to width rows, and how many are real."""
        k = min(n, width, self.pending.shape[0])
        chunk = torch.zeros(width, self.feature_size)
        chunk[:k] = self.pending[:k]
        self.pending = self.pending[k:]
        self.count += k
        return chunk, torch.tensor([k])

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        held = self.count + self.pending.shape[0]
        if pos != held:
            raise HyflashError(f"draft at position {pos} but the drafter holds {held} context "
                               "features: the engine and drafter are out of step")
        while self.pending.shape[0] > self.step_rows:
            chunk, k = self.take(self.pending.shape[0] - self.step_rows, self.commit_rows)
            self.state = list(self.commit_only.execute([chunk, k, *self.state]))
            self.calls["commit"] += 1
        chunk, k = self.take(self.step_rows, self.step_rows)
        logits, *self.state = self.step.execute([torch.tensor([anchor]), chunk, k, *self.state])
        self.calls["step"] += 1
        return logits

    def state_bytes(self) -> int:
        """Draft-side memory: the fixed state plus the commit buffer (up to ``step_rows``
        fp32 feature rows waiting for the next call)."""
        return sum(s.nbytes for s in self.state) + self.step_rows * self.feature_size * 4


def load_executorch_pair(folder: str | Path, threads: int = 0, verify_hashes: bool = True
                         ) -> tuple[Bundle, ExecuTorchTarget, ExecuTorchDrafter]:
    """Validate an ExecuTorch bundle and open its target and drafter methods."""
    bundle = read_bundle(folder, verify_hashes)
    if bundle.manifest.backend != "executorch":
        raise HyflashError(f"bundle {folder} is for {bundle.manifest.backend}, not executorch: "
                           "this runs ExecuTorch bundles (`hyflash export --backend "
                           "executorch`)")
    program = load_program(bundle, threads)
    return bundle, ExecuTorchTarget(program, bundle), ExecuTorchDrafter(program, bundle)
