"""Speculative vs plain ONNX Runtime decoding of one target/drafter pair, fp32 and int4,
short and long prompts: the numbers issue #6 asks for.

    python benchmarks/onnx_simulate.py --target pocket --drafter runs/drafter \
        --out benchmarks/results/onnx-pocket [--threads 1] [--max-new-tokens 128] \
        [--target-graph auto|lean|optimum]

Exports the pair once (fp32), requantizes it to int4 (no second export), then runs
``hyflash simulate`` on each bundle with a short-prompt and a long-prompt set (greedy,
the drafter's block size). Writes each simulate report under ``--out`` plus
``summary.md`` / ``summary.json`` side by side. Long prompts are slices of the Python
standard library's source, which the pocket model's held-out split also comes from.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from hyflash.bundle import read_bundle
from hyflash.cli import main as hyflash
from hyflash.export.bundle import export_onnx_bundle, requantize_bundle
from hyflash.simulate.command import DEFAULT_PROMPTS

LONG_SOURCES = ("textwrap.py", "shlex.py", "fnmatch.py")


def prompt_sets(out: Path, long_chars: int) -> dict[str, Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sets = {"short": DEFAULT_PROMPTS[:4],
            "long": [(stdlib / f).read_text()[:long_chars] for f in LONG_SOURCES]}
    files = {}
    for name, prompts in sets.items():
        files[name] = out / f"prompts-{name}.jsonl"
        files[name].write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return files


def bundles(args) -> dict[str, Path]:
    root = args.out / "bundles"
    fp32, int4 = root / "fp32", root / "int4"
    if not (fp32 / "manifest.json").exists():
        export_onnx_bundle(args.target, args.drafter, fp32, "fp32",
                           target_graph=args.target_graph)
    if not (int4 / "manifest.json").exists():
        requantize_bundle(fp32, "int4", int4)
    return {"fp32": fp32, "int4": int4}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="pocket")
    p.add_argument("--drafter", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target-graph", default="auto", choices=("auto", "lean", "optimum"),
                   help="the target graph's form (hyflash export --target-graph)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--long-chars", type=int, default=3000,
                   help="characters of each long prompt (~1 token per 3 for code BPE)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = prompt_sets(args.out, args.long_chars)
    rows = []
    made = bundles(args)
    for quant, bundle in made.items():
        for kind, file in prompts.items():
            report = args.out / f"{quant}-{kind}"
            code = hyflash(["simulate", str(bundle), "--prompts", str(file), "--threads",
                            str(args.threads), "--max-new-tokens", str(args.max_new_tokens),
                            "--out", str(report), "--no-progress"])
            if code:
                raise SystemExit(code)
            s = json.loads((report / "report.json").read_text())["summary"]
            rows.append({"quant": quant, "prompts": kind, **s})
    manifest = read_bundle(made["fp32"]).manifest
    arch, form = manifest.drafter.config.arch, manifest.kv_cache.form
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    cols = [("tau", "%.2f"), ("plain_tokens_per_s", "%.1f"), ("spec_tokens_per_s", "%.1f"),
            ("speedup", "%.2fx"), ("ms_per_plain_decode_call", "%.2f"),
            ("ms_per_drafter_call", "%.2f"), ("ms_per_verify_call", "%.2f"),
            ("drafter_over_verify", "%.2f"), ("tau_for_2x", "%.2f"), ("peak_rss_mib", "%.0f")]
    lines = [f"# ONNX Runtime simulation, {arch} drafter, target KV form {form}, "
             f"{args.threads} thread(s), {args.max_new_tokens} new tokens", "",
             "| quant | prompts | " + " | ".join(c for c, _ in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for r in rows:
        cells = ["-" if r[c] is None else f % r[c] for c, f in cols]
        lines.append(f"| {r['quant']} | {r['prompts']} | " + " | ".join(cells) + " |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
