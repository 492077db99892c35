"""Quantization recipes for exported ONNX files: one handler per recipe.

Each handler turns an fp32 ONNX file into the recipe's file with ONNX Runtime's own
quantization tools (no hand-written graph surgery) and returns the description that
goes into the manifest, so a reader knows exactly which tool and settings made it.

- ``fp32``: the exporter's graph as is.
- ``int8``, ``int4``: ``MatMulNBitsQuantizer``: MatMul weights int8 / int4 in blocks of
  32 along the input dimension, one fp32 scale per block (symmetric), run by the
  MatMulNBits contrib op; activations stay fp32. MatMul weights shrink ~3.6x / ~6x.
- ``int4``, ``8da4w`` of a GGUF target: weights that already are 4-bit blocks of 32 (its
  Q4_0 / Q4_1 layers) are kept (exactly at ``int4``; at ``8da4w`` with the blocks' offsets
  to ~1e-4, folded into the same MatMulNBits) instead of quantized a second time, and with
  int8 activations a Q8_0 weight (its LM head) at 8 bits (``hyflash.export.grid_blocks``;
  ``quantize(..., source_blocks="requantize")``, ``hyflash export --source-blocks``, turns
  it off).
- ``8da4w``, ``8da8w``: the int4 / int8 weights of ``int4`` / ``int8``, with MatMulNBits'
  ``accuracy_level`` 4: each call quantizes its activations to int8 at run time, one scale
  per block of 32 inputs of each row, and multiplies in integers (what onnxruntime-genai's
  model builder writes by default; the same idea as ExecuTorch's ``8da4w``). Much faster
  on a CPU with int8 dot products: SmolLM2-135M on this project's AVX-512 machine, 1
  thread, a decode 12.0 ms at 8da4w against 16.6 at int4 and 32.0 at fp32, a verify of 8
  tokens 30.4 against 62.4 and 52.7 (``benchmarks/results/verify_rows.md``); ``int8``
  has no fast kernel at all (a decode 304 ms).

``int8`` and ``int4`` are weight-only on purpose. Dynamic activation quantization
(``quantize_dynamic``: DynamicQuantizeLinear + MatMulInteger) takes one activation scale
per call over all T rows, so a verify of B tokens computes each row slightly differently
from a decode of that row alone, and a near-tie can then make speculative output differ
from the quantized target's own greedy decode. Weight-only recipes compute every row the
same way whatever else is in the call (but for the last bits of a one-row call on an AVX2
CPU, below, as float32 attention does): verification stays lossless.

The 8da recipes scale each row on its own, so a row's result does not depend on the other
rows of a call either, except that a call of ONE row takes another path in two kernels:
the lean target graph's GroupQueryAttention (on every CPU measured), and MatMulNBits
itself on an AVX2 CPU (an AMD EPYC without AVX-512: 3-5e-6 between a row computed alone
and the same row among 8, at every accuracy level, 0.0 between 2 rows and 8; on the
AVX-512 Xeon it computes one row like many). Their float32 results differ in the last
bits (1e-5 on the pocket model's logits, harmless at fp32 activations), and rounding
activations to int8 turns that into real differences (up to 1.1 in a SmolLM2-135M logit).
A target graph of an 8da bundle, in either form, therefore records ``min_rows: 2``
(``record_min_rows``), and its backend runs a one-token call as two rows, the second a pad
whose outputs are dropped and whose cache row the next call overwrites
(``hyflash.runtime.backends.pad_rows``): a decode then computes bit for bit the row a
verify computes, and the usable context is one position shorter than the graph's
(``tests/test_onnx_8da4w.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from hyflash.errors import HyflashError
from hyflash.export.grid_blocks import FOLD_DIGITS, keep_grid_blocks

BLOCK = 32  # weights per quantization block (and per fp32 scale)
SOURCE_GRIDS = {"int4": "a GGUF's Q4_0 / Q4_1: codes, a float32 scale and offset per block",
                "int8": "a GGUF's Q8_0: codes and a float32 scale per block"}
FOLDED = ("a GGUF's Q4_0 / Q4_1: codes and a float32 scale per block; the offsets in "
          f"{FOLD_DIGITS} 4-bit digits on the input's block sums, in the same MatMulNBits")


def fp32(src: Path, dst: Path) -> dict:
    """The graph as exported, every weight inside the file (external data, such as a
    bundle's shared weights, is read in: dst may be in another folder)."""
    import onnx

    onnx.save_model(onnx.load(str(src)), str(dst))
    return {"recipe": "fp32", "weights": "float32"}


def fold_weight_transposes(src: Path):
    """src with every Transpose of a constant folded into a new initializer -> ModelProto."""
    import onnx
    import onnx_ir as ir
    from onnxscript.optimizer import fold_constants

    model = ir.from_proto(onnx.load(str(src)))
    fold_constants(model, should_fold=lambda node: True if node.op_type == "Transpose" else None,
                   output_size_limit=1 << 40)
    return ir.to_proto(model)


def matmul_nbits(bits: int, accuracy_level: int = 0, keep_source_grid: bool = True,
                 fold: bool | None = None) -> Callable[[Path, Path], dict]:
    """An int{bits} recipe: MatMulNBits, symmetric blocks of BLOCK; activations fp32
    (accuracy level 0) or quantized to int8 per block and row at run time (level 4).
    4-bit weights that already are blocks of BLOCK (a GGUF's) are kept
    (``hyflash.export.grid_blocks``; ``fold``: their offsets inside the MatMulNBits, by
    default with int8 activations) unless ``keep_source_grid`` is off."""
    name = f"int{bits}" if accuracy_level == 0 else f"8da{bits}w"

    def recipe(src: Path, dst: Path) -> dict:
        with quiet_logger():  # importing the quantizer calls logging.basicConfig(INFO)
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        model = fold_weight_transposes(src)
        kept, helpers = (keep_grid_blocks(model, accuracy_level, fold)
                         if bits == 4 and keep_source_grid else ({}, []))
        with quiet_logger():
            # MatMuls of two activations are left alone by the quantizer (no constant weight)
            q = MatMulNBitsQuantizer(model, bits=bits, block_size=BLOCK, is_symmetric=True,
                                     accuracy_level=accuracy_level, nodes_to_exclude=helpers,
                                     op_types_to_quantize=("MatMul",))
            q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=False)
        nodes = q.model.model.graph.node
        described = {"recipe": name, "tool": "onnxruntime.quantization.MatMulNBitsQuantizer",
                     "weights": f"int{bits} symmetric, blocks of {BLOCK} (MatMulNBits)",
                     "block_size": BLOCK, "op_types": ["MatMul"],
                     "quantized_nodes": sum(n.op_type == "MatMulNBits" for n in nodes)}
        if not keep_source_grid:
            described["source_blocks"] = "requantized"
        if kept:  # weights that already were blocks of BLOCK on a 4- or 8-bit grid (a GGUF's)
            described["source_grid"] = kept
            folded = bool(accuracy_level) if fold is None else fold
            grids = {**SOURCE_GRIDS, **({"int4": FOLDED} if folded else {})}
            described["weights"] += "; " + " and ".join(
                f"{n} MatMuls on the source's {kind} grid ({grids[kind]}) kept"
                for kind, n in kept.items()) + " (hyflash.export.grid_blocks)"
        if accuracy_level == 0:
            return {**described, "activations": "float32"}
        return {**described, "activations": f"int8 per block of {BLOCK} per row, at run time "
                                            f"(accuracy_level {accuracy_level})",
                "accuracy_level": accuracy_level}

    return recipe


