"""How each quantization recipe stores weights, as our exporters actually do it.

Read from ``hyflash/export/quantize.py`` (ONNX) and ``hyflash/export/executorch.py`` and
checked against real bundles (``tests/test_budget_memory.py``; the SmolLM2 and pocket
bundles in ``benchmarks/results/budget_measure.md``):

- ONNX ``fp32``: every weight float32. A tied LM head is a Transpose of the embedding
  table: stored once. ``int8`` / ``int4``: ONNX Runtime's MatMulNBitsQuantizer on every
  MatMul with a constant weight (all projections of both models and the LM head, whose
  Transpose is folded first so it gets its own matrix), symmetric, blocks of 32 along the
  input with one float32 scale per block (K padded to a whole block); the embedding table
  (a Gather) stays float32. ``8da4w``: the int4 weights of ``int4`` (activations are
  quantized at run time, which stores nothing); ``8da8w``: the int8 weights of ``int8``.
- ExecuTorch ``fp32``: float32; a tied table is stored twice (the embedding as a program
  constant, the LM head inside the XNNPACK blob). ``8da4w``: torchao int4 weights in groups
  of ``group_size`` on every Linear (the LM head too), a 2-byte scale per group as XNNPACK
  serializes it; the embedding stays float32.
- ONNX ``int4`` / ``8da4w`` of a target whose projections already are 4-bit blocks (a
  GGUF's Q4_0 / Q4_1, ``hyflash.export.grid_blocks``): those keep their codes with a
  float32 scale and, at ``int4``, a float32 offset per block of 32; at ``8da4w`` the
  offsets are 3 more 4-bit blocks per output row and 32 blocks of input (``offset_digits``);
  ``8da4w`` keeps a Q8_0 LM head as 8-bit blocks with a float32 scale (``source_grid``).
- ``fp16`` (and ``int8``/``int4``/``8da8w`` on ExecuTorch): no exporter writes
  them yet; sized as the nearest recipe would store them and marked ``offered=False``.

Norms, biases and the drafter's memory scalars stay float32 in every recipe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hyflash.errors import HyflashError

BACKENDS = ("onnx", "executorch")
RECIPE_NAMES = ("fp32", "fp16", "int8", "int4", "8da4w", "8da8w")
ONNX_BLOCK = 32  # hyflash.export.quantize.BLOCK
FOLD_DIGITS = 3  # hyflash.export.grid_blocks.FOLD_DIGITS (the budget never imports the exporter)
ET_GROUP = 32  # hyflash.export.executorch.DEFAULT_GROUP_SIZE
PER_ROW = -1  # group size meaning one scale per output row


@dataclass(frozen=True)
class WeightFormat:
    """bits per weight, and a scale of scale_bytes per group of ``group`` weights along
    the input dimension (0: no scales; PER_ROW: one per output row); ``offset_digits``: per
    output row that many more blocks of ``bits``-bit codes with their scales over the
    input's group sums, padded to whole groups (a GGUF's block offsets folded into an
    8da4w MatMulNBits, ``hyflash.export.grid_blocks``)."""

    bits: int
    group: int = 0
    scale_bytes: int = 0
    offset_digits: int = 0

    def bytes(self, rows: int, cols: int, count: int = 1) -> int:
        if self.group == 0:
            return count * rows * cols * self.bits // 8
        if self.group == PER_ROW:
            return count * rows * (cols * self.bits // 8 + self.scale_bytes)
        blocks = math.ceil(cols / self.group)  # the input is padded to whole groups
        if self.offset_digits:  # the group sums, padded to whole groups, once per digit
            blocks += self.offset_digits * math.ceil(blocks / self.group)
        return count * rows * blocks * (self.group * self.bits // 8 + self.scale_bytes)

    def describe(self) -> str:
        if self.group == 0:
            return f"{self.bits}-bit"
        scales = "a scale per row" if self.group == PER_ROW else f"groups of {self.group}"
        return f"int{self.bits}, {scales} ({self.scale_bytes}-byte scales)"

    @classmethod
    def from_dict(cls, d: dict) -> WeightFormat:
        return cls(int(d["bits"]), int(d.get("group", 0)), int(d.get("scale_bytes", 0)),
                   int(d.get("offset_digits", 0)))


F32, F16 = WeightFormat(32), WeightFormat(16)


@dataclass(frozen=True)
class Recipe:
    name: str
    backend: str
    linear: WeightFormat  # every projection of the target and the drafter
    lm_head: WeightFormat  # the LM head, and a drafter's draft-vocabulary head
    embedding: WeightFormat  # the token embedding table (a gather: one row read per token)
    tied_head_stored: bool  # a tied LM head is stored as its own matrix (else: the table)
    kv_bytes: int  # bytes per KV cache element
    offered: bool  # `hyflash export` writes it
    about: str

    def describe(self) -> str:
        head = "its own matrix" if self.tied_head_stored else "the embedding table itself"
        return (f"{self.backend} {self.name}: projections {self.linear.describe()}, LM head "
                f"{self.lm_head.describe()}, embedding {self.embedding.describe()}; a tied LM "
                f"head is stored as {head}; KV cache {8 * self.kv_bytes}-bit")


def onnx_nbits(bits: int) -> WeightFormat:
    return WeightFormat(bits, ONNX_BLOCK, 4)


def et_8da4w(group: int = ET_GROUP) -> WeightFormat:
    return WeightFormat(4, group, 2)


def recipe(name: str, backend: str, group_size: int | None = None) -> Recipe:
    """The recipe ``name`` as ``backend``'s exporter stores it."""
    if backend not in BACKENDS:
        raise HyflashError(f"unknown backend {backend!r}: choose {' or '.join(BACKENDS)}")
    if name not in RECIPE_NAMES:
        raise HyflashError(f"unknown quantization recipe {name!r}: choose one of "
                           f"{', '.join(RECIPE_NAMES)}")
    if backend == "onnx":
        if name in ("int8", "int4"):
            q = onnx_nbits(int(name[3:]))
            return Recipe(name, backend, q, q, F32, True, 4, True,
                          "MatMulNBits weight-only, fp32 activations, fp32 embedding")
        if name in ("8da4w", "8da8w"):
            q = onnx_nbits(int(name[3]))
            return Recipe(name, backend, q, q, F32, True, 4, True,
                          f"MatMulNBits int{name[3]} weights, int8 activations at run time "
                          "(accuracy level 4), fp32 embedding")
        fmt = F32 if name == "fp32" else F16
        return Recipe(name, backend, fmt, fmt, fmt, False, fmt.bits // 8, name == "fp32",
                      "float weights" + ("" if name == "fp32" else
                                         "; not an export recipe yet: sized as fp16 throughout"))
    if name in ("8da4w", "int4"):
        q = et_8da4w(group_size or ET_GROUP)
        return Recipe(name, backend, q, q, F32, True, 4, name == "8da4w",
                      "torchao int4 weights, int8 per-token activations, fp32 embedding"
                      + ("" if name == "8da4w" else "; int4 is ExecuTorch's 8da4w"))
    if name in ("int8", "8da8w"):
        q = WeightFormat(8, PER_ROW, 4)
        return Recipe(name, backend, q, q, F32, True, 4, False,
                      "not offered (XNNPACK has no int8-weight float linear): sized as int8 "
                      "per-channel weights" if name == "int8" else
                      "not an ExecuTorch export recipe: sized as int8 per-channel weights")
    fmt = F32 if name == "fp32" else F16
    return Recipe(name, backend, fmt, fmt, fmt, True, fmt.bits // 8, name == "fp32",
                  "float weights; the tied table is stored twice (constant + XNNPACK blob)"
                  + ("" if name == "fp32" else "; fp16 is not an export recipe yet"))


