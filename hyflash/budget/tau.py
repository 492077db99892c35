"""tau as `hyflash simulate` measured it, remembered per bundle for `hyflash budget`.

A bundle's manifest carries its own content hash (``manifest_sha256``), so the record is
kept outside the bundle (which stays byte for byte what export wrote) under
``$HYFLASH_CACHE/simulate/<hash>.json``: the last run's tau with how it was measured.
A re-exported bundle has a new hash and so no stale tau.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hyflash.bundle.fields import MANIFEST


def record_path(folder: str | Path) -> Path | None:
    from hyflash.models.gguf import cache_root

    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        digest = manifest["manifest_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # format 1 bundles have no hash: nothing to key a record by
    return cache_root() / "simulate" / f"{digest}.json"


def record(folder: str | Path, summary: dict, settings: dict) -> None:
    """Remember a simulate run's tau for this bundle (best effort: a read-only cache only
    means budget asks for --tau)."""
    path = record_path(folder)
    tau = summary.get("tau")
    if path is None or not isinstance(tau, float) or tau != tau:
        return
    data = {"tau": tau, "acceptance_by_position": summary.get("acceptance_by_position"),
            "bundle": str(folder), "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
            "settings": {k: settings.get(k) for k in ("prompts", "max_new_tokens",
                                                      "temperature", "threads")}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def recorded(folder: str | Path) -> dict | None:
    """The last simulate run's record for this bundle, if any."""
    path = record_path(folder)
    try:
        data = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("tau"), (int, float)) else None
