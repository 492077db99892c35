"""A long-range evaluation set: held-out code where the next tokens repeat something that
left the drafter's window long ago.

A drafter with a local window of W context features and a memory of everything older
can only show what its memory is worth where the tokens to draft are knowable from
context older than W and not from the window. Ordinary held-out prompts hardly test
that (README, "The pocket model's drafters"), so this module scans real files (the
held-out stdlib split, ``corpus.split_files``) for such positions instead of building
puzzles.

Selection rule (exact, deterministic). In a file's token ids ``x``, an anchor ``p`` (the
first token the target writes after the prompt; the drafter's first block then drafts
``x[p+1 : p+1+span]``) qualifies when (``long_range_positions``)

1. the (span+1)-gram ``x[p : p+1+span]`` occurred earlier, and its latest such
   occurrence ``x[s : s+1+span]`` ends at or before ``p - W``: it lies entirely in what
   the drafter has evicted from its window when it drafts at p (it holds the features
   of the prompt; the window is ``x[p-W:p]``);
2. the drafted span ``x[p+1 : p+1+span]`` occurs nowhere that overlaps the window or the
   anchor (no start in ``(p-W-span, p]``): nothing recent gives it away;
3. the drafted span's text holds a letter or digit (not indentation or punctuation
   alone; optional ``text_of`` decoder);
4. ``p`` is not inside an earlier selected repeat: after a selection at p the scan
   resumes where the repeat ends (``length``: tokens from p that equal those from s), so
   each repeat counts once, at its start;

and it enters the set when (``file_items``, ``target_writes``)

5. its prompt ``x[a:p]``, with ``a`` the multiple of C (chunk, 1024) that leaves C to
   2C-1 tokens before p, holds the occurrence (``s >= a``) and leaves room for the run's
   new tokens (``p - a + room <= 2C``);
6. the target, given that prompt, greedily writes the anchor and the span exactly as the
   file has them. A drafter is scored against the target, not the file: only where the
   target itself repeats the old text can recalling it earn tau. One teacher-forced
   target pass per prompt start ``a`` checks every position of the chunk.

``spread`` draws n of them (seeded), one file at a time in turn. ``kind`` names what
repeats (the repeat's text, first rule that fits): ``line`` (it covers a whole non-blank
line), ``string`` (it holds a quote), ``arguments`` (a parenthesis or comma: a call's or
signature's argument list, or prose), else ``identifier`` (names and attribute chains).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hyflash.errors import HyflashError

SPAN = 4  # drafted tokens that must repeat: half a block at B=8
KINDS = ("line", "string", "arguments", "identifier")


@dataclass(frozen=True)
class Repeat:
    pos: int       # anchor index p: x[p : p+length] == x[source : source+length]
    source: int    # start of the latest earlier occurrence that qualifies
    length: int    # repeated tokens from p (>= span + 1)

    @property
    def distance(self) -> int:
        """Tokens between the earlier occurrence and the anchor (> window)."""
        return self.pos - self.source


@dataclass(frozen=True)
class LongRangeItem:
    file: str       # held-out file, relative to the stdlib root
    start: int      # the prompt is the file's tokens [start, pos)
    pos: int        # the anchor: the first token the target writes
    length: int     # tokens from pos that repeat the earlier occurrence
    source: int     # where that occurrence starts (start <= source)
    kind: str

    @property
    def distance(self) -> int:
        return self.pos - self.source

    def prompt(self, ids: Sequence[int]) -> list[int]:
        return list(ids[self.start:self.pos])

    def expected(self, ids: Sequence[int]) -> list[int]:
        """The repeat as the file has it: anchor first."""
        return list(ids[self.pos:self.pos + self.length])


def ngram_starts(ids: Sequence[int], n: int) -> dict[tuple[int, ...], list[int]]:
    """Every n-gram of ids -> its start indices, ascending."""
    starts: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i in range(len(ids) - n + 1):
        starts[tuple(ids[i:i + n])].append(i)
    return starts


def long_range_positions(ids: Sequence[int], window: int, span: int = SPAN,
                         text_of: Callable[[Sequence[int]], str] | None = None
                         ) -> list[Repeat]:
    """The positions of ids that satisfy the module's selection rule, ascending."""
    if window < 1 or span < 1:
        raise HyflashError(f"long-range selection needs window >= 1 and span >= 1, got "
                           f"window {window}, span {span}")
    ids = list(ids)
    grams = ngram_starts(ids, span + 1)   # anchor + drafted span
    drafted = ngram_starts(ids, span)     # drafted span alone
    found: list[Repeat] = []
    p = 0
    while p + span + 1 <= len(ids):
        rep = qualify(ids, p, window, span, grams, drafted, text_of)
        if rep is None:
            p += 1
            continue
        found.append(rep)
        p += rep.length
    return found


def qualify(ids, p, window, span, grams, drafted, text_of) -> Repeat | None:
    starts = grams[tuple(ids[p:p + span + 1])]
    # latest occurrence ending at or before p - window: start <= p - window - span - 1
    i = bisect.bisect_right(starts, p - window - span - 1) - 1
    if i < 0:
        return None
    span_starts = drafted[tuple(ids[p + 1:p + 1 + span])]
    j = bisect.bisect_right(span_starts, p - window - span)  # first start > p-window-span
    if j < len(span_starts) and span_starts[j] <= p:
        return None
    if text_of is not None and not any(c.isalnum() for c in text_of(ids[p + 1:p + 1 + span])):
        return None
    s = starts[i]
    n = span + 1
    while p + n < len(ids) and s + n < p and ids[s + n] == ids[p + n]:
        n += 1
    return Repeat(pos=p, source=s, length=n)


