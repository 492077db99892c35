"""What every run reports: acceptance (tau, per position), call counts, where the time
went, speed and memory.

Kept apart from the engine so that ``bench`` and ``simulate`` print the same table.
"""

from __future__ import annotations

import math
import resource
import sys
from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """Counters of one generate call.

    tau is the mean number of tokens committed per verify call: the accepted drafts plus
    the target's bonus token (``k+1``), counted as verified, before a stop truncates the
    last block. Plain decoding has tau == 1. ``position_accepted[i]`` over
    ``position_proposed[i]`` is the fraction of verify rounds that proposed draft position
    ``i+1`` in which it was accepted (position ``i+1`` is accepted only if ``1..i`` are).
    ``dropped_draft_rows`` counts draft rows that were no distribution (NaN, +inf, all
    -inf), or came after one in the same block: the engine proposed nothing there, and
    the acceptance rates count them as proposed and rejected, so a broken drafter shows.

    ``cut_draft_rows`` counts drafted rows that a row policy (``SpeculativeEngine(...,
    draft_rows=...)``, ``draft_rows.py``) chose not to propose, with the rows after them;
    they are not counted as proposed.

    ``lookup_rounds`` counts the rounds whose drafts the context lookup copied (no
    drafter call); the drafter's commits still run in them, inside ``draft_s``.
    ``plain_rounds`` counts the rounds a rate gate (``gate.py``) decoded one token in
    without drafts, because that paid more than drafting did.

    Times are wall-clock seconds; time a streaming consumer spends between tokens is not
    counted. ``overhead_s`` is everything that is neither the prefill, the drafter, nor
    a target verify pass: verification arithmetic, sampling, bookkeeping.
    """

    block_size: int = 1
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0              # verify calls
    target_calls: int = 0        # prefill + verify calls
    drafter_calls: int = 0       # draft calls (commits are counted in draft_s, not here)
    lookup_rounds: int = 0       # rounds whose drafts were copied from the context
    plain_rounds: int = 0        # rounds a rate gate decoded without drafts
    accepted_drafts: int = 0
    dropped_draft_rows: int = 0  # rows of a broken drafter, never verified (see above)
    cut_draft_rows: int = 0      # drafted rows a row policy left unproposed (see above)
    position_proposed: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    peak_rss_mib: float = 0.0
    stop_reason: str = ""  # "eos", "max_new_tokens" or "context_full" (engine.py)

    @property
    def tau(self) -> float:
        return (self.accepted_drafts + self.rounds) / self.rounds if self.rounds else math.nan

    @property
    def acceptance_rates(self) -> list[float]:
        return [a / n if n else math.nan
                for a, n in zip(self.position_accepted, self.position_proposed,
                                       strict=True)]

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.total_s - self.prefill_s - self.draft_s - self.verify_s)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of the whole call, prefill included."""
        return self.new_tokens / self.total_s if self.total_s > 0 else math.nan


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (not only of one run). On Linux
    from /proc (VmHWM): getrusage's ru_maxrss also counts the parent's resident set at
    fork, so a process started by a big one (a benchmark driver) reported the parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def format_stats(s: GenerationStats) -> str:
    """A small two-column table for the terminal."""
    def pct(x: float) -> str:
        return f"{1000 * x:8.1f} ms  {100 * x / s.total_s:5.1f} %" if s.total_s else "-"

    rates = " ".join("-" if math.isnan(r) else f"{r:.2f}" for r in s.acceptance_rates)
    # plain decoding verifies nothing: its target calls after the prefill are decodes
    step, phase = ("verify", "verifying") if s.block_size > 1 else ("decode", "decoding")
    rows = [
        ("stop reason", s.stop_reason),
        ("prompt / new tokens", f"{s.prompt_tokens} / {s.new_tokens}"),
        ("block size", s.block_size if s.block_size > 1 else "- (plain decoding)"),
        ("tau (tokens per verify)", "-" if math.isnan(s.tau) else f"{s.tau:.2f}"),
        ("acceptance by position", rates or "-"),
        ("target calls", f"{s.target_calls} (1 prefill + {s.rounds} {step})"
         if s.target_calls else "0"),
        ("drafter calls", s.drafter_calls),
        *([("rounds drafted by lookup", f"{s.lookup_rounds} of {s.rounds}")]
          if s.lookup_rounds else []),
        *([("rounds decoded plain by the gate", f"{s.plain_rounds} of {s.rounds}")]
          if s.plain_rounds else []),
        *([("drafted rows not proposed", f"{s.cut_draft_rows} (draft rows policy)")]
          if s.cut_draft_rows else []),
        ("prefill", pct(s.prefill_s)),
        ("drafting", pct(s.draft_s)),
        (phase, pct(s.verify_s)),
        ("overhead", pct(s.overhead_s)),
        ("total", f"{1000 * s.total_s:8.1f} ms"),
        ("tokens/s", "-" if math.isnan(s.tokens_per_s) else f"{s.tokens_per_s:.1f}"),
        ("peak RSS", f"{s.peak_rss_mib:.0f} MiB"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
