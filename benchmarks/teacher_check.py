"""Is the KL term's teacher the target, and what does it cost? On a real data folder.

    python benchmarks/teacher_check.py --target MODEL --data DATA_DIR --drafter DIR \
        [--batch 8] [--anchors 32] [--threads 1]

``hyflash train --kl`` recomputes the target's distribution at every block position from
the last tap layer's cached features (``hyflash/train/teacher.py``). Its argmax must then
be the target's greedy token, which the data stores as labels (computed from float32
logits by the full target); this reports how often they agree, at float32 and under bf16
autocast (what ``--precision bfloat16`` trains in), and the teacher's time beside one
training step of the drafter (forward and backward) on the same batch, plus the mean
KL(target || drafter) of the given drafter. Prints one line per precision.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the data's target (folder or .gguf)")
    ap.add_argument("--data", type=Path, required=True, help="a hyflash train data folder")
    ap.add_argument("--drafter", type=Path, required=True, help="a drafter folder for it")
    ap.add_argument("--batch", type=int, default=8, help="sequences in the batch")
    ap.add_argument("--anchors", type=int, default=32, help="anchors per sequence")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    from hyflash.models.drafter_folder import load_drafter
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.train import loop
    from hyflash.train.features import autocast
    from hyflash.train.shards import DistillSet
    from hyflash.train.teacher import Teacher, kl_to_teacher

    torch.set_num_threads(args.threads)
    target = Target.from_pretrained(resolve_model_folder(args.target))
    drafter = load_drafter(args.drafter, target)
    data = DistillSet(args.data)
    teacher = Teacher(target, drafter)
    bsz = drafter.cfg.block_size
    step = max(1, len(data) // args.batch)
    picks = [(i, np.random.default_rng(i)) for i in range(0, step * args.batch, step)]
    tokens, feats, anchors, labels = loop.make_batch(data, picks, args.anchors, bsz)
    lab = loop.head_labels(drafter, labels)
    scored = lab >= 0  # labelled and inside the drafter's vocabulary
    print(f"{len(picks)} sequences of up to {tokens.shape[1]} tokens, {args.anchors} anchors "
          f"each, {int(scored.sum())} labelled block positions")
    for precision in ("float32", "bfloat16"):
        with autocast(precision, "cpu"):
            t0 = time.perf_counter()
            soft = teacher.logits(feats, anchors, bsz)
            t_teacher = time.perf_counter() - t0
            t0 = time.perf_counter()
            q = drafter(tokens, feats, anchors)
            loss, _ = loop.block_loss(q, lab, loop.position_weights(bsz, 4.0))
            loss.backward()
            t_step = time.perf_counter() - t0
        agree = (soft.argmax(-1) == lab)[scored].float().mean()
        kl = kl_to_teacher(q.detach(), soft)[labels != loop.NO_LABEL].mean()
        print(f"{precision}: teacher argmax = the data's greedy label at {agree:.4f} of the "
              f"positions; teacher {t_teacher:.2f} s, drafter forward + backward "
              f"{t_step:.2f} s; mean KL(target || drafter) {kl:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
