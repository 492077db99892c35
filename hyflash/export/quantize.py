"""Quantization recipes for exported ONNX files: one handler per recipe.

Each handler turns an fp32 ONNX file into the recipe's file with ONNX Runtime's own
quantization tools (no hand-written graph surgery) and returns the description that
goes into the manifest, so a reader knows exactly which tool and settings made it.

- ``fp32``: the exporter's graph as is.
- ``int8``, ``int4``: ``MatMulNBitsQuantizer``: MatMul weights int8 / int4 in blocks of
  32 along the input dimension, one fp32 scale per block (symmetric), run by the
  MatMulNBits contrib op; activations stay fp32. MatMul weights shrink ~3.6x / ~6x.

Both recipes are weight-only on purpose. Dynamic activation quantization
(``quantize_dynamic``: DynamicQuantizeLinear + MatMulInteger) takes one activation scale
per call over all T rows, so a verify of B tokens computes each row slightly differently
from a decode of that row alone, and a near-tie can then make speculative output differ
from the quantized target's own greedy decode. Weight-only recipes compute every row the
same way whatever else is in the call: verification stays exactly lossless.

Only MatMul weights whose weight is a constant are quantized (a MatMul of two
activations, like the drafter's memory read-out, stays fp32); the token embedding
Gather and the rope tables stay fp32.

Tied embeddings: the exporter feeds the LM head's MatMul through a Transpose of the
shared embedding matrix, and leaves that Transpose unfolded because the matrix has a
second consumer (the embedding Gather). Both ONNX Runtime quantizers only see MatMuls
whose weight is an initializer, so they would skip the LM head, the largest matrix of a
small model. The quantized recipes therefore first fold constant Transposes with
onnxscript's constant folder, which gives the LM head its own (transposed) weight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from hyflash.errors import HyflashError

BLOCK = 32  # weights per quantization block (and per fp32 scale)


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


def weight_only(bits: int) -> Callable[[Path, Path], dict]:
    """The int{bits} recipe: MatMulNBits, symmetric blocks of BLOCK, fp32 activations."""

    def recipe(src: Path, dst: Path) -> dict:
        with quiet_logger():  # importing the quantizer calls logging.basicConfig(INFO)
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        with quiet_logger():
            # MatMuls of two activations are left alone by the quantizer (no constant weight)
            q = MatMulNBitsQuantizer(fold_weight_transposes(src), bits=bits, block_size=BLOCK,
                                     is_symmetric=True, op_types_to_quantize=("MatMul",))
            q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=False)
        nodes = q.model.model.graph.node
        return {"recipe": f"int{bits}", "tool": "onnxruntime.quantization.MatMulNBitsQuantizer",
                "weights": f"int{bits} symmetric, blocks of {BLOCK} (MatMulNBits)",
                "block_size": BLOCK, "activations": "float32", "op_types": ["MatMul"],
                "quantized_nodes": sum(n.op_type == "MatMulNBits" for n in nodes)}

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


RECIPES: dict[str, Callable[[Path, Path], dict]] = {"fp32": fp32, "int8": weight_only(8),
                                                     "int4": weight_only(4)}


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        from hyflash.export.executorch import RECIPES as EXECUTORCH_RECIPES

        hint = (f" ({recipe} is an ExecuTorch recipe: pass --backend executorch)"
                if recipe in EXECUTORCH_RECIPES else "")
        raise HyflashError(f"unknown ONNX quantization recipe {recipe!r}: choose one of "
                           f"{', '.join(RECIPES)}{hint}")


def quantize(recipe: str, src: Path, dst: Path) -> dict:
    """Write src quantized with ``recipe`` to dst; return the manifest's description."""
    check_recipe(recipe)
    return RECIPES[recipe](Path(src), Path(dst))
