"""The long-range evaluation set's selection rule, on hand-made texts whose qualifying
positions are known (one token per character)."""

from __future__ import annotations

import itertools

import pytest

from hyflash.errors import HyflashError
from hyflash.train.longrange import (
    LongRangeItem,
    Repeat,
    classify,
    file_items,
    long_range_positions,
    prompt_start,
    spread,
    target_writes,
)

W, SPAN = 8, 3
_fresh = itertools.count(0x4E00)


def unique(n: int) -> str:
    """n characters never used before: filler with no repeated n-grams."""
    return "".join(chr(next(_fresh)) for _ in range(n))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def text_of(part) -> str:
    return "".join(chr(i) for i in part)


def test_a_repeat_older_than_the_window_qualifies_once_at_its_start():
    text = "foo(a,b)" + unique(20) + "foo(a,b)"
    assert long_range_positions(ids(text), W, SPAN, text_of) == [Repeat(28, 0, 8)]


def test_a_repeat_inside_the_window_does_not_qualify():
    text = "foo(a,b)" + unique(3) + "foo(a,b)"
    assert long_range_positions(ids(text), W, SPAN, text_of) == []


def test_a_recent_copy_in_the_window_disqualifies_the_old_one():
    # abcd at 0, again at 24 (far from 0: qualifies), again at 31: the copy at 24 is in
    # the window then, so the window alone can draft it
    text = "abcd" + unique(20) + "abcd" + unique(3) + "abcd"
    assert long_range_positions(ids(text), W, SPAN, text_of) == [Repeat(24, 0, 4)]


def test_punctuation_only_spans_need_a_letter_or_digit():
    text = "x,,,," + unique(20) + "x,,,,"
    assert long_range_positions(ids(text), W, SPAN, text_of) == []
    assert long_range_positions(ids(text), W, SPAN) == [Repeat(25, 0, 5)]


def test_the_latest_old_occurrence_is_the_source():
    text = "name=1" + unique(12) + "name=2" + unique(12) + "name=3"
    reps = long_range_positions(ids(text), W, SPAN, text_of)
    assert [(r.pos, r.source, r.length) for r in reps] == [(18, 0, 5), (36, 18, 5)]
    assert reps[1].distance == 18


@pytest.mark.parametrize("text,starts_line,kind", [
    ("    return x\n", True, "line"),
    ("return x\n", False, "identifier"),
    ("x)\n    y = 1\n", False, "line"),
    ("foo('a')", False, "string"),
    ("foo(a, b)", False, "arguments"),
    ("self.name", False, "identifier"),
])
def test_kinds(text, starts_line, kind):
    assert classify(text, starts_line) == kind


def test_prompts_start_at_a_chunk_multiple_one_to_two_chunks_back():
    assert prompt_start(9, 10) is None
    assert [prompt_start(p, 10) for p in (10, 19, 20, 29)] == [0, 0, 10, 10]


def test_file_items_keep_the_old_occurrence_inside_the_prompt():
    # chunk 16: the repeat at 28 gets the prompt [0, 28), which holds its source at 0
    text = "foo(a,b)" + unique(20) + "foo(a,b)" + unique(4)
    items = file_items("f.py", ids(text), W, chunk=16, room=4, span=SPAN, text_of=text_of)
    assert [(it.start, it.pos, it.length, it.kind) for it in items] == \
        [(0, 28, 8, "arguments")]
    assert items[0].prompt(ids(text)) == ids(text)[:28]
    assert text_of(items[0].expected(ids(text))) == "foo(a,b)"
    # no room for 4 new tokens when the prompt would pass 2*chunk - room
    assert file_items("f.py", ids(text), W, chunk=16, room=5, span=SPAN) == []
    # with chunk 12 the prompt is [12, 28): the source at 0 is not in it
    assert file_items("f.py", ids(text), W, chunk=12, room=4, span=SPAN) == []


def test_target_writes_checks_the_anchor_and_span_by_teacher_forcing():
    x = ids("foo(a,b)" + unique(20) + "foo(a,b)")
    item = LongRangeItem("f.py", 0, 28, 8, 0, "arguments")
    calls = []

    def copier(tokens):  # predicts the file exactly: writes every repeat
        calls.append(len(tokens))
        return x[1:len(tokens) + 1]

    def forgets(tokens):  # right except the span's third token
        out = copier(tokens)
        out[28 + 2 - 1] = -1
        return out

    assert target_writes(copier, x, [item, item], SPAN) == [True, True]
    assert calls == [32]  # one pass per prompt start, anchor + span covered
    assert target_writes(forgets, x, [item], SPAN) == [False]


def test_spread_is_seeded_and_takes_files_in_turn():
    pool = [LongRangeItem(f, 0, p, 5, 0, "line") for f in "ab" for p in range(10)]
    pool += [LongRangeItem("c", 0, 99, 5, 0, "line")]
    got = spread(pool, 6, seed=3)
    assert got == spread(pool, 6, seed=3)
    assert [it.file for it in got] == ["a", "b", "c", "a", "b", "a"]
    assert got != spread(pool, 6, seed=4)
    assert len(spread(pool, 100, seed=0)) == len(pool)


def test_bad_window_is_a_hyflash_error():
    with pytest.raises(HyflashError, match="window"):
        long_range_positions([1, 2, 3], 0)
