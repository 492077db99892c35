"""The drafter training loop: many anchors per sequence, one parallel pass per step.

Loss: cross-entropy on the target's tokens at the B-1 block positions, weighted by
exp(-(i-1)/gamma) so early positions (which decide tau most) count most; with ``kl`` > 0,
plus that weight times KL(target || drafter) at each position (``teacher.py``). Anchors sit in
the target's continuation and, with ``prompt_anchors``, in the prompt too: every prefix
of the prompt is a prompt the target could be asked to continue, and the data's greedy
labels (the target's argmax after every token) say how it would, for as long as the text
agrees with them (``block_labels``). AdamW with
warmup + cosine decay, checkpoints every few hundred steps, and resume: the batch at
step s depends only on (seed, s), so a resumed run sees exactly the data it would have.

Under torchrun (``distributed.py``) each rank computes its lanes' part of the global
batch from its own shards (``lanes.py``) and DDP or FSDP2 averages the gradients: the
update is the one a single process makes on the whole batch, and a run resumes from its
distributed checkpoint (``checkpoints.py``) at any world size. Features come with the
data or, given the frozen ``target``, are recomputed in the step (``features.py``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.train import checkpoints
from hyflash.train.distributed import SINGLE, Dist, place_target, unwrap, wrap
from hyflash.train.features import PRECISIONS, autocast, target_features
from hyflash.train.lanes import Sampler, rank_shards
from hyflash.train.scaffold import save_checkpoint, warmup_cosine
from hyflash.train.shards import DistillSet
from hyflash.train.teacher import Teacher, kl_to_teacher
from hyflash.train.validation import Validation

KEEP = ("last", "best")


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
    prompt_anchors: float = 0.0  # share of a sequence's anchors placed in its prompt
    checkpoint_every: int = 100
    eval_every: int = 0  # steps between validations (0: only at the end); see Validation
    keep: str = "last"  # the drafter a run ends with: its "last" weights, or the "best" validated
    val_fraction: float = 0.05
    seed: int = 0
    precision: str = "float32"  # the drafter's forward and backward: float32 or bf16 autocast
    kl: float = 0.0  # weight of KL(target || drafter) beside the CE (``teacher.py``)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise HyflashError(f"precision {self.precision!r}: choose "
                               f"{' or '.join(PRECISIONS)}")
        if self.keep not in KEEP:
            raise HyflashError(f"keep {self.keep!r}: choose {' or '.join(KEEP)}")
        if self.kl < 0:
            raise HyflashError(f"kl weight {self.kl} < 0: use 0 (no KL term) or more")
        if self.keep == "best" and not self.eval_every:
            raise HyflashError("--keep best needs validations during the run: add "
                               "--eval-every N")


def position_weights(bsz: int, gamma: float) -> torch.Tensor:
    return torch.exp(-torch.arange(bsz - 1, dtype=torch.float32) / gamma)


NO_LABEL = -100  # a block position with no label: the text left the target's greedy path


def pick_anchors(rng: np.random.Generator, plen: int, length: int, anchors: int, bsz: int,
                 prompt_share: float) -> np.ndarray:
    """Sorted anchor positions of one sequence: round(anchors x prompt_share) of them in
    the prompt (positions 1..plen-2: at least one context feature, and a label inside the
    prompt), the rest in the target's continuation (plen-1..length-B)."""
    lo, hi = max(plen - 1, 0), length - bsz  # inclusive range of continuation anchors
    n_prompt = round(anchors * prompt_share) if plen >= 3 else 0
    parts = []
    if n_prompt:
        parts.append(rng.choice(np.arange(1, plen - 1), size=n_prompt,
                                replace=plen - 2 < n_prompt))
    n = anchors - n_prompt
    parts.append(rng.choice(np.arange(lo, hi + 1), size=n, replace=hi + 1 - lo < n))
    return np.sort(np.concatenate(parts))


def block_labels(tokens: torch.Tensor, greedy: torch.Tensor, anchor_t: torch.Tensor,
                 bsz: int) -> torch.Tensor:
    """Labels [N, A, B-1] from the target's greedy tokens: position k of anchor p is
    greedy[p+k-1], the target's token after the text up to p+k-1, which is its greedy
    continuation from p only while the text agrees with it (tokens[p+j] == greedy[p+j-1]
    for j < k); after the first disagreement there is no label (NO_LABEL). In the
    continuation the text is the target's own greedy output, so every label stands."""
    lab = torch.stack([greedy.gather(1, anchor_t + k - 1) for k in range(1, bsz)], -1)
    text = torch.stack([tokens.gather(1, anchor_t + k) for k in range(1, bsz - 1)], -1)
    agree = torch.cumprod((text == lab[..., :-1]).long(), -1).bool()
    on_path = torch.cat([torch.ones_like(agree[..., :1]), agree], -1)
    return lab.masked_fill(~on_path, NO_LABEL)


