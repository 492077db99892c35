"""Self-distillation data: the target writes the continuations the drafter learns.

A corpus (read and checked by ``corpus.py``) is tokenized into one stream. Prompts are
windows of that stream at a mix of lengths (short and long, so the memory sees long
contexts); an engine (``engines.py``; hyflash's own target by default) continues each one,
greedily or by sampling (seeded), and the run caches tokens and, unless the training step
recomputes them (``features.py``), the target's features for every position. Each shard
depends only on (seed, shard number), so shards can be generated in any order and by
different processes (each rank of a torchrun job writes its own); they are written
atomically (``shards.py``), so an interrupted run resumes at the next missing shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hyflash.errors import HyflashError
from hyflash.models.target import Target
from hyflash.train.shards import DistillSet, Shard, shard_exists, shard_path, write_shard

__all__ = ["DataSpec", "DistillSet", "generate_dataset"]  # DistillSet: shards


@dataclass
class DataSpec:
    sequences: int = 2048
    gen_len: int = 128
    short_prompt: tuple[int, int] = (32, 128)
    long_prompt: tuple[int, int] = (256, 1920)
    long_fraction: float = 0.6
    sampled_fraction: float = 0.0
    temperature: float = 1.0
    batch: int = 32
    shard: int = 128
    seed: int = 0

    def key(self, target_id: str, corpus_id: str, extra: dict | None = None) -> str:
        """Names the data folder: a new target, corpus or spec means new data. ``extra``:
        settings that are not the default (another engine, features not cached); left
        out when empty, so folders written before those settings existed keep their key."""
        blob = json.dumps({"target": target_id, "corpus": corpus_id, **asdict(self),
                           **(extra or {})}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    @property
    def shards(self) -> int:
        return -(-self.sequences // self.shard)

    @classmethod
    def read(cls, folder: Path) -> DataSpec:
        """The spec a data folder was written with (its ``spec.json``, as
        ``generate_dataset`` writes it); ValueError or TypeError if unreadable."""
        raw = json.loads((folder / "spec.json").read_text())
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


# ------------------------------------------------------------------ tokenizer

def check_tokenizer(tokenizer, target: Target) -> None:
    """The tokenizer must produce ids the target's embedding knows."""
    n = len(tokenizer)
    if n > target.cfg.vocab_size:
        raise HyflashError(f"tokenizer does not match the target: it has {n} tokens, the "
                           f"target's vocabulary {target.cfg.vocab_size}; use the target's "
                           "own tokenizer")


