"""The bench's results: Markdown, JSON and a PNG, with the goals judged in plain words.

Files are ``bench-SUITE.{md,json,png}``; a run with an untrained drafter is a dry run,
written as ``bench-SUITE-dryrun.*`` and saying so at the top, its tau figures marked as
meaningless (its speed rows still measure the calls).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

DRY = ("DRY RUN: the drafter is untrained (no training report in its config.json). Its tau, "
       "acceptance and speculative speed say nothing about HyFlash; plain rows and per-call "
       "costs are valid.")


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {"cores": os.cpu_count(), "arch": platform.machine(),
            "load_average_at_start": [round(x, 2) for x in load],
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M")}


def command_line(args) -> str:
    argv = ["hyflash", "bench"] + [a for a in sys.argv[2:]] if sys.argv[1:2] == ["bench"] \
        else ["hyflash", "bench", *(["--quick"] if args.quick else ["--suite", args.suite])]
    return shlex.join(argv)


def stem(result: dict) -> str:
    return f"bench-{result['suite']}" + ("-dryrun" if result["dry_run"] else "")


def fmt(x, spec: str = "%.1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec % x


# ---------------------------------------------------------------------- goals

def goals(result: dict) -> list[dict]:
    out = []
    speed = result.get("speed")
    if speed:
        rows = speed["rows"]
        ours = max((r for r in rows if r["group"] == "ours"), key=lambda r: r["tokens_per_s"],
                   default=None)
        peer = max((r for r in rows if r["group"] == "peer"), key=lambda r: r["tokens_per_s"],
                   default=None)
        model = "SmolLM2-135M" if result["suite"] == "smollm2" else \
            "this model (the goal is stated for SmolLM2-135M)"
        missing = [s["label"] for s in speed.get("skipped", []) if s["group"] == "peer"]
        if ours and peer:
            x = ours["tokens_per_s"] / peer["tokens_per_s"]
            verdict = ("Dry run, no verdict (untrained drafter)" if result["dry_run"] else
                       "Met" if x >= 2 else "Missed")
            if missing and x >= 2 and not result["dry_run"]:
                verdict = "Met against the peers that ran only"
            caveat = (f" Peers that did not run here, so are not in the comparison: "
                      f"{', '.join(missing)}." if missing else "")
            out.append({"goal": "our fastest configuration >= 2x the best peer's tokens/s",
                        "met": None if result["dry_run"] or (missing and x >= 2) else x >= 2,
                        "text": (
                            f"{verdict} on {model}: our fastest, "
                            f"{ours['system']} ({ours['mode']}), {ours['tokens_per_s']:.1f} tok/s "
                            f"is {x:.2f}x the best peer, {peer['system']} ({peer['mode']}), "
                            f"{peer['tokens_per_s']:.1f} tok/s.{caveat}")})
        else:
            out.append({"goal": "our fastest configuration >= 2x the best peer's tokens/s",
                        "met": None, "text": "Not judged: no peer ran in this suite."})
        out.append(speedup_goal(rows, result["dry_run"]))
        claims = [r for r in rows if "identical" in r and r["group"] == "ours"]
        bad = [f"{r['system']} / {r['mode']}" for r in claims if not r["identical"]]
        out.append({"goal": "identical greedy output to plain decoding in every speculative "
                            "configuration", "met": not bad and bool(claims), "text": (
                    f"Met: all {len(claims)} speculative configurations gave exactly the tokens "
                    "of plain decoding of the same export." if claims and not bad else
                    f"MISSED: {', '.join(bad)} differ from plain decoding." if bad else
                    "Not judged: no speculative configuration ran.")})
    acc = result.get("acceptance")
    if acc:
        out.append(tau_goal(acc, result["dry_run"]))
    return out


DRAFTER_MODES = ("speculative", "speculative+auto-rows")  # the drafter alone, no lookup


def speedup_goal(rows: list[dict], dry: bool) -> dict:
    """Issue #11's goal, per export of ours: drafting with the HyFlash drafter >= 2x the
    same export's plain decoding, in the decode phase (the prefill is the same work)."""
    goal = "speculative decoding >= 2x plain decoding of the same export (decode phase)"
    best: dict[str, dict] = {}
    for r in rows:
        if r["group"] == "ours" and r["mode"] in DRAFTER_MODES and \
                r.get("decode_speedup_vs_plain") is not None:
            if r["system"] not in best or r["decode_speedup_vs_plain"] > \
                    best[r["system"]]["decode_speedup_vs_plain"]:
                best[r["system"]] = r
    if dry or not best:
        return {"goal": goal, "met": None, "text": "Not judged: " + (
            "dry run (untrained drafter)." if dry else "no export of ours reported its prefill.")}
    cases = "; ".join(f"{s} ({r['mode']}) {r['decode_speedup_vs_plain']:.2f}x, tau "
                      f"{r['tau']:.2f}" for s, r in best.items())
    met = all(r["decode_speedup_vs_plain"] >= 2 for r in best.values())
    return {"goal": goal, "met": met, "text": ("Met" if met else "Missed") + f": {cases}."}


