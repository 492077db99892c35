"""The speculative engine: prefill -> draft -> verify -> accept -> commit -> roll back.

Committed tokens are ``x_0 .. x_{n-1}``. The target has processed (and holds KV for) all
but the last one; the drafter holds the features of exactly those ``n-1`` tokens, because
the features of a token exist only once the target has run it. One round:

1. **draft**  - the anchor is the last committed token ``x_{n-1}`` at ``pos = n-1``. The
   drafter proposes ``d_1 .. d_r`` for positions ``pos+1 .. pos+r`` in one pass
   (``r = B-1``, fewer only when the context is about to run out). Only the leading
   rows of its logits that are a distribution become drafts: a row with NaN, +inf or
   nothing above -inf (say, an fp16 drafter that overflowed) proposes nothing, so the
   verify pass takes the target's own token there and the output stays the target's.
   A row policy (``draft_rows.py``) may keep fewer of the leading rows still, judged by
   the drafter's confidence alone, so that a verify is not paid for unlikely drafts.
2. **verify** - ONE target pass over ``[anchor, d_1 .. d_r]`` at ``pos`` gives the target's
   logits for positions ``pos+1 .. pos+r+1`` and the features of the anchor and drafts.
3. **accept** - greedy or rejection sampling (``verify.py``) keeps ``k`` drafts and adds
   one bonus token from the target: ``k+1`` new committed tokens.
4. **commit** - the drafter absorbs the features of the anchor and the ``k`` accepted
   drafts; features of rejected drafts are simply dropped, so the drafter's state never
   has to roll back.
5. **roll back** - the target's cache length becomes ``pos+k+1``; the rejected positions
   are overwritten by the next verify.

Without a drafter ``r`` is 0 and the same loop is plain autoregressive decoding, with
the same stop rules and the same stats. The prefill is round zero: the whole prompt in
one target pass, its features committed, its last logits giving the first new token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from hyflash.errors import HyflashError
from hyflash.runtime.backends import DrafterBackend, TargetBackend
from hyflash.runtime.draft_rows import RowPolicy, confidences
from hyflash.runtime.gate import RateGate
from hyflash.runtime.lookup import ContextLookup
from hyflash.runtime.sampling import Sampling, distribution_rows, sample
from hyflash.runtime.stats import GenerationStats, peak_rss_mib
from hyflash.runtime.verify import verify_greedy, verify_sampled


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]  # the new tokens, stop token included
    stats: GenerationStats


class SpeculativeEngine:
    """Runs one sequence at a time (batch 1) on a target and, optionally, a drafter and
    a context lookup (``lookup.py``): a round drafts by copying from the context when the
    lookup finds the last tokens earlier in it, and asks the drafter otherwise. With a
    ``RateGate`` (``gate.py``) the round instead takes whichever of the lookup, the
    drafter and a plain decode has committed the most tokens per second so far."""

    def __init__(self, target: TargetBackend, drafter: DrafterBackend | None = None,
                 lookup: ContextLookup | None = None, gate: RateGate | None = None,
                 draft_rows: RowPolicy | None = None):
        """draft_rows: which of the drafter's rows a round proposes (``draft_rows.py``:
        ``Cutoff(p)``, ``ExpectedRate()``); None proposes every row."""
        if drafter is not None:
            check_pair(target, drafter)
            if lookup is not None and lookup.block_size != drafter.block_size:
                raise HyflashError(f"lookup block size {lookup.block_size} != drafter block "
                                   f"size {drafter.block_size}: one verify pass serves both")
        self.target = target
        self.drafter = drafter
        self.lookup = lookup
        self.gate = gate
        self.draft_rows = draft_rows

    @property
    def block_size(self) -> int:
        """Tokens per verify pass at most: anchor + B-1 drafts (1 with neither a drafter
        nor a lookup)."""
        if self.drafter is not None:
            return self.drafter.block_size
        return self.lookup.block_size if self.lookup is not None else 1

    # ------------------------------------------------------------------ public API

    def generate(self, prompt: Sequence[int] | torch.Tensor, *, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 eos_ids: Sequence[int] = (),
                 on_token: Callable[[int], None] | None = None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens; ``on_token`` sees each as it commits."""
        tokens = self.stream(prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_k=top_k, top_p=top_p, seed=seed, eos_ids=eos_ids)
        while True:
            try:
                tok = next(tokens)
            except StopIteration as done:
                return done.value
            if on_token is not None:
                on_token(tok)

    def stream(self, prompt: Sequence[int] | torch.Tensor, *, max_new_tokens: int = 128,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               eos_ids: Sequence[int] = ()) -> Iterator[int]:
        """Yield new tokens as they are committed; the generator returns the Generation.

        Arguments are checked here, before anything runs, so bad input raises
        HyflashError at the call and leaves the engine untouched.
        """
        prompt = self._check_prompt(prompt)
        if max_new_tokens < 1:
            raise HyflashError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = Sampling(temperature, top_k, top_p)
        generator = torch.Generator().manual_seed(seed)
        return self._run(prompt, max_new_tokens, sampling, generator, frozenset(eos_ids))

    # ------------------------------------------------------------------- the loop

    def _run(self, prompt: list[int], max_new_tokens: int, sampling: Sampling,
             generator: torch.Generator, eos_ids: frozenset[int]) -> Iterator[int]:
        target, drafter, B = self.target, self.drafter, self.block_size
        stats = GenerationStats(block_size=B, prompt_tokens=len(prompt),
                                position_proposed=[0] * (B - 1),
                                position_accepted=[0] * (B - 1))
        clock = Clock(stats)
        tokens = list(prompt)
        new: list[int] = []

        def stop_after(tok: int) -> str | None:
            if tok in eos_ids:
                return "eos"
            if len(new) >= max_new_tokens:
                return "max_new_tokens"
            if len(tokens) >= target.max_seq_len:
                return "context_full"
            return None

        def emit(block: list[int]) -> tuple[int, str | None]:
            """Commit tokens of block in order until a stop rule fires after one of them."""
            for i, tok in enumerate(block):
                tokens.append(tok)
                new.append(tok)
                if reason := stop_after(tok):
                    return i + 1, reason
            return len(block), None

        # prefill: the prompt in one pass; its features go to the drafter
        with clock("prefill_s"):
            logits, features = target.forward(torch.tensor(prompt), 0, logits_rows=1)
        stats.target_calls += 1
        if drafter is not None:
            with clock("draft_s"):
                drafter.reset()
                drafter.commit(features)
        first = self._pick(logits[-1:], sampling, generator)
        _, reason = emit([first])
        if self.lookup is not None:
            self.lookup.reset(tokens)
        if self.gate is not None:
            self.gate.reset()
        yield from clock.paused([first])

        while reason is None:
            pos, anchor = len(tokens) - 1, tokens[-1]
            r = min(B - 1, target.max_seq_len - len(tokens) - 1)  # drafts that still fit

            # draft: copied from the context if the lookup finds a match, else the drafter's
            # (or whichever of them and a plain decode the gate finds pays most)
            q = None
            drafts = torch.empty(0, dtype=torch.long)
            copied = self.lookup.propose(r) if self.lookup is not None and r > 0 else []
            available = [name for name, ok in (("lookup", bool(copied)),
                                               ("drafter", r > 0 and drafter is not None),
                                               ("plain", True)) if ok]
            choice = self.gate.choose(available) if self.gate is not None else available[0]
            round_start = time.perf_counter()
            if choice == "plain":
                r = 0
                if self.gate is not None:
                    stats.plain_rounds += 1
            elif choice == "lookup":
                stats.lookup_rounds += 1
                drafts = torch.tensor(copied)
                if not sampling.greedy:  # a copy is a draft from a point mass
                    q = torch.zeros(len(copied), target.vocab_size).scatter_(
                        1, drafts[:, None], 1.0)
            else:
                with clock("draft_s"):
                    draft_logits = self._check_draft(drafter.draft(anchor, pos))[:r]
                stats.drafter_calls += 1
                if self.draft_rows is not None:
                    valid = distribution_rows(draft_logits)  # broken rows stay "dropped"
                    kept = self.draft_rows.choose(confidences(draft_logits[:valid]))
                    if kept < valid:
                        stats.cut_draft_rows += r - kept
                        draft_logits, r = draft_logits[:kept], kept
                q, drafts = self._propose(draft_logits, sampling, generator)
                stats.dropped_draft_rows += r - drafts.numel()

            # verify: one target pass over [anchor, d_1..d_r] at pos
            t = time.perf_counter()
            logits, features = target.forward(torch.cat([torch.tensor([anchor]), drafts]), pos)
            verify_s = time.perf_counter() - t
            stats.verify_s += verify_s
            if self.draft_rows is not None:
                self.draft_rows.record_verify(drafts.numel() + 1, verify_s)
            stats.target_calls += 1
            stats.rounds += 1
            round_s = time.perf_counter() - round_start

            # accept
            if sampling.greedy:
                k, bonus = verify_greedy(drafts, logits)
            else:
                k, bonus = verify_sampled(drafts, q, sampling.probs(logits), generator)
            stats.accepted_drafts += k
            if self.draft_rows is not None and choice == "drafter":
                self.draft_rows.record_accepted(k)
            for i in range(r):
                stats.position_proposed[i] += 1
                stats.position_accepted[i] += int(i < k)
            n, reason = emit(drafts[:k].tolist() + [bonus])
            if self.gate is not None:
                self.gate.record(choice, k + 1, round_s)
            if self.lookup is not None:
                self.lookup.extend(new[-n:])

            # commit the verified features (anchor + accepted drafts that were emitted)
            if drafter is not None:
                with clock("draft_s"):
                    drafter.commit(features[:n])
            # roll back: everything after the last committed-and-processed token is dead
            target.rollback(pos + n)
            if self.draft_rows is not None and choice == "drafter":
                self.draft_rows.record_overhead(time.perf_counter() - round_start - verify_s)
            yield from clock.paused(new[-n:])

        stats.new_tokens = len(new)
        stats.stop_reason = reason
        stats.total_s = clock.elapsed()
        stats.peak_rss_mib = peak_rss_mib()
        return Generation(prompt=prompt, tokens=new, stats=stats)

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
        """A token from the target's own distribution (the prefill's first token)."""
        if sampling.greedy:
            return int(logits[0].argmax())
        return int(sample(sampling.probs(logits), generator)[0])

    @staticmethod
    def _propose(logits: torch.Tensor, sampling: Sampling,
                 generator: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The drafts (argmax, or a sample of the warped q) of the drafter's leading rows
        that are a distribution; -> (q of those rows or None when greedy, drafts)."""
        if sampling.greedy:
            return None, logits[:distribution_rows(logits)].argmax(-1)
        q = sampling.probs(logits)
        q = q[:distribution_rows(q)]
        return q, sample(q, generator)

    def _check_prompt(self, prompt: Sequence[int] | torch.Tensor) -> list[int]:
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1).tolist()
        limit, vocab = self.target.max_seq_len, self.target.vocab_size
        if not ids:
            raise HyflashError("empty prompt: pass at least one token")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise HyflashError(f"prompt token ids {bad[:3]} are outside the target's "
                               f"vocabulary 0..{vocab - 1}")
        if len(ids) >= limit:
            raise HyflashError(f"prompt of {len(ids)} tokens leaves no room in the target's "
                               f"context of {limit} tokens: shorten it below {limit}")
        room = limit - len(ids)
        if self.block_size > room:
            raise HyflashError(f"block size {self.block_size} exceeds the remaining context: "
                               f"the {len(ids)}-token prompt leaves {room} of {limit} "
                               f"positions; shorten the prompt or use --no-draft")
        return ids

    def _check_draft(self, logits: torch.Tensor) -> torch.Tensor:
        want = (self.block_size - 1, self.target.vocab_size)
        if tuple(logits.shape) != want:
            raise HyflashError(f"drafter returned logits of shape {tuple(logits.shape)}, "
                               f"expected {want} (block size - 1, vocabulary)")
        return logits.float()


def check_pair(target: TargetBackend, drafter: DrafterBackend) -> None:
    """A drafter only fits the target it was trained for: same vocabulary and features."""
    if drafter.vocab_size != target.vocab_size:
        raise HyflashError(f"drafter vocabulary {drafter.vocab_size} != target vocabulary "
                           f"{target.vocab_size}: the drafter was trained for another target")
    if drafter.feature_size != target.feature_size:
        raise HyflashError(f"drafter feature size {drafter.feature_size} != target feature "
                           f"size {target.feature_size}: the drafter was trained for another "
                           "target (or other tap layers)")
    if drafter.block_size < 2:
        raise HyflashError(f"drafter block size {drafter.block_size} < 2: a block is the "
                           "anchor plus at least one drafted token")


class Clock:
    """Wall time per phase into GenerationStats, minus time spent paused at yields."""

    def __init__(self, stats: GenerationStats):
        self.stats = stats
        self.start = time.perf_counter()
        self.paused_s = 0.0

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            setattr(self.stats, phase, getattr(self.stats, phase) + time.perf_counter() - t)

    def paused(self, tokens: list[int]) -> Iterator[int]:
        for tok in tokens:
            t = time.perf_counter()
            yield tok
            self.paused_s += time.perf_counter() - t

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused_s