def classify(text: str, starts_line: bool) -> str:
    """What a repeated text is (see the module docstring); ``starts_line``: only
    whitespace precedes the repeat on its line."""
    pieces = text.split("\n")
    whole = [seg for i, seg in enumerate(pieces[:-1]) if i > 0 or starts_line]
    if any(seg.strip() for seg in whole):
        return "line"
    if "'" in text or '"' in text:
        return "string"
    if any(c in text for c in "(),"):
        return "arguments"
    return "identifier"


def repeat_kind(ids: Sequence[int], rep: Repeat, text_of: Callable) -> str:
    before = text_of(ids[max(0, rep.pos - 32):rep.pos]).rsplit("\n", 1)
    starts_line = len(before) > 1 and not before[-1].strip() or rep.pos == 0
    return classify(text_of(ids[rep.pos:rep.pos + rep.length]), starts_line)


def prompt_start(pos: int, chunk: int) -> int | None:
    """Where the prompt of anchor pos starts: the multiple of chunk that leaves chunk to
    2*chunk - 1 tokens before pos (None when pos < chunk). Prompts of one start share one
    target pass of 2*chunk tokens in ``target_writes``."""
    return None if pos < chunk else (pos - chunk) // chunk * chunk


def file_items(name: str, ids: Sequence[int], window: int, chunk: int, room: int,
               span: int = SPAN, text_of: Callable | None = None) -> list[LongRangeItem]:
    """A file's qualifying positions with a prompt of chunk..2*chunk-room tokens (room:
    the new tokens a run writes after it) that holds the earlier occurrence."""
    items = []
    for rep in long_range_positions(ids, window, span, text_of):
        start = prompt_start(rep.pos, chunk)
        if start is None or rep.source < start or rep.pos - start + room > 2 * chunk:
            continue
        kind = repeat_kind(ids, rep, text_of) if text_of else ""
        items.append(LongRangeItem(name, start, rep.pos, rep.length, rep.source, kind))
    return items


def target_writes(next_tokens: Callable[[list[int]], Sequence[int]], ids: Sequence[int],
                  items: list[LongRangeItem], span: int = SPAN) -> list[bool]:
    """Rule 6 for each item of one file: next_tokens(tokens) -> the target's argmax after
    every prefix of tokens, called once per prompt start (the argmax after the prompt plus
    ``expected[:i]`` must be ``expected[i]`` for i = 0..span)."""
    ends: dict[int, int] = {}
    for it in items:
        ends[it.start] = max(ends.get(it.start, 0), it.pos + span + 1)
    argmax = {a: list(next_tokens(list(ids[a:end]))) for a, end in ends.items()}
    return [all(argmax[it.start][it.pos - it.start - 1 + i] == ids[it.pos + i]
                for i in range(span + 1)) for it in items]


def spread(pool: list[LongRangeItem], n: int, seed: int) -> list[LongRangeItem]:
    """n items, shuffled (seeded) within each file and then taken one file at a time in
    turn, so a few long files full of repeats (codec tables) cannot fill the set."""
    rng = np.random.default_rng(seed)
    by_file: dict[str, list[LongRangeItem]] = defaultdict(list)
    for item in pool:
        by_file[item.file].append(item)
    queues = [[group[i] for i in rng.permutation(len(group))] for group in by_file.values()]
    picked: list[LongRangeItem] = []
    while len(picked) < min(n, len(pool)):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return picked


def build_set(tokenizer, next_tokens: Callable[[list[int]], Sequence[int]], n: int,
              window: int, room: int, chunk: int = 1024, span: int = SPAN, seed: int = 0,
              root=None, progress: Callable[[str], None] | None = None):
    """The long-range set of the held-out stdlib files: (n items, {file: token ids},
    counts of candidates by rule). ``next_tokens``: the target's argmax after every prefix
    of a token list (rule 6)."""
    from hyflash.train.corpus import read_text, split_files

    if not span < room < chunk:
        raise HyflashError(f"runs of {room} new tokens must write more than the span "
                           f"({span}) and less than a chunk ({chunk}): pick another count")
    _, held, root = split_files(root)

    def text_of(part):
        return tokenizer.decode(list(part))

    pool: list[LongRangeItem] = []
    files: dict[str, list[int]] = {}
    counts = {"positions": 0, "candidates": 0, "target_writes": 0}
    for f in held:
        name = f.relative_to(root).as_posix()
        ids = tokenizer(read_text(f), add_special_tokens=False).input_ids
        counts["positions"] += len(long_range_positions(ids, window, span, text_of))
        items = file_items(name, ids, window, chunk, room, span, text_of)
        counts["candidates"] += len(items)
        writes = target_writes(next_tokens, ids, items, span)
        kept = [it for it, ok in zip(items, writes, strict=True) if ok]
        counts["target_writes"] += len(kept)
        if kept:
            pool += kept
            files[name] = ids
        if progress:
            progress(f"{name}: {len(kept)} of {len(items)} candidates")
    if not pool:
        raise HyflashError("no long-range positions in the held-out files that the target "
                           "repeats: pass a smaller --window or a longer context")
    picked = spread(pool, n, seed)
    return picked, {k: v for k, v in files.items() if any(it.file == k for it in picked)}, \
        counts