def features_for(target: Target, tokens: list[np.ndarray], batch: int,
                 precision: str = "float32", greedy: list[np.ndarray] | None = None
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The target's features (float16 [T-1, F]) and greedy labels (int32 [T-1]) of
    sequences generated earlier: one causal pass (at ``precision``) per run of up to
    ``batch`` consecutive sequences of equal length (a generation batch has one length).
    greedy: their labels from an earlier pass at the same precision; the pass then stops
    at the last tap layer and skips the LM head (on SmolLM2-135M at bf16, half its time:
    ``benchmarks/label_pass.py``), the features the same."""
    from hyflash.train.features import features_and_greedy, target_features

    device = target.embed_tokens.weight.device
    out: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    i = 0
    while i < len(tokens):
        j = i + 1
        while j < len(tokens) and j - i < batch and len(tokens[j]) == len(tokens[i]):
            j += 1
        t = torch.from_numpy(np.stack(tokens[i:j])).long().to(device)
        if greedy is None:
            f, g = features_and_greedy(target, t[:, :-1], precision)
            labels += [x.cpu().numpy().astype(np.int32) for x in g]
        else:
            f = target_features(target, t[:, :-1], precision)
            labels += [np.asarray(x, np.int32) for x in greedy[i:j]]
        out += [x.cpu().numpy() for x in f.half()]
        i = j
    return out, labels


def link_shard(folders, out: Path, s: int, size: int) -> bool:
    """Shard s of the first folder that has it with ``size`` sequences -> out (a hard link,
    a copy across file systems), atomically; False when none has it."""
    for folder in folders:
        src = shard_path(Path(folder), s)
        if not src.exists() or len(Shard(src)) != size:
            continue
        tmp = shard_path(out, s).with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, shard_path(out, s))
        return True
    return False


def generate_dataset(target: Target, stream: np.ndarray, spec: DataSpec, out: Path,
                     progress: bool = True, engine=None, shards=None,
                     features: bool = True, tokens_from: Path | None = None,
                     feature_precision: str = "float32", grown_from=()) -> Path:
    """Write shards of (tokens, features, prompt length) to out; resume where it stopped.
    engine: ``engines.py`` (default: hyflash's, on ``target``); shards: the shard numbers
    to write (default: all; a rank writes its own); features: cache them (else tokens
    only: the training step recomputes them). tokens_from: a tokens-only folder of the
    same spec (``--features recompute``, perhaps generated on another machine): its
    shards' tokens are taken as they are and only their features computed (one causal
    pass, no decoding); shards it lacks are generated. feature_precision: float32 takes
    the features decoding computes; bfloat16 decodes at float32 (the continuations are the
    target's own) and computes every shard's features by one bf16 causal pass. grown_from:
    folders of the same data with another sequence count (``command.grown_from``): a full
    shard s there is shard s here (it depends only on the seed and s), so it is linked
    instead of generated, and growing --sequences costs only the new shards."""
    from tqdm import tqdm

    from hyflash.train.engines import HyflashEngine
    from hyflash.train.features import features_and_greedy

    max_len = spec.long_prompt[1] + spec.gen_len
    if max_len > target.cfg.max_seq_len:
        raise HyflashError(f"prompt + continuation ({max_len}) exceeds the target's context "
                           f"({target.cfg.max_seq_len}); shorten the prompts or --gen-len")
    if len(stream) < 4 * max_len:
        raise HyflashError(f"too few examples: the corpus has {len(stream)} tokens, need at "
                           f"least {4 * max_len} to cut prompts of up to {max_len}")
    engine = engine or HyflashEngine(target)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "spec.json").exists():
        (out / "spec.json").write_text(json.dumps(asdict(spec), indent=1))
    todo = list(range(spec.shards) if shards is None else shards)
    sizes = {s: min(spec.shard, spec.sequences - s * spec.shard) for s in todo}
    bar = tqdm(total=sum(sizes.values()), desc="distil", disable=not progress,
               dynamic_ncols=True)
    for s in todo:
        size = sizes[s]
        if shard_exists(out, s) or link_shard(grown_from, out, s, size):
            bar.update(size)
            continue
        if features and tokens_from is not None and shard_path(tokens_from, s).exists():
            src = Shard(shard_path(tokens_from, s))
            toks = [src.tokens(i).numpy().astype(np.int32) for i in range(len(src))]
            known = src.has_greedy and src.greedy_precision == feature_precision
            feats, labels = features_for(target, toks, spec.batch, feature_precision,
                                         [src.greedy(i).numpy() for i in range(len(src))]
                                         if known else None)
            write_shard(out, s, toks, feats, src.meta, greedy=labels,
                        greedy_precision=feature_precision)
            bar.update(size)
            continue
        rng = np.random.default_rng([spec.seed, s])
        gen = torch.Generator().manual_seed(spec.seed * 100003 + s)
        toks, feats, labels, meta = [], [], [], []
        done = 0
        while done < size:
            n = min(spec.batch, size - done)
            lo, hi = spec.long_prompt if rng.random() < spec.long_fraction else spec.short_prompt
            length = int(rng.integers(lo, hi + 1))
            starts = rng.integers(0, len(stream) - length, n)
            prompts = torch.from_numpy(np.stack([stream[a:a + length] for a in starts])).long()
            sample = bool(rng.random() < spec.sampled_fraction)
            from_decoding = features and feature_precision == "float32"
            t, f, g = engine.continue_batch(prompts, spec.gen_len, sample, spec.temperature,
                                            gen, features=from_decoding)
            if features and f is None:  # tokens only (engine or precision): one causal pass
                f, g = features_and_greedy(target,
                                           t[:, :-1].to(target.embed_tokens.weight.device),
                                           feature_precision)
                f = f.half()
            for i in range(n):
                toks.append(t[i].cpu().numpy().astype(np.int32))
                if features:
                    feats.append(f[i].cpu().numpy())
                    labels.append(g[i].cpu().numpy().astype(np.int32))
                meta.append({"prompt_len": length, "sampled": sample})
            done += n
            bar.update(n)
        write_shard(out, s, toks, feats if features else None, meta,
                    greedy=labels if features else None, greedy_precision=feature_precision)
    bar.close()
    return out
