"""`hyflash bench`: our runtimes against what users would pick instead, side by side.

One run: export (or reuse) the bundles, run every system round robin in fresh processes
(medians of --runs), measure acceptance by context and draft-side memory, and write
``bench-SUITE.md`` / ``.json`` / ``.png`` to --out with the goals judged in plain words.
Greedy speculative output must equal plain decoding of the same export: the report
records it per row and the command fails (after writing it) if any row differs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hyflash.argtypes import positive_int, threads
from hyflash.errors import HyflashError

SUITES = ("standard", "pocket", "smollm2")
PARTS = ("speed", "acceptance", "memory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=SUITES, default="standard",
                   help="standard (= pocket: the embedded pocket pair) or smollm2 "
                        "(SmolLM2-135M-Instruct's GGUF from the hyflash cache; needs --drafter)")
    p.add_argument("--quick", action="store_true",
                   help="a seconds-long run on the pocket pair (what the test suite runs)")
    p.add_argument("--target", metavar="PATH", help="the target (default: the suite's)")
    p.add_argument("--drafter", metavar="DIR", help="its HyFlash drafter (default: the suite's; "
                                                    "smollm2: required, the repository ships "
                                                    "benchmarks/drafters/smollm2-hyflash)")
    p.add_argument("--baseline", metavar="DIR", help="the full-context drafter trained like it "
                                                     "(default pocket-full for the pocket pair)")
    p.add_argument("--runs", type=positive_int, default=3,
                   help="rounds per configuration, each in a fresh process; medians reported")
    p.add_argument("--threads", type=threads, default=1,
                   help="threads of every system (default 1: on a shared 2-core machine a "
                        "second thread spins against other jobs)")
    p.add_argument("--new-tokens", type=positive_int, default=None,
                   help="tokens per generation in the speed rows (default 128; --quick 16)")
    p.add_argument("--parts", default=",".join(PARTS), metavar="LIST",
                   help=f"what to measure, comma-separated (default {','.join(PARTS)})")
    p.add_argument("--configs", metavar="LIST",
                   help="only these of our export configurations, comma-separated by name "
                        "(onnx-lean-fp32, onnx-optimum-int4, executorch-8da4w, ...; default all)")
    p.add_argument("--no-peers", action="store_true",
                   help="our configurations and transformers generate only (it needs "
                        "nothing beyond this venv); no optimum, onnxruntime-genai or "
                        "llama.cpp")
    p.add_argument("--setup-peers", action="store_true",
                   help="create the venvs and builds peers need (pip; llama.cpp compiles "
                        "~30 min once); without it a missing peer is reported as such")
    p.add_argument("--work", metavar="DIR",
                   help="where the bundles and peer builds are kept between runs (default: "
                        "bench/SUITE in the hyflash cache)")
    p.add_argument("--out", metavar="DIR", default="benchmarks/results",
                   help="where bench-SUITE.md / .json / .png go (default benchmarks/results)")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument("--list", action="store_true",
                   help="list the suites and the focused scripts in benchmarks/")
    p.add_argument("--script", metavar="NAME",
                   help="run benchmarks/NAME.py instead of a suite; its arguments follow --")
    p.add_argument("script_args", nargs="*", metavar="-- ARGS", help=argparse.SUPPRESS)


def check_args(args: argparse.Namespace) -> list[str]:
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        raise HyflashError(f"--parts takes {', '.join(PARTS)}, not {args.parts!r}")
    if args.quick and args.suite != "standard":
        raise HyflashError("--quick is its own suite (the pocket pair): drop --suite")
    if args.suite == "smollm2" and not args.drafter:
        raise HyflashError("--suite smollm2 needs --drafter DIR: the repository ships one "
                           "in benchmarks/drafters/smollm2-hyflash (`python benchmarks/"
                           "smollm2_drafter.py` rebuilds it into ~/.cache/hyflash/runs/"
                           "smollm2-hyflash)")
    for flag in ("out", "work"):
        value = getattr(args, flag)
        if value and Path(value).exists() and not Path(value).is_dir():
            raise HyflashError(f"--{flag} {value} is a file: pass a folder")
    return parts


def untrained(drafter: str) -> bool:
    """A drafter folder without a training report was initialised, not trained: its tau
    means nothing (its speed rows still measure the calls)."""
    from hyflash.models.drafter_folder import read_drafter_config

    return "training" not in read_drafter_config(drafter)[2]


def run(args: argparse.Namespace) -> int:
    from hyflash.bench import report, runs, scripts, suites
    from hyflash.models.gguf import cache_root

    if args.list:
        print(scripts.listing(("standard (= pocket)", "smollm2")))
        return 0
    if args.script:
        return scripts.run_script(args.script, args.script_args)
    if args.script_args:
        raise HyflashError(f"arguments after -- ({' '.join(args.script_args)}) go to a "
                           "--script: add --script NAME or drop them")
    parts = check_args(args)
    cache = cache_root()
    suite = suites.build(args, cache)
    say = (lambda *a, **k: None) if args.no_progress else (lambda m: print(m, flush=True))
    if args.configs:
        names = [c.strip() for c in args.configs.split(",") if c.strip()]
        known = [e.name for e in suite.exports]
        bad = [n for n in names if n not in known]
        if bad:
            raise HyflashError(f"--configs: {bad[0]} is not one of this suite's: "
                               f"{', '.join(known)}")
        suite.exports = [e for e in suite.exports if e.name in names]
    if args.no_peers:
        suite.peers = False
    dry = untrained(suite.drafter)
    started = time.time()
    result = {"suite": suite.name, "target": suite.target, "drafter": suite.drafter,
              "baseline": suite.baseline, "dry_run": dry, "threads": args.threads,
              "runs": args.runs, "new_tokens": suite.new_tokens, "parts": parts,
              "machine": report.machine(), "command": report.command_line(args)}
    if "speed" in parts:
        result["speed"] = speed(args, suite, cache, say)
    if "acceptance" in parts:
        from hyflash.bench import acceptance

        drafters = {"hyflash": suite.drafter, **({"full-context": suite.baseline}
                                                 if suite.baseline else {})}
        say(f"acceptance: {', '.join(drafters)} at contexts {suite.contexts}")
        result["acceptance"] = acceptance.measure(
            suite.target, drafters, suite.contexts, suite.acceptance_prompts,
            suite.acceptance_new_tokens, [0.0, 1.0], args.threads,
            say=None if args.no_progress else say)
    if "memory" in parts:
        from hyflash.bench import memory

        result["memory"] = memory.table({"hyflash": suite.drafter, **(
            {"full-context": suite.baseline} if suite.baseline else {})}, suite.target)
    result["seconds"] = round(time.time() - started, 1)
    result["goals"] = report.goals(result)
    files = report.write(result, Path(args.out))
    print(report.summary_text(result))
    print(f"\nresults written to {', '.join(str(f) for f in files)}")
    if "speed" in parts:
        runs.check_lossless(result["speed"]["rows"])
    return 0


def speed(args, suite, cache: Path, say) -> dict:
    from hyflash.bench import exports, peers, runs
    from hyflash.bench.native import native_system
    from hyflash.bench.systems import Skipped, System
    from hyflash.models.target import resolve_model_folder

    root = Path(args.work) if args.work else cache / "bench" / suite.name
    hf = resolve_model_folder(suite.target)
    ids = prompt_ids(hf, suite)
    systems: list[System] = []
    skipped: list[Skipped] = [Skipped(label, "ours", why) for label, why in suite.left_out]
    built = {}
    for spec in suite.exports:
        done = exports.ensure(spec, root, args.threads, progress=not args.no_progress, say=say)
        built[spec.name] = {"folder": str(done.folder), "reused": done.reused,
                            "seconds": round(done.seconds, 1), "note": done.note}
        backend = "ExecuTorch" if spec.backend == "executorch" else "ORT " + graph_form(done.folder)
        systems.append(System(f"ours {backend} {spec.quant}", "ours", "ours", spec.quant,
                              {"folder": str(done.folder)}))
        if spec.backend == "executorch" and suite.native:
            native = native_system(done.folder, spec.quant)
            (skipped if isinstance(native, Skipped) else systems).append(native)
    found = peers.transformers_systems(hf)
    if suite.peers:
        found += peers.optimum_systems(hf, root, ["fp32", "int4"], say)
        found += peers.genai_systems(hf, root, cache, args.setup_peers, say)
        found.append(peers.genai_draft_attempt(hf, Path(resolve_drafter(suite.drafter)), root,
                                               cache, args.setup_peers))
        from hyflash.bench import llamacpp

        binary = llamacpp.ensure_build(cache, args.setup_peers, say)
        gguf = llamacpp.gguf_for(suite.target, hf, cache, say)
        found += llamacpp.systems(binary, gguf, suite.max_seq_len)
    elif args.no_peers:  # so the "2x the best peer" verdict says whom it did not compare with
        skipped.append(Skipped("optimum, onnxruntime-genai, llama.cpp", "peer",
                               "left out (--no-peers)"))
    systems += [s for s in found if isinstance(s, System)]
    skipped += [s for s in found if isinstance(s, Skipped)]
    say(f"speed: {len(systems)} systems x {args.runs} rounds, {len(ids)} prompts x "
        f"{suite.new_tokens} new tokens, {args.threads} thread(s)")
    rows, failed = runs.measure(systems, ids, suite.new_tokens, args.threads, args.runs, say)
    reference = next((f"{r['system']} / plain" for r in rows if r["group"] == "ours"
                      and r["quant"] == "fp32" and r["mode"] == "plain"),
                     "transformers generate / plain")
    runs.compare_to(rows, reference)
    return {"rows": rows, "skipped": [vars(s) for s in skipped] + failed, "exports": built,
            "prompt_tokens": [len(p) for p in ids], "prompt_ids": ids}


def graph_form(folder: Path) -> str:
    """lean or optimum: the target graph form export chose (``auto`` picks per model)."""
    from hyflash.bundle import read_bundle

    form = read_bundle(folder, verify_hashes=False).manifest.kv_cache.form
    return "lean" if form == "in_place" else "optimum"


def resolve_drafter(name: str) -> str:
    from hyflash.models.drafter_folder import resolve_drafter_folder

    return str(resolve_drafter_folder(name))


def prompt_ids(hf: Path, suite) -> list[list[int]]:
    from hyflash.bench.prompts import speed_texts
    from hyflash.models.tokenizer import load_tokenizer

    tok = load_tokenizer(hf)
    ids = [tok(t).input_ids for t in speed_texts(*suite.prompts)]
    room = suite.max_seq_len - suite.new_tokens - 16
    for i, p in enumerate(ids):
        if len(p) > room:
            raise HyflashError(f"bench prompt {i + 1} has {len(p)} tokens; the exports' context "
                               f"of {suite.max_seq_len} holds {room} with {suite.new_tokens} new "
                               "tokens: pass fewer --new-tokens")
    return ids
