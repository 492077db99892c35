"""Run every system side by side: one fresh process per system and round, round robin.

Each round runs every system once over the same prompts (token ids), in an order that
rotates by round, so load from other processes on a shared machine hits all alike; a
row's figure is the median over rounds of that round's tokens/s (all new tokens over the
summed wall time of the generate calls, prefill included); for our systems also of the
decode phase alone (``decode_rate``: the prefill is the same work in every mode of a
system, so it dilutes what speculation buys). Peak RSS is the median of the processes'
high-water marks.

Losslessness is checked, not assumed: a speculative (or lookup) mode claims the output of
its system's plain mode, token for token; ``rows`` records whether it holds and the
command fails after writing the report if any greedy claim does not.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hyflash.bench.systems import LOSSLESS_PAIRS, System
from hyflash.errors import HyflashError

WORKERS = {"ours": "hyflash.bench.worker", "transformers": "hyflash.bench.worker",
           "optimum": "hyflash.bench.worker"}
GENAI_WORKER = Path(__file__).with_name("genai_worker.py")


def package_env() -> dict:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1"}


def run_worker(system: System, prompts: list[list[int]], new: int, threads: int) -> dict:
    """One process of one system -> {"modes": {mode: {tokens, seconds, ...}}, "peak_rss_mib"}."""
    if system.kind == "native":
        from hyflash.bench.native import run_native

        return run_native(system, prompts, new, threads)
    if system.kind == "llamacpp":
        from hyflash.bench.llamacpp import run_llamacpp

        return run_llamacpp(system, prompts, new, threads)
    with tempfile.TemporaryDirectory(prefix="hyflash-bench-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps({"system": system.kind, "prompts": prompts,
                                   "max_new_tokens": new, "threads": threads, **system.request}))
        if system.kind == "genai":
            cmd, env = [system.python, str(GENAI_WORKER)], {**os.environ, "PYTHONPATH": ""}
        else:
            cmd, env = [sys.executable, "-m", WORKERS[system.kind]], package_env()
        done = subprocess.run([*cmd, str(req), str(out)], capture_output=True, text=True,
                              env=env)
        if done.returncode or not out.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{system.label}: worker failed (exit {done.returncode}): {last}")
        return json.loads(out.read_text())


def measure(systems: list[System], prompts: list[list[int]], new: int, threads: int,
            runs: int, say=print) -> tuple[list[dict], list[dict]]:
    """-> (rows, failures): a row per (system, mode) with medians and the round-0 tokens;
    a failure per system whose worker failed (the reason, never dropped)."""
    got: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}
    for r in range(runs):
        live = [s for s in systems if s.label not in failed]
        order = live[r % max(len(live), 1):] + live[:r % max(len(live), 1)]
        for s in order:
            try:
                result = run_worker(s, prompts, new, threads)
            except (RuntimeError, OSError, ValueError) as e:
                failed[s.label] = str(e)
                say(f"  [{r + 1}/{runs}] {s.label}: failed: {e}")
                continue
            got.setdefault(s.label, []).append(result)
            speeds = ", ".join(f"{m} {rate(v, new):.1f} tok/s"
                               for m, v in result["modes"].items())
            say(f"  [{r + 1}/{runs}] {s.label}: {speeds}")
    rows = []
    for s in systems:
        if s.label in got:
            rows += system_rows(s, got[s.label], new)
    return rows, [{"label": s.label, "group": s.group, "reason": failed[s.label]}
                  for s in systems if s.label in failed]


def rate(mode: dict, new: int) -> float:
    """New tokens per second; tokens past `new` (transformers' prompt lookup can overshoot
    max_new_tokens by a few) are not counted."""
    seconds = sum(mode["seconds"])
    return sum(min(len(t), new) for t in mode["tokens"]) / seconds if seconds else float("nan")


def decode_rate(mode: dict, new: int) -> float | None:
    """Tokens per second of the decode phase: the tokens after the first (which the
    prefill's last row gives) over the time after the prefill; None where the system does
    not report its prefill time."""
    if "prefill_seconds" not in mode:
        return None
    seconds = sum(mode["seconds"]) - sum(mode["prefill_seconds"])
    return sum(min(len(t), new) - 1 for t in mode["tokens"]) / seconds if seconds > 0 else None


def system_rows(s: System, results: list[dict], new: int) -> list[dict]:
    rows = []
    first = results[0]["modes"]
    for mode, data in first.items():
        speeds = [rate(r["modes"][mode], new) for r in results]
        steady = all(r["modes"][mode]["tokens"] == data["tokens"] for r in results)
        row = {"system": s.label, "kind": s.kind, "group": s.group, "quant": s.quant,
               "mode": mode, "tokens_per_s": statistics.median(speeds),
               "all_tokens_per_s": [round(x, 2) for x in speeds], "runs": len(results),
               "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in results),
               "deterministic": steady,
               "lengths_not_new": [len(t) for t in data["tokens"] if len(t) != new],
               "tokens": [t[:new] for t in data["tokens"]], "note": s.note,
               "decode_tokens_per_s": median_or_none(decode_rate(r["modes"][mode], new)
                                                     for r in results),
               **{k: data[k] for k in ("tau", "acceptance", "ms_per_target_call",
                                       "ms_per_drafter_call") if k in data}}
        pair = LOSSLESS_PAIRS.get(mode)
        if pair in first:
            row["identical_to"] = f"{s.label} / {pair}"
            row["identical"] = row["tokens"] == [t[:new] for t in first[pair]["tokens"]]
            plain = statistics.median(rate(r["modes"][pair], new) for r in results)
            row["speedup_vs_plain"] = row["tokens_per_s"] / plain if plain else None
            plain = median_or_none(decode_rate(r["modes"][pair], new) for r in results)
            row["decode_speedup_vs_plain"] = (row["decode_tokens_per_s"] / plain if plain and
                                              row["decode_tokens_per_s"] else None)
        rows.append(row)
    return rows


def median_or_none(values) -> float | None:
    values = list(values)
    return None if not values or None in values else statistics.median(values)


def compare_to(rows: list[dict], reference: str) -> None:
    """Each row's first token that differs from the reference row's (None: identical)."""
    ref = next((r for r in rows if f"{r['system']} / {r['mode']}" == reference), None)
    if ref is None:
        return
    for r in rows:
        diffs = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b),
                      None if len(x) == len(y) else min(len(x), len(y)))
                 for x, y in zip(r["tokens"], ref["tokens"], strict=True)]
        found = [d for d in diffs if d is not None]
        r["first_diff_vs_reference"] = min(found) if found else None
        r["reference"] = reference


def check_lossless(rows: list[dict]) -> None:
    bad = [f"{r['system']} / {r['mode']}" for r in rows if r.get("identical") is False
           and r["group"] == "ours"]
    if bad:
        raise HyflashError(f"speculative output differs from plain decoding in {', '.join(bad)} "
                           "(greedy must be lossless): the report says where; this is a bug")
