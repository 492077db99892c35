"""Where self-distillation data generation spends its time, on a SmolLM2-135M-shaped target
(or, with ``--shape pocket``, the pocket model's shape).

`hyflash train` spends most of its wall time in `hyflash.train.generation.continue_batch`: the
target prefills a batch of prompts, then decodes `gen_len` tokens, keeping the features
of every position. This script times that on a randomly initialised target of
SmolLM2-135M's shape (llama, 30 layers, hidden 576, 9/3 heads, vocabulary 49152, tied
embeddings; fp32; random weights cost the same as trained ones) and splits each batch
into setup (KV cache allocation), prefill, decode steps, feature copies / sampling (the
rest of `continue_batch`) and the shard write.

With ``--before REV`` it also runs `continue_batch` as of git revision REV (from
``hyflash/train/generation.py``, or ``data.py`` where it lived before) on the same target
(same process, runs interleaved, so both see the same machine load), and reports tokens/s
before and after. It ends with a projection of the wall time for a training budget
(default: 4096 continuations of 128 tokens with `hyflash train`'s default prompt mix).

    python benchmarks/data_gen_speed.py --threads 1 --before 18422bc
Writes benchmarks/results/data_gen_speed.md and the raw rows to data_gen_speed.json
(``--from-json`` re-renders the report from them without measuring).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

from hyflash.models import pocket
from hyflash.models.folders import read_hf_config
from hyflash.models.target import Target, TargetConfig
from hyflash.train import generation
from hyflash.train.shards import write_shard

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "data_gen_speed.md"
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, max_seq_len=4096, rms_norm_eps=1e-5, rope_theta=100000.0,
                    tie_word_embeddings=True, model_type="llama")
POCKET = TargetConfig.from_hf(read_hf_config(pocket.path())).to_dict()  # the shipped model's
SHAPES = {"smollm2": SMOLLM2_135M, "pocket": POCKET}
TITLES = {"smollm2": "SmolLM2-135M shape", "pocket": "pocket model shape"}


def generation_path(rev: str) -> str:
    """Where continue_batch is at a revision: generation.py, or data.py before it moved."""
    path = "hyflash/train/generation.py"
    found = subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT,
                           capture_output=True).returncode == 0
    return path if found else "hyflash/train/data.py"


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
    """A module's source as of a git revision, imported under another name."""
    src = subprocess.check_output(["git", "show", f"{rev}:{path}"], cwd=ROOT, text=True)
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


