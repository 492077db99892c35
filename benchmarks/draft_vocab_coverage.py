"""How much of what the target writes does a reduced draft vocabulary cover?

    python benchmarks/draft_vocab_coverage.py DISTILL_DATA_FOLDER [--sizes 1024,...,16384]

On a self-distillation data folder (``hyflash train`` writes it under its work folder),
every tenth sequence is held out; the ids are ranked on the rest as ``hyflash train
--draft-vocab`` ranks them (``most_frequent``: generated counts, then prompt counts),
and by generated counts alone; it prints, per size, the share of held-out generated
tokens inside the subset: the ceiling on each position's acceptance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    from hyflash.models.draft_vocab import most_frequent
    from hyflash.train.data import DistillSet

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", type=Path)
    p.add_argument("--sizes", default="1024,2048,4096,8192,16384")
    p.add_argument("--vocab", type=int, default=None, help="default: largest id + 1")
    args = p.parse_args()
    parts = list(DistillSet(args.data).token_parts())
    held = np.concatenate([g for i, (_, g) in enumerate(parts) if i % 10 == 0])
    fit = [(pr, g) for i, (pr, g) in enumerate(parts) if i % 10]
    vocab = args.vocab or int(max(max(pr.max(initial=0), g.max(initial=0))
                                  for pr, g in parts)) + 1
    prompts, generated = [pr for pr, _ in fit], [g for _, g in fit]
    print(f"{len(parts)} sequences ({len(parts) - len(fit)} held out, {held.size} generated "
          f"tokens), vocabulary {vocab}")
    print("| ids | covered (generated, then prompt counts) | covered (generated counts only) |")
    print("|---|---|---|")
    for size in map(int, args.sizes.split(",")):
        both = np.isin(held, most_frequent(generated, prompts, size, vocab).numpy()).mean()
        alone = np.isin(held, most_frequent(generated, [], size, vocab).numpy()).mean()
        print(f"| {size} | {both:.1%} | {alone:.1%} |")


if __name__ == "__main__":
    main()
