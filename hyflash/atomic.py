"""Folders that appear whole or not at all.

Every output folder (a drafter, a bundle, the pocket model) is written into a temp
folder beside its destination and renamed into place; an existing folder is moved aside
first and removed only after the new one is in place. An interrupted run leaves at most
a hidden temp folder, never a half-written output.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def write_folder_atomically(out: str | Path, write: Callable[[Path], T]) -> T:
    """Call ``write(tmp)`` to fill a temp folder, then rename it to ``out``."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    old = None
    try:
        result = write(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        return result
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
