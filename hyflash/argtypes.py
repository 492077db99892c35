"""argparse types shared by every command: a bad number is a one-line usage error.

Each function takes the raw string and returns the parsed value or raises
``argparse.ArgumentTypeError``, which ``hyflash.cli.OneLineParser`` prints as one line
naming the flag, with exit status 2. Import nothing heavy here: ``--help`` uses it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

# ONNX Runtime and torch both accept any thread count; far more threads than cores only
# makes them contend (ONNX Runtime spins them), so counts above this are capped.
MAX_THREAD_OVERSUBSCRIPTION = 1


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _require(value, ok: bool, rule: str):
    """value if ok, else the one-line usage error 'must be RULE, got VALUE'."""
    if not ok:
        shown = f"{value:g}" if isinstance(value, float) else value
        raise argparse.ArgumentTypeError(f"must be {rule}, got {shown}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1 (steps, tokens, sequences, batch sizes)."""
    value = _int(text)
    return _require(value, value >= 1, ">= 1")


def nonneg_int(text: str) -> int:
    """An int >= 0 (seeds, top-k where 0 means off)."""
    value = _int(text)
    return _require(value, value >= 0, ">= 0")


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def nonneg_float(text: str) -> float:
    """A finite float >= 0 (temperature: 0 means greedy)."""
    value = finite_float(text)
    return _require(value, value >= 0, ">= 0")


def positive_float(text: str) -> float:
    value = finite_float(text)
    return _require(value, value > 0, "> 0")


def unit_interval(text: str) -> float:
    """A float in (0, 1] (top-p)."""
    value = finite_float(text)
    return _require(value, 0 < value <= 1, "in (0, 1]")


def fraction(text: str) -> float:
    """A float in [0, 1] (shares of data)."""
    value = finite_float(text)
    return _require(value, 0 <= value <= 1, "in [0, 1]")


def threads(text: str) -> int:
    """Thread count >= 1, capped at the machine's cores (with a note on stderr): more
    threads than cores only makes the runtime's threads contend."""
    value = positive_int(text)
    cores = machine_cores() * MAX_THREAD_OVERSUBSCRIPTION
    if value > cores:
        print(f"note: --threads {value} capped at {cores}, the cores this process may use",
              file=sys.stderr)
        return cores
    return value


# Default --threads of the commands that compute (generate, demo, simulate, export). Small
# models gain nothing from a second thread, and threads that spin against another busy
# process lose 10-30x: `generate --target pocket --drafter pocket` ran at 49-85 tok/s on 1
# thread and 2-7 tok/s on 2 (medians of 3, 2-core machine under load; README).
DEFAULT_THREADS = 1
