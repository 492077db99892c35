"""`hyflash demo`: the three jobs end to end on the embedded pocket pair, offline.

1. **export** the pocket target + its shipped HyFlash drafter for a phone: ONNX int4 and
   ExecuTorch 8da4w (``exports``: a second run reuses bundles whose files and inputs are
   unchanged);
2. **simulate** each bundle on held-out code prompts exactly as the phone's loop runs it,
   streaming the first bundle's completions, against plain decoding of the same bundle
   (greedy: the outputs must be identical);
3. **size** the memory budget and project phone speed on a device profile, with the tau
   just measured (``hyflash budget``'s model).

Everything goes to one report folder: ``summary.md``, ``demo.json``, ``demo.png`` and each
bundle's simulate report (``BACKEND/report.{json,txt,png}``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from hyflash.argtypes import DEFAULT_THREADS, positive_int, threads
from hyflash.errors import HyflashError

BACKENDS = {"onnx": ("onnx", "int4"), "executorch": ("executorch", "8da4w")}
CONTEXT = 1024  # holds the prompts (~100-200 tokens), the window (64) and the completions
DEFAULT_DEVICE = "galaxy-s25"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", default="onnx,executorch", metavar="LIST",
                   help="which bundles to export and simulate: onnx (int4), executorch "
                        "(8da4w), comma-separated (default both)")
    p.add_argument("--prompts", type=positive_int, default=3,
                   help="held-out code prompts to complete (default 3)")
    p.add_argument("--max-new-tokens", type=positive_int, default=96)
    p.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                   help=f"device profile for the budget and the phone projection (default "
                        f"{DEFAULT_DEVICE}; `hyflash budget` lists them)")
    p.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"CPU threads of export and runtimes (default {DEFAULT_THREADS}: the "
                        "pocket model is too small to gain from more)")
    p.add_argument("--out", metavar="DIR",
                   help="report folder (default: demo/report in the hyflash cache)")
    p.add_argument("--work", metavar="DIR",
                   help="where the bundles are kept between runs (default: demo/bundles in "
                        "the hyflash cache)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def check_args(args: argparse.Namespace) -> list[str]:
    from hyflash.budget.phone import check_device

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or not backends:
        raise HyflashError(f"--backends takes {' and '.join(BACKENDS)}, not {args.backends!r}")
    check_device(args.device)
    for flag in ("out", "work"):
        value = getattr(args, flag)
        if value and Path(value).exists() and not Path(value).is_dir():
            raise HyflashError(f"--{flag} {value} is a file: pass a folder")
    return list(dict.fromkeys(backends))


def run(args: argparse.Namespace) -> int:
    from hyflash.bench import demo_report, exports
    from hyflash.bench.prompts import code_prompts
    from hyflash.models.gguf import cache_root

    backends = check_args(args)
    started = time.perf_counter()
    work = Path(args.work) if args.work else cache_root() / "demo" / "bundles"
    out = Path(args.out) if args.out else cache_root() / "demo" / "report"
    print("HyFlash demo: the pocket code model (5.5M parameters) and its HyFlash drafter "
          "(1.8M), offline\n")
    print(f"[1/3] export for a phone ({', '.join(f'{b} {BACKENDS[b][1]}' for b in backends)})")
    bundles = {}
    for b in backends:
        backend, quant = BACKENDS[b]
        spec = exports.ExportSpec("pocket", "pocket", backend, quant, CONTEXT)
        done = exports.ensure(spec, work, args.threads, progress=not args.no_progress,
                              say=lambda m: print(f"      {m}", flush=True))
        took = "" if done.reused else f" in {done.seconds:.0f} s"
        print(f"      {b} {quant}: {done.folder} {done.note}{took}")
        bundles[b] = done
    prompts = code_prompts(args.prompts)
    print(f"\n[2/3] simulate on {len(prompts)} held-out code prompts (stdlib files no model "
          f"here trained on), greedy, {args.max_new_tokens} new tokens, plain vs HyFlash")
    results = {}
    for i, b in enumerate(backends):
        results[b] = simulate(bundles[b].folder, prompts, args, stream=i == 0)
    print(f"\n[3/3] memory budget and phone projection ({args.device})")
    for b in backends:
        results[b]["budget"] = budget_text(bundles[b].folder)
        print(f"\n{b} {BACKENDS[b][1]} bundle:\n{results[b]['budget']}")
    print()
    print(demo_report.table(results))
    files = demo_report.write(out, results, bundles, args, time.perf_counter() - started)
    print(f"\nreport: {out}/ ({', '.join(f.name for f in files)})")
    print(f"took {time.perf_counter() - started:.0f} s; a second run reuses the bundles in "
          f"{work}")
    return 0


def simulate(folder: Path, prompts: list[str], args, stream: bool) -> dict:
    """Plain and speculative decoding of every prompt with the bundle's runtime (as
    `hyflash simulate`), the speculative completions streamed when asked."""
    import torch

    from hyflash.budget.phone import projection
    from hyflash.budget.tau import record
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.open_bundle import open_bundle
    from hyflash.simulate.report import Report

    torch.set_num_threads(args.threads)
    with native_stderr_quiet():  # runtimes' own load-time logging (cpuinfo, thread pool)
        bundle, target, drafter = open_bundle(folder, threads=args.threads)
    tok = load_tokenizer(bundle.folder)
    eos = sorted(set(target.eos_token_ids) | ({tok.eos_token_id} - {None}))
    plain, spec = SpeculativeEngine(target), SpeculativeEngine(target, drafter)
    kw = dict(max_new_tokens=args.max_new_tokens, eos_ids=eos)
    ids = [tok(p).input_ids for p in prompts]
    for engine in (plain, spec):  # first calls allocate and plan: not in the numbers
        engine.generate(ids[0][:8], max_new_tokens=8)
    ns = argparse.Namespace(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
                            threads=args.threads)
    report = Report(bundle, ns, len(ids))
    name = f"{bundle.manifest.backend} {bundle.manifest.quantization.recipe}"
    for i, (text, p) in enumerate(zip(prompts, ids, strict=True)):
        drafter.calls = {"step": 0, "commit": 0}
        if stream:
            print(f"\n--- prompt {i + 1} ({len(p)} tokens), ends with: "
                  f"{text.rstrip().splitlines()[-1].strip()}")
        b = spec.generate(p, **kw, on_token=Streamer(tok) if stream else None)
        calls = dict(drafter.calls)
        a = plain.generate(p, **kw)
        report.add(i, a, b, calls, drafter.state_bytes(), target.kv_bytes())
        s = report.rows[-1]
        stop = (f"{b.stats.new_tokens} tokens" if b.stats.stop_reason != "eos" else
                f"stopped on EOS after {b.stats.new_tokens} token(s)")
        tau = "-" if b.stats.rounds == 0 else f"{b.stats.tau:.2f}"
        print(("\n" if stream else "") + f"      {name} prompt {i + 1}: {stop}, tau {tau}, "
              f"{s['spec_tokens_per_s']:.0f} tok/s vs plain {s['plain_tokens_per_s']:.0f}, "
              f"identical to plain: {'yes' if s['identical'] else 'NO'}", flush=True)
    report.finish()
    record(bundle.folder, report.summary, report.meta)  # `hyflash budget` projects with it
    report.phone = projection(bundle.folder, args.device, report.summary)
    return {"report": report, "folder": str(bundle.folder), "recipe": name}


@contextlib.contextmanager
def native_stderr_quiet():
    """Silence what native libraries write straight to file descriptor 2 while a runtime
    loads (ExecuTorch logs its CPU probing and thread pool); Python errors still raise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Streamer:
    """Prints a completion as its tokens are committed (decoded as a whole, so byte-level
    tokens that only make a character together print once they do)."""

    def __init__(self, tok):
        self.tok, self.ids, self.shown = tok, [], ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text


def budget_text(folder: Path) -> str:
    from hyflash.budget.memory import budget
    from hyflash.budget.plan import for_bundle
    from hyflash.budget.report import terms_table
    from hyflash.budget.sources import resolve

    return terms_table(budget(for_bundle(resolve(str(folder)))))