class PhaseClock:
    """Wraps a target's forward / prefill / setup_cache to add up their wall time."""

    def __init__(self, target: Target):
        self.times = {"setup": 0.0, "prefill": 0.0, "decode": 0.0}
        self.decode_calls = 0
        for name, phase in (("forward", None), ("prefill", "prefill"), ("setup_cache", "setup")):
            setattr(target, name, self.timed(getattr(target, name), phase))

    def timed(self, fn, phase):
        def call(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            single = phase is None and args[0].shape[1] == 1
            key = phase or ("decode" if single else "prefill")
            self.times[key] += time.perf_counter() - t0
            self.decode_calls += key == "decode"
            return out
        return call


def one_batch(impl, target: Target, n: int, length: int, gen_len: int, seed: int) -> dict:
    """Time continue_batch + the per-row copies generate_dataset makes + one shard write."""
    prompts = torch.randint(0, target.cfg.vocab_size, (n, length),
                            generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    tokens, feats = impl.continue_batch(target, prompts, gen_len, False, 1.0,
                                        torch.Generator().manual_seed(seed))[:2]
    toks = [tokens[i].numpy().astype(np.int32) for i in range(n)]
    fts = [feats[i].to(torch.float16).numpy() for i in range(n)]
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        write_shard(Path(d), 0, toks, fts, [{"prompt_len": length}] * n)
    t2 = time.perf_counter()
    return {"batch": t1 - t0, "write": t2 - t1, "total": t2 - t0}


def measure(impl, target: Target, n: int, length: int, gen_len: int, seed: int) -> dict:
    clock = PhaseClock(target)
    r = one_batch(impl, target, n, length, gen_len, seed)
    for name in ("forward", "prefill", "setup_cache"):
        delattr(target, name)  # back to the class's methods
    r.update(clock.times)
    r["copies"] = r["batch"] - sum(clock.times.values())
    r["ms_per_step"] = 1e3 * clock.times["decode"] / max(1, clock.decode_calls)
    r["new_tok_s"] = n * gen_len / r["total"]
    r["all_tok_s"] = n * (length + gen_len) / r["total"]
    return r


def median_runs(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def default_mix(sequences: int, batch: int, max_seq_len: int, gen_len: int,
                seed: int = 0) -> list[int]:
    """Prompt lengths of the batches `hyflash train` generates with its default DataSpec
    mix for a target of this context (60% long prompts of 256 up to 1920 tokens, 40% short
    of 32-128), drawn the same way (one length per batch)."""
    room = max_seq_len - gen_len
    long_hi = min(1920, room)
    rng = np.random.default_rng(seed)
    lengths = []
    for _ in range(-(-sequences // batch)):
        lo, hi = (min(256, long_hi), long_hi) if rng.random() < 0.6 else (32, min(128, room))
        lengths.append(int(rng.integers(lo, hi + 1)))
    return lengths


def project(rows: dict, batch: int, gen_len: int, lengths: list[int]) -> dict:
    """Seconds for batches of `batch` prompts of these lengths, from the measured rows:
    prefill per prompt row = a*L + b*L^2 (fitted over every measured row: the linear
    layers are linear in L, attention quadratic); decode ms/step linear in L and the rest
    (setup, copies, write) averaged, both from the rows measured at `batch`."""
    after = [((n, length), r) for (n, length, impl), r in rows.items() if impl == "after"]
    ls = np.array([length for (_, length), _ in after], dtype=float)
    per_row = np.array([r["prefill"] / n for (n, _), r in after])
    (a, b), *_ = np.linalg.lstsq(np.stack([ls, ls ** 2], 1), per_row, rcond=None)
    same = [(length, r) for (n, length), r in after if n == batch]
    step = np.polyfit([length for length, _ in same], [r["ms_per_step"] for _, r in same], 1)
    other = float(np.mean([r["setup"] + r["copies"] + r["write"] for _, r in same]))
    ls = np.array(lengths, dtype=float)
    return {"prefill": float(batch * (a * ls + b * ls ** 2).sum()),
            "decode": float((gen_len - 1) * np.polyval(step, ls).sum() / 1e3),
            "other": other * len(lengths)}


def batch_bytes(n: int, length: int, gen_len: int, impl: str, c: dict) -> int | None:
    """The big buffers of one batch: KV cache + fp16 features (the fused prefill never
    holds a score tensor). None for ``before`` rows: what they held depends on the
    revision (the committed data_gen_speed.md gives 18422bc's)."""
    if impl == "before":
        return None
    kv_row = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 4
    fed = length + gen_len - 1
    return n * (kv_row * fed + fed * 3 * c["hidden_size"] * 2)


DEFAULT_CONFIGS = ["8x64", "8x512", "8x1024", "8x1920", "32x64", "32x512", "32x1024"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2",
                   help="the target's shape (random weights): SmolLM2-135M or the pocket model")
    p.add_argument("--gen-len", type=int, default=96)
    p.add_argument("--runs", type=int, default=3, help="median of this many runs")
    p.add_argument("--config", action="append", default=None, metavar="BATCHxPROMPT",
                   help=f"batch x prompt length (repeatable; default {' '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--before", metavar="REV", default=None,
                   help="also time continue_batch as of this revision")
    p.add_argument("--before-config", action="append", default=None, metavar="BATCHxPROMPT",
                   help="configs to run the old code on (default: all; its KV cache spans "
                        "the whole 4096-token context, 46 MB per row)")
    p.add_argument("--project-batch", type=int, default=32)
    p.add_argument("--budget", type=int, default=4096, help="continuations to project")
    p.add_argument("--budget-gen-len", type=int, default=128)
    p.add_argument("--from-json", type=Path, default=None,
                   help="re-render the report from a previous run's .json (no measuring)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if not args.from_json:
        lengths = [length for n, length in parse_configs(args.config or DEFAULT_CONFIGS)
                   if n == args.project_batch]
        if len(set(lengths)) < 2:
            p.error(f"the projection fits decode time against prompt length at batch "
                    f"--project-batch {args.project_batch}: give --config at that batch for "
                    f"two prompt lengths or more (measured at it: {sorted(set(lengths))})")

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        vars(args).update(saved["args"], out=args.out)
        rows = {(r["n"], r["length"], r["impl"]): r for r in saved["rows"]}
    else:
        rows = measure_all(args)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k in RECORDED},
             "rows": [{"n": n, "length": length, "impl": impl, **r}
                      for (n, length, impl), r in rows.items()]}, indent=1))
    report = render(args, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    return 0


RECORDED = ("threads", "shape", "config", "gen_len", "runs", "before", "project_batch",
            "budget", "budget_gen_len")


def parse_configs(texts: list[str]) -> list[tuple[int, int]]:
    return [tuple(map(int, c.split("x"))) for c in texts]


def measure_all(args) -> dict[tuple[int, int, str], dict]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = Target(TargetConfig(**SHAPES[args.shape])).eval()
    configs = parse_configs(args.config or DEFAULT_CONFIGS)
    before_cfgs = parse_configs(args.before_config or []) or configs
    impls = {"after": generation}
    if args.before:
        impls["before"] = module_at(args.before, generation_path(args.before), "data_before")
    rows: dict[tuple[int, int, str], dict] = {}
    for n, length in configs:
        runs: dict[str, list[dict]] = {k: [] for k in impls}
        for i in range(args.runs):
            for name, impl in impls.items():
                if name == "before":
                    if (n, length) not in before_cfgs:
                        continue
                    target.setup_cache(n)  # untimed: the old code kept one cache per run
                runs[name].append(measure(impl, target, n, length, args.gen_len, seed=i))
                target.drop_cache()
                r = runs[name][-1]
                print(f"{name:6s} {n}x{length} run {i}: {r['total']:.1f}s "
                      f"({r['new_tok_s']:.1f} new tok/s)", flush=True)
        for name, rs in runs.items():
            if rs:
                rows[(n, length, name)] = median_runs(rs)
    return rows


def render(args, rows) -> str:
    lines = [
        f"# Self-distillation data generation speed ({TITLES[args.shape]}, fp32, random init)",
        "",
        f"`python benchmarks/data_gen_speed.py --threads {args.threads} --shape {args.shape}"
        f" --gen-len {args.gen_len} --runs {args.runs}"
        + "".join(f" --config {c}" for c in args.config or [])
        + (f" --before {args.before}" if args.before else "") + "`: "
        f"torch {torch.__version__}, {args.threads} thread(s), gen_len {args.gen_len}, "
        f"greedy, median of {args.runs} runs per row (before/after interleaved). Phases in "
        "seconds per batch; *copies* = the rest of the batch (argmax, feature and token "
        "copies); *write* = one shard write of the batch; *buffers* = the batch's KV cache "
        "and features (computed for the current code, MB). Tokens/s counts new tokens "
        "(*new*) and prompt + new tokens (*all*).",
        "",
        "| batch x prompt | code | setup | prefill | decode (ms/step) | copies | write | "
        "total s | new tok/s | all tok/s | buffers MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (n, length, name), r in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                     kv[0][2] != "before")):
        mb = batch_bytes(n, length, args.gen_len, name, SHAPES[args.shape])
        mb = "-" if mb is None else f"{mb / 2**20:,.0f}"
        lines.append(f"| {n} x {length} | {name} | {r['setup']:.2f} | {r['prefill']:.2f} | "
                     f"{r['decode']:.1f} ({r['ms_per_step']:.0f}) | {r['copies']:.2f} | "
                     f"{r['write']:.2f} | {r['total']:.1f} | {r['new_tok_s']:.1f} | "
                     f"{r['all_tok_s']:.0f} | {mb} |")
    if args.before:
        lines += ["", "Speedup (before / after, total time per batch): " + ", ".join(
            f"{n} x {length}: {rows[(n, length, 'before')]['total'] / r['total']:.2f}x"
            for (n, length, name), r in sorted(rows.items())
            if name == "after" and (n, length, "before") in rows) + "."]
    lines += ["", f"Projection for {args.budget} continuations x {args.budget_gen_len} tokens "
              f"at the measured speeds of batch {args.project_batch} (prefill per prompt row "
              "fitted as a*L + b*L^2 over all rows, decode ms/step linear in L; prompts longer "
              "than the longest measured one are extrapolated):", "",
              "| prompt mix | batches | mean prompt | prompt tokens | prefill h | decode h | "
              "other h | total h |", "|---|---|---|---|---|---|---|---|"]
    longest = max(length for (n, length, impl) in rows
                  if impl == "after" and n == args.project_batch)
    for label, context in (("`hyflash train` default (prompts up to 1920)", 4096),
                           ("`--max-seq-len 1152` (prompts up to 1024)", 1152)):
        lengths = default_mix(args.budget, args.project_batch, context, args.budget_gen_len)
        t = project(rows, args.project_batch, args.budget_gen_len, lengths)
        bad = [k for k, v in t.items() if v < 0]
        if bad:  # a fit from short prompts carried far past them can go below zero
            lines.append(f"| {label} | {len(lengths)} | {np.mean(lengths):.0f} | not "
                         f"projected: the fit from prompts of at most {longest} tokens gives "
                         f"a negative {' and '.join(bad)} at {max(lengths)}; measure longer "
                         f"prompts (`--config {args.project_batch}x512`) |||||")
            continue
        lines.append(f"| {label} | {len(lengths)} | {np.mean(lengths):.0f} | "
                     f"{sum(lengths) * args.project_batch / 1e6:.2f}M | "
                     f"{t['prefill'] / 3600:.2f} | {t['decode'] / 3600:.2f} | "
                     f"{t['other'] / 3600:.2f} | **{sum(t.values()) / 3600:.1f}** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
