"""How many of the drafter's rows a round proposes.

The drafter drafts a whole block in one pass, but a verify of T tokens costs more the
larger T is (on SmolLM2-135M's lean fp32 graph a verify of 8 tokens costs ~1.5 decodes;
on the pocket pair T hardly matters), and late rows are rarely accepted. A policy looks
at the drafter's confidence in each row, the probability its most likely token has
(softmax of the row's logits), and keeps the leading rows that pay:

- ``Cutoff(p)``: the leading rows whose confidence is at least p;
- ``ExpectedRate()``: the k that maximises the expected committed tokens per second,
  ``(1 + a_1 + a_1 a_2 + ... + a_1..a_k) / (t_round + t_verify(k + 1))``. The acceptance
  a_i of row i is how often rows of its confidence (in bins of 0.1) were accepted when
  the verify reached them, starting from the confidence itself; every ``explore_every``-th
  round proposes every row, so confidences it would cut are still measured. The
  costs are measured as the run goes: an exponentially weighted mean of the wall time
  of every verify call per length T (lookup and plain rounds measure lengths too), and
  of the rest of a drafter round (the drafter call, acceptance, commit, the loop's own
  work: on a small model that is as much as the verify). Lengths not
  measured yet are interpolated linearly between measured ones, or take the nearest
  measured one; its first ``explore`` drafter rounds propose all, half and none of the
  rows in turn, so the cost curve is measured before the rule relies on it.

The choice depends only on the drafter's logits, never on a sampled token, so each kept
row's draft is still a sample of that row's full distribution: greedy output stays the
target's own and sampled output keeps exactly its distribution, whatever is kept.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from hyflash.runtime.sampling import leading


class RowPolicy(Protocol):
    def choose(self, conf: torch.Tensor) -> int: ...
    def record_verify(self, tokens: int, seconds: float) -> None: ...
    def record_overhead(self, seconds: float) -> None: ...
    def record_accepted(self, accepted: int) -> None: ...


def confidences(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] drafter logits -> [R] probability of each row's most likely token (NaN for
    a row that is no distribution, which ends every policy's run of kept rows).

    In numpy, not torch: a torch op this size runs on torch's OpenMP pool, whose threads
    then spin and slow the next ONNX Runtime call (measured on the pocket pair at 2
    threads beside a busy core: drafter and verify calls 1.5x slower, ~3 ms more per
    round)."""
    x = logits.detach().float().numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        top = x.max(axis=-1, keepdims=True)
        conf = 1.0 / np.exp(x - top).sum(axis=-1)
    return torch.from_numpy(conf.astype(np.float32))