def make_batch(data: DistillSet, picks: list[tuple[int, np.random.Generator]], anchors: int,
               bsz: int, features: bool = True, prompt_share: float = 0.0):
    """Pad a few sequences and pick anchors (``pick_anchors``), each sequence with its own
    generator (so a sequence's anchors do not depend on what else is in the batch, or on
    which rank computes it). Anchor p needs context features 0..p-1 and labels
    p+1..p+B-1: the text's tokens, or with prompt_share > 0 ``block_labels`` of the data's
    greedy labels. features=False: no features read (None; the step computes them)."""
    seqs = [data.get(i, features) for i, _ in picks]
    t = max(len(tok) for tok, _, _ in seqs)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    feats = torch.zeros(len(seqs), t, seqs[0][1].shape[-1]) if features else None
    greedy = torch.zeros(len(seqs), t, dtype=torch.long) if prompt_share else None
    anchor_rows = []
    for r, ((tok, feat, plen), (i, rng)) in enumerate(zip(seqs, picks, strict=True)):
        tokens[r, : len(tok)] = tok
        if features:
            feats[r, : len(feat)] = feat
        if greedy is not None:
            greedy[r, : len(tok) - 1] = data.greedy(i)
        choice = pick_anchors(rng, plen, len(tok), anchors, bsz, prompt_share)
        anchor_rows.append(torch.from_numpy(choice))
    anchor_t = torch.stack(anchor_rows).long()
    if greedy is not None:
        return tokens, feats, anchor_t, block_labels(tokens, greedy, anchor_t, bsz)
    labels = torch.stack([tokens.gather(1, anchor_t + i) for i in range(1, bsz)], -1)
    return tokens, feats, anchor_t, labels


def step_batch(data: DistillSet, picks, anchors: int, bsz: int, target, d: Dist,
               prompt_share: float = 0.0):
    """make_batch on the device, features from the data or, given target, from it."""
    tokens, feats, anchor_t, labels = (None if x is None else x.to(d.device) for x in
                                       make_batch(data, picks, anchors, bsz, target is None,
                                                  prompt_share))
    if target is not None:
        with d.on_device():
            feats = target_features(target, tokens)
    return tokens, feats, anchor_t, labels


def head_labels(drafter: Drafter, labels: torch.Tensor) -> torch.Tensor:
    """Token-id labels -> indices into the drafter's head output (``label_space``), with
    NO_LABEL kept as it is (a draft vocabulary would otherwise read it as a token id)."""
    none = labels == NO_LABEL
    return drafter.label_space(labels.masked_fill(none, 0)).masked_fill(none, NO_LABEL)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
               teacher: torch.Tensor | None = None, kl: float = 0.0):
    """logits [N,A,B-1,V], labels [N,A,B-1] (indices into V; -1 = a token the drafter
    cannot score, outside its draft vocabulary: no loss, a miss; NO_LABEL: not counted
    at all) -> weighted CE, per-position accuracy over the labelled blocks. teacher: the
    target's logits at the same positions (``teacher.py``), whose KL(p || q) is added
    with weight kl at every labelled position (those outside the draft vocabulary too)."""
    labelled = labels != NO_LABEL
    target = labels.masked_fill(~labelled, -1)
    ce = F.cross_entropy(logits.flatten(0, 2).float(), target.flatten(), reduction="none",
                         ignore_index=-1)
    per = ce.view(labels.shape)
    if teacher is not None and kl:
        per = per + kl * kl_to_teacher(logits, teacher) * labelled
    w = weights * labelled
    loss = (per * weights).sum() / w.sum().clamp_min(1e-9)
    hits = ((logits.argmax(-1) == labels) & labelled).float().sum((0, 1))
    acc = hits / labelled.float().sum((0, 1)).clamp_min(1)
    return loss, acc


LR_FLOOR = 0.05  # the cosine ends at 5% of the peak learning rate


def lr_at(step: int, spec: TrainSpec) -> float:
    return warmup_cosine(step, spec.steps, spec.lr, spec.warmup, LR_FLOOR)


