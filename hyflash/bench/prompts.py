"""Held-out code prompts: text no model or drafter here was trained on.

The pocket model, its drafters and the SmolLM2 drafter all train on the *train* split of
the Python standard library (``hyflash.train.corpus``); these prompts come from the
held-out split, so tau and speed are measured on unseen code.

- ``code_prompts``: a file's beginning up to a ``def`` line, so the model continues a
  function body (the demo's prompts; ``speed_texts``: the speed rows', short and long);
- ``context_windows``: windows of exactly n tokens of the held-out token stream, for
  tau at a given context length (as ``benchmarks/drafter_tau.py`` measures it).
"""

from __future__ import annotations

import numpy as np

from hyflash.errors import HyflashError

# held out in CPython 3.10-3.13's stdlib (hyflash.train.corpus.is_heldout); other
# versions fall back to whatever held-out files they have
PREFERRED = ("reprlib.py", "wsgiref/headers.py", "importlib/util.py", "idlelib/searchengine.py",
             "email/encoders.py", "idlelib/history.py", "xml/etree/ElementPath.py",
             "lib2to3/fixer_util.py")


def heldout_sources() -> list[tuple[str, str]]:
    """(relative path, text) of the held-out stdlib files, preferred ones first."""
    from hyflash.train.corpus import read_text, split_files

    _, held, root = split_files()
    named = {f.relative_to(root).as_posix(): f for f in held}
    order = [n for n in PREFERRED if n in named] + sorted(set(named) - set(PREFERRED))
    return [(n, read_text(named[n])) for n in order]


def cut_at_def(text: str, min_chars: int, max_chars: int) -> str | None:
    """The text up to the end of the first ``def`` line after min_chars characters (at
    most max_chars), so that the continuation is a function body; None if none."""
    pos = 0
    for line in text.splitlines(keepends=True):
        end = pos + len(line)
        if end > max_chars:
            return None
        if end >= min_chars and line.lstrip().startswith("def ") and line.rstrip().endswith(":"):
            return text[:end]
        pos = end
    return None


def code_prompts(n: int, min_chars: int = 300, max_chars: int = 1500) -> list[str]:
    """n prompts from n different held-out files, each ending on a ``def`` line."""
    out = []
    for _, text in heldout_sources():
        p = cut_at_def(text, min_chars, max_chars)
        if p:
            out.append(p)
        if len(out) == n:
            return out
    raise HyflashError(f"this Python's held-out stdlib split gives only {len(out)} code prompts "
                       f"of {min_chars}-{max_chars} characters, not {n}: pass fewer")


def speed_texts(short: int, long: int) -> list[str]:
    """The speed rows' prompts: ``short`` code prompts of 300-1500 characters, then
    ``long`` ones of 2500-5000 (from other files than the short ones)."""
    return code_prompts(short) + (code_prompts(long + short, 2500, 5000)[short:] if long
                                  else [])


def context_windows(tokenizer, length: int, n: int, seed: int) -> list[list[int]]:
    """n windows of exactly `length` tokens from the held-out stream (files joined with EOS)."""
    ids: list[int] = []
    for _, text in heldout_sources():
        ids.extend(tokenizer(text, add_special_tokens=False).input_ids)
        ids.append(tokenizer.eos_token_id or 0)
    if len(ids) <= length:
        raise HyflashError(f"the held-out split has {len(ids)} tokens, fewer than a context of "
                           f"{length}")
    starts = np.random.default_rng(seed).integers(0, len(ids) - length, n)
    return [ids[s:s + length] for s in starts]
