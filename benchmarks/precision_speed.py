"""What bfloat16 buys in drafter training on this CPU: the feature pass and the train step.

    python benchmarks/setup_models.py        # the SmolLM2-135M GGUF, once
    python benchmarks/precision_speed.py [--threads 2] [--repeats 5] [--out benchmarks/results]

1. The feature pass (``--feature-precision``): SmolLM2-135M's causal pass over committed
   distillation tokens (``benchmarks/distill/smollm2-hyflash``, batches of 8 sequences of
   one length), float32 vs bf16 autocast: seconds per batch, the features' relative L2
   error and how often the greedy labels (argmax of float32 logits) agree.
2. The drafter's train step (``--precision``): the SmolLM2 recipe's drafter (2 layers,
   draft vocabulary 8192, 32 anchors, batch 8) on features of that pass, forward and
   backward + AdamW, float32 vs bf16 autocast (float32 weights).

The two precisions alternate run by run, so load from other processes hits both alike;
figures are medians over ``--repeats`` after one warm-up. Writes precision_speed.md/.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
TOKENS = HERE / "distill" / "smollm2-hyflash"


def token_batch(n: int = 8) -> torch.Tensor:
    """n committed sequences of one length (a generation batch has one length)."""
    from hyflash.train.shards import Shard

    shard = Shard(sorted(TOKENS.glob("*/shard0000.safetensors"))[0])
    toks = [shard.tokens(i) for i in range(len(shard))]
    length = max({len(t) for t in toks}, key=lambda k: sum(len(t) == k for t in toks))
    return torch.stack([t for t in toks if len(t) == length][:n]).long()


def feature_pass(target, tokens: torch.Tensor, repeats: int) -> dict:
    from hyflash.train.features import features_and_greedy

    x = tokens[:, :-1]
    times = {"float32": [], "bfloat16": []}
    out = {}
    for r in range(repeats + 1):
        for p in times:
            t0 = time.perf_counter()
            out[p] = features_and_greedy(target, x, p)
            if r:
                times[p].append(time.perf_counter() - t0)
    (f32, g32), (fb, gb) = out["float32"], out["bfloat16"]
    rel = ((fb - f32).norm(dim=-1) / f32.norm(dim=-1)).mean()
    return {"batch": list(x.shape), **{f"{p}_s": round(statistics.median(v), 3)
                                        for p, v in times.items()},
            "speedup": round(statistics.median(times["float32"]) /
                             statistics.median(times["bfloat16"]), 2),
            "feature_rel_l2": round(float(rel), 4),
            "greedy_agree": round(float((gb == g32).float().mean()), 4),
            "features": f32}


def train_step(target, feats: torch.Tensor, tokens: torch.Tensor, repeats: int) -> dict:
    from hyflash.models.drafter import Drafter
    from hyflash.train.features import autocast
    from hyflash.train.loop import block_loss, head_labels, pick_anchors, position_weights

    torch.manual_seed(0)
    drafter = Drafter.for_target(target, "hyflash", num_layers=2, num_heads=8, block_size=8,
                                 draft_vocab=8192, window=64)
    drafter.draft_head.set_ids(torch.arange(8192))
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    w = position_weights(8, 4.0)
    rng = np.random.default_rng(0)
    length = tokens.shape[1]
    anchors = torch.stack([torch.from_numpy(pick_anchors(rng, length // 2, length, 32, 8, 0.0))
                           for _ in range(len(tokens))]).long()
    labels = torch.stack([tokens.gather(1, anchors + i) for i in range(1, 8)], -1)
    feats = feats.half().float()  # as cached: float16
    times = {"float32": [], "bfloat16": []}
    losses = {"float32": [], "bfloat16": []}
    for r in range(repeats + 1):
        for p in times:
            t0 = time.perf_counter()
            with autocast(p, "cpu"):
                loss, _ = block_loss(drafter(tokens, feats, anchors),
                                     head_labels(drafter, labels), w)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if r:
                times[p].append(time.perf_counter() - t0)
                losses[p].append(round(float(loss.detach()), 3))
    return {**{f"{p}_s": round(statistics.median(v), 3) for p, v in times.items()},
            "speedup": round(statistics.median(times["float32"]) /
                             statistics.median(times["bfloat16"]), 2),
            "losses": losses}


def markdown(res: dict, command: str) -> str:
    f, t = res["features"], res["train_step"]
    return "\n".join([
        "# bfloat16 in drafter training (SmolLM2-135M)", "", f"`{command}`; medians, the "
        "two precisions alternating run by run.", "",
        "| part | float32 s | bfloat16 s | speedup | fidelity |", "|---|---|---|---|---|",
        f"| feature pass, batch {f['batch'][0]} x {f['batch'][1]} tokens | {f['float32_s']} | "
        f"{f['bfloat16_s']} | {f['speedup']}x | features within {100 * f['feature_rel_l2']:.2f}"
        f"% (relative L2); greedy labels equal at {100 * f['greedy_agree']:.1f}% of positions |",
        f"| drafter train step (fwd + bwd + AdamW) | {t['float32_s']} | {t['bfloat16_s']} | "
        f"{t['speedup']}x | losses of the alternating steps: float32 {t['losses']['float32']}, "
        f"bf16 {t['losses']['bfloat16']} |", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=HERE / "results")
    a = p.parse_args()
    from smollm2_drafter import gguf  # benchmarks/ is on the path of a script run from it

    from hyflash.models.target import Target, resolve_model_folder

    torch.set_num_threads(a.threads)
    target = Target.from_pretrained(resolve_model_folder(str(gguf())), max_seq_len=640)
    tokens = token_batch()
    feats = feature_pass(target, tokens, a.repeats)
    step = train_step(target, feats.pop("features"), tokens[:, :-1], a.repeats)
    res = {"threads": a.threads, "features": feats, "train_step": step}
    command = (f"python benchmarks/precision_speed.py --threads {a.threads} "
               f"--repeats {a.repeats}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "precision_speed.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.out / "precision_speed.md").write_text(markdown(res, command))
    print(markdown(res, command))


if __name__ == "__main__":
    main()
