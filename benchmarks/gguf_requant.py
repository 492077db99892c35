"""What our ONNX recipes do to a GGUF's own 4-bit weights, and what keeping them would cost.

    python benchmarks/gguf_requant.py GGUF [--layers 0,15,29] [--out benchmarks/results]

A GGUF such as SmolLM2-135M-Instruct.Q4_1.gguf holds its linear layers already quantized
(Q4_1: blocks of 32 along the input dimension, w = d * q + m with q in 0..15 and a float16
d and m per block). ``--target FILE.gguf`` dequantizes them, so our fp32 bundle computes
with exactly those weights, but the int4 / 8da4w recipes quantize them a second time onto
their own grid, and the drafter (distilled from the fp32 target) then drafts for a slightly
different model. This measures, per recipe and on the GGUF's real tensors of the layers
given, the relative error ||x W' - x W|| / ||x W|| of a one-MatMul graph quantized by
``hyflash.export.quantize`` (x: 8 random normal rows; W: the GGUF's dequantized weight),
and the same for the exact encoding of Q4_1 in MatMulNBits (codes q, scale d, a float zero
point -m/d: MatMulNBits takes float zero points, an integer one cannot hold -m/d). Then
the time of one call of each at 1 and 8 rows, 1 thread, on the widest tensor measured.
Writes ``gguf_requant.md`` / ``.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RECIPES = ("int8", "int4", "8da4w", "8da8w")


def matmul_model(w: np.ndarray):
    """y = x @ w.T for w [N, K] as an fp32 ONNX model (the form torch.onnx exports)."""
    from onnx import TensorProto, helper, numpy_helper

    n, k = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def q4_1_blocks(raw: np.ndarray, n: int, k: int):
    """A Q4_1 tensor's raw blocks -> (codes [N, K/32, 32], d [N, K/32], m [N, K/32])."""
    blocks = raw.reshape(n, k // 32, 20)  # per block: d (f16), m (f16), 16 bytes of codes
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    nib = blocks[..., 4:]
    return np.concatenate([nib & 0x0F, nib >> 4], axis=-1), d, m  # byte j: codes j, j+16


def q4_1_float_zp_model(raw: np.ndarray, n: int, k: int):
    """The GGUF's Q4_1 blocks exactly as MatMulNBits with float zero points: the codes,
    scale d, zero point -m/d (an integer zero point cannot hold -m/d)."""
    from onnx import TensorProto, helper, numpy_helper

    q, d, m = q4_1_blocks(raw, n, k)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # MatMulNBits: 2i, 2i+1
    node = helper.make_node("MatMulNBits", ["x", "b", "scales", "zero_points"], ["y"],
                            domain="com.microsoft", K=k, N=n, bits=4, block_size=32)
    graph = helper.make_graph(
        [node], "q4_1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(d.reshape(-1), "scales"),
         numpy_helper.from_array((-m / np.where(d == 0, 1.0, d)).reshape(-1), "zero_points")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def session(model_or_path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    src = model_or_path.SerializeToString() if hasattr(model_or_path, "SerializeToString") \
        else str(model_or_path)
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def call_ms(sess, x: np.ndarray, repeats: int = 50) -> float:
    for _ in range(5):
        sess.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--layers", default="0,15,29", help="block indices to measure")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)

    import onnx
    from gguf.quants import dequantize

    from hyflash.export.quantize import quantize
    from hyflash.models.gguf import open_reader

    reader = open_reader(args.gguf)
    layers = {f"blk.{i}." for i in args.layers.split(",")}
    tensors = [t for t in reader.tensors if t.tensor_type.name == "Q4_1"
               and any(t.name.startswith(x) for x in layers)]
    if not tensors:
        sys.exit(f"{args.gguf}: no Q4_1 tensors in blocks {args.layers}")
    rng = np.random.default_rng(0)
    errors = {name: [] for name in (*RECIPES, "int4 requantized", "8da4w requantized",
                                     "q4_1 float zp")}
    widest, timing = None, {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in tensors:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)  # [N, K]
            n, k = w.shape
            x = rng.standard_normal((8, k)).astype(np.float32)
            ref = x @ w.T
            src = Path(tmp) / "fp32.onnx"
            onnx.save_model(matmul_model(w), str(src))
            built = {}
            for recipe in RECIPES:
                built[recipe] = Path(tmp) / f"{recipe}.onnx"
                quantize(recipe, src, built[recipe])
            for recipe in ("int4", "8da4w"):  # the grid left to the quantizer
                built[f"{recipe} requantized"] = Path(tmp) / f"{recipe}-requantized.onnx"
                quantize(recipe, src, built[f"{recipe} requantized"], source_blocks="requantize")
            built["q4_1 float zp"] = q4_1_float_zp_model(np.asarray(t.data), n, k)

            for name, model in built.items():
                y = session(model).run(None, {"x": x})[0]
                errors[name].append(float(np.linalg.norm(y - ref) / np.linalg.norm(ref)))
            print(f"{t.name} [{n}x{k}]: " + ", ".join(f"{a} {v[-1]:.4f}"
                                                      for a, v in errors.items()), flush=True)
            if widest is None or n * k > widest[0]:
                widest = (n * k, t.name, {"fp32": src.read_bytes(), **{
                    a: b.read_bytes() if isinstance(b, Path) else b.SerializeToString()
                    for a, b in built.items()}}, k)
        _, wide_name, models, k = widest
        for name, blob in models.items():
            sess = session(onnx.load_from_string(blob))
            timing[name] = {rows: round(call_ms(sess, rng.standard_normal((rows, k)).astype(
                np.float32)), 3) for rows in (1, 8)}
    report = {"gguf": str(args.gguf), "layers": args.layers, "tensors": len(tensors),
              "relative_error": {a: {"mean": float(np.mean(v)), "max": float(np.max(v))}
                                 for a, v in errors.items()},
              "timed_tensor": wide_name, "ms_per_call_1_thread": timing}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf_requant.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# A GGUF's Q4_1 weights through our ONNX recipes", "",
             f"`python benchmarks/gguf_requant.py {args.gguf.name} --layers {args.layers}`: "
             f"{len(tensors)} Q4_1 tensors; error = ||x W' - x W|| / ||x W||, x 8 random "
             "normal rows, W the GGUF's dequantized weight (what the fp32 bundle computes "
             f"with). Times: one call on {wide_name}, 1 thread, median of 50.", "",
             "| encoding | mean error | max error | ms, 1 row | ms, 8 rows |",
             "|---|---|---|---|---|"]
    for name, e in report["relative_error"].items():
        lines.append(f"| {name} | {e['mean']:.4f} | {e['max']:.4f} | "
                     f"{timing[name][1]:.3f} | {timing[name][8]:.3f} |")
    lines.append(f"| fp32 | 0 | 0 | {timing['fp32'][1]:.3f} | {timing['fp32'][8]:.3f} |")
    (args.out / "gguf_requant.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
