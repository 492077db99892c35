"""The budget's data files: presets, device profiles, measured runtime costs, calibration.

They live in ``hyflash/budget/data/`` as JSON, each with a ``format`` number and the source
of every fact; users pass their own device file with ``--devices``. Reading one checks it
and turns any problem into one line naming the file and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.errors import HyflashError

DATA = Path(__file__).parent / "data"
FORMAT = 1


def load(name: str) -> dict:
    """A data file shipped with hyflash (``devices``, ``presets``, ``runtime``, ...)."""
    return read(DATA / f"{name}.json", "reinstall hyflash")


def read(path: Path, fix: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HyflashError(f"no file at {path}: {fix}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HyflashError(f"{path} is not valid JSON ({getattr(e, 'msg', e)}): {fix}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise HyflashError(f"{path} is not a hyflash budget data file of format {FORMAT} (its "
                           f"top level needs \"format\": {FORMAT}): {fix}")
    return data


def section(data: dict, key: str, path: str, fix: str) -> dict:
    """data[key], which must be an object of objects."""
    value = data.get(key)
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise HyflashError(f"{path} has no \"{key}\" object of entries: {fix}")
    return value


def number(entry: dict, key: str, where: str, fix: str, *, optional: bool = False):
    """A positive number field (None when optional and absent or null)."""
    value = entry.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HyflashError(f"{where}: {key} must be a number > 0, got {value!r}: {fix}")
    return float(value)