class Cutoff:
    """Keep the leading rows whose confidence is at least ``p``."""

    def __init__(self, p: float):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"draft cutoff {p}: need 0 <= p < 1 (a probability)")
        self.p = p

    def choose(self, conf: torch.Tensor) -> int:
        return leading(conf >= self.p)

    def record_verify(self, tokens: int, seconds: float) -> None:
        pass

    def record_overhead(self, seconds: float) -> None:
        pass

    def record_accepted(self, accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"cutoff {self.p:g}"


class ExpectedRate:
    """Keep the k rows that maximise expected tokens per second (module docstring)."""

    BINS = 10  # confidence bins of the calibration: [0, 0.1), [0.1, 0.2), ...

    def __init__(self, keep: float = 0.9, explore: int = 6, explore_every: int = 16,
                 calibration_keep: float = 0.97):
        if not (0 < keep < 1 and 0 < calibration_keep < 1) or explore < 0 or explore_every < 2:
            raise ValueError(f"ExpectedRate(keep={keep}, explore={explore}, explore_every="
                             f"{explore_every}, calibration_keep={calibration_keep}): need "
                             "0 < keep, calibration_keep < 1, explore >= 0, explore_every >= 2")
        self.keep, self.explore, self.explore_every = keep, explore, explore_every
        self.calibration_keep = calibration_keep
        self.verify: dict[int, list[float]] = {}  # T -> [weighted seconds, weight]
        self.overhead = [0.0, 0.0]  # a drafter round's seconds outside the verify
        self.rounds = 0
        # calibration per confidence bin: weighted counts of rows the verify reached and
        # of those it accepted, starting from one pseudo-row accepted at the bin's centre
        self.reached = [1.0] * self.BINS
        self.accepted = [(b + 0.5) / self.BINS for b in range(self.BINS)]
        self.last: list[float] = []  # confidences of the rows proposed in the last round

    def _add(self, acc: list[float], seconds: float) -> None:
        acc[0] = self.keep * acc[0] + seconds
        acc[1] = self.keep * acc[1] + 1.0

    def record_verify(self, tokens: int, seconds: float) -> None:
        self._add(self.verify.setdefault(tokens, [0.0, 0.0]), seconds)

    def record_overhead(self, seconds: float) -> None:
        self._add(self.overhead, seconds)

    def _bin(self, c: float) -> int:
        return min(self.BINS - 1, max(0, int(c * self.BINS)))

    def record_accepted(self, accepted: int) -> None:
        """The verify of the last proposed rows accepted the first ``accepted`` of them:
        rows 0..accepted were reached (row ``accepted`` rejected, if proposed)."""
        k = self.calibration_keep
        for i, c in enumerate(self.last[:accepted + 1]):
            b = self._bin(c)
            self.reached[b] = k * self.reached[b] + 1.0
            self.accepted[b] = k * self.accepted[b] + float(i < accepted)
        self.last = []

    def calibrated(self, conf: torch.Tensor) -> torch.Tensor:
        """Per row, how often rows of its confidence were accepted when reached."""
        return torch.tensor([self.accepted[b] / self.reached[b]
                             for b in map(self._bin, conf.tolist())], dtype=torch.float64)

    def verify_costs(self) -> dict[int, float]:
        """Measured mean seconds of a verify, per length T."""
        return {t: s / w for t, (s, w) in self.verify.items()}

    def verify_cost(self, tokens: int, known: dict[int, float] | None = None) -> float | None:
        """Estimated seconds of a verify of ``tokens`` tokens (None before any verify), from
        ``known`` (``verify_costs()``, computed here when not given)."""
        known = self.verify_costs() if known is None else known
        if not known:
            return None
        if tokens in known:
            return known[tokens]
        below = [t for t in known if t < tokens]
        above = [t for t in known if t > tokens]
        if below and above:
            a, b = max(below), min(above)
            return known[a] + (known[b] - known[a]) * (tokens - a) / (b - a)
        return known[max(below)] if below else known[min(above)]

    def choose(self, conf: torch.Tensor) -> int:
        rows = leading(~torch.isnan(conf))
        if rows == 0:
            return 0
        self.rounds += 1
        if self.rounds <= self.explore:  # measure a few lengths: all, half, none, ...
            best = (rows, rows // 2, 0)[(self.rounds - 1) % 3]
        elif self.rounds % self.explore_every == 0:  # every row now and then: calibrates
            best = rows  # the confidences it would otherwise never propose
        else:
            best = self._best(conf[:rows])
        self.last = conf[:best].tolist()
        return best

    def _best(self, conf: torch.Tensor) -> int:
        rows = conf.numel()
        t_round = self.overhead[0] / self.overhead[1] if self.overhead[1] else 0.0
        expected = 1.0 + torch.cumprod(self.calibrated(conf), 0).cumsum(0)
        known = self.verify_costs()
        best, best_rate = rows, -1.0
        for k in range(rows + 1):
            cost = self.verify_cost(k + 1, known)
            if cost is None:
                return rows
            gain = 1.0 if k == 0 else float(expected[k - 1])
            rate = gain / (t_round + cost) if t_round + cost > 0 else gain
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def __repr__(self) -> str:
        return "auto"


ROWS_HELP = ("which drafted rows a drafter round proposes: all (default), auto (the number "
             "that maximises expected tokens per second, verify costs and acceptance measured "
             "as it runs) or a probability p (the leading rows whose best token has at "
             "least p under the drafter); lossless either way (runtime/draft_rows.py)")


def policy_arg(text: str) -> str:
    """argparse type: a policy name, checked."""
    import argparse

    try:
        parse_policy(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_policy(text: str):
    """``all`` -> None (every row), ``auto`` -> ExpectedRate(), a probability -> Cutoff."""
    if text == "all":
        return None
    if text == "auto":
        return ExpectedRate()
    try:
        p = float(text)
    except ValueError:
        raise ValueError(f"draft rows {text!r}: pass all, auto or a probability cutoff "
                         "such as 0.2") from None
    return Cutoff(p)
