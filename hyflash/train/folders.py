"""Which folders `hyflash train` may replace or delete: only its own.

``--out`` is replaced only if it is a drafter folder this command wrote (its config.json
carries the format marker and training report ``Drafter.save`` writes, and nothing else
is in it); ``--work`` is used only if it is new, empty, or carries the marker file this
command leaves in every work folder. Anything else is the user's and is refused before
any work starts, with one line saying how to proceed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hyflash.errors import HyflashError

DRAFTER_FILES = {"config.json", "model.safetensors"}
WORK_MARKER = "hyflash-train-work.txt"


def is_trained_drafter(folder: Path) -> bool:
    """A folder `hyflash train` wrote: only its two files, config.json with the markers."""
    if not {p.name for p in folder.iterdir()} <= DRAFTER_FILES:
        return False
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and isinstance(meta.get("format_version"), int)
            and isinstance(meta.get("config"), dict) and "training" in meta)


def check_parent(path: Path, flag: str) -> None:
    for parent in path.resolve().parents:
        if parent.exists():
            if not parent.is_dir():
                raise HyflashError(f"{flag} {path}: {parent} is a file, not a folder; choose "
                                   f"another {flag}")
            return


def check_out(out: Path) -> None:
    """Refuse an --out that holds anything but a drafter this command wrote."""
    check_parent(out, "--out")
    how = "choose a new --out, or remove it yourself"
    if out.exists() and not out.is_dir():
        raise HyflashError(f"--out {out} is a file, not a drafter folder: {how}")
    if out.is_dir() and any(out.iterdir()) and not is_trained_drafter(out):
        raise HyflashError(f"--out {out} is a folder that `hyflash train` did not write "
                           f"(it holds {', '.join(sorted(p.name for p in out.iterdir())[:3])}"
                           f"...): {how}")


def check_work(work: Path, out: Path) -> None:
    """Refuse a --work that is a file, the user's folder, or overlaps --out."""
    check_parent(work, "--work")
    w, o = work.resolve(), out.resolve()
    if w == o or o in w.parents or w in o.parents:
        raise HyflashError(f"--work {work} and --out {out} overlap: put the work folder "
                           "beside the drafter folder (the default is OUT.work)")
    how = "choose another --work, or remove it yourself"
    if work.exists() and not work.is_dir():
        raise HyflashError(f"--work {work} is a file, not a work folder: {how}")
    if work.is_dir() and any(work.iterdir()) and not (work / WORK_MARKER).exists():
        raise HyflashError(f"--work {work} is a folder that `hyflash train` did not make "
                           f"(no {WORK_MARKER} in it): {how}")


def claim_work(work: Path, out: Path) -> None:
    """Create the work folder and mark it as ours, so that a rerun may reuse or remove it."""
    work.mkdir(parents=True, exist_ok=True)
    marker = work / WORK_MARKER
    if not marker.exists():
        marker.write_text(f"Work folder of `hyflash train --out {out}`: self-distillation "
                          "data and checkpoints, reused when the same command is rerun. "
                          "Safe to delete.\n")


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def finish_work(work: Path, keep: bool) -> str:
    """Remove the work folder (unless keep) -> the one line that says what happened."""
    size = human_bytes(folder_bytes(work))
    if keep:
        return f"kept the work folder {work} ({size}): rerunning the command reuses it"
    shutil.rmtree(work)
    return f"removed the work folder {work} ({size}); pass --keep-work to keep it"
