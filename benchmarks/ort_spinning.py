"""What ONNX Runtime's spinning threads cost the speculative loop, separated from what
interleaving two graphs costs anyway (each evicts the other's weights from the caches).

    python benchmarks/ort_spinning.py [--bundle pocket] [--bundle DIR ...] [--threads 2] \
        [--runs 5] [--repeats 25] [--context 512] [--simulate-runs 5] [--out DIR]

For each bundle (``pocket``: the pocket pair, exported once into the hyflash cache), the
target and drafter are opened twice in this process: once as the product opens them
(``session.intra_op.allow_spinning`` = "0", ``hyflash.runtime.onnx_session.make_session``)
and once with ONNX Runtime's default, spinning on (the same ``make_session``, its
``InferenceSession`` patched for the duration to set "1"; the product keeps one setting).
Each setting then measures, through the runtime backends:

- (a) verify alone: target calls of T = block size at ``--context``, rolled back after each
  call so the context stays the same;
- (b) drafter alone: drafter calls (commit a block of features, draft), back to back;
- (c) the pair as the loop runs it: drafter call, then verify, per pair and per component.

Then ``pair - (verify + drafter)`` with spinning ON is spinning plus cache eviction, with
spinning OFF it is cache eviction only, and their difference is what spinning costs. The
settings alternate run by run (ABAB); every figure is the median over ``--runs`` runs of
each run's median over ``--repeats`` calls, and the differences are taken within a run.
CPU ms per call (the whole process, all threads, over the loop) shows spinning as work.
Last, ``hyflash simulate BUNDLE --threads N --max-new-tokens 64`` runs in this process
with each setting (ABAB too) for bundles that carry a tokenizer. Writes
``ort_spinning.md`` and ``ort_spinning.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.argtypes import nonneg_float, positive_int, threads

SPIN_KEY = "session.intra_op.allow_spinning"
SETTINGS = {"on": "1", "off": "0"}  # spinning: ORT's default / the product's setting


@contextlib.contextmanager
def spinning(on: bool):
    """Sessions opened meanwhile (through make_session) spin like ORT's default if on."""
    import onnxruntime as ort

    real = ort.InferenceSession
    if not on:
        yield
        return

    def session(path, opts=None, **kw):
        opts.add_session_config_entry(SPIN_KEY, "1")  # overrides make_session's "0"
        return real(path, opts, **kw)

    ort.InferenceSession = session
    try:
        yield
    finally:
        ort.InferenceSession = real


def open_pair(bundle: Path, n_threads: int, setting: str):
    """(bundle, target, drafter) with every session's spinning checked to be `setting`."""
    from hyflash.runtime.onnx_backend import load_onnx_pair

    with spinning(setting == "on"):
        pair = load_onnx_pair(bundle, threads=n_threads, verify_hashes=False)
    _, target, drafter = pair
    for s in (target.session, drafter.step, drafter.commit_only):
        got = s.get_session_options().get_session_config_entry(SPIN_KEY)
        if got != SETTINGS[setting]:  # "off" is the product's own setting: it came back
            raise SystemExit(f"spinning {setting}: a session has {SPIN_KEY} = {got}, not "
                             f"{SETTINGS[setting]} (hyflash.runtime.onnx_session.make_session)")
    return pair


def pocket_bundle() -> Path:
    """The pocket pair (target pocket, drafter pocket, context 2048) as an fp32 ONNX bundle
    in the hyflash cache, exported on first use or when the format moved on."""
    import shutil

    from hyflash.bundle import read_bundle
    from hyflash.errors import HyflashError
    from hyflash.export.bundle import export_onnx_bundle
    from hyflash.models.gguf import cache_root

    out = cache_root() / "benchmarks" / "ort_spinning" / "pocket-fp32"
    if (out / "manifest.json").exists():
        try:
            read_bundle(out, verify_hashes=False)
            return out
        except HyflashError:
            shutil.rmtree(out)
    export_onnx_bundle("pocket", "pocket", out, "fp32", max_seq_len=2048, progress=False)
    return out


