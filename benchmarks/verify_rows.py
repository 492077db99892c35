"""Does a verify row compute what a decode of that row computes? Per quantization recipe,
on the lean target graph of a bundle (SmolLM2-135M in the README).

    python benchmarks/verify_rows.py BUNDLE_FP32 [--trials 6] [--out benchmarks/results]

Greedy speculative decoding equals the target's own greedy decode only if the logits of
row i of a verify call over 8 tokens lead to the same argmax as a decode of token i
alone. For each recipe of ``hyflash export`` (fp32, int4, int8, 8da4w, 8da8w), quantized
here from the bundle's fp32 lean graph, after a random prompt (50..250 tokens) it runs
one verify of 8 random tokens, rolls back, decodes the same 8 one by one, once as one-row
calls and once padded to two rows (what the backend does for the 8da recipes:
``hyflash.runtime.backends.pad_rows``), and reports the largest logit difference to the
verify, how many argmaxes differ, and the median call times (1 thread unless
``--threads``); and how far each recipe's verify rows are from the fp32 graph's.
``int4 requantized`` / ``8da4w requantized``: the 4-bit recipes with a GGUF's own 4-bit
blocks quantized again instead of kept (``hyflash.export.grid_blocks``), to show what
keeping them buys and costs; ``8da4w float offsets``: 8da4w with the kept blocks' offsets
as a float32 MatMul and Add per layer (what ``int4`` does) instead of folded into the
MatMulNBits (what ``8da4w`` does); ``w8a8 per-token``: not a recipe of ours, every
MatMul as MatMulIntegerToFloat over int8 weights (one scale per column) and activations
quantized per row at run time (``per_token_int8``: the u8 x s8 GEMM ONNX Runtime runs
on AMX where the CPU has it, unlike MatMulNBits), to show what that kernel would buy.
The prefill column times one call over ``PREFILL`` random tokens.
Writes ``verify_rows.md`` / ``.json`` under ``--out``.
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
import torch


def compare(path: Path, manifest, trials: int, threads: int = 1) -> dict:
    import onnxruntime as ort

    from hyflash.runtime.onnx_lean import OnnxLeanTarget

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    target = OnnxLeanTarget(session, manifest.target.config, manifest.kv_names())
    rng = np.random.default_rng(0)
    worst, flips, rows, verifies = {1: 0.0, 2: 0.0}, {1: 0, 2: 0}, 0, []
    times = {"verify": [], "decode": [], "padded_decode": [], "prefill": []}
    target.rollback(0)
    t0 = time.perf_counter()
    target.forward(torch.tensor(rng.integers(100, 20000, PREFILL)), 0)
    times["prefill"].append(time.perf_counter() - t0)
    for trial in range(trials):
        prompt = torch.tensor(rng.integers(100, 20000, 50 + 40 * trial))
        target.rollback(0)
        target.forward(prompt, 0)
        pos = len(prompt)
        block = torch.tensor(rng.integers(100, 20000, 8))
        t0 = time.perf_counter()
        verify, _ = target.forward(block, pos)
        times["verify"].append(time.perf_counter() - t0)
        verifies.append(verify)
        for pad, name in ((1, "decode"), (2, "padded_decode")):
            target.min_rows = pad
            target.rollback(pos)
            decoded = []
            for i in range(8):
                t0 = time.perf_counter()
                decoded.append(target.forward(block[i:i + 1], pos + i)[0][0])
                times[name].append(time.perf_counter() - t0)
            decoded = torch.stack(decoded)
            worst[pad] = max(worst[pad], float((decoded - verify).abs().max()))
            flips[pad] += int((decoded.argmax(-1) != verify.argmax(-1)).sum())
        target.min_rows = 1
        rows += 8
    return {"max_abs_logit_diff": worst[1], "argmax_differs": flips[1],
            "padded_max_abs_logit_diff": worst[2], "padded_argmax_differs": flips[2],
            "rows": rows, "verifies": torch.cat(verifies),
            **{f"{k}_ms": round(1e3 * statistics.median(v), 1) for k, v in times.items()}}


REQUANTIZED = {"int4 requantized": "int4", "8da4w requantized": "8da4w"}
UNFOLDED = {"8da4w float offsets": "8da4w"}
PER_TOKEN = "w8a8 per-token"
PREFILL = 1018  # tokens: the longest speed prompt of the SmolLM2 bench


def per_token_int8(src: Path, dst: Path) -> None:
    """Every MatMul with a constant weight (the LM head's through its Transpose too) ->
    MatMulIntegerToFloat(x_q, W_q, row scale, column scales, 128): W_q int8 with one scale
    per column, x_q = round(x / s) + 128 as uint8 with s = max|x| / 127 per row (one chain
    of 8 ops per distinct input, shared by the MatMuls that read it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hyflash.export.grid_blocks import replace_nodes

    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in graph.node
                  if n.op_type == "Transpose" and n.input[0] in inits}
    consts = {"q_axes": np.array([-1], np.int64), "q_inv127": np.array(1 / 127, np.float32),
              "q_eps": np.array(1e-30, np.float32), "q_128": np.array(128, np.float32),
              "q_zp": np.array(128, np.uint8)}
    nodes, quantized = [], {}

    def quant(x: str) -> tuple[str, str]:
        if x not in quantized:
            b = x.replace("/", "_")
            steps = [("Abs", [x], "abs", {}),
                     ("ReduceMax", ["abs", "q_axes"], "max", {"keepdims": 1}),
                     ("Max", ["max", "q_eps"], "max2", {}),
                     ("Mul", ["max2", "q_inv127"], "scale", {}),
                     ("Div", [x, "scale"], "div", {}), ("Round", ["div"], "round", {}),
                     ("Add", ["round", "q_128"], "shift", {}),
                     ("Cast", ["shift"], "q", {"to": TensorProto.UINT8})]
            local = {"abs", "max", "max2", "scale", "div", "round", "shift", "q"}
            for op, ins, out, attrs in steps:
                nodes.append(helper.make_node(op, [f"{b}_{i}" if i in local else i for i in ins],
                                              [f"{b}_{out}"], **attrs))
            quantized[x] = (f"{b}_q", f"{b}_scale")
        return quantized[x]

    for node in graph.node:
        if node.op_type == "Transpose" and node.output[0] in transposed:
            continue
        w = node.input[1] if node.op_type == "MatMul" else None
        if w is None or (w not in inits and w not in transposed):
            nodes.append(node)
            continue
        weight = inits[w] if w in inits else inits[transposed[w]].T
        scale = np.abs(weight).max(0) / 127
        scale[scale == 0] = 1
        base = node.name.replace("/", "_")
        consts[f"{base}_wq"] = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
        consts[f"{base}_cs"] = scale.astype(np.float32)
        q, s = quant(node.input[0])
        nodes.append(helper.make_node("MatMulIntegerToFloat",
                                      [q, f"{base}_wq", s, f"{base}_cs", "q_zp"],
                                      list(node.output), domain="com.microsoft"))
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    replace_nodes(model, nodes)
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


def main() -> None:
    from hyflash.bundle import read_bundle
    from hyflash.export.quantize import NBITS, RECIPES, matmul_nbits, quantize

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path, help="an fp32 bundle with the lean target graph")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every recipe this many times, interleaved; report the median "
                        "round (this machine's timings vary from minute to minute)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per call")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    bundle = read_bundle(args.bundle, verify_hashes=False)
    m = bundle.manifest
    if m.kv_cache.form != "in_place" or m.quantization.recipe != "fp32":
        raise SystemExit(f"{args.bundle} is not an fp32 bundle with the lean target graph")
    rows, ref = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        src = bundle.path("target")
        paths = {}
        for recipe in (*RECIPES, *REQUANTIZED, *UNFOLDED, PER_TOKEN):
            paths[recipe] = src if recipe == "fp32" else Path(tmp) / f"{recipe}.onnx"
            if recipe in REQUANTIZED:  # a GGUF's 4-bit blocks quantized again, not kept
                quantize(REQUANTIZED[recipe], src, paths[recipe], source_blocks="requantize")
            elif recipe in UNFOLDED:  # the kept blocks' offsets as a float32 MatMul + Add
                matmul_nbits(*NBITS[UNFOLDED[recipe]], fold=False)(src, paths[recipe])
            elif recipe == PER_TOKEN:
                per_token_int8(src, paths[recipe])
            elif recipe != "fp32":
                quantize(recipe, src, paths[recipe])
        timed = {recipe: [] for recipe in paths}
        for _ in range(args.rounds):
            for recipe, path in paths.items():
                r = compare(path, m, args.trials, args.threads)
                got = r.pop("verifies")
                if recipe == "fp32":  # first: the reference of the others
                    ref = got
                r["vs_fp32_max_abs_logit_diff"] = round(float((got - ref).abs().max()), 4)
                r["vs_fp32_argmax_differs"] = int((got.argmax(-1) != ref.argmax(-1)).sum())
                rows[recipe] = r  # greedy results are the same every round
                timed[recipe].append({k: v for k, v in r.items() if k.endswith("_ms")})
                print(recipe, r, flush=True)
        for recipe, rounds in timed.items():
            rows[recipe].update({k: statistics.median(t[k] for t in rounds) for k in rounds[0]})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify_rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# Verify rows vs decodes of the same rows", "",
             f"`python {' '.join(sys.argv)}` (target: {m.target.source}, {args.threads} "
             f"thread{'s' if args.threads > 1 else ''})", "",
             "*vs fp32*: the verify rows against the fp32 graph's (how far the recipe moves the "
             "model); *requantized*: a GGUF's 4-bit blocks quantized again instead of kept "
             "(`hyflash.export.grid_blocks`).", "",
             "| recipe | one-row decodes: max abs logit diff | argmax differs | padded to two "
             "rows: max abs logit diff | argmax differs | vs fp32: max abs logit diff | argmax "
             f"differs | verify ms (T=8) | decode ms | padded decode ms | prefill ms "
             f"({PREFILL} tokens) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['max_abs_logit_diff']:.2g} | {r['argmax_differs']} of "
                     f"{r['rows']} | {r['padded_max_abs_logit_diff']:.2g} | "
                     f"{r['padded_argmax_differs']} of {r['rows']} | "
                     f"{r['vs_fp32_max_abs_logit_diff']:.2g} | {r['vs_fp32_argmax_differs']} of "
                     f"{r['rows']} | {r['verify_ms']} | "
                     f"{r['decode_ms']} | {r['padded_decode_ms']} | {r['prefill_ms']:.0f} |")
    (args.out / "verify_rows.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
