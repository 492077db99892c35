"""The C++ runtime (`hyflash-run`, runtime_native/) against the Python engine over the same
ExecuTorch bundle: tokens/s of greedy speculative and plain decoding, 1 thread.

    make native     # builds build/native/hyflash-run
    python benchmarks/native_vs_python.py [--bundle DIR ...] [--repeats 7] \
        [--max-new-tokens 128] [--out benchmarks/results]

Without ``--bundle`` the pocket pair is exported (context 512) at fp32 and at 8da4w into
the hyflash cache on first use. For every bundle, prompt (the first four of ``hyflash
simulate``'s default prompts) and mode (speculative, plain), the two runtimes run in turn,
in alternating order: the Python engine (``SpeculativeEngine`` over
``hyflash.runtime.executorch_backend``, in this process) generates ``--repeats`` times after
one warm-up, and ``hyflash-run --repeat`` does the same in one process (its first run
discarded too). EOS is ignored, so every run decodes the same number of tokens. Both time
the same span, the whole ``generate`` call with its prefill, so tokens/s is new tokens over
that. The token ids and tau of the two must be equal (checked).
Reported: per bundle and mode the median over all runs of all prompts, and the ratio.
Writes ``native_vs_python.md`` and ``native_vs_python.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hyflash.argtypes import positive_int

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "native" / "hyflash-run"
MODES = {"speculative": (), "plain": ("--no-draft",)}
PROMPT_COUNT = 4  # the first prompts of `hyflash simulate`'s defaults


def pocket_bundles() -> list[Path]:
    """The pocket pair at fp32 and 8da4w (context 512) in the hyflash cache."""
    from hyflash.export.executorch_bundle import export_executorch_bundle
    from hyflash.models.gguf import cache_root

    out = []
    for quant in ("fp32", "8da4w"):
        folder = cache_root() / "benchmarks" / "native_vs_python" / f"pocket-{quant}"
        if not (folder / "manifest.json").exists():
            print(f"exporting the pocket pair ({quant}) to {folder}", file=sys.stderr)
            export_executorch_bundle("pocket", "pocket", folder, quant=quant, max_seq_len=512,
                                     progress=False)
        out.append(folder)
    return out


def python_runs(engine, ids, max_new, repeats) -> tuple[list[float], list[int], float]:
    engine.generate(ids, max_new_tokens=max_new)  # warm-up
    gens = [engine.generate(ids, max_new_tokens=max_new) for _ in range(repeats)]
    return [g.stats.tokens_per_s for g in gens], gens[0].tokens, gens[0].stats.tau


def native_runs(bundle, ids, max_new, flags, repeats) -> tuple[list[float], list[int], float]:
    cmd = [str(BINARY), str(bundle), "--prompt-ids", ",".join(map(str, ids)),
           "--max-new-tokens", str(max_new), "--threads", "1", "--repeat", str(repeats + 1),
           "--ignore-eos", "--json", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"hyflash-run failed: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    return [r["tokens_per_s"] for r in out["runs"][1:]], out["tokens"], out["stats"]["tau"]


def measure(bundle: Path, prompts: list[str], max_new: int, repeats: int) -> dict:
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime import SpeculativeEngine
    from hyflash.runtime.executorch_backend import load_executorch_pair

    b, target, drafter = load_executorch_pair(bundle, threads=1)
    tok = load_tokenizer(bundle)
    result = {"bundle": str(bundle), "recipe": b.manifest.quantization.recipe}
    for m, (mode, flags) in enumerate(MODES.items()):
        engine = SpeculativeEngine(target, None if flags else drafter)
        py, cc, taus = [], [], []
        for i, prompt in enumerate(prompts):
            ids = tok(prompt).input_ids
            order = ("python", "native") if (i + m) % 2 == 0 else ("native", "python")
            got = {}
            for who in order:
                got[who] = (python_runs(engine, ids, max_new, repeats) if who == "python"
                            else native_runs(bundle, ids, max_new, flags, repeats))
            if got["python"][1] != got["native"][1]:
                raise SystemExit(f"{bundle} {mode}: the runtimes decoded different tokens")
            if got["python"][2] != got["native"][2]:
                raise SystemExit(f"{bundle} {mode}: tau {got['python'][2]} (Python) != "
                                 f"{got['native'][2]} (C++)")
            py += got["python"][0]
            cc += got["native"][0]
            taus.append(got["python"][2])
        result[mode] = {"python_tokens_per_s": statistics.median(py),
                        "native_tokens_per_s": statistics.median(cc),
                        "native_over_python": statistics.median(cc) / statistics.median(py),
                        "tau_mean": sum(taus) / len(taus), "runs_per_runtime": len(py),
                        "python_all": py, "native_all": cc}
        print(f"{b.manifest.quantization.recipe} {mode}: python "
              f"{result[mode]['python_tokens_per_s']:.1f} tok/s, native "
              f"{result[mode]['native_tokens_per_s']:.1f} tok/s", file=sys.stderr)
    return result


def write(results: list[dict], args, out: Path) -> None:
    meta = {"command": " ".join(["python", "benchmarks/native_vs_python.py", *sys.argv[1:]]),
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": 1,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
            "date": time.strftime("%Y-%m-%d")}
    (out / "native_vs_python.json").write_text(json.dumps({**meta, "results": results},
                                                          indent=1) + "\n")
    lines = ["# C++ runtime vs Python engine, same ExecuTorch bundle", "",
             f"`{meta['command']}` ({meta['date']}): greedy, {args.max_new_tokens} new "
             f"tokens (EOS ignored), 1 thread, median tokens/s over {args.repeats} runs x "
             f"{PROMPT_COUNT} prompts per runtime (warm-up runs discarded); equal token ids "
             "and tau checked.", "",
             "| bundle | mode | tau | Python tok/s | C++ tok/s | C++ / Python |",
             "|---|---|---|---|---|---|"]
    for r in results:
        for mode in MODES:
            x = r[mode]
            lines.append(f"| pocket {r['recipe']} | {mode} | {x['tau_mean']:.2f} | "
                         f"{x['python_tokens_per_s']:.1f} | {x['native_tokens_per_s']:.1f} | "
                         f"{x['native_over_python']:.2f}x |")
    (out / "native_vs_python.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    from hyflash.simulate.command import DEFAULT_PROMPTS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, action="append",
                   help="an ExecuTorch bundle (repeatable; default: the pocket pair)")
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    if not BINARY.exists():
        raise SystemExit(f"no {BINARY}: build it with `make native`")
    torch.set_num_threads(1)
    bundles = args.bundle or pocket_bundles()
    results = [measure(b, DEFAULT_PROMPTS[:PROMPT_COUNT], args.max_new_tokens, args.repeats)
               for b in bundles]
    args.out.mkdir(parents=True, exist_ok=True)
    write(results, args, args.out)
    print((args.out / "native_vs_python.md").read_text())


if __name__ == "__main__":
    main()
