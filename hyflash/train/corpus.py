"""Text corpora: the stdlib split the pocket model trains on, and the user's prompt files.

One home for both readers, because `train`, the pocket build and the benchmarks must
agree on which stdlib files are held out, and because a corpus is user input: a file
that is not UTF-8, is binary, is empty, or a JSONL line that is not a record with a
``text`` / ``prompt`` string ends as one line naming the file (and line) and the fix,
never as a traceback or as replacement characters silently trained on.

The stdlib is read with ``errors="replace"`` (as the pocket model was built), so the
split and its tokens stay exactly what the shipped model saw.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np

from hyflash.errors import HyflashError

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".jsonl")
HELDOUT_PERCENT = 3  # stdlib files whose path hash falls below this go to the held-out split
JSONL_FIELDS = ("text", "prompt")


# ----------------------------------------------------------------------- stdlib

def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise HyflashError(f"no stdlib sources: {root} is not a directory; pass --stdlib DIR")
    files = sorted(
        p for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    if len(files) < 50:
        raise HyflashError(
            f"no stdlib sources: found {len(files)} .py files under {root}; "
            "this Python may ship compiled-only stdlib, pass --stdlib DIR"
        )
    return files


def is_heldout(rel_path: str) -> bool:
    """Fixed split: a file is held out iff the hash of its relative path says so."""
    h = int(hashlib.sha1(rel_path.encode()).hexdigest(), 16)
    return h % 100 < HELDOUT_PERCENT


def split_files(root: Path | None = None) -> tuple[list[Path], list[Path], Path]:
    """-> (train files, held-out files, root) of the stdlib sources."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    train, held = [], []
    for f in files:
        (held if is_heldout(f.relative_to(root).as_posix()) else train).append(f)
    return train, held, root


def read_text(path: Path) -> str:
    """A stdlib source file, undecodable bytes replaced (as the pocket model saw them)."""
    return path.read_text(encoding="utf-8", errors="replace")


# ----------------------------------------------------------------- user corpus

def read_corpus(data: str | Path) -> list[str]:
    """`stdlib`, a folder of text files, a text file or a .jsonl -> its texts (non-empty)."""
    if str(data) == "stdlib":
        train, _, _ = split_files()
        return [read_text(f) for f in train]
    path = Path(data)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        texts = [t for f in files for t in read_file(f)]
        if not texts:
            raise HyflashError(f"no text in {data}: found no non-empty "
                               f"{', '.join(TEXT_SUFFIXES)} files")
        return texts
    if path.is_file():
        texts = read_file(path)
        if not texts:
            raise HyflashError(f"no text in {data}: the file is empty; pass a corpus with text")
        return texts
    raise HyflashError(f"no data at {data}: pass a folder of text files, a .txt or .jsonl "
                       "file, or `stdlib`")


def read_file(f: Path) -> list[str]:
    """One corpus file -> its texts ([] if it holds none); bad content is a HyflashError."""
    text = decode(f)
    if f.suffix != ".jsonl":
        return [text] if text.strip() else []
    texts = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            texts.append(jsonl_text(line, f"{f}:{i + 1}"))
    return [t for t in texts if t.strip()]


def decode(f: Path) -> str:
    try:
        raw = f.read_bytes()
    except OSError as e:
        raise HyflashError(f"cannot read {f}: {e.strerror}") from None
    if b"\0" in raw:
        raise HyflashError(f"{f} is binary (it holds NUL bytes), not text: remove it from the "
                           "corpus")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HyflashError(f"{f} is not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                           f"{e.start}): convert it to UTF-8 or remove it from the "
                           "corpus") from None


def jsonl_text(line: str, where: str) -> str:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise HyflashError(f"{where}: not a JSON line ({e.msg}); write one JSON object per "
                           "line") from None
    if not isinstance(rec, dict):
        got = "null" if rec is None else f"a JSON {type(rec).__name__}"
    else:
        field = next((k for k in JSONL_FIELDS if k in rec), None)
        if field is not None and isinstance(rec[field], str):
            return rec[field]
        got = (f"keys {sorted(rec)[:4]}" if field is None
               else f"{field!r} of type {type(rec[field]).__name__}")
    raise HyflashError(f"{where}: a JSONL record needs a 'text' or 'prompt' string field, "
                       f"got {got}")


def corpus_digest(texts: list[str]) -> str:
    """sha1 of the texts in order: the data cache is keyed by what the prompts come from."""
    h = hashlib.sha1()
    for t in texts:
        h.update(t.encode("utf-8", errors="surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def token_stream(texts: list[str], tokenizer, eos_id: int) -> np.ndarray:
    """All texts tokenized into one stream, each followed by EOS."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return np.asarray(ids, dtype=np.int32)
