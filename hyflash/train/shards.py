"""Self-distillation data on disk: numbered shards that each rank streams on its own.

A shard is one ``shardNNNN.safetensors`` file: ``tokens`` (int32, the shard's sequences
concatenated), ``features`` (float16 [rows, F], the target's tap features of every fed
token; absent when the run recomputes them in the training step), ``greedy`` (int32
[rows], the target's argmax after every fed token, beside the features or in a tokens-only
shard, where a later features pass at the same precision takes them instead of running
the LM head; absent in folders written before it existed) and, in the header's
metadata, the offsets and prompt length of every sequence (and the precision of the pass
that computed ``greedy``, where known). It is written to a temp file
and renamed, so a shard exists whole or not at all and an interrupted run resumes at the
next missing one. safetensors because a reader can slice one sequence out of a shard
without loading the rest (the file is memory-mapped), and every framework reads it.

Folders written before this format hold ``shardNNNN.{tokens,features}.npy`` + a
``shardNNNN.json`` index (written last, the shard's marker); they are read as they are,
shard by shard, so a folder may mix both (a run resumed by a newer hyflash).

``DistillSet`` numbers the sequences of all shards in shard order (the global ids the
validation split and the batch sampler use) from the shards' metadata alone, and opens
the data of a shard only when one of its sequences is read; given ``shards``, it reads
only those (a rank's own, ``lanes.py``) and refuses any other sequence.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from pathlib import Path

import numpy as np
import torch

from hyflash.errors import HyflashError

SHARD_RE = re.compile(r"shard(\d{4,})\.(safetensors|json)$")
META_KEY = "hyflash"
FORMAT = 1


def shard_path(folder: Path, s: int) -> Path:
    return folder / f"shard{s:04d}.safetensors"


def shard_exists(folder: Path, s: int) -> bool:
    """A finished shard, in either format."""
    return shard_path(folder, s).exists() or (folder / f"shard{s:04d}.json").exists()


def offsets(lengths) -> list[int]:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()


def write_shard(folder: Path, s: int, toks: list[np.ndarray], feats: list[np.ndarray] | None,
                meta: list[dict], greedy: list[np.ndarray] | None = None,
                greedy_precision: str | None = None) -> Path:
    """One shard: sequences' tokens, their features (None: not cached), the target's
    greedy labels (one per fed token, as long as the features; with or without them) and
    per-sequence metadata ({"prompt_len", "sampled"}), atomically. greedy_precision: the
    precision of the pass that computed the labels (``features.PRECISIONS``)."""
    from safetensors.torch import save_file

    tensors = {"tokens": torch.from_numpy(np.concatenate(toks).astype(np.int32))}
    index = {"format": FORMAT, "token_offsets": offsets([len(t) for t in toks]),
             "sequences": meta}
    fed = [len(f) for f in feats] if feats is not None else [len(t) - 1 for t in toks]
    if feats is not None or greedy is not None:  # rows of the per-fed-token arrays
        index["feature_offsets"] = offsets(fed)
    if feats is not None:
        tensors["features"] = torch.from_numpy(np.concatenate(feats).astype(np.float16))
    if greedy is not None:
        if [len(g) for g in greedy] != fed:
            raise ValueError("greedy labels must be one per fed token, as long as the "
                             "features")
        tensors["greedy"] = torch.from_numpy(np.concatenate(greedy).astype(np.int32))
        if greedy_precision is not None:
            index["greedy_precision"] = greedy_precision
    out = shard_path(folder, s)
    tmp = out.with_suffix(".tmp")
    save_file(tensors, tmp, metadata={META_KEY: json.dumps(index)})
    os.replace(tmp, out)
    return out


class Shard:
    """One shard's index (always) and its arrays (opened on first read)."""

    def __init__(self, path: Path):
        self.path = path
        self.legacy = path.suffix == ".json"
        self._data = self._file = None
        try:
            if self.legacy:
                index = json.loads(path.read_text())
            else:
                from safetensors import safe_open

                with safe_open(path, "pt") as f:
                    index = json.loads((f.metadata() or {})[META_KEY])
                    self.has_features = "features" in f.keys()
                    self.has_greedy = "greedy" in f.keys()
        except Exception as e:  # truncated, foreign or hand-edited files fail in many ways
            raise HyflashError(f"data shard {path} is damaged ({type(e).__name__}): delete it "
                               "and rerun the command to regenerate it") from None
        if self.legacy:
            self.has_features, self.has_greedy = True, False
        self.token_offsets = index["token_offsets"]
        self.feature_offsets = index.get("feature_offsets")
        self.meta = index["sequences"]
        self.greedy_precision = index.get("greedy_precision")  # None: not recorded
        self.prompt_lens = [int(m["prompt_len"]) for m in self.meta]

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def _open(self):
        if self._data is None:
            if self.legacy:
                stem = self.path.name[: -len(".json")]
                self._data = {name: np.load(self.path.parent / f"{stem}.{name}.npy",
                                            mmap_mode="r") for name in ("tokens", "features")}
            else:
                from safetensors import safe_open

                self._file = safe_open(self.path, "pt")  # kept open: the slices map it
                self._data = {k: self._file.get_slice(k) for k in self._file.keys()}
        return self._data

    def tokens(self, i: int) -> torch.Tensor:
        a, b = self.token_offsets[i], self.token_offsets[i + 1]
        part = self._open()["tokens"][a:b]
        return torch.from_numpy(np.array(part, np.int64)) if self.legacy else part.long()

    def _fed_rows(self, name: str, i: int):
        """Sequence i's rows of a per-fed-token array (features, greedy): T-1 of them, the
        last token was never fed."""
        a = self.feature_offsets[i]
        n = self.token_offsets[i + 1] - self.token_offsets[i] - 1
        return self._open()[name][a:a + n]

    def features(self, i: int) -> torch.Tensor:
        """[T-1, F] float32."""
        part = self._fed_rows("features", i)
        return torch.from_numpy(np.array(part, np.float32)) if self.legacy else part.float()

    def greedy(self, i: int) -> torch.Tensor:
        """[T-1] int64: the target's argmax after each fed token (aligned with features)."""
        return self._fed_rows("greedy", i).long()


