"""`hyflash budget`: does the pair fit the phone, with what headroom, and how fast will it run.

Sizes every memory term of a target + drafter pair (``memory``), checks the total against
device profiles (``devices``), projects decode speed per device (``roofline``), and with a
bundle can run it and put measured memory next to the estimate (``measure``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hyflash.argtypes import positive_int, threads
from hyflash.errors import HyflashError

RECIPES = ("fp32", "fp16", "int8", "int4", "8da4w", "8da8w")  # budget.recipes.RECIPE_NAMES


def tau_value(text: str) -> float:
    from hyflash.argtypes import finite_float

    value = finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (tokens per verify, bonus included), "
                                         f"got {value:g}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="a bundle, a model folder or config.json, a hub id (config only), a "
                        ".gguf file or a preset name (without: list presets and devices)")
    p.add_argument("--device", action="append", metavar="NAME",
                   help="device profile to check against (repeatable; default: all)")
    p.add_argument("--devices", metavar="FILE",
                   help="your own device profiles (JSON, as hyflash/budget/data/devices.json)")
    p.add_argument("--context", type=positive_int, metavar="TOKENS",
                   help="context the app holds (static KV cache; default: the model's, capped "
                        "at 4096)")
    p.add_argument("--quant", choices=RECIPES, help="weight quantization recipe (default fp32)")
    p.add_argument("--backend", choices=("onnx", "executorch"),
                   help="runtime (default: the recipe's exporter; onnx for fp32)")
    p.add_argument("--group-size", type=positive_int, help="8da4w: weights per int4 group")
    p.add_argument("--drafter", metavar="DIR_OR_ARCH",
                   help="a drafter folder, or hyflash (default) / full / none for a sized one")
    p.add_argument("--draft-vocab", type=positive_int, metavar="N",
                   help="the drafter scores N token ids (train --draft-vocab)")
    p.add_argument("--prefill-chunk", type=positive_int, metavar="ROWS",
                   help="tokens per prefill call (default 64)")
    p.add_argument("--tau", type=tau_value, help="tokens per verify for the speed projection "
                                                 "(default: the bundle's last simulate run)")
    p.add_argument("--tau-full", type=tau_value, help="tau of the full-context drafter "
                                                      "(default: --tau)")
    p.add_argument("--explain", action="store_true", help="print the formulas")
    p.add_argument("--sweep-context", action="store_true",
                   help="plot memory against context (PNG in --out)")
    p.add_argument("--measure", action="store_true",
                   help="run the bundle and compare the estimate with measured memory")
    p.add_argument("--prompt-tokens", type=positive_int,
                   help="--measure: prompt length (default: fill the context)")
    p.add_argument("--new-tokens", type=positive_int, default=32,
                   help="--measure: tokens to decode (default 32)")
    p.add_argument("--threads", type=threads, default=1, help="--measure: runtime threads")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", metavar="DIR", help="where plots and reports go (default: .)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from hyflash.budget import plan as planning
    from hyflash.budget import report
    from hyflash.budget.devices import device, profiles
    from hyflash.budget.memory import budget
    from hyflash.budget.roofline import calibration
    from hyflash.budget.sources import presets, resolve

    if args.source is None:
        print(listing(presets(), profiles(args.devices)))
        return 0
    check_args(args)
    src = resolve(args.source)
    devs = ([device(k, args.devices) for k in args.device] if args.device
            else list(profiles(args.devices).values()))
    plan = planning.build(src, args)
    tau, tau_full = taus(src, args, plan)
    cal = calibration()
    b = budget(plan)
    variants_text, totals = report.variants_table(plan)
    devices_text, verdicts = report.devices_table(b, devs, cal, tau, tau_full)
    out = report.as_json(b, src, totals, verdicts, cal, tau, tau_full)
    text = [f"hyflash budget: {report.describe(plan, src)}", "", report.terms_table(b), "",
            variants_text, "", devices_text]
    if plan.target.notes:
        text += ["", "approximated: " + "; ".join(plan.target.notes)]
    if args.explain:
        text += ["", report.explain(b, cal)]
    if args.sweep_context:
        from hyflash.budget.plot import plot

        path = Path(args.out or ".") / f"budget_{safe(src.target.name)}_context.png"
        plot(plan, devs, f"{src.target.name}, {plan.recipe_name()} on {plan.recipe.backend}", path)
        out["sweep_png"] = str(path)
        text += ["", f"memory vs context written to {path}"]
    if args.measure:
        text += ["", measure(src, plan, args, out)]
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print("\n".join(text))
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Flags that would be ignored are errors (before anything is read)."""
    if not args.measure and args.prompt_tokens is not None:
        raise HyflashError("--prompt-tokens sizes the run of --measure: add --measure or drop it")
    if args.tau_full is not None and args.tau is None:
        raise HyflashError("--tau-full needs --tau (the HyFlash drafter's): pass both")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise HyflashError(f"--out {args.out} is a file: pass a folder")


def taus(src, args, plan) -> tuple[float | None, float | None]:
    if args.tau is not None or plan.drafter is None:
        return args.tau, args.tau_full
    if src.kind == "bundle":
        from hyflash.budget.tau import recorded

        rec = recorded(src.name)
        if rec:
            src.facts["tau_record"] = rec
            return float(rec["tau"]), None
    return None, None


def measure(src, plan, args, out: dict) -> str:
    from hyflash.budget import measure as runner
    from hyflash.budget.measure_report import measured, table

    block = plan.drafter.block if plan.drafter else 1
    room = plan.context - args.new_tokens - block - 1
    prompt = args.prompt_tokens or room
    if prompt < 1 or prompt > room:
        raise HyflashError(f"--measure needs prompt + {args.new_tokens} new tokens + a block to "
                           f"fit the bundle's context of {plan.context}: pass --prompt-tokens "
                           f"<= {max(room, 1)} or fewer --new-tokens")
    stages = runner.run(str(src.name), prompt, args.new_tokens, args.threads,
                        progress=not args.no_progress)
    b, rows = measured(plan, src, stages, prompt)
    out["measure"] = {"prompt_tokens": prompt, "stages": stages, "checkpoints": rows,
                      "terms": [t.__dict__ for t in b.terms]}
    return table(rows, stages["run"], prompt)


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in name)


def listing(table: dict, devs: dict) -> str:
    lines = ["presets (hyflash budget NAME):"]
    lines += [f"  {k:<14} {v['source']}" for k, v in table.items()]
    lines.append("devices (--device NAME; --devices FILE adds your own):")
    lines += [f"  {d.key:<20} {d.name}: {d.app_limit_gib:g} GiB for one app of "
              f"{d.ram_gib:g} GiB, {d.bandwidth_gbs or '?'} GB/s" for d in devs.values()]
    return "\n".join(lines)