def split(n: int, spec: TrainSpec) -> tuple[list[int], list[int]]:
    perm = np.random.default_rng(spec.seed).permutation(n).tolist()
    n_val = max(1, int(n * spec.val_fraction))
    return perm[n_val:], perm[:n_val]


VAL_STREAM = 999_999  # seeds validation anchors apart from training's


@torch.no_grad()
def evaluate(drafter: Drafter, data: DistillSet, ids: list[int], spec: TrainSpec,
             d: Dist = SINGLE, target=None) -> dict:
    """Teacher-forced per-position accuracy on validation sequences (an offline proxy;
    online tau comes from the runtime): means over sequences. Each rank scores the ids
    it is given (its own shards'); sums are added over ranks, and every sequence's
    anchors are seeded by its id, so the result does not depend on the world size."""
    drafter.eval()
    bsz = drafter.cfg.block_size
    w = position_weights(bsz, spec.gamma).to(d.device)
    sums = torch.zeros(bsz + 1)  # loss, accuracy per position, sequences
    batches = [ids[a:a + spec.batch] for a in range(0, len(ids), spec.batch)]
    for k in range(d.max(len(batches))):  # as many rounds as the busiest rank: a sharded
        if k >= len(batches):            # target's layers gather in every rank's forward
            if target is not None:
                target_features(target, torch.zeros(1, 1, dtype=torch.long, device=d.device))
            continue
        picks = [(i, np.random.default_rng([spec.seed, VAL_STREAM, i])) for i in batches[k]]
        tokens, feats, anchors, labels = step_batch(data, picks, spec.anchors, bsz, target, d)
        with d.on_device(), autocast(spec.precision, d.device.type):
            loss, acc = block_loss(drafter(tokens, feats, anchors), head_labels(drafter, labels),
                                   w)
        sums += torch.cat([loss[None], acc, torch.ones(1, device=acc.device)]).cpu() * len(picks)
    drafter.train()
    sums = d.sum(sums)
    mean = sums[:-1] / sums[-1]
    acc = mean[1:]
    return {"val_loss": float(mean[0]), "val_accuracy": [round(float(x), 4) for x in acc],
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
          progress: bool = True, *, target=None, d: Dist = SINGLE,
          parallel: str = "ddp", teacher: Teacher | None = None) -> dict:
    """Train drafter on data; checkpoints, log.jsonl and resume in work. target: recompute
    the features with it in every step (the data may then hold tokens only); d, parallel:
    this process's place in a torchrun job and the wrapping (``distributed.py``); teacher:
    the target's distributions for the KL term (needed when spec.kl > 0). Every rank ends
    with the trained weights in drafter; only rank 0 writes files."""
    from tqdm import tqdm

    bsz = drafter.cfg.block_size
    train_ids, val_ids = split(len(data), spec)
    sampler = Sampler(data, train_ids, spec.batch, spec.seed, d.rank, d.world)
    data.keep(rank_shards(d.rank, d.world, len(data.shard_sizes), sampler.lanes))
    if target is None and not data.has_features:
        raise HyflashError("the data holds no cached features (generated for --features "
                           "recompute): rerun with --features recompute")
    if spec.prompt_anchors and not data.has_greedy:
        raise HyflashError("--prompt-anchors needs the target's greedy labels, which this data "
                           "lacks (written by an older hyflash, or for --features recompute): "
                           "rerun with --prompt-anchors 0, or regenerate the data")
    if spec.kl and teacher is None:
        raise HyflashError(f"kl {spec.kl} needs the target's distributions: pass a Teacher")
    if target is not None:
        place_target(target, d, parallel)
    model, trained = wrap(drafter, d, parallel)
    params = [p for p in trained.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(param_groups(trained, spec), lr=spec.lr, betas=(0.9, 0.95))
    w = position_weights(bsz, spec.gamma).to(d.device)
    if d.main:
        work.mkdir(parents=True, exist_ok=True)
    d.barrier()
    step, last_loss = 0, None
    run = run_settings(drafter, spec)
    meta = checkpoints.read_meta(work)
    if meta is not None:
        check_resumable(work / checkpoints.META, meta.get("run", run), run)
        checkpoints.load(model, opt, work, meta, d)
        step, last_loss = meta["step"], meta.get("loss")
    log = StepLog(work / "log.jsonl", step, d.main)
    val = Validation(work, step, d.main)
    own_val = [i for i in val_ids if data.owns(i)]
    last_val = None
    trained.train()
    bar = tqdm(total=spec.steps, initial=step, desc=f"train {drafter.cfg.arch}",
               disable=not (progress and d.main), dynamic_ncols=True)
    t0, ema = time.time(), None
    while step < spec.steps:
        tokens, feats, anchors, labels = step_batch(data, sampler.local(step), spec.anchors,
                                                    bsz, target, d, spec.prompt_anchors)
        lr = lr_at(step, spec)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        with d.on_device(), autocast(spec.precision, d.device.type):
            soft = teacher.logits(feats, anchors, bsz) if spec.kl else None
            loss, acc = block_loss(model(tokens, feats, anchors), head_labels(drafter, labels),
                                   w, soft, spec.kl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        mean_loss = d.mean(loss)  # the global batch's loss (the ranks' shares are equal)
        step, last_loss = step + 1, round(mean_loss, 4)
        log.write(step, mean_loss, lr)
        ema = acc.cpu() if ema is None else 0.95 * ema + 0.05 * acc.cpu()
        bar.update(1)
        if spec.eval_every and (step % spec.eval_every == 0 or step == spec.steps):
            last_val = validate(model, trained, drafter, data, own_val, spec, d, target, val,
                                step)
        post = {"loss": f"{mean_loss:.3f}", "acc": "/".join(f"{x:.2f}" for x in ema[:4].tolist())}
        if last_val is not None:
            post["val_tau"] = f"{last_val['val_expected_tau']:.2f}"
        bar.set_postfix(post)
        if step % spec.checkpoint_every == 0 or step == spec.steps:
            checkpoints.save(model, opt, work, {"step": step, "loss": last_loss, "run": run}, d,
                             save_checkpoint)
    bar.close()
    log.close()
    unwrap(model, drafter, d)
    report = {"train_spec": asdict(spec), "train_seconds_last_run": round(time.time() - t0, 1),
              "final_train_loss": last_loss, "world_size": d.world}
    if val.best:
        report["validations"] = [{k: r[k] for k in ("step", "val_loss", "val_expected_tau")}
                                 for r in val.rows] if d.main else []
        report["best_step"] = val.best[1]
        if spec.keep == "best":
            d.barrier()
            drafter.load_state_dict(val.best_weights(), strict=False)
            report["kept"] = f"best (step {val.best[1]} of {spec.steps})"
    report.update(evaluate(drafter, data, own_val, spec, d, target))
    return report


def validate(model, trained, drafter: Drafter, data: DistillSet, ids: list[int],
             spec: TrainSpec, d: Dist, target, val: Validation, step: int) -> dict:
    """Collective: score the validation sequences with the weights of this step, log them
    and keep them if they are the best so far (``validation.py``)."""
    result = evaluate(trained, data, ids, spec, d, target)
    weights = None
    if val.better(result["val_expected_tau"]):
        unwrap(model, drafter, d)  # FSDP: gather the whole weights into drafter
        weights = drafter.trainable_state()
    val.record(step, result, weights)
    return result


class StepLog:
    """``log.jsonl``, rank 0's: one line per step with the global batch's loss and the
    learning rate. A resumed run first drops the lines after its checkpoint."""

    def __init__(self, path: Path, step: int, enabled: bool):
        self.file = None
        if not enabled:
            return
        kept = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):  # a line torn by a killed run
                    continue
        path.write_text("".join(f"{line}\n" for line in kept))
        self.file = path.open("a")

    def write(self, step: int, loss: float, lr: float) -> None:
        if self.file:
            self.file.write(json.dumps({"step": step, "loss": loss, "lr": lr}) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


# settings that never change the weights a step computes: a run resumes under other values
AFTERMATH = ("checkpoint_every", "eval_every", "keep")


def run_settings(drafter: Drafter, spec: TrainSpec) -> dict:
    """What a checkpoint must agree with to be resumed: the drafter's config and every
    training setting (``AFTERMATH`` aside)."""
    train = {k: v for k, v in asdict(spec).items() if k not in AFTERMATH}
    return {"drafter": drafter.cfg.to_dict(), "train": train}


def check_resumable(ckpt: Path, saved: dict, now: dict) -> None:
    defaults = {"drafter": {}, "train": asdict(TrainSpec())}  # settings newer than a run
    for part in ("drafter", "train"):
        for key, value in now[part].items():
            was = saved[part].get(key, defaults[part].get(key))
            if was != value:
                raise HyflashError(
                    f"{ckpt} is a run with {key} {was!r}, not {value!r}: "
                    "rerun with its settings to resume it, or use another --work folder")