def wait_for_quiet(max_load: float, tries: int = 10, pause: int = 60) -> list[float]:
    """1-minute load averages seen, waiting while above max_load (up to `tries` pauses)."""
    seen = [round(os.getloadavg()[0], 2)]
    while seen[-1] > max_load and len(seen) <= tries:
        print(f"load {seen[-1]:.2f} > {max_load}: waiting {pause} s", flush=True)
        time.sleep(pause)
        seen.append(round(os.getloadavg()[0], 2))
    return seen


class Loop:
    """One opened pair at a fixed context: the target holds `context` positions and each
    verify is rolled back to it; the drafter is refilled with the context's features."""

    def __init__(self, pair, context: int, seed: int = 0):
        bundle, self.target, self.drafter = pair
        self.block = bundle.manifest.block_size
        ids = np.random.default_rng(seed).integers(1, self.target.vocab_size, context)
        self.prompt = torch.from_numpy(ids)
        self.context = context
        self.target.reset()
        _, self.features = self.target.forward(self.prompt, 0)

    def refill_drafter(self) -> None:
        d = self.drafter
        d.reset()
        d.commit(self.features)
        d.draft(int(self.prompt[-1]), self.context)  # absorbs the context (commit-only calls)

    def verify(self) -> None:
        self.target.forward(self.prompt[:self.block], self.context)
        self.target.rollback(self.context)

    def draft(self) -> None:
        d = self.drafter
        d.commit(self.features[:self.block])  # a fully accepted block, as after a verify
        d.draft(int(self.prompt[0]), d.count + d.n_pending)


def timed(steps: dict, repeats: int) -> dict[str, float]:
    """Wall ms per step (median over repeats, after two warm-ups) of a sequence of steps
    run in order each repeat, their sum per repeat as "pair" when there are several, and
    "cpu": the process's CPU ms per repeat over the timed loop (all threads)."""
    wall = {k: [] for k in steps}
    for i in range(repeats + 2):
        if i == 2:
            c0 = time.process_time()
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
    cpu = 1000 * (time.process_time() - c0) / repeats
    out = {k: 1000 * statistics.median(v[2:]) for k, v in wall.items()}
    if len(steps) > 1:
        out["pair"] = 1000 * statistics.median(sum(x) for x in zip(
            *(v[2:] for v in wall.values()), strict=True))
    return {**out, "cpu": cpu}


def one_run(loop: Loop, repeats: int) -> dict[str, float]:
    loop.refill_drafter()
    a = timed({"verify": loop.verify}, repeats)
    b = timed({"drafter": loop.draft}, repeats)
    loop.refill_drafter()
    c = timed({"drafter": loop.draft, "verify": loop.verify}, repeats)
    row = {"verify_alone": a["verify"], "verify_alone_cpu": a["cpu"],
           "drafter_alone": b["drafter"], "drafter_alone_cpu": b["cpu"],
           "pair": c["pair"], "pair_verify": c["verify"], "pair_drafter": c["drafter"],
           "pair_cpu": c["cpu"]}
    row["interleaving_cost"] = row["pair"] - row["verify_alone"] - row["drafter_alone"]
    return {k: round(v, 3) for k, v in row.items()}


