"""ExecuTorch and ONNX Runtime side by side on one target/drafter pair: bundle size, tau,
plain vs speculative tokens/s, milliseconds per call and peak RSS for every recipe.

    python benchmarks/backend_simulate.py --target pocket --drafter pocket \
        --out benchmarks/results/backends-pocket [--recipes executorch:fp32,onnx:int4] \
        [--threads 1] [--max-new-tokens 128] [--repeats 3] [--work DIR]

Each bundle is written once by ``hyflash export`` (cached under ``--work``, default a
folder next to the results) and simulated, greedy, on two prompt sets no model here was
trained on: *short* = ``hyflash simulate``'s built-in code prompts (written for it), and
*long* = the first ``--long-chars`` characters (~1000 tokens) of stdlib files in the
held-out split of ``hyflash.train.corpus`` (the pocket model's and every drafter's
training data come from the other split). Every export and every simulate runs in its
own process, so the peak RSS of a row is that bundle's alone (a process's high-water mark
never drops). Each simulate runs ``--repeats`` times, recipes in turn (round robin), and a
row holds the medians; any prompt whose speculative output differs from plain decoding
stops the benchmark (lossless verification is asserted, not just reported).
*planned MiB* is ExecuTorch's memory plan: activations of all methods + mutable buffers
(KV cache and feature ring, placed once). Writes each simulate report under ``--out``
plus ``summary.md`` / ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hyflash.simulate.command import DEFAULT_PROMPTS
from hyflash.train.corpus import split_files

LONG_SOURCES = ("reprlib.py", "wsgiref/headers.py", "idlelib/searchengine.py",
                "importlib/util.py")  # held out: hyflash.train.corpus.is_heldout

DEFAULT_RECIPES = "executorch:fp32,executorch:8da4w,onnx:fp32,onnx:int4"
COLS = [("tau", "%.2f"), ("plain_tokens_per_s", "%.1f"), ("spec_tokens_per_s", "%.1f"),
        ("speedup", "%.2fx"), ("ms_per_plain_decode_call", "%.2f"),
        ("ms_per_verify_call", "%.2f"), ("ms_per_drafter_call", "%.2f"),
        ("peak_rss_mib", "%.0f")]


def hyflash(*argv: str) -> None:
    """One `hyflash` command in a fresh process; its output goes to our stderr."""
    cmd = [sys.executable, "-m", "hyflash", *argv]
    done = subprocess.run(cmd, stdout=sys.stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}")


def prompt_sets(out: Path, long_chars: int) -> dict[str, Path]:
    _, held, root = split_files()
    held = {f.relative_to(root).as_posix(): f for f in held}
    missing = [f for f in LONG_SOURCES if f not in held]
    if missing:
        raise SystemExit(f"not in this Python's held-out stdlib split: {missing}")
    sets = {"short": DEFAULT_PROMPTS[:4],
            "long": [held[f].read_text()[:long_chars] for f in LONG_SOURCES]}
    files = {}
    for name, prompts in sets.items():
        files[name] = out / f"prompts-{name}.jsonl"
        files[name].write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return files


def folder_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def planned_mib(bundle: Path) -> tuple[float, float] | tuple[None, None]:
    """ExecuTorch's memory plan of a bundle's program -> (MiB of activations over all
    methods, MiB of mutable buffers: KV cache and feature ring, placed once for all
    methods); (None, None) for other backends."""
    pte = bundle / "model.pte"
    if not pte.exists():
        return None, None
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes())
    plans = getattr(program, "program", program).execution_plan
    sizes = [plan.non_const_buffer_sizes for plan in plans]
    arenas = sum(s[1] for s in sizes if len(s) > 1)
    mutable = max((s[2] for s in sizes if len(s) > 2), default=0)
    return arenas / 2**20, mutable / 2**20


def export(args, backend: str, quant: str) -> tuple[Path, float | None]:
    """The bundle for one recipe (reused when its manifest exists) and the seconds its
    export took (None when reused)."""
    out = args.work / f"{backend}-{quant}"
    if (out / "manifest.json").exists():
        return out, None
    start = time.perf_counter()
    hyflash("export", "--backend", backend, "--quant", quant, "--target", args.target,
            "--drafter", args.drafter, "--out", str(out), "--threads", str(args.threads),
            "--no-progress", *(["--max-seq-len", str(args.max_seq_len)]
                               if args.max_seq_len else []))
    return out, time.perf_counter() - start


def median(values) -> float | None:
    """Median of the values that exist (a summary says None where it has no number)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="pocket")
    p.add_argument("--drafter", default="pocket")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=None,
                   help="bundle cache (default: OUT/bundles)")
    p.add_argument("--recipes", default=DEFAULT_RECIPES,
                   help=f"backend:quant list (default {DEFAULT_RECIPES})")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--long-chars", type=int, default=3000,
                   help="characters of each long prompt (~1 token per 3 for code BPE)")
    p.add_argument("--repeats", type=int, default=3,
                   help="simulate runs per bundle and prompt set; rows hold medians")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or args.out / "bundles"
    prompts = prompt_sets(args.out, args.long_chars)
    bundles = {}
    for recipe in args.recipes.split(","):
        backend, quant = recipe.split(":")
        bundles[recipe] = (backend, quant, *export(args, backend, quant))
    runs: dict[tuple[str, str], list[dict]] = {}
    for repeat in range(args.repeats):  # round robin: slow drifts of the machine hit all
        for recipe, (backend, quant, bundle, _) in bundles.items():
            for kind, file in prompts.items():
                report = args.out / f"{backend}-{quant}-{kind}"
                hyflash("simulate", str(bundle), "--prompts", str(file), "--threads",
                        str(args.threads), "--max-new-tokens", str(args.max_new_tokens),
                        "--out", str(report), "--no-progress")
                s = json.loads((report / "report.json").read_text())["summary"]
                done, total = s["lossless"].split()[0].split("/")
                if done != total:
                    raise SystemExit(f"{recipe} {kind}: speculative output differs from "
                                     f"plain decoding ({s['lossless']}), see {report}")
                runs.setdefault((recipe, kind), []).append(s)
                print(f"[{repeat + 1}/{args.repeats}] {recipe} {kind}: tau {s['tau']:.2f} "
                      f"speedup {s['speedup']:.2f}x", file=sys.stderr)
    rows = []
    for (recipe, kind), summaries in runs.items():
        backend, quant, bundle, export_s = bundles[recipe]
        arenas, mutable = planned_mib(bundle)
        first = summaries[0]
        rows.append({"backend": backend, "quant": quant, "prompts": kind,
                     "bundle_mib": folder_mib(bundle), "export_s": export_s,
                     "planned_activations_mib": arenas, "planned_buffers_mib": mutable,
                     "lossless": first["lossless"], "runs": len(summaries),
                     "acceptance_by_position": first["acceptance_by_position"],
                     **{c: median(s[c] for s in summaries) for c, _ in COLS}})
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [f"# Bundles side by side: target {args.target}, drafter {args.drafter}, "
             f"{args.threads} thread(s), {args.max_new_tokens} new tokens, greedy", "",
             f"`python benchmarks/backend_simulate.py --target {args.target} --drafter "
             f"{args.drafter} --recipes {args.recipes} --threads {args.threads} --repeats "
             f"{args.repeats}`; medians of {args.repeats} runs; long prompts: the first "
             f"{args.long_chars} characters of {', '.join(LONG_SOURCES)} (held out)", "",
             "| backend | quant | bundle MiB | planned MiB | prompts | "
             + " | ".join(c for c, _ in COLS) + " | acceptance by position | lossless |",
             "|---|---|---|---|---|" + "---|" * (len(COLS) + 2)]
    for r in rows:
        cells = ["-" if r[c] is None else f % r[c] for c, f in COLS]
        plan = ("-" if r["planned_activations_mib"] is None else
                f"{r['planned_activations_mib']:.1f} + {r['planned_buffers_mib']:.1f}")
        lines.append(f"| {r['backend']} | {r['quant']} | {r['bundle_mib']:.1f} | {plan} | "
                     f"{r['prompts']} | " + " | ".join(cells) + " | "
                     + " ".join("-" if a is None else f"{a:.2f}"
                                for a in r["acceptance_by_position"])
                     + f" | {r['lossless']} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
