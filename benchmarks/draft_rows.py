"""Does proposing fewer drafts pay? Tokens/s when a drafter round proposes only some of
its rows (``hyflash/runtime/draft_rows.py``), per bundle, side by side.

    python benchmarks/draft_rows.py BUNDLE [BUNDLE ...] [--rows all,0.2,auto] \
        [--runs 3] [--threads 2] [--new-tokens 128] [--out DIR]

A verify of T tokens costs more the larger T is (on SmolLM2's lean fp32 graph a verify of
8 costs ~1.5 decodes), and the drafter's late rows are rarely accepted. ``--rows`` lists
the policies to compare: ``all`` (every row), a probability p (the leading rows whose
best token has probability >= p under the drafter) and ``auto`` (the number of rows that
maximises expected tokens per second, with verify costs measured as it runs). The
output stays the target's (asserted here against plain decoding, token for token).

Prompts are ``hyflash bench``'s speed prompts (2 held-out code prompts ending on a ``def``
line, 2 long ones of 2500-5000 characters), EOS ignored. Each run goes over every
configuration (plain, then the drafter with each policy) on every prompt; tokens/s of a
configuration in a run is its new tokens over its seconds, prefill included, and the
table gives the median over runs and the ratio to plain taken within each run. Writes
``draft_rows.md`` / ``.json`` under ``--out`` (default: print only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from hyflash.argtypes import positive_int, threads


def policies(text: str) -> list[str]:
    from hyflash.runtime.draft_rows import parse_policy

    names = [v.strip() for v in text.split(",") if v.strip()]
    try:
        for n in names:
            parse_policy(n)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rows {text!r}: {e}") from None
    if not names:
        raise argparse.ArgumentTypeError("--rows: name at least one policy")
    return names


def speed_prompts(tokenizer) -> list[list[int]]:
    from hyflash.bench.prompts import speed_texts

    return [tokenizer(t).input_ids for t in speed_texts(2, 2)]  # the smollm2 suite's


def measure(folder: Path, names: list[str], runs: int, n_threads: int, new: int) -> dict:
    import torch

    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime.draft_rows import parse_policy
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.open_bundle import open_bundle

    torch.set_num_threads(n_threads)
    _, target, drafter = open_bundle(folder, threads=n_threads)
    prompts = speed_prompts(load_tokenizer(folder))
    configs = {"plain": SpeculativeEngine(target)}
    configs.update({f"drafter, rows {n}": SpeculativeEngine(target, drafter,
                                                             draft_rows=parse_policy(n))
                    for n in names})
    for engine in configs.values():  # warm-up
        engine.generate(prompts[0], max_new_tokens=8)
    per_run = {name: [] for name in configs}
    reference = None
    for run in range(runs):
        for name, engine in configs.items():
            gens = [engine.generate(p, max_new_tokens=new) for p in prompts]
            tokens = [g.tokens for g in gens]
            if name == "plain":
                reference = tokens if reference is None else reference
            if tokens != reference:
                raise SystemExit(f"{folder}: {name} differs from plain decoding (run {run + 1})")
            s = [g.stats for g in gens]
            rounds = sum(x.rounds for x in s)
            per_run[name].append({
                "tok_s": sum(x.new_tokens for x in s) / sum(x.total_s for x in s),
                "tau": (sum(x.accepted_drafts for x in s) + rounds) / rounds,
                "drafts_per_round": sum(sum(x.position_proposed) for x in s) / rounds,
                "ms_verify": 1000 * sum(x.verify_s for x in s) / rounds,
                "ms_drafter": 1000 * sum(x.draft_s for x in s) / max(
                    1, sum(x.drafter_calls for x in s)),
            })
        print(f"{folder.name} run {run + 1}/{runs}: " + ", ".join(
            f"{n} {v[-1]['tok_s']:.1f}" for n, v in per_run.items()), flush=True)
    rows = {}
    for name, vals in per_run.items():
        row = {k: statistics.median(v[k] for v in vals) for k in vals[0]}
        row["speedup"] = statistics.median(v["tok_s"] / p["tok_s"]
                                           for v, p in zip(vals, per_run["plain"], strict=True))
        rows[name] = row
    return {"bundle": str(folder), "prompt_tokens": [len(p) for p in prompts], "rows": rows}


def markdown(results: list[dict], args, seconds: float) -> str:
    lines = ["# Draft rows: how many of the drafter's rows a round proposes", "",
             f"`python benchmarks/draft_rows.py {' '.join(r['bundle'] for r in results)} "
             f"--rows {','.join(args.rows)} --runs {args.runs} --threads {args.threads} "
             f"--new-tokens {args.new_tokens}` ({seconds:.0f} s). Medians of {args.runs} runs; "
             "speedup over plain decoding taken within each run; every row's tokens equal "
             "plain decoding's (asserted).", ""]
    for r in results:
        lines += [f"## {r['bundle']}", "", f"prompt tokens {r['prompt_tokens']}", "",
                  "| configuration | tok/s | speedup | tau | drafts per round | ms per verify "
                  "| ms per drafter call |", "|---|---|---|---|---|---|---|"]
        for name, row in r["rows"].items():
            lines.append(f"| {name} | {row['tok_s']:.1f} | {row['speedup']:.2f}x | "
                         f"{row['tau']:.2f} | {row['drafts_per_round']:.2f} | "
                         f"{row['ms_verify']:.1f} | "
                         + (f"{row['ms_drafter']:.1f} |" if name != "plain" else "- |"))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", type=Path, metavar="BUNDLE",
                    help="ONNX bundle folders with a drafter and a tokenizer")
    ap.add_argument("--rows", type=policies, default=policies("all,0.2,auto"),
                    help="row policies to compare: all, auto, or probability cutoffs "
                         "(default all,0.2,auto)")
    ap.add_argument("--runs", type=positive_int, default=3)
    ap.add_argument("--threads", type=threads, default=2)
    ap.add_argument("--new-tokens", type=positive_int, default=128)
    ap.add_argument("--out", type=Path, help="folder for draft_rows.md / .json")
    args = ap.parse_args(argv)
    for b in args.bundles:
        if not (b / "manifest.json").is_file():
            ap.error(f"{b} is not a bundle folder (no manifest.json): pass `hyflash export`'s "
                     "--out folder")
    t0 = time.perf_counter()
    results = [measure(b, args.rows, args.runs, args.threads, args.new_tokens)
               for b in args.bundles]
    text = markdown(results, args, time.perf_counter() - t0)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "draft_rows.md").write_text(text + "\n")
        (args.out / "draft_rows.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
