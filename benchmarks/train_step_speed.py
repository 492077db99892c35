"""Time one drafter training step (forward, backward, AdamW) of the pocket recipe's shape,
HyFlash and full-context, now and (``--before REV``) as the drafter code stood at REV.

The step is what ``hyflash train`` runs: 8 sequences of 2048 tokens, 32 anchors each,
block 8, bf16 autocast (``--precision bfloat16``), on random tokens and features of the
pocket model's sizes (the time does not depend on the values). Every measurement runs in
its own process, the code of REV from a git worktree; rounds interleave the rows, and a
row's time is the median over rounds of each round's median step.

    python benchmarks/train_step_speed.py --threads 1 --before 35467c2 --runs 3

Writes benchmarks/results/NAME.{json,md} (NAME: --name, default train_step_speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
ARCHS = ("hyflash", "full")


def worker(arch: str, layers: int, steps: int, threads: int) -> dict:
    import torch

    from hyflash.models import pocket
    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target
    from hyflash.train.features import autocast
    from hyflash.train.loop import block_loss, position_weights

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    target = Target.from_pretrained(pocket.path())
    d = Drafter.for_target(target, arch, num_layers=layers).train()
    n, t, a, bsz = 8, target.cfg.max_seq_len, 32, d.cfg.block_size
    tokens = torch.randint(0, target.cfg.vocab_size, (n, t))
    feats = torch.randn(n, t, d.cfg.feature_size)
    anchors = torch.randint(0, t - bsz, (n, a))
    labels = torch.randint(0, target.cfg.vocab_size, (n, a, bsz - 1))
    weights = position_weights(bsz, 4.0)  # the recipe's gamma
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=1e-3)
    times = []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        t0 = time.perf_counter()
        with autocast("bfloat16", "cpu"):  # the loss and arithmetic of hyflash train's step
            loss, _ = block_loss(d(tokens, feats, anchors), labels, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times[1:])}


def run_worker(src: Path, arch: str, args) -> float:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", arch,
           "--layers", str(args.layers), "--steps", str(args.steps),
           "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=src)
    return json.loads(out.stdout.strip().splitlines()[-1])["step_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", metavar="REV", help="also time the drafter code of this commit")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per process")
    p.add_argument("--runs", type=int, default=3, help="rounds (a process per row each)")
    p.add_argument("--name", default="train_step_speed")
    p.add_argument("--worker", choices=ARCHS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.layers, args.steps, args.threads)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"now": ROOT}
        if args.before:
            wt = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                            str(wt), args.before], check=True)
            srcs["before"] = wt
        try:
            times: dict[str, list[float]] = {}
            for r in range(args.runs):
                for code, src in srcs.items():
                    for arch in ARCHS:
                        s = run_worker(src, arch, args)
                        times.setdefault(f"{code}/{arch}", []).append(s)
                        print(f"round {r + 1}/{args.runs} {code} {arch}: {s:.3f} s/step",
                              flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(srcs["before"])], check=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    cmd = "python benchmarks/train_step_speed.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if k not in ("worker",) and v is not None)
    lines = ["# Drafter training step, pocket recipe shape", "",
             f"`{cmd}`: 8 x 2048 tokens, 32 anchors, block 8, {args.layers} layers, bf16 "
             f"autocast, {args.threads} thread(s); median of {args.runs} rounds "
             f"(each the median of {args.steps} steps in a fresh process).", "",
             "| code | HyFlash s/step | full-context s/step | HyFlash / full |",
             "|---|---|---|---|"]
    for code in srcs:
        h, f = med[f"{code}/hyflash"], med[f"{code}/full"]
        label = f"before ({args.before})" if code == "before" else "now"
        lines.append(f"| {label} | {h:.3f} | {f:.3f} | {h / f:.2f}x |")
    if args.before:
        lines += ["", "HyFlash step, before / now: "
                  f"{med['before/hyflash'] / med['now/hyflash']:.2f}x; full-context: "
                  f"{med['before/full'] / med['now/full']:.2f}x."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (OUT / f"{args.name}.json").write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items() if k != "worker"}, "rounds": times,
         "median_s": med}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
