"""Does the runtime draft what training scored? Online tau against teacher-forced drafts,
on sequences of a drafter's own distillation data.

    python benchmarks/online_vs_offline.py DATA_FOLDER --drafter DIR [--target PATH]
        [--ids 1,4000,4090] [--out benchmarks/results]

For each sequence (its prompt, then the target's greedy continuation the data holds) it
runs the speculative engine (torch reference backends) on the prompt for as many tokens
as the continuation has, and checks the engine's tokens equal the data's. Beside it, the
drafter's training forward with the data's cached features and an anchor at every
continuation position: the mean of 1 + the leading drafts that match (the tau a round
starting there would reach). The two agree when the runtime gives the drafter what
training gave it; the online rounds start at a subset of those positions, so a sequence
that repeats itself can differ. Writes ``online_vs_offline.md`` / ``.json`` under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hyflash.errors import HyflashError


def offline_tau(drafter, tokens: torch.Tensor, feats: torch.Tensor, plen: int) -> float:
    from hyflash.train.loop import head_labels

    bsz = drafter.cfg.block_size
    t = len(tokens)
    anchors = torch.arange(plen - 1, t - bsz + 1)[None]
    padded = torch.zeros(1, t, feats.shape[-1])
    padded[0, :len(feats)] = feats.float()
    with torch.no_grad():
        logits = drafter(tokens[None], padded, anchors)
    labels = torch.stack([tokens[None].gather(1, anchors + k) for k in range(1, bsz)], -1)
    match = logits.argmax(-1) == head_labels(drafter, labels)
    return 1 + float(torch.cumprod(match.long(), -1).sum(-1).float().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="a data folder of `hyflash train` (cached features)")
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--target", help="default: the target in the drafter's training report")
    ap.add_argument("--ids", default="1,4000,4090", help="sequence ids, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)

    from hyflash.models.drafter_folder import load_drafter, read_drafter_config
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.runtime import SpeculativeEngine, TorchTarget
    from hyflash.runtime.drafter_backend import TorchDrafter
    from hyflash.train.shards import DistillSet

    torch.set_num_threads(args.threads)
    data = DistillSet(args.data)
    if not data.has_features:
        raise HyflashError(f"{args.data}: no cached features (a --features recompute folder)")
    report = read_drafter_config(args.drafter)[2].get("training", {})
    target_path = args.target or report.get("target")
    if not target_path:
        raise HyflashError("--target: the drafter's config.json names no target")
    target = Target.from_pretrained(resolve_model_folder(target_path))
    drafter = load_drafter(str(args.drafter), target).float().eval()
    rows = []
    for i in (int(x) for x in args.ids.split(",")):
        if not 0 <= i < len(data):
            raise HyflashError(f"--ids: {i} is not in 0..{len(data) - 1}")
        tokens, feats, plen = data.get(i)
        engine = SpeculativeEngine(TorchTarget(target), TorchDrafter(drafter))
        g = engine.generate(tokens[:plen].tolist(), max_new_tokens=len(tokens) - plen,
                            temperature=0.0)
        rows.append({"id": i, "prompt": int(plen), "new": len(tokens) - plen,
                     "same_tokens": g.tokens == tokens[plen:].tolist(),
                     "online_tau": g.stats.tau,
                     "offline_tau": offline_tau(drafter, tokens, feats, plen)})
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/online_vs_offline.py " + " ".join(argv or sys.argv[1:])
    (args.out / "online_vs_offline.json").write_text(json.dumps(
        {"command": cmd, "data": str(args.data), "drafter": str(args.drafter), "rows": rows},
        indent=1))
    lines = ["# Online tau vs teacher-forced drafts on the drafter's own data", "",
             f"`{cmd}`", "",
             "| sequence | prompt | new tokens | engine tokens = data | online tau | "
             "teacher-forced 1 + leading matches |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['prompt']} | {r['new']} | {'yes' if r['same_tokens'] else 'NO'}"
              f" | {r['online_tau']:.2f} | {r['offline_tau']:.2f} |" for r in rows]
    (args.out / "online_vs_offline.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'online_vs_offline.md'}")
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