def median_row(rows: list[dict]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


def measure_calls(bundle: Path, n_threads: int, runs: int, repeats: int,
                  context: int) -> dict:
    loops = {s: Loop(open_pair(bundle, n_threads, s), context) for s in SETTINGS}
    runs_by = {s: [] for s in SETTINGS}
    for r in range(runs):
        for s, loop in loops.items():  # ABAB
            runs_by[s].append({**one_run(loop, repeats), "load": round(os.getloadavg()[0], 2)})
            print(f"{bundle.name} run {r + 1} spinning {s}: {runs_by[s][-1]}", flush=True)
    return {"medians": {s: median_row(v) for s, v in runs_by.items()},
            "spinning": spinning_split(runs_by["on"], runs_by["off"]),
            "runs": runs_by, "block_size": loops["off"].block}


def spinning_split(on: list[dict], off: list[dict]) -> dict[str, float]:
    """Medians over runs of run-paired differences. pair(on) - pair(off) splits exactly
    into spinning's cost to the calls alone (its threads against other processes) and its
    cost between the two sessions (interleaving cost on - off); the interleaving cost
    with spinning off is the cache eviction."""
    def alone(r: dict) -> float:
        return r["verify_alone"] + r["drafter_alone"]

    diffs = {"pair_on_minus_off": [a["pair"] - b["pair"] for a, b in zip(on, off, strict=True)],
             "alone_on_minus_off": [alone(a) - alone(b) for a, b in zip(on, off, strict=True)],
             "between_sessions": [a["interleaving_cost"] - b["interleaving_cost"]
                                  for a, b in zip(on, off, strict=True)],
             "cache_eviction": [b["interleaving_cost"] for b in off]}
    return {k: round(statistics.median(v), 3) for k, v in diffs.items()}


def simulate_speedups(bundle: Path, n_threads: int, runs: int, new_tokens: int) -> dict:
    """`hyflash simulate BUNDLE --threads N --max-new-tokens M`, in this process, with
    spinning on and off alternately; the report's summary of each run."""
    from hyflash.simulate import command as simulate

    p = argparse.ArgumentParser()
    simulate.add_arguments(p)
    out = {s: [] for s in SETTINGS}
    for _ in range(runs):
        for s in SETTINGS:
            with tempfile.TemporaryDirectory() as tmp, spinning(s == "on"), \
                    contextlib.redirect_stdout(io.StringIO()):
                simulate.run(p.parse_args([str(bundle), "--threads", str(n_threads),
                                           "--max-new-tokens", str(new_tokens),
                                           "--out", tmp, "--no-progress"]))
                summary = json.loads((Path(tmp) / "report.json").read_text())["summary"]
            keep = ("speedup", "tau", "plain_tokens_per_s", "spec_tokens_per_s",
                    "ms_per_drafter_call", "ms_per_verify_call", "ms_per_plain_decode_call")
            out[s].append({k: round(summary[k], 3) for k in keep})
            print(f"{bundle.name} simulate spinning {s}: {out[s][-1]}", flush=True)
    return {"medians": {s: median_row(v) for s, v in out.items()}, "runs": out}


def has_tokenizer(bundle: Path) -> bool:
    return any((bundle / f).exists() for f in ("tokenizer.json", "tokenizer.model",
                                               "vocab.json"))


def markdown(results: dict, command: str) -> str:
    out = ["# ONNX Runtime spinning vs cache eviction in the speculative loop", "",
           f"`{command}`", "",
           f"Threads {results['threads']}, context {results['context']}; medians over "
           f"{results['runs']} runs (settings alternating ABAB) of each run's median over "
           f"{results['repeats']} calls. Load average (1 min) before each bundle: "
           + ", ".join(f"{k}: {v}" for k, v in results["load"].items()) + ".", "",
           "Wall ms per call (CPU ms of the process per call, all threads). *interleaving "
           "cost* = pair - verify alone - drafter alone: with spinning on it is spinning + "
           "cache eviction, with spinning off cache eviction only.", "",
           "| bundle | spinning | verify alone | drafter alone | pair | verify in pair | "
           "drafter in pair | interleaving cost | load |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["bundles"].items():
        for s in SETTINGS:
            m = r["calls"]["medians"][s]
            out.append(f"| {name} | {s} | {m['verify_alone']:.2f} ({m['verify_alone_cpu']:.2f}) "
                       f"| {m['drafter_alone']:.2f} ({m['drafter_alone_cpu']:.2f}) | "
                       f"{m['pair']:.2f} ({m['pair_cpu']:.2f}) | {m['pair_verify']:.2f} | "
                       f"{m['pair_drafter']:.2f} | {m['interleaving_cost']:.2f} | "
                       f"{m['load']:.2f} |")
    out += ["", "Spinning's cost, split (ms; medians over runs of differences within a run; "
            "*pair on - off* = *on lone calls* + *between the sessions*):", "",
            "| bundle | pair on - off | on lone calls (alone on - off) | between the sessions "
            "(interleaving cost on - off) | cache eviction (interleaving cost, off) |",
            "|---|---|---|---|---|"]
    for name, r in results["bundles"].items():
        c = r["calls"]["spinning"]
        out.append(f"| {name} | {c['pair_on_minus_off']:.2f} | {c['alone_on_minus_off']:.2f} | "
                   f"{c['between_sessions']:.2f} | {c['cache_eviction']:.2f} |")
    out += ["", "`hyflash simulate BUNDLE --threads "
            f"{results['threads']} --max-new-tokens {results['simulate_tokens']}` "
            "(in process, ABAB, medians):", "",
            "| bundle | spinning | speedup | tau | plain tok/s | spec tok/s | ms drafter | "
            "ms verify | ms decode |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["bundles"].items():
        sim = r.get("simulate")
        if not isinstance(sim, dict):
            out.append(f"| {name} | - | {sim} | | | | | | |")
            continue
        for s in SETTINGS:
            m = sim["medians"][s]
            out.append(f"| {name} | {s} | {m['speedup']:.2f}x | {m['tau']:.2f} | "
                       f"{m['plain_tokens_per_s']:.1f} | {m['spec_tokens_per_s']:.1f} | "
                       f"{m['ms_per_drafter_call']:.2f} | {m['ms_per_verify_call']:.2f} | "
                       f"{m['ms_per_plain_decode_call']:.2f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", action="append", metavar="DIR",
                   help="an ONNX bundle, or `pocket` (default) for the pocket pair; repeatable")
    p.add_argument("--threads", type=threads, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--runs", type=positive_int, default=5, help="runs per setting (ABAB)")
    p.add_argument("--repeats", type=positive_int, default=25, help="calls per run")
    p.add_argument("--context", type=positive_int, default=512)
    p.add_argument("--simulate-runs", type=positive_int, default=5)
    p.add_argument("--simulate-tokens", type=positive_int, default=64)
    p.add_argument("--max-load", type=nonneg_float, default=2.5,
                   help="wait (60 s, up to 10 times) while the 1-minute load is above this")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = p.parse_args()
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the override of the spinning entry warns
    torch.set_num_threads(1)
    results = {"threads": a.threads, "context": a.context, "runs": a.runs,
               "repeats": a.repeats, "simulate_tokens": a.simulate_tokens,
               "load": {}, "bundles": {}}
    for spec in a.bundle or ["pocket"]:
        bundle = pocket_bundle() if spec == "pocket" else Path(spec)
        name = "pocket" if spec == "pocket" else f"{bundle.parent.name}/{bundle.name}"
        results["load"][name] = wait_for_quiet(a.max_load)
        r = {"path": str(bundle),
             "calls": measure_calls(bundle, a.threads, a.runs, a.repeats, a.context)}
        r["simulate"] = (simulate_speedups(bundle, a.threads, a.simulate_runs,
                                           a.simulate_tokens) if has_tokenizer(bundle)
                         else "not run: the bundle has no tokenizer")
        results["bundles"][name] = r
    results["load"]["after"] = [round(os.getloadavg()[0], 2)]
    command = "python " + shlex.join(["benchmarks/ort_spinning.py", *sys.argv[1:]])
    results["command"] = command
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ort_spinning.json").write_text(json.dumps(results, indent=1) + "\n")
    md = markdown(results, command)
    (a.out / "ort_spinning.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
