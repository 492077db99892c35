"""The pocket pair's ExecuTorch bundle as the tests export it, shared by test_executorch.py
(the Python runtime) and test_native.py (the C++ runtime over the same program): the
export costs ~1 min, so a session makes it once (conftest's ``fp32_bundle``)."""

from __future__ import annotations

from pathlib import Path

CONTEXT = 128  # holds the pocket drafter's window (64) + block (8) and the prompts


def on_a_fresh_stack(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a new thread. torch.fx records the Python stack of every
    node it creates, and lowering creates hundreds of thousands: under pytest's deep stack
    each export took ~8 s (15%) longer than from a shallow one (measured)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def export_pocket_fp32(out: Path) -> Path:
    """`hyflash export --backend executorch` of the pocket pair (fp32) at out."""
    from hyflash.cli import main

    assert on_a_fresh_stack(main, ["export", "--target", "pocket", "--drafter", "pocket",
                                   "--backend", "executorch", "--max-seq-len", str(CONTEXT),
                                   "--out", str(out), "--no-progress"]) == 0
    return out
