"""Self-distillation data: the target writes the continuations the drafter learns.

A corpus (a folder of text files, a .txt, a .jsonl with "text"/"prompt" fields, or the
keyword ``stdlib`` for the pocket model's training split) is tokenized into one stream.
Prompts are windows of that stream at a mix of lengths (short and long, so the memory
sees long contexts); the target continues each one, greedily or by sampling (seeded),
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

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".jsonl")


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

    def key(self, target_id: str) -> str:
        blob = json.dumps({"target": target_id, **asdict(self)}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


# --------------------------------------------------------------------- corpus

def read_corpus(data: str | Path) -> list[str]:
    if str(data) == "stdlib":
        from hyflash.models.pocket.build import read_text, split_files

        train, _, _ = split_files()
        return [read_text(f) for f in train]
    path = Path(data)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    elif path.is_file():
        files = [path]
    else:
        raise HyflashError(f"no data at {data}: pass a folder of text files, a .txt or .jsonl "
                           "file, or `stdlib`")
    texts: list[str] = []
    for f in files:
        if f.suffix == ".jsonl":
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                rec = json.loads(line)
                text = rec.get("text") or rec.get("prompt") if isinstance(rec, dict) else None
                if not isinstance(text, str):
                    raise HyflashError(f"{f}:{i + 1}: a JSONL record needs a 'text' or 'prompt' "
                                       "string field")
                texts.append(text)
        else:
            texts.append(f.read_text(encoding="utf-8", errors="replace"))
    if not texts:
        raise HyflashError(f"no text in {data}: found no {', '.join(TEXT_SUFFIXES)} files")
    return texts


def token_stream(texts: list[str], tokenizer, eos_id: int) -> np.ndarray:
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return np.asarray(ids, dtype=np.int32)


def check_tokenizer(tokenizer, target: Target) -> None:
    """The tokenizer must produce ids the target's embedding knows."""
    n = len(tokenizer)
    if n > target.cfg.vocab_size:
        raise HyflashError(f"tokenizer does not match the target: it has {n} tokens, the "
                           f"target's vocabulary {target.cfg.vocab_size}; use the target's "
                           "own tokenizer")


# ----------------------------------------------------------------- generation

@torch.inference_mode()
def continue_batch(target: Target, prompts: torch.Tensor, gen_len: int, sample: bool,
                   temperature: float, gen: torch.Generator):
    """prompts [N, L] -> tokens [N, L+gen_len], features [N, L+gen_len-1, F].
    The last token is generated but not fed back, so it has no features."""
    n, length = prompts.shape
    if target.cache_batch != n:
        target.setup_cache(n)
    logits, feats = target.prefill(prompts)
    tokens, all_feats = [prompts], [feats]
    pos = length
    for i in range(gen_len):
        last = logits[:, -1].float()
        if sample:
            probs = torch.softmax(last / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=gen)
        else:
            nxt = last.argmax(-1, keepdim=True)
        tokens.append(nxt)
        if i < gen_len - 1:
            logits, feats = target(nxt, pos)
            all_feats.append(feats)
            pos += 1
    return torch.cat(tokens, 1), torch.cat(all_feats, 1)


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
                feats.append(f[i].to(torch.float16).numpy())
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

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        si, a, b, f, plen = self.items[i]
        tokens = torch.from_numpy(np.asarray(self.tokens[si][a:b], dtype=np.int64))
        feats = torch.from_numpy(np.asarray(self.features[si][f:f + b - a - 1],
                                            dtype=np.float32))
        return tokens, feats, plen
