"""What the greedy labels committed with the SmolLM2 tokens save: the features pass over
one batch of a committed shard with the LM head (labels computed) and without it (labels
taken from the shard), side by side, median of --runs, and whether both give the same
features and labels bit for bit (and the same as a cached data folder's, given one).

    python benchmarks/label_pass.py                       # shard 100, 32 sequences, 1 thread
    python benchmarks/label_pass.py --cached ~/.cache/hyflash/work/smollm2-hyflash/data-...

Needs the GGUF in the hyflash cache (``benchmarks/setup_models.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
TOKENS = HERE / "distill" / "smollm2-hyflash" / "data-2ad6bad63a38"  # shards 64-127


def main() -> None:
    from hyflash.models.gguf import cache_root
    from hyflash.models.target import Target
    from hyflash.train.data import features_for
    from hyflash.train.shards import Shard, shard_path

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=Path, default=TOKENS, help="a committed tokens folder")
    ap.add_argument("--shard", type=int, default=100)
    ap.add_argument("--sequences", type=int, default=32, help="the batch (its first ones)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cached", type=Path, help="a data folder with cached features to "
                                                "compare with")
    ap.add_argument("--target", type=Path,
                    default=cache_root() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    src = Shard(shard_path(args.tokens, args.shard))
    if not src.has_greedy:
        raise SystemExit(f"{src.path} holds no greedy labels")
    precision = src.greedy_precision or "float32"
    target = Target.from_pretrained(args.target, max_seq_len=640).eval()
    ids = range(min(args.sequences, len(src)))
    toks = [src.tokens(i).numpy().astype(np.int32) for i in ids]
    labels = [src.greedy(i).numpy() for i in ids]
    times = {"LM head": [], "labels given": []}
    for _ in range(args.runs):  # interleaved, so drift on a shared machine hits both
        for name, given in (("LM head", None), ("labels given", labels)):
            t0 = time.perf_counter()
            feats, out = features_for(target, toks, len(toks), precision, given)
            times[name].append(time.perf_counter() - t0)
            if given is None:
                computed = (feats, out)
            else:
                taken = (feats, out)
    same = (all(np.array_equal(a, b) for a, b in zip(computed[0], taken[0], strict=True))
            and all(np.array_equal(a, b) for a, b in zip(computed[1], labels, strict=True)))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{src.path.name}: {len(toks)} sequences of {sorted({len(t) for t in toks})} tokens, "
          f"{precision} pass, {args.threads} thread(s), median of {args.runs}: "
          f"LM head {med['LM head']:.2f} s, labels given {med['labels given']:.2f} s "
          f"({med['labels given'] / med['LM head']:.2f}x); features and labels bitwise "
          f"equal: {same}")
    if args.cached:
        c = Shard(shard_path(args.cached, args.shard))
        equal = all(np.array_equal(f, c.features(i).half().numpy())
                    and np.array_equal(g, c.greedy(i).numpy())
                    for i, f, g in zip(ids, computed[0], computed[1], strict=False))
        print(f"equal to {c.path}: {equal}")


if __name__ == "__main__":
    main()
