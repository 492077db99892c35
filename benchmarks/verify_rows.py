"""Does a verify row compute what a decode of that row computes? Per quantization recipe,
on the lean target graph of a bundle (SmolLM2-135M in the README).

    python benchmarks/verify_rows.py BUNDLE_FP32 [--trials 6] [--out benchmarks/results]

Greedy speculative decoding equals the target's own greedy decode only if the logits of
row i of a verify call over 8 tokens lead to the same argmax as a decode of token i
alone. For each graph below, after a random prompt (50..250 tokens), it runs one verify
of 8 random tokens, rolls back, decodes the same 8 one by one, and reports the largest
logit difference, how many argmaxes differ, and the median call times:

- the bundle's fp32 lean graph;
- int4 as ``hyflash export --quant int4`` makes it (MatMulNBits, accuracy level 0);
- int8 as ``hyflash export --quant int8`` makes it;
- int4 and int8 with ``accuracy_level=4`` (int8 activations, what onnxruntime-genai's
  builder uses by default), quantized here from the fp32 graph.
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


def quantized(src: Path, dst: Path, bits: int, accuracy_level: int) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from hyflash.export.quantize import BLOCK, fold_weight_transposes, quiet_logger

    with quiet_logger():
        q = MatMulNBitsQuantizer(fold_weight_transposes(src), bits=bits, block_size=BLOCK,
                                 is_symmetric=True, accuracy_level=accuracy_level,
                                 op_types_to_quantize=("MatMul",))
        q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=True)
    return dst


def compare(path: Path, manifest, trials: int) -> dict:
    import onnxruntime as ort

    from hyflash.runtime.onnx_lean import OnnxLeanTarget

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    target = OnnxLeanTarget(session, manifest.target.config, manifest.kv_names())
    rng = np.random.default_rng(0)
    worst, flips, rows = 0.0, 0, 0
    times = {"verify": [], "decode": []}
    for trial in range(trials):
        prompt = torch.tensor(rng.integers(100, 20000, 50 + 40 * trial))
        target.rollback(0)
        target.forward(prompt, 0)
        pos = len(prompt)
        block = torch.tensor(rng.integers(100, 20000, 8))
        t0 = time.perf_counter()
        verify, _ = target.forward(block, pos)
        times["verify"].append(time.perf_counter() - t0)
        target.rollback(pos)
        decoded = []
        for i in range(8):
            t0 = time.perf_counter()
            decoded.append(target.forward(block[i:i + 1], pos + i)[0][0])
            times["decode"].append(time.perf_counter() - t0)
        decoded = torch.stack(decoded)
        worst = max(worst, float((decoded - verify).abs().max()))
        flips += int((decoded.argmax(-1) != verify.argmax(-1)).sum())
        rows += 8
    return {"max_abs_logit_diff": worst, "argmax_differs": flips, "rows": rows,
            **{f"{k}_ms": round(1e3 * statistics.median(v), 1) for k, v in times.items()}}


def main() -> None:
    from hyflash.bundle import read_bundle

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path, help="an fp32 bundle with the lean target graph")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    bundle = read_bundle(args.bundle, verify_hashes=False)
    m = bundle.manifest
    if m.kv_cache.form != "in_place" or m.quantization.recipe != "fp32":
        raise SystemExit(f"{args.bundle} is not an fp32 bundle with the lean target graph")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = bundle.path("target")
        graphs = {"fp32": src,
                  **{f"int{bits} (hyflash recipe, accuracy level 0)":
                     quantized(src, Path(tmp) / f"{bits}a0.onnx", bits, 0) for bits in (4, 8)},
                  **{f"int{bits}, accuracy_level=4":
                     quantized(src, Path(tmp) / f"{bits}a4.onnx", bits, 4) for bits in (4, 8)}}
        for name, path in graphs.items():
            rows[name] = compare(path, m, args.trials)
            print(name, rows[name], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify_rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# Verify rows vs decodes of the same rows", "",
             f"`python {' '.join(sys.argv)}` (target: {m.target.source}, 1 thread)", "",
             "| graph | max abs logit diff | argmax differs | verify ms (T=8) | decode ms |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['max_abs_logit_diff']:.2g} | {r['argmax_differs']} of "
                     f"{r['rows']} | {r['verify_ms']} | {r['decode_ms']} |")
    (args.out / "verify_rows.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
