"""Keep weights that are already 4-bit blocks (a GGUF's Q4_0 / Q4_1 tensors) exactly.

A target loaded from a GGUF (``--target FILE.gguf``) computes with the file's dequantized
weights: for SmolLM2-135M-Instruct.Q4_1.gguf every linear layer is blocks of 32 along the
input dimension, ``w = d * q + m`` with ``q`` in 0..15 and a float ``d`` and ``m`` per
block. Quantizing those values a second time onto the int4 recipe's symmetric grid moves
each layer's output by ~9% (``benchmarks/results/gguf_requant.md``): the int4 bundle is
then another model than the fp32 one, and a drafter distilled from the fp32 target drafts
worse for it. MatMulNBits can hold such a block only with a fractional zero point (``-m /
d``), and its kernels then dequantize the whole matrix on every call (~25x an int4 call,
``benchmarks/results/gguf_requant.md``); so a block is stored as its codes with the
default zero point 8, ``(q - 8) * d``, and the offset ``m + 8 d`` of every block is added
back through the sums of the input over each block: ``x W = MatMulNBits(x) + (x P) E``,
with ``P`` the [K, K/32] block indicator and ``E`` the [K/32, N] offsets.

- float32 activations (``int4``): both terms are float32 MatMuls and exact; the second
  costs a MatMul and an Add per layer (the sums ``x P`` are shared by the layers that read
  the same input) and reads E, 1 bit per weight in float32.
- int8 activations (``8da4w``, accuracy level 4): the kernel rounds every block of 32
  inputs to int8 anyway, so the offsets term is folded into the same MatMulNBits as extra
  blocks along K: the input becomes ``[x, s, s, s]`` (``s = x P``, padded to whole blocks)
  and E is written as three 4-bit digits, each block of 32 offsets with its own scale and
  the next digit coding what the previous left (``FOLD_DIGITS``; a block's offsets to ~1e-4
  of its largest). One Concat per input replaces a MatMul and an Add per layer: on
  SmolLM2-135M at 2 threads a padded decode 10.2 -> 8.2 ms, a verify of 8 16.5 -> 15.4,
  and the verify's argmax leaves the fp32 graph's in 4 of 48 random-token rows against 7
  (``benchmarks/results/verify_rows_2threads``). With float32 activations the exact form
  stays: there the longer K costs more than the nodes it saves.

``hyflash export --source-blocks requantize`` turns all this off.

With int8 activations (accuracy level 4) a weight on an 8-bit block grid (a GGUF's Q8_0,
``w = d * q``, q in -127..127: SmolLM2's tied embedding and LM head) is kept too, as
8-bit MatMulNBits codes ``q + 128`` with scale ``d``; without them ONNX Runtime has no fast
8-bit kernel (a call ~20x an int4 one), so the recipe's quantizer takes it.

``keep_grid_blocks`` finds such weights by their values alone (every block of 32 along K
takes at most 16 values, evenly spaced), so it works whatever graph form or fusion the
exporter produced, and rewrites their MatMul nodes; a weight with one block off the grid
(trained float weights, a 5- or 6-bit tensor; K-quants are not tested) is left for the
recipe's quantizer.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
LEVELS = 16  # 4-bit codes
FOLD_DIGITS = 3  # 4-bit digits of the offsets folded into an int8-activation MatMulNBits


def blocks_of(w: np.ndarray) -> np.ndarray | None:
    """w [K, N] (a MatMul's B) as its blocks along K, [N, K/32, 32]; None if K is not whole
    blocks or w is not float32."""
    k, n = w.shape
    if k % BLOCK or w.dtype != np.float32:
        return None
    return np.ascontiguousarray(w.T).reshape(n, k // BLOCK, BLOCK)


def grid_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """w [K, N] -> (codes [N, K/32, 32] uint8, step [N, K/32], low [N, K/32]) with ``w =
    low + step * codes`` to float32 precision, or None when some block of 32 along K is not
    on an evenly spaced grid of at most 16 values."""
    blocks = blocks_of(w)
    if blocks is None:
        return None
    low, high = blocks.min(-1), blocks.max(-1)
    span = high - low
    tol = 1e-5 * np.maximum(np.abs(blocks).max(-1), 1e-30)  # float32 noise of d * q + m
    gaps = np.diff(np.sort(blocks, axis=-1), axis=-1)
    gaps = np.where(gaps > tol[..., None], gaps, np.inf).min(-1)  # the grid's step
    flat = ~np.isfinite(gaps)  # a block of one value
    step = np.where(flat, 0.0, gaps).astype(np.float32)
    if np.any(span > (LEVELS - 1) * step * (1 + 1e-4) + tol):
        return None
    codes = np.rint((blocks - low[..., None]) / np.where(flat, 1.0, step)[..., None])
    codes = np.where(flat[..., None], 0.0, codes)
    if codes.max() > LEVELS - 1:
        return None
    # the step refined by least squares over each block's codes (the smallest gap alone
    # carries the rounding of two values)
    dx = blocks - low[..., None]
    qq = (codes * codes).sum(-1)
    step = np.where(qq > 0, (codes * dx).sum(-1) / np.maximum(qq, 1), 0.0).astype(np.float32)
    if np.any(np.abs(low[..., None] + step[..., None] * codes - blocks) > 4 * tol[..., None]):
        return None
    return codes.astype(np.uint8), step, low.astype(np.float32)


def grid8_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """w [K, N] -> (codes [N, K/32, 32] uint8, scale [N, K/32]) with ``w = (codes - 128) *
    scale`` to float32 precision (a GGUF's Q8_0: ``w = d * q``, q in -127..127, d = the
    block's largest magnitude / 127), or None when some block is not such a grid."""
    blocks = blocks_of(w)
    if blocks is None:
        return None
    amax = np.abs(blocks).max(-1)
    scale = (amax / 127).astype(np.float32)
    q = np.rint(blocks / np.where(scale == 0, 1.0, scale)[..., None])
    tol = 1e-5 * np.maximum(amax, 1e-30)
    if np.any(np.abs(q * scale[..., None] - blocks) > tol[..., None]):
        return None
    return (q + 128).astype(np.uint8), scale


def offset_digits(offsets: np.ndarray, rows: int, digits: int = FOLD_DIGITS
                  ) -> tuple[np.ndarray, np.ndarray]:
    """offsets E [K/32, N], zero-padded to ``rows`` (whole blocks of 32) -> MatMulNBits codes
    [N, digits * rows/32, 16] (packed 4-bit) and scales [N, digits * rows/32] such that the
    digits' blocks, each read against the same block sums, add up to E: digit j codes, per
    block of 32 offsets, what digits 0..j-1 left, symmetric with codes -7..7 (+ 8)."""
    b, n = offsets.shape
    padded = np.zeros((rows, n), np.float64)
    padded[:b] = offsets
    left = np.ascontiguousarray(padded.T).reshape(n, rows // BLOCK, BLOCK)
    codes, scales = [], []
    for _ in range(digits):
        scale = (np.abs(left).max(-1) / 7).astype(np.float32)  # what the kernel will use
        step = np.where(scale == 0, 1.0, scale).astype(np.float64)[..., None]
        q = np.clip(np.rint(left / step), -7, 7)
        left = left - q * scale.astype(np.float64)[..., None]
        c = (q + 8).astype(np.uint8)
        codes.append((c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8))
        scales.append(scale)
    return np.concatenate(codes, axis=1), np.concatenate(scales, axis=1)


def keep_grid_blocks(model, accuracy_level: int, fold: bool | None = None
                     ) -> tuple[dict[str, int], list[str]]:
    """Rewrite, in the ModelProto, every MatMul whose constant weight is on a 4-bit block
    grid (``grid_codes``) into MatMulNBits + the offsets term, and with int8 activations
    one on an 8-bit grid (``grid8_codes``) into an 8-bit MatMulNBits. ``fold``: the offsets
    as extra 4-bit blocks of the same MatMulNBits (default: with int8 activations) rather
    than a float32 MatMul and an Add. Returns how many of each (``{"int4": n, "int8": m}``,
    kinds with none left out) and the names of the float MatMuls it added (the block sums
    and offsets: a quantizer run afterwards must leave them alone)."""
    from onnx import helper, numpy_helper

    fold = bool(accuracy_level) if fold is None else fold
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, kept, sums_of, indicators, added = [], {"int4": 0, "int8": 0}, {}, {}, []

    def block_sums(x: str, k: int, base: str) -> tuple[str, int]:
        """The node computing x's sums over its blocks of 32 (once per input): [.., K/32],
        or with ``fold`` zero-padded to whole blocks and x's input with them appended ->
        (the name of the sums, or with ``fold`` of x with them; the sums' width)."""
        blocks = k // BLOCK
        width = -(-blocks // BLOCK) * BLOCK if fold else blocks
        if k not in indicators:
            indicators[k] = f"grid_block_indicator_{k}"
            eye = np.zeros((k, width), np.float32)
            eye[:, :blocks] = np.repeat(np.eye(blocks, dtype=np.float32), BLOCK, axis=0)
            graph.initializer.append(numpy_helper.from_array(eye, indicators[k]))
        if (x, k) not in sums_of:
            sums = sums_of[x, k] = f"{base}_block_sums"
            nodes.append(helper.make_node("MatMul", [x, indicators[k]], [sums],
                                          name=f"{base}_sums"))
            added.append(f"{base}_sums")
            if fold:
                sums_of[x, k] = f"{base}_with_sums"
                nodes.append(helper.make_node("Concat", [x] + [sums] * FOLD_DIGITS,
                                              [sums_of[x, k]], name=sums_of[x, k], axis=-1))
        return sums_of[x, k], width

    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None:  # not a MatMul, or one of two activations
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        grid = grid_codes(w)
        grid8 = grid8_codes(w) if grid is None and accuracy_level else None
        if grid8 is not None:  # int8 weights are fast only with int8 activations
            codes, scale = grid8
            n, blocks, _ = codes.shape
            base = f"{node.name or node.output[0]}_grid8"
            graph.initializer.extend([numpy_helper.from_array(codes, f"{base}_codes"),
                                      numpy_helper.from_array(scale.reshape(-1), f"{base}_scales")])
            nodes.append(helper.make_node(
                "MatMulNBits", [node.input[0], f"{base}_codes", f"{base}_scales"],
                list(node.output), name=f"{base}_nbits", domain="com.microsoft",
                K=blocks * BLOCK, N=n, bits=8, block_size=BLOCK, accuracy_level=accuracy_level))
            kept["int8"] += 1
            continue
        if grid is None:
            nodes.append(node)
            continue
        codes, step, low = grid
        n, blocks, _ = codes.shape
        k = blocks * BLOCK
        base = f"{node.name or node.output[0]}_grid"
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
        offsets = np.ascontiguousarray((low + 8 * step).T)  # [K/32, N]
        x = node.input[0]
        sums, width = block_sums(x, k, base)
        if fold:
            digit_codes, digit_scales = offset_digits(offsets, width)
            graph.initializer.extend([
                numpy_helper.from_array(np.concatenate([packed, digit_codes], 1), f"{base}_codes"),
                numpy_helper.from_array(np.concatenate([step, digit_scales], 1).reshape(-1),
                                        f"{base}_scales")])
            nodes.append(helper.make_node(
                "MatMulNBits", [sums, f"{base}_codes", f"{base}_scales"],
                list(node.output), name=f"{base}_nbits",
                domain="com.microsoft", K=k + FOLD_DIGITS * width, N=n, bits=4,
                block_size=BLOCK, accuracy_level=accuracy_level))
            kept["int4"] += 1
            continue
        graph.initializer.extend([
            numpy_helper.from_array(packed, f"{base}_codes"),
            numpy_helper.from_array(step.reshape(-1), f"{base}_scales"),
            numpy_helper.from_array(offsets, f"{base}_offsets")])
        nodes += [
            helper.make_node("MatMulNBits", [x, f"{base}_codes", f"{base}_scales"],
                             [f"{base}_codes_out"], name=f"{base}_nbits", domain="com.microsoft",
                             K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=accuracy_level),
            helper.make_node("MatMul", [sums, f"{base}_offsets"], [f"{base}_offset_out"],
                             name=f"{base}_offset"),
            helper.make_node("Add", [f"{base}_codes_out", f"{base}_offset_out"], list(node.output),
                             name=f"{base}_add")]
        added.append(f"{base}_offset")
        kept["int4"] += 1
    if any(kept.values()):
        replace_nodes(model, nodes)
    return {kind: n for kind, n in kept.items() if n}, added


def replace_nodes(model, nodes) -> None:
    """The graph's nodes -> ``nodes`` (contrib ops among them): initializers no node reads
    any more are dropped, and the com.microsoft opset is imported."""
    from onnx import helper

    graph = model.graph
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for nd in graph.node for i in nd.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
