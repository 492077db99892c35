"""Context lookup: drafts copied from the context itself, beside the drafter's.

Code repeats itself: identifiers, argument lists, whole lines, and a small target's
greedy continuation repeats it even more. So the tokens that followed the most recent
earlier occurrence of the last n committed tokens are a draft that costs no model call
(prompt-lookup decoding). The engine verifies it like any other draft, so the output
stays the target's: greedy token for token, and exact under rejection sampling, where a
copied token is a draft drawn from a point mass (q = 1 on it).

``ContextLookup`` keeps, for each n-gram size, the end of the latest occurrence of every
n-gram that has a successor, updated as tokens commit: a proposal is one dictionary read
per n-gram size, whatever the context length (the phone keeps the same table).
"""

from __future__ import annotations

from hyflash.errors import HyflashError


class ContextLookup:
    """Proposals from the longest matching suffix, n = max_ngram down to min_ngram."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, block_size: int = 8):
        if not 1 <= min_ngram <= max_ngram:
            raise HyflashError(f"lookup n-gram sizes must satisfy 1 <= min ({min_ngram}) <= "
                               f"max ({max_ngram})")
        if block_size < 2:
            raise HyflashError(f"lookup block size {block_size} < 2: a block is the anchor "
                               "plus at least one drafted token")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.block_size = block_size  # anchor + up to block_size - 1 copied drafts
        self.reset([])

    def reset(self, tokens: list[int]) -> None:
        self.tokens: list[int] = []
        self.seen: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Commit tokens: each makes the n-grams ending just before it proposable."""
        toks = self.tokens
        for t in tokens:
            end = len(toks) - 1  # the n-grams ending here now have a successor (t)
            for n, table in self.seen.items():
                if end - n + 1 >= 0:
                    table[tuple(toks[end - n + 1:end + 1])] = end
            toks.append(int(t))

    def propose(self, r: int) -> list[int]:
        """r tokens copied from after the latest earlier occurrence of the longest suffix
        found, or none. A copy that reaches the end of the context goes on through its
        own tokens: a text repeating with period P is continued with period P."""
        toks, last = self.tokens, len(self.tokens) - 1
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if last - n + 1 < 0:
                continue
            end = self.seen[n].get(tuple(toks[last - n + 1:last + 1]))
            if end is not None:
                out: list[int] = []
                for i in range(end + 1, end + 1 + r):
                    out.append(toks[i] if i <= last else out[i - last - 1])
                return out
        return []
