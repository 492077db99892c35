"""What a runtime costs besides the model's own bytes, as measured on this machine.

``data/runtime.json`` is written by ``benchmarks/budget_overhead.py`` (the command and
versions are recorded in it). Per backend:

- ``library_mib``: resident memory the runtime library plus a session of a trivial graph
  adds to a bare Python process (with numpy). What an app pays on a phone, give or take
  the platform's own build of the library.
- ``desktop_process_mib``: the whole resident set of a Python process that imported
  hyflash's runtime and that backend and opened a trivial graph: what ``--measure`` starts
  from before the bundle loads.
- ``session_mib``: each further graph session (ONNX Runtime: the drafter's two graphs
  beside the target's; ExecuTorch runs one program);
- ``run_mib``: what the first decoding adds in the desktop process beyond the modelled
  terms (allocator arenas, the engine's temporaries), the median over the calibration
  bundles; desktop only;
- ``weights_factor``: resident bytes per stored byte of the weights a graph computes
  with, after loading (ONNX Runtime prepacks every MatMul weight into its own buffer and
  frees the original; ExecuTorch keeps the program's data and XNNPACK packs a copy of the
  delegated weights: about 2).
- ``load_transient_factor``: the extra peak while the largest graph loads, as a fraction
  of that graph's resident weights (buffers that exist during loading only);
- ``run_weights_factor``: per recipe, what the first calls add per stored weight byte
  beyond ``run_mib`` (ONNX Runtime's int8 MatMulNBits resolves its weights on the first
  call and dequantizes one to float32 for calls of more than one row: about 2).

The factors come from a calibration model exported by our own exporters, of a shape
unlike the pocket model's and SmolLM2's, so ``--measure`` on those checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyflash.budget.data import load, number, section
from hyflash.errors import HyflashError

MIB = 2 ** 20
FIX = "rerun `python benchmarks/budget_overhead.py`"


@dataclass(frozen=True)
class RuntimeCosts:
    backend: str
    library_bytes: int
    desktop_process_bytes: int
    session_bytes: int
    run_bytes: int
    weights_factor: dict[str, float]
    load_transient_factor: float
    embedding_mapped: bool  # a shared embedding table is memory-mapped, not loaded
    run_weights_factor: dict[str, float] = field(default_factory=dict)
    source: str = "measured on this machine"  # where the weights factors come from

    def factor(self, recipe: str) -> float:
        """Resident per stored weight byte for a recipe (the nearest measured one for a
        recipe the exporter does not offer: the float or the 4-bit one)."""
        if recipe in self.weights_factor:
            return self.weights_factor[recipe]
        nearest = {"fp16": "fp32", "int8": "int4", "int4": "8da4w", "8da4w": "int4",
                   "8da8w": "int4"}.get(recipe)
        return self.weights_factor.get(nearest, self.weights_factor["fp32"])


def runtime_costs(backend: str) -> RuntimeCosts:
    data = load("runtime")
    where = "hyflash/budget/data/runtime.json"
    backends = section(data, "backends", where, FIX)
    if backend not in backends:
        raise HyflashError(f"{where} has no measurements for backend {backend!r}: {FIX}")
    b = backends[backend]
    at = f"{where} backends.{backend}"
    factors = b.get("weights_factor")
    if not isinstance(factors, dict) or "fp32" not in factors:
        raise HyflashError(f"{at}.weights_factor must give at least fp32: {FIX}")
    return RuntimeCosts(
        backend=backend,
        library_bytes=int(number(b, "library_mib", at, FIX) * MIB),
        desktop_process_bytes=int(number(b, "desktop_process_mib", at, FIX) * MIB),
        session_bytes=int(float(b.get("session_mib", 0.0)) * MIB),
        run_bytes=int(float(b.get("run_mib", 0.0)) * MIB),
        weights_factor={k: number(factors, k, f"{at}.weights_factor", FIX) for k in factors},
        load_transient_factor=float(b.get("load_transient_factor", 0.0)),
        embedding_mapped=backend == "onnx",
        run_weights_factor={k: float(v) for k, v in b.get("run_weights_factor", {}).items()})
