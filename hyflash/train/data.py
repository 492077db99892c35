"""Self-distillation data: the target writes the continuations the drafter learns.

A corpus (read and checked by ``corpus.py``) is tokenized into one stream. Prompts are
windows of that stream at a mix of lengths (short and long, so the memory sees long
contexts); the target continues each one, greedily or by sampling (seeded),
and the run caches tokens *and* the target's features for every position, since
generation computes them anyway. Shards are written atomically, so an interrupted run
resumes at the next missing shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hyflash.errors import HyflashError
from hyflash.models.target import Target


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

    def key(self, target_id: str, corpus_id: str) -> str:
        """Names the data folder: a new target, corpus or spec means new data."""
        blob = json.dumps({"target": target_id, "corpus": corpus_id, **asdict(self)},
                          sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


# ------------------------------------------------------------------ tokenizer

def check_tokenizer(tokenizer, target: Target) -> None:
    """The tokenizer must produce ids the target's embedding knows."""
    n = len(tokenizer)
    if n > target.cfg.vocab_size:
        raise HyflashError(f"tokenizer does not match the target: it has {n} tokens, the "
                           f"target's vocabulary {target.cfg.vocab_size}; use the target's "
                           "own tokenizer")


# ----------------------------------------------------------------- generation

PREFILL_SCORES_BYTES = 1 << 25  # attention scores of one prefill chunk (32 MB)