def tau_goal(acc: dict, dry: bool) -> dict:
    goal = "HyFlash tau >= full-context tau at every context >= 1024"
    if dry:
        return {"goal": goal, "met": None, "text": "Not judged: dry run (untrained drafter)."}
    by = {(r["drafter"], r["context"], r["temperature"]): r["tau"] for r in acc["rows"]}
    pairs = [(c, t, by[("hyflash", c, t)], by.get(("full-context", c, t)))
             for (_, c, t) in by if _ == "hyflash" and c >= 1024]
    pairs = [p for p in pairs if p[3] is not None]
    if not pairs:
        return {"goal": goal, "met": None,
                "text": "Not judged: no full-context drafter, or no context >= 1024 fits."}
    lost = [p for p in pairs if p[2] < p[3]]
    cases = "; ".join(f"context {c}, temperature {t:g}: {h:.2f} vs {f:.2f}"
                      for c, t, h, f in pairs)
    return {"goal": goal, "met": not lost,
            "text": ("Met" if not lost else f"Missed at {len(lost)} of {len(pairs)}") +
                    f" (HyFlash vs full-context tau): {cases}."}


# ---------------------------------------------------------------------- text

def speed_table(speed: dict, dry: bool) -> list[str]:
    rows = speed["rows"]
    peers = [r["tokens_per_s"] for r in rows if r["group"] == "peer"]
    best_peer = max(peers) if peers else None
    lines = ["| system | quant | mode | tok/s | vs its plain | vs best peer | decode tok/s | "
             "decode vs its plain | tau | identical to plain | first diff vs reference | peak "
             "RSS MiB | runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["group"] != "ours", -r["tokens_per_s"])):
        same = "-" if "identical" not in r else "yes" if r["identical"] else "**NO**"
        diff = r.get("first_diff_vs_reference")
        tau = "dry run" if dry and r.get("tau") else fmt(r.get("tau"), "%.2f")
        lines.append(f"| {r['system']} | {r['quant']} | {r['mode']} | {r['tokens_per_s']:.1f} | "
                     f"{fmt(r.get('speedup_vs_plain'), '%.2fx')} | "
                     f"{fmt(r['tokens_per_s'] / best_peer if best_peer else None, '%.2fx')} | "
                     f"{fmt(r.get('decode_tokens_per_s'), '%.1f')} | "
                     f"{fmt(r.get('decode_speedup_vs_plain'), '%.2fx')} | {tau} | {same} | "
                     f"{'=' if diff is None else diff} | "
                     f"{r['peak_rss_mib']:.0f} | {r['runs']} |")
    return lines


def acceptance_table(acc: dict, dry: bool) -> list[str]:
    ctxs = acc["contexts"]
    lines = ["| drafter | temperature | " + " | ".join(f"tau @ {c}" for c in ctxs) + " |",
             "|---|---|" + "---|" * len(ctxs)]
    by = {(r["drafter"], r["temperature"], r["context"]): r for r in acc["rows"]}
    for name, temp in dict.fromkeys((r["drafter"], r["temperature"]) for r in acc["rows"]):
        cells = ["dry run" if dry else fmt(by[(name, temp, c)]["tau"], "%.2f")
                 if (name, temp, c) in by else "-" for c in ctxs]
        lines.append(f"| {name} | {temp:g} | " + " | ".join(cells) + " |")
    lines += ["", "| drafter | temperature | context | acceptance by draft position |",
              "|---|---|---|---|"]
    for r in acc["rows"]:
        lines.append(f"| {r['drafter']} | {r['temperature']:g} | {r['context']} | "
                     + ("dry run" if dry else " ".join(fmt(a, "%.2f") for a in r["acceptance"]))
                     + " |")
    return lines


def memory_table(mem: dict) -> list[str]:
    ctxs = mem["contexts"]
    lines = ["| drafter | window layout | " + " | ".join(f"{c} tok" for c in ctxs) + " |",
             "|---|---|" + "---|" * len(ctxs)]
    for r in mem["rows"]:
        lines.append(f"| {r['drafter']} | {r['layout']} | "
                     + " | ".join(f"{r['bytes'][c] / 1024:.0f} KiB" for c in ctxs) + " |")
    lines.append("| (target KV cache, fp32) | | " + " | ".join(
        f"{mem['target_kv_bytes'][c] / 1024:.0f} KiB" for c in ctxs) + " |")
    return lines


def markdown(result: dict) -> str:
    m = result["machine"]
    out = [f"# hyflash bench: {result['suite']}", ""]
    if result["dry_run"]:
        out += [f"**{DRY}**", ""]
    out += [f"`{result['command']}` ({m['date']}, {result['seconds']:.0f} s): target "
            f"`{result['target']}`, drafter `{result['drafter']}`, full-context baseline "
            f"`{result['baseline'] or 'none'}`; {m['cores']} cores ({m['arch']}), load "
            f"average {m['load_average_at_start'][0]} at the start; {result['threads']} "
            f"thread(s) per system; medians of {result['runs']} rounds, every system in a "
            "fresh process per round, systems interleaved.", "", "## Goals", ""]
    out += [f"- **{g['goal']}**: {g['text']}" for g in result["goals"]]
    speed = result.get("speed")
    if speed:
        out += ["", "## Speed", "",
                f"Greedy, {result['new_tokens']} new tokens (EOS ignored) after each of "
                f"{len(speed['prompt_tokens'])} held-out code prompts of "
                f"{', '.join(map(str, speed['prompt_tokens']))} tokens; tok/s = all new tokens "
                "over the wall time of the generate calls, prefill included; *decode tok/s*: "
                "the tokens after the first over the time after the prefill (ours only: "
                "the prefill is the same work in every mode). *identical to "
                "plain*: the speculative / lookup tokens equal the same system's plain decoding "
                "(asserted for ours). *first diff vs reference*: first position where a row's "
                f"tokens leave `{speed['rows'][0].get('reference', '-') if speed['rows'] else '-'}`"
                " (`=`: never; quantized and other runtimes may differ).", ""]
        out += speed_table(speed, result["dry_run"])
        notes = [f"- {r['system']}: {r['note']}" for r in
                 {r["system"]: r for r in speed["rows"] if r.get("note")}.values()]
        if notes:
            out += ["", *notes]
        if speed["skipped"]:
            out += ["", "Not run here (never dropped silently):", ""]
            out += [f"- **{s['label']}**: {s['reason']}" for s in speed["skipped"]]
    acc = result.get("acceptance")
    if acc:
        cut = "; ".join(f"{c} cut to {v} (the context limit)" for c, v in acc["cut"].items())
        first = acc["rows"][0] if acc["rows"] else {"prompts": 0, "new_tokens": 0}
        out += ["", "## Acceptance", "",
                f"Reference engine (torch), {first['prompts']} windows of held-out code per "
                f"context, {first['new_tokens']} new tokens; temperature 1 = rejection "
                f"sampling, a seed per prompt. {cut}", ""]
        out += acceptance_table(acc, result["dry_run"])
    mem = result.get("memory")
    if mem:
        out += ["", "## Draft-side memory (fp32) vs context", ""] + memory_table(mem)
    return "\n".join(out) + "\n"


def summary_text(result: dict) -> str:
    lines = [f"hyflash bench {result['suite']}" + (" (DRY RUN)" if result["dry_run"] else "")]
    for g in result["goals"]:
        lines.append(f"- {g['goal']}: {g['text']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- files

def clean(x):
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    return x


def scrub(result: dict) -> dict:
    """A dry run's JSON without acceptance figures: an untrained drafter's tau is noise
    nobody should quote."""
    drop = ("tau", "acceptance")
    out = dict(result)
    if "speed" in out:
        out["speed"] = {**out["speed"], "rows": [{k: v for k, v in r.items() if k not in drop}
                                                 for r in out["speed"]["rows"]]}
    if "acceptance" in out:
        out["acceptance"] = {**out["acceptance"], "rows": [
            {k: v for k, v in r.items() if k not in drop} for r in out["acceptance"]["rows"]]}
    return out


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    base = out / stem(result)
    files = [base.with_suffix(".md"), base.with_suffix(".json"), base.with_suffix(".png")]
    files[0].write_text(markdown(result))
    files[1].write_text(json.dumps(clean(scrub(result) if result["dry_run"] else result),
                                   indent=1) + "\n")
    from hyflash.bench.plot import plot

    plot(result, files[2])
    return files
