"""Which model's quantization moves tau at int4: the drafter's, or the target's?

    python benchmarks/setup_models.py                  # the SmolLM2 GGUF, once
    python benchmarks/quant_roles.py --out benchmarks/results/quant_roles [--quant int4] \
        [--drafter benchmarks/drafters/smollm2-hyflash] [--work DIR] [--prompts FILE]

One fp32 ONNX bundle of SmolLM2-135M-Instruct (GGUF) with the drafter, then the same
graphs requantized (``requantize_bundle``) four ways: nothing, the drafter's two graphs
only, the target only, all of them. Each bundle runs ``hyflash simulate`` greedy, one
thread, on the speed bench's prompts (``speed_texts(2, 2)``: two short and two long
held-out code prompts, 128 new tokens), or on ``--prompts``. Greedy output is
deterministic, so tau does not depend on the machine's load; the timings do and are not
reported. Quantizing the drafter alone shows what its quantization costs in acceptance;
quantizing the target alone changes the text the drafter must predict (the drafter was
distilled from the float target), which the per-prompt tau shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from hyflash.models.gguf import cache_root

HERE = Path(__file__).resolve().parent
DRAFTER_ROLES = ("drafter_commit", "drafter_step")


def bundles(work: Path, drafter: str, quant: str, source_blocks: str = "keep") -> dict[str, Path]:
    """name -> bundle folder: fp32 everywhere, quant on the drafter, on the target, on both
    (``source_blocks``: what the 4-bit recipes do with the GGUF's own blocks)."""
    from smollm2_drafter import gguf  # benchmarks/ is on the path of a script run from it

    from hyflash.export.bundle import requantize_bundle

    fp32 = work / "fp32"
    if not (fp32 / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "hyflash", "export", "--target", str(gguf()),
                        "--drafter", drafter, "--quant", "fp32", "--out", str(fp32),
                        "--max-seq-len", "2048", "--no-progress"], check=True)
    plan = {f"{quant} drafter": DRAFTER_ROLES, f"{quant} target": ("target",),
            f"{quant} both": None}
    out = {"fp32 both": fp32}
    for name, roles in plan.items():
        folder = work / (name.replace(" ", "-") + ("" if source_blocks == "keep" else "-requant"))
        if not (folder / "manifest.json").exists():
            requantize_bundle(fp32, quant, folder, roles, source_blocks)
        out[name] = folder
    return out


def write_prompts(work: Path) -> Path:
    from hyflash.bench.prompts import speed_texts

    f = work / "prompts.jsonl"
    f.write_text("".join(json.dumps(t) + "\n" for t in speed_texts(2, 2)), encoding="utf-8")
    return f


def simulate(bundle: Path, prompts: Path, report: Path) -> dict:
    subprocess.run([sys.executable, "-m", "hyflash", "simulate", str(bundle), "--prompts",
                    str(prompts), "--max-new-tokens", "128", "--threads", "1", "--out",
                    str(report), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    return json.loads((report / "report.json").read_text())


def table(results: dict[str, dict]) -> str:
    n = len(next(iter(results.values()))["prompts"])
    head = ("| target / drafter | tau | acceptance by position | "
            + " | ".join(f"tau prompt {i + 1}" for i in range(n)) + " | lossless |")
    lines = [head, "|" + "---|" * (n + 4)]
    for name, r in results.items():
        s = r["summary"]
        lines.append(f"| {name} | {s['tau']:.2f} | "
                     + " ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) + " | "
                     + " | ".join(f"{row['tau']:.2f}" for row in r["prompts"])
                     + f" | {s['lossless']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for quant_roles.md/.json")
    p.add_argument("--quant", default="int4", choices=("int8", "int4", "8da4w", "8da8w"))
    p.add_argument("--drafter", default=str(HERE / "drafters" / "smollm2-hyflash"))
    p.add_argument("--work", type=Path, default=cache_root() / "work" / "quant-roles",
                   help="bundles and simulate reports (reused when present)")
    p.add_argument("--prompts", type=Path, help="prompts file for hyflash simulate (default: "
                   "the speed bench's four held-out code prompts)")
    p.add_argument("--source-blocks", choices=("keep", "requantize"), default="keep",
                   help="int4 / 8da4w: keep the GGUF's own 4-bit blocks (default) or quantize "
                        "them again (hyflash export --source-blocks)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    made = bundles(args.work, args.drafter, args.quant, args.source_blocks)
    prompts = args.prompts or write_prompts(args.work)
    names = {"fp32 both": "fp32 / fp32", f"{args.quant} drafter": f"fp32 / {args.quant}",
             f"{args.quant} target": f"{args.quant} / fp32",
             f"{args.quant} both": f"{args.quant} / {args.quant}"}
    results = {}
    for key, folder in made.items():
        print(f"simulate {names[key]} ...", file=sys.stderr, flush=True)
        results[names[key]] = simulate(folder, prompts, args.work / f"report-{folder.name}")
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/quant_roles.py " + " ".join(sys.argv[1:])
    md = (f"# Quantizing one model of the pair: tau\n\n`{cmd}`\n\nGreedy, 128 new tokens, "
          f"one thread, prompts: {prompts.name}; drafter {args.drafter}.\n\n"
          f"{table(results)}\n")
    (args.out / "quant_roles.md").write_text(md, encoding="utf-8")
    kept = {k: {"summary": r["summary"], "prompts": r["prompts"]} for k, r in results.items()}
    (args.out / "quant_roles.json").write_text(json.dumps(kept, indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