def prefill_chunk(target: Target, n: int, keys: int) -> int:
    """Prompt tokens per prefill call, so that one layer's attention scores (n rows x
    heads x chunk x keys, fp32) stay under PREFILL_SCORES_BYTES. A batch of 32 prompts
    of 2000 tokens in one call would need 4.6 GB for them; and chunks this small are
    faster too (measured: 20-30% less prefill time than 256 MB chunks at 512-1024 tokens;
    the scores and activations of a chunk stay in cache)."""
    per_token = n * target.cfg.num_attention_heads * keys * 4
    return max(1, PREFILL_SCORES_BYTES // per_token)


@torch.inference_mode()
def continue_batch(target: Target, prompts: torch.Tensor, gen_len: int, sample: bool,
                   temperature: float, gen: torch.Generator):
    """prompts [N, L] -> tokens [N, L+gen_len] (int64), features [N, L+gen_len-1, F]
    (float16). The last token is generated but not fed back, so it has no features.

    Where the time goes, and why it is spent this way: the whole batch is prefilled
    together, in chunks; the KV cache holds exactly the L+gen_len-1 positions this batch
    feeds (each decode step attends over all of it, so a cache of the target's whole
    context would cost up to 4x the weights' traffic per step); logits are computed for
    the last position only; features go straight into one preallocated float16 buffer."""
    n, length = prompts.shape
    fed = length + gen_len - 1
    target.setup_cache(n, max_len=fed)
    tokens = torch.empty(n, fed + 1, dtype=torch.long)
    tokens[:, :length] = prompts
    feats = torch.empty(n, fed, target.cfg.feature_size, dtype=torch.float16)
    chunk = prefill_chunk(target, n, fed)
    for a in range(0, length, chunk):
        logits, f = target(prompts[:, a:a + chunk], a, last_logits=True)
        feats[:, a:a + f.shape[1]] = f
    for pos in range(length, fed + 1):
        last = logits[:, -1].float()
        if sample:
            probs = torch.softmax(last / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=gen)
        else:
            nxt = last.argmax(-1, keepdim=True)
        tokens[:, pos] = nxt[:, 0]
        if pos < fed:
            logits, f = target(nxt, pos, last_logits=True)
            feats[:, pos] = f[:, 0]
    return tokens, feats


def generate_dataset(target: Target, stream: np.ndarray, spec: DataSpec, out: Path,
                     progress: bool = True) -> Path:
    """Write shards of (tokens, features, prompt length) to out; resume where it stopped."""
    from tqdm import tqdm

    max_len = spec.long_prompt[1] + spec.gen_len
    if max_len > target.cfg.max_seq_len:
        raise HyflashError(f"prompt + continuation ({max_len}) exceeds the target's context "
                           f"({target.cfg.max_seq_len}); shorten the prompts or --gen-len")
    if len(stream) < 4 * max_len:
        raise HyflashError(f"too few examples: the corpus has {len(stream)} tokens, need at "
                           f"least {4 * max_len} to cut prompts of up to {max_len}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(asdict(spec), indent=1))
    shards = -(-spec.sequences // spec.shard)
    bar = tqdm(total=spec.sequences, desc="distil", disable=not progress, dynamic_ncols=True)
    for s in range(shards):
        size = min(spec.shard, spec.sequences - s * spec.shard)
        if (out / f"shard{s:04d}.json").exists():
            bar.update(size)
            continue
        rng = np.random.default_rng([spec.seed, s])
        gen = torch.Generator().manual_seed(spec.seed * 100003 + s)
        toks, feats, meta = [], [], []
        done = 0
        while done < size:
            n = min(spec.batch, size - done)
            lo, hi = spec.long_prompt if rng.random() < spec.long_fraction else spec.short_prompt
            length = int(rng.integers(lo, hi + 1))
            starts = rng.integers(0, len(stream) - length, n)
            prompts = torch.from_numpy(np.stack([stream[a:a + length] for a in starts])).long()
            sample = bool(rng.random() < spec.sampled_fraction)
            t, f = continue_batch(target, prompts, spec.gen_len, sample, spec.temperature, gen)
            for i in range(n):
                toks.append(t[i].numpy().astype(np.int32))
                feats.append(f[i].numpy())
                meta.append({"prompt_len": length, "sampled": sample})
            done += n
            bar.update(n)
        write_shard(out, s, toks, feats, meta)
    bar.close()
    return out


def write_shard(out: Path, s: int, toks, feats, meta) -> None:
    def offsets(arrays) -> list[int]:
        return np.concatenate([[0], np.cumsum([len(x) for x in arrays])]).tolist()

    for name, arr in (("tokens", np.concatenate(toks)), ("features", np.concatenate(feats))):
        tmp = out / f"shard{s:04d}.{name}.tmp.npy"
        np.save(tmp, arr)
        os.replace(tmp, out / f"shard{s:04d}.{name}.npy")
    index = {"token_offsets": offsets(toks), "feature_offsets": offsets(feats),
             "sequences": meta}
    tmp = out / f"shard{s:04d}.json.tmp"
    tmp.write_text(json.dumps(index))
    os.replace(tmp, out / f"shard{s:04d}.json")  # the index is written last: a shard's marker


# ----------------------------------------------------------------------- read

class DistillSet:
    """Memory-mapped view of generated shards: sequence i -> (tokens [T], features [T-1, F],
    prompt length). The last token has no features: it was never fed to the target."""

    def __init__(self, folder: Path):
        self.items: list[tuple[int, int, int, int, int]] = []
        self.tokens, self.features = [], []
        for idx_file in sorted(folder.glob("shard*.json")):
            stem = idx_file.name[: -len(".json")]
            index = json.loads(idx_file.read_text())
            si = len(self.tokens)
            self.tokens.append(np.load(folder / f"{stem}.tokens.npy", mmap_mode="r"))
            self.features.append(np.load(folder / f"{stem}.features.npy", mmap_mode="r"))
            to, fo = index["token_offsets"], index["feature_offsets"]
            for i, m in enumerate(index["sequences"]):
                self.items.append((si, to[i], to[i + 1], fo[i], m["prompt_len"]))
        if not self.items:
            raise HyflashError(f"no generated data in {folder}")

    def __len__(self) -> int:
        return len(self.items)

    def token_parts(self):
        """(prompt tokens, generated tokens) of every sequence, as numpy views."""
        for si, a, b, _, plen in self.items:
            yield self.tokens[si][a:a + plen], self.tokens[si][a + plen:b]

    def draft_vocabulary(self, size: int, vocab_size: int) -> torch.Tensor:
        """The ``size`` ids ``train --draft-vocab`` scores: the target's most written here
        (``hyflash.models.draft_vocab.most_frequent``)."""
        from hyflash.models.draft_vocab import most_frequent

        prompts, generated = zip(*self.token_parts(), strict=True)
        return most_frequent(list(generated), list(prompts), size, vocab_size)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        si, a, b, f, plen = self.items[i]
        tokens = torch.from_numpy(np.asarray(self.tokens[si][a:b], dtype=np.int64))
        feats = torch.from_numpy(np.asarray(self.features[si][f:f + b - a - 1],
                                            dtype=np.float32))
        return tokens, feats, plen
