"""The C++ runtime (`build/native/hyflash-run`, `make native`) as a bench system.

It runs an ExecuTorch bundle's program with the loop in C++ and takes token ids, so it
gets the same prompts as every other system. Per prompt and mode one process with
``--repeat 2 --ignore-eos --json``: the first run is the warm-up, the second is timed
(its ``total_s``, prefill included, as the Python engine times a generate call). The
modes are the Python engine's (``worker.py``): plain, speculative, speculative+auto-rows
(``--draft-rows auto``), lookup (copied drafts only), speculative+lookup and adaptive (the
rate gate), by hyflash-run's flags.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hyflash.bench.systems import Skipped, System

BINARY = Path(__file__).resolve().parents[2] / "build" / "native" / "hyflash-run"
MODES = (("plain", ["--no-draft"]), ("speculative", []),
         ("speculative+auto-rows", ["--draft-rows", "auto"]),
         ("lookup", ["--lookup", "--no-draft"]),
         ("speculative+lookup", ["--lookup"]), ("adaptive", ["--lookup", "--adaptive"]))


def native_system(bundle: Path, quant: str) -> System | Skipped:
    label = f"ours C++ runtime (hyflash-run), ExecuTorch {quant}"
    if not BINARY.is_file():
        return Skipped(label, "ours", f"{BINARY} is not built: run `make native`")
    return System(label, "native", "ours", quant, {"folder": str(bundle)},
                  note="the same .pte as the ExecuTorch row, loop in C++")


def run_native(system: System, prompts: list[list[int]], new: int, threads: int) -> dict:
    modes, peak = {}, 0.0
    for mode, flags in MODES:
        tokens, seconds, rounds, accepted = [], [], 0, 0
        proposed = taken = None
        for ids in prompts:
            cmd = [str(BINARY), system.request["folder"], "--prompt-ids", ",".join(map(str, ids)),
                   "--max-new-tokens", str(new), "--threads", str(threads), "--repeat", "2",
                   "--ignore-eos", "--json", *flags]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"hyflash-run failed: {done.stderr.strip()[-300:]}")
            out = json.loads(done.stdout)
            timed = out["runs"][1]
            tokens.append(out["tokens"])
            seconds.append(timed["total_s"])
            rounds += timed["rounds"]
            accepted += timed["accepted_drafts"]
            peak = max(peak, timed["peak_rss_mib"])
            if timed["position_proposed"]:
                p, a = timed["position_proposed"], timed["position_accepted"]
                proposed = p if proposed is None else [x + y for x, y in zip(proposed, p,
                                                                             strict=True)]
                taken = a if taken is None else [x + y for x, y in zip(taken, a, strict=True)]
        modes[mode] = {"tokens": tokens, "seconds": seconds}
        if mode != "plain" and rounds:
            modes[mode]["tau"] = (accepted + rounds) / rounds
            modes[mode]["acceptance"] = [a / n if n else None
                                         for a, n in zip(taken, proposed, strict=True)]
    return {"modes": modes, "peak_rss_mib": peak}
