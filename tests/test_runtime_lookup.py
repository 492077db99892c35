"""Context lookup: its incremental table proposes what a search of the whole context
finds, and drafts copied from the context keep the engine lossless."""

import random

import pytest

from hyflash.errors import HyflashError
from hyflash.runtime.lookup import ContextLookup


def brute_force(toks: list[int], r: int, max_ngram: int, min_ngram: int) -> list[int]:
    last = len(toks) - 1
    for n in range(max_ngram, min_ngram - 1, -1):
        if last - n + 1 < 0:
            continue
        suffix = toks[last - n + 1:]
        for end in range(last - 1, n - 2, -1):  # the latest earlier occurrence
            if toks[end - n + 1:end + 1] == suffix:
                seq = list(toks)
                for i in range(r):  # copying on through the copy itself
                    seq.append(seq[end + 1 + i])
                return seq[last + 1:]
    return []


@pytest.mark.parametrize("max_ngram,min_ngram", [(3, 1), (4, 2), (1, 1)])
def test_incremental_table_finds_what_a_full_search_finds(max_ngram, min_ngram):
    rng = random.Random(0)
    toks = [rng.randrange(6) for _ in range(300)]  # a small alphabet: many repeats
    lookup = ContextLookup(max_ngram, min_ngram)
    lookup.reset(toks[:5])
    found = 0
    at = 5
    while at < len(toks):
        step = rng.randrange(1, 5)
        lookup.extend(toks[at:at + step])
        at += step
        for r in (1, 3, 7):
            want = brute_force(toks[:at], r, max_ngram, min_ngram)
            assert lookup.propose(r) == want, (at, r)
            found += bool(want)
    assert found > 50  # the comparison saw real proposals, not only empty ones


def test_a_copy_that_reaches_the_end_continues_the_period():
    lookup = ContextLookup(2, 1)
    lookup.reset([5, 6, 7, 5, 6])
    assert lookup.propose(7) == [7, 5, 6, 7, 5, 6, 7]  # period 3
    lookup.reset([4, 4])
    assert lookup.propose(3) == [4, 4, 4]
    lookup.reset([1, 2, 3])
    assert lookup.propose(7) == []  # nothing repeats: no proposal


def test_bad_ngram_sizes_are_one_error():
    with pytest.raises(HyflashError, match="1 <= min"):
        ContextLookup(2, 3)