def source_grid(r: Recipe, grid: dict | None) -> Recipe:
    """r as it stores a target whose weights the exporter kept on their source's grid
    (``grid``: the kinds kept, as a GGUF's tensor types or a manifest's ``source_grid``
    give them): projections with a scale and an offset per block, an 8-bit LM head."""
    if not grid or r.backend != "onnx" or r.name not in ("int4", "8da4w"):
        return r
    folded = r.name == "8da4w"  # the offsets as 4-bit digits in the same MatMulNBits
    linear = (WeightFormat(4, ONNX_BLOCK, 4, FOLD_DIGITS) if folded
              else WeightFormat(4, ONNX_BLOCK, 8)) if grid.get("int4") else r.linear
    head = onnx_nbits(8) if grid.get("int8") and folded else r.lm_head
    if (linear, head) == (r.linear, r.lm_head):
        return r
    offsets = f"{FOLD_DIGITS} 4-bit digits of the offsets" if folded else "a float32 offset " \
                                                                        "per block"
    kept = " and ".join(x for x, on in ((f"projections' Q4 blocks (+ {offsets})",
                                         linear != r.linear),
                                        ("LM head's Q8_0 blocks", head != r.lm_head)) if on)
    return replace(r, linear=linear, lm_head=head, about=f"{r.about}; the source's {kept} "
                                                          "kept exactly")


def default_backend(name: str) -> str:
    """The backend whose exporter offers the recipe (ONNX for the float ones)."""
    return "executorch" if name == "8da4w" else "onnx"


def custom(name: str, d: dict) -> Recipe:
    """A recipe from a data file (the roofline's calibration points: published models
    quantized in ways our exporters do not)."""
    return Recipe(name, "executorch", WeightFormat.from_dict(d["linear"]),
                  WeightFormat.from_dict(d["lm_head"]), WeightFormat.from_dict(d["embedding"]),
                  bool(d.get("tied_head_stored", True)), int(d["kv_bytes"]), False,
                  d.get("about", name))