@contextmanager
def quiet_logger(name: str | None = None):
    """Raise a logger to ERROR for a block. ONNX Runtime's quantizers log advice on the
    root logger (one sets it to INFO when imported); torch.onnx logs notices that are not
    the user's."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


NBITS = {"int8": (8, 0), "int4": (4, 0), "8da4w": (4, 4), "8da8w": (8, 4)}  # bits, level
RECIPES: dict[str, Callable[[Path, Path], dict]] = {
    "fp32": fp32, **{name: matmul_nbits(*bits_level) for name, bits_level in NBITS.items()}}


def record_min_rows(graphs: dict[str, dict]) -> dict[str, dict]:
    """graphs (role -> description) with ``min_rows: 2`` on a target graph whose
    activations are quantized (see above), in either form; the others as they are."""
    target = graphs.get("target", {})
    if not target.get("accuracy_level"):
        return graphs
    return {**graphs, "target": {**target, "min_rows": 2}}


SOURCE_BLOCKS = ("keep", "requantize")  # what the 4-bit recipes do with a GGUF's own blocks


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise HyflashError(f"unknown ONNX quantization recipe {recipe!r}: choose one of "
                           f"{', '.join(RECIPES)}")


def check_source_blocks(recipe: str, source_blocks: str) -> None:
    if source_blocks not in SOURCE_BLOCKS:
        raise HyflashError(f"unknown source-blocks mode {source_blocks!r}: choose "
                           f"{' or '.join(SOURCE_BLOCKS)}")
    if source_blocks != "keep" and recipe not in ("int4", "8da4w"):
        raise HyflashError(f"--source-blocks {source_blocks} applies to the 4-bit ONNX recipes "
                           f"(int4, 8da4w), not {recipe}: drop it")


def quantize(recipe: str, src: Path, dst: Path, source_blocks: str = "keep") -> dict:
    """Write src quantized with ``recipe`` to dst; return the manifest's description.
    ``source_blocks``: ``keep`` (weights already on a 4-bit block grid, a GGUF's, are
    stored exactly: ``hyflash.export.grid_blocks``) or ``requantize`` (they are quantized
    again like any weight: smaller and faster, another model)."""
    check_recipe(recipe)
    check_source_blocks(recipe, source_blocks)
    if source_blocks == "requantize":
        return matmul_nbits(*NBITS[recipe], keep_source_grid=False)(Path(src), Path(dst))
    return RECIPES[recipe](Path(src), Path(dst))
