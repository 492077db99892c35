"""The drafter training loop: many anchors per sequence, one parallel pass per step.

Loss: cross-entropy on the target's tokens at the B-1 block positions, weighted by
exp(-(i-1)/gamma) so early positions (which decide tau most) count most. AdamW with
warmup + cosine decay, checkpoints every few hundred steps, and resume: the batch at
step s depends only on (seed, s), so a resumed run sees exactly the data it would have.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.train.data import DistillSet
from hyflash.train.scaffold import load_checkpoint, save_checkpoint, warmup_cosine


@dataclass
class TrainSpec:
    steps: int = 1500
    batch: int = 8
    anchors: int = 16
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    memory_lr_scale: float = 10.0  # the memory's decays and gates: few scalars, slow to move
    gamma: float = 4.0
    checkpoint_every: int = 100
    val_fraction: float = 0.05
    seed: int = 0


def position_weights(bsz: int, gamma: float) -> torch.Tensor:
    return torch.exp(-torch.arange(bsz - 1, dtype=torch.float32) / gamma)


def make_batch(data: DistillSet, ids: list[int], anchors: int, bsz: int,
               rng: np.random.Generator):
    """Pad a few sequences and pick anchors in their generated part.
    Anchor p needs context features 0..p-1 and labels p+1..p+B-1."""
    seqs = [data.get(i) for i in ids]
    t = max(len(tok) for tok, _, _ in seqs)
    f = seqs[0][1].shape[-1]
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    feats = torch.zeros(len(seqs), t, f)
    anchor_rows = []
    for r, (tok, feat, plen) in enumerate(seqs):
        tokens[r, : len(tok)] = tok
        feats[r, : len(feat)] = feat
        lo, hi = max(plen - 1, 0), len(tok) - bsz  # inclusive range of valid anchors
        choice = rng.choice(np.arange(lo, hi + 1), size=anchors,
                            replace=hi + 1 - lo < anchors)
        anchor_rows.append(torch.from_numpy(np.sort(choice)))
    anchor_t = torch.stack(anchor_rows).long()
    labels = torch.stack([tokens.gather(1, anchor_t + i) for i in range(1, bsz)], -1)
    return tokens, feats, anchor_t, labels


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """logits [N,A,B-1,V], labels [N,A,B-1] (indices into V; -1 = a token the drafter
    cannot score, outside its draft vocabulary: no loss, a miss) -> weighted CE,
    per-position accuracy."""
    ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten(), reduction="none",
                         ignore_index=-1)
    ce = ce.view(labels.shape)
    loss = (ce * weights).sum(-1).mean() / weights.sum()
    acc = (logits.argmax(-1) == labels).float().mean((0, 1))
    return loss, acc


LR_FLOOR = 0.05  # the cosine ends at 5% of the peak learning rate


def lr_at(step: int, spec: TrainSpec) -> float:
    return warmup_cosine(step, spec.steps, spec.lr, spec.warmup, LR_FLOOR)


def split(n: int, spec: TrainSpec) -> tuple[list[int], list[int]]:
    perm = np.random.default_rng(spec.seed).permutation(n).tolist()
    n_val = max(1, int(n * spec.val_fraction))
    return perm[n_val:], perm[:n_val]


@torch.no_grad()
def evaluate(drafter: Drafter, data: DistillSet, ids: list[int], spec: TrainSpec) -> dict:
    """Teacher-forced per-position accuracy on validation sequences (an offline proxy;
    online tau comes from the runtime)."""
    drafter.eval()
    bsz = drafter.cfg.block_size
    rng = np.random.default_rng([spec.seed, 999_999])
    accs, losses = [], []
    w = position_weights(bsz, spec.gamma)
    for a in range(0, len(ids), spec.batch):
        tokens, feats, anchors, labels = make_batch(data, ids[a:a + spec.batch], spec.anchors,
                                                    bsz, rng)
        loss, acc = block_loss(drafter(tokens, feats, anchors), drafter.label_space(labels), w)
        losses.append(loss.item())
        accs.append(acc)
    drafter.train()
    acc = torch.stack(accs).mean(0)
    return {"val_loss": float(np.mean(losses)), "val_accuracy": [round(float(x), 4) for x in acc],
            "val_expected_tau": float(1 + torch.cumprod(acc, 0).sum())}


def param_groups(drafter: Drafter, spec: TrainSpec) -> list[dict]:
    """Matrices get weight decay; vectors (norms, the mask embedding) do not; the memory's
    decay logits and gate biases (a few scalars per layer that set how far back it
    remembers) train at memory_lr_scale x the learning rate, no decay."""
    groups = {"matrix": [], "vector": [], "memory": []}
    for name, p in drafter.named_parameters():
        if not p.requires_grad:
            continue
        if ".memory." in name and name.endswith(("decay_logit", "gate.bias")):
            groups["memory"].append(p)
        else:
            groups["matrix" if p.ndim >= 2 else "vector"].append(p)
    scale = {"matrix": (1.0, spec.weight_decay), "vector": (1.0, 0.0),
             "memory": (spec.memory_lr_scale, 0.0)}
    return [{"params": ps, "lr_scale": scale[k][0], "weight_decay": scale[k][1]}
            for k, ps in groups.items() if ps]


def train(drafter: Drafter, data: DistillSet, spec: TrainSpec, work: Path,
          progress: bool = True) -> dict:
    from tqdm import tqdm

    bsz = drafter.cfg.block_size
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(param_groups(drafter, spec), lr=spec.lr, betas=(0.9, 0.95))
    train_ids, val_ids = split(len(data), spec)
    w = position_weights(bsz, spec.gamma)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "checkpoint.pt"
    step, last_loss = 0, None
    run = run_settings(drafter, spec)
    state = load_checkpoint(ckpt)
    if state is not None:
        check_resumable(ckpt, state.get("run", run), run)
        drafter.load_state_dict(state["drafter"], strict=False)  # (DraftHead re-derives rows)
        opt.load_state_dict(state["opt"])
        step, last_loss = state["step"], state.get("loss")
    drafter.train()
    bar = tqdm(total=spec.steps, initial=step, desc=f"train {drafter.cfg.arch}",
               disable=not progress, dynamic_ncols=True)
    t0, ema = time.time(), None
    while step < spec.steps:
        rng = np.random.default_rng([spec.seed, step])
        ids = rng.choice(train_ids, size=spec.batch, replace=len(train_ids) < spec.batch)
        tokens, feats, anchors, labels = make_batch(data, ids.tolist(), spec.anchors, bsz, rng)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spec) * g["lr_scale"]
        loss, acc = block_loss(drafter(tokens, feats, anchors), drafter.label_space(labels), w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step, last_loss = step + 1, round(loss.item(), 4)
        ema = acc if ema is None else 0.95 * ema + 0.05 * acc
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}",
                        acc="/".join(f"{x:.2f}" for x in ema[:4].tolist()))
        if step % spec.checkpoint_every == 0 or step == spec.steps:
            save_checkpoint(ckpt, {"drafter": drafter.trainable_state(), "opt": opt.state_dict(),
                                   "step": step, "loss": last_loss, "run": run})
    bar.close()
    report = {"train_spec": asdict(spec), "train_seconds_last_run": round(time.time() - t0, 1),
              "final_train_loss": last_loss}
    report.update(evaluate(drafter, data, val_ids, spec))
    return report


def run_settings(drafter: Drafter, spec: TrainSpec) -> dict:
    """What a checkpoint must agree with to be resumed: the drafter's config and every
    training setting (checkpoint_every aside)."""
    train = {k: v for k, v in asdict(spec).items() if k != "checkpoint_every"}
    return {"drafter": drafter.cfg.to_dict(), "train": train}


def check_resumable(ckpt: Path, saved: dict, now: dict) -> None:
    for part in ("drafter", "train"):
        for key, value in now[part].items():
            if saved[part].get(key) != value:
                raise HyflashError(
                    f"{ckpt} is a run with {key} {saved[part].get(key)!r}, not {value!r}: "
                    "rerun with its settings to resume it, or use another --work folder")

