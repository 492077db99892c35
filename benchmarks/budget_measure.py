"""`hyflash budget --measure` on real bundles: the estimate next to measured peak RSS.

    python benchmarks/setup_models.py        # the SmolLM2-135M GGUF, once
    python benchmarks/budget_measure.py --out benchmarks/results [--work DIR] [--drafter DIR]

Builds (once, with `hyflash export`) SmolLM2-135M-Instruct bundles from the Q4_1 GGUF at
context 2048, ONNX fp32 and int4, with a SmolLM2 drafter (``--drafter``; default: the
random-weight 8192-id drafter `benchmarks/lean_drafter.py` leaves in its work folder:
memory does not depend on training), and pocket bundles (ONNX fp32 / int4, ExecuTorch fp32
/ 8da4w, context 512) with the shipped pocket drafter. Then, per bundle, runs
`hyflash budget BUNDLE --measure --json` (a fresh child process fills the context: prompt
= context - new tokens - a block) and writes ``budget_measure.md`` / ``.json``: every
checkpoint (process, after opening, peak) measured and estimated, and the weights on disk.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

GGUF = Path.home() / ".cache/hyflash/models/SmolLM2-135M-Instruct.Q4_1.gguf"
WORK = Path.home() / ".cache/hyflash/benchmarks/budget_measure"
LEAN_DRAFTER = Path.home() / ".cache/hyflash/benchmarks/lean_drafter/drafter-dv8192"
MIB = 2 ** 20
# name -> (target, backend, quant, context)
BUNDLES = {"smollm2-fp32": ("smollm2", "onnx", "fp32", 2048),
           "smollm2-int4": ("smollm2", "onnx", "int4", 2048),
           "pocket-onnx-fp32": ("pocket", "onnx", "fp32", 512),
           "pocket-onnx-int4": ("pocket", "onnx", "int4", 512),
           "pocket-et-fp32": ("pocket", "executorch", "fp32", 512),
           "pocket-et-8da4w": ("pocket", "executorch", "8da4w", 512)}


def hyflash(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "hyflash", *argv], capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"hyflash {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def export(name: str, work: Path, drafter: Path) -> Path:
    target, backend, quant, context = BUNDLES[name]
    out = work / name
    if not (out / "manifest.json").exists():
        print(f"exporting {name}", flush=True)
        hyflash("export", "--target", str(GGUF) if target == "smollm2" else "pocket",
                "--drafter", str(drafter) if target == "smollm2" else "pocket",
                "--backend", backend, "--quant", quant, "--max-seq-len", str(context),
                "--out", str(out), "--no-progress")
    return out


def measure(bundle: Path, new_tokens: int) -> dict:
    return json.loads(hyflash("budget", str(bundle), "--measure", "--json", "--no-progress",
                              "--new-tokens", str(new_tokens), "--device", "oneplus-12"))


def report(rows: list[dict], out: Path, command: str, drafter: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "budget_measure.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    lines = ["# `hyflash budget --measure`: estimate vs measured memory", "", f"`{command}`", "",
             f"SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized) with drafter `{drafter}`; pocket "
             "bundles with the shipped pocket drafter. Each bundle runs in a fresh desktop "
             "Python process (1 thread) that fills its context: prompt = context - new tokens - "
             "a block, then decodes speculatively. Memory from /proc/self/status (VmRSS after "
             "each checkpoint, VmHWM for the peak); the estimate is `hyflash budget`'s, with "
             "the desktop process as the runtime term and the KV cache and prefill of that "
             "run. Error = estimate / measured - 1.", "",
             "| bundle | prompt + new | process MiB (est) | after open MiB (est) | peak MiB "
             "(est) | peak error | weights on disk MB (est) | disk error | largest step miss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["checkpoints"]
        pair = [f"{x['measured_bytes'] / MIB:.0f} ({x['estimated_bytes'] / MIB:.0f})"
                for x in c[:3]]
        steps = sorted(c[:3], key=lambda x: -abs(x["step_estimated_bytes"]
                                                  - x["step_measured_bytes"]))
        miss = steps[0]
        lines.append(
            f"| {r['bundle']} | {r['prompt_tokens']} + {r['new_tokens']} | {pair[0]} | "
            f"{pair[1]} | {pair[2]} | {100 * c[2]['error']:+.1f}% | "
            f"{c[3]['measured_bytes'] / 1e6:.1f} ({c[3]['estimated_bytes'] / 1e6:.1f}) | "
            f"{100 * c[3]['error']:+.1f}% | {miss['checkpoint']}: "
            f"{(miss['step_estimated_bytes'] - miss['step_measured_bytes']) / MIB:+.0f} MiB "
            f"({', '.join(miss['terms'])}) |")
    (out / "budget_measure.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--drafter", type=Path, default=LEAN_DRAFTER,
                   help="a drafter trained for SmolLM2-135M (default: lean_drafter's random one)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--only", default=None, help="comma-separated bundle names")
    args = p.parse_args()
    if not GGUF.exists():
        raise SystemExit(f"no {GGUF}: run `python benchmarks/setup_models.py` first")
    if not (args.drafter / "config.json").exists():
        raise SystemExit(f"no drafter at {args.drafter}: run benchmarks/lean_drafter.py first, "
                         "or pass --drafter DIR")
    names = args.only.split(",") if args.only else list(BUNDLES)
    rows = []
    for name in names:
        bundle = export(name, args.work, args.drafter)
        m = measure(bundle, args.new_tokens)["measure"]
        rows.append({"bundle": name, "prompt_tokens": m["prompt_tokens"],
                     "new_tokens": m["stages"]["run"]["new_tokens"], **m})
        print(name, f"peak error {100 * m['checkpoints'][2]['error']:+.1f}%", flush=True)
    report(rows, args.out, "python " + " ".join(sys.argv), args.drafter)


if __name__ == "__main__":
    main()