def shard_files(folder: Path) -> dict[int, Path]:
    """Shard number -> its marker file (the safetensors file, or a legacy index)."""
    found = {}
    for p in folder.glob("shard*"):
        m = SHARD_RE.fullmatch(p.name)
        if m:
            found.setdefault(int(m.group(1)), p)
            if m.group(2) == "safetensors":
                found[int(m.group(1))] = p
    return dict(sorted(found.items()))


class DistillSet:
    """Sequences of a data folder: id -> (tokens [T], features [T-1, F] or None, prompt
    length). ``shards``: the shard numbers this reader may open (default: all)."""

    def __init__(self, folder: Path, shards=None):
        files = shard_files(Path(folder))
        if not files:
            raise HyflashError(f"no generated data in {folder}")
        self.numbers = list(files)
        self.shards = [Shard(p) for p in files.values()]
        self.starts = offsets([len(s) for s in self.shards])
        self.local = set(self.numbers if shards is None else shards)

    def __len__(self) -> int:
        return self.starts[-1]

    def keep(self, positions) -> DistillSet:
        """Own only the shards at these positions (a rank's, ``lanes.rank_shards``)."""
        self.local = {self.numbers[k] for k in positions}
        return self

    @property
    def shard_sizes(self) -> list[int]:
        return [len(s) for s in self.shards]

    def shard_of(self, i: int) -> int:
        """Position (in ``numbers``) of the shard that holds sequence i."""
        return bisect.bisect_right(self.starts, i) - 1

    def ids_of(self, positions) -> list[int]:
        """Global ids of every sequence in the shards at these positions."""
        return [i for k in positions for i in range(self.starts[k], self.starts[k + 1])]

    def owns(self, i: int) -> bool:
        return self.numbers[self.shard_of(i)] in self.local

    def local_ids(self) -> list[int]:
        return self.ids_of(k for k, n in enumerate(self.numbers) if n in self.local)

    @property
    def has_features(self) -> bool:
        return all(s.has_features for s, n in zip(self.shards, self.numbers, strict=True)
                   if n in self.local)

    def _locate(self, i: int) -> tuple[Shard, int]:
        k = self.shard_of(i)
        if self.numbers[k] not in self.local:
            raise IndexError(f"sequence {i} is in shard {self.numbers[k]}, which this reader "
                             "does not own")
        return self.shards[k], i - self.starts[k]

    @property
    def has_greedy(self) -> bool:
        return all(s.has_greedy for s, n in zip(self.shards, self.numbers, strict=True)
                   if n in self.local)

    def greedy(self, i: int) -> torch.Tensor:
        shard, j = self._locate(i)
        return shard.greedy(j)

    def get(self, i: int, features: bool = True):
        shard, j = self._locate(i)
        feats = shard.features(j) if features else None
        return shard.tokens(j), feats, shard.prompt_lens[j]

    def token_parts(self):
        """(prompt tokens, generated tokens) of every sequence this reader owns."""
        for i in self.local_ids():
            tokens, _, plen = self.get(i, features=False)
            yield tokens.numpy()[:plen], tokens.numpy()[plen:]

    def token_counts(self, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        """How often each id occurs in the generated parts and in the prompts (own shards)."""
        gen = np.zeros(vocab_size, dtype=np.int64)
        prompt = np.zeros(vocab_size, dtype=np.int64)
        for p, g in self.token_parts():
            np.add.at(prompt, p, 1)
            np.add.at(gen, g, 1)
        return gen, prompt

    def draft_vocabulary(self, size: int, vocab_size: int) -> torch.Tensor:
        """The ``size`` ids ``train --draft-vocab`` scores: the target's most written here
        (``hyflash.models.draft_vocab.rank_counts``)."""
        from hyflash.models.draft_vocab import rank_counts

        return rank_counts(*self.token_counts(vocab_size), size)
