"""Device profiles: RAM, what one app may hold, memory bandwidth, each with its source.

The shipped profiles are ``data/devices.json``; ``--devices FILE`` adds a user's own (same
fields; an entry with a shipped name replaces it). ``bandwidth_gbs`` may be null (unknown):
such a device gets a memory verdict and no speed projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hyflash.budget.data import DATA, number, read, section
from hyflash.errors import HyflashError

GIB = 2 ** 30
FIX = "every device needs name, ram_gib, app_limit_gib (numbers > 0), bandwidth_gbs (or null)"


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    os: str
    ram_gib: float
    app_limit_gib: float
    bandwidth_gbs: float | None
    app_limit_entitled_gib: float | None
    sources: dict[str, str]

    @property
    def limit_bytes(self) -> int:
        return int(self.app_limit_gib * GIB)


def profiles(user_file: str | None = None) -> dict[str, Device]:
    out = read_profiles(DATA / "devices.json", "reinstall hyflash")
    if user_file:
        out.update(read_profiles(Path(user_file), f"fix it ({FIX})"))
    return out


def read_profiles(path: Path, fix: str) -> dict[str, Device]:
    entries = section(read(path, fix), "devices", str(path), fix)
    out = {}
    for key, e in entries.items():
        where = f"{path}: device {key}"
        name = e.get("name")
        if not isinstance(name, str) or not name:
            raise HyflashError(f"{where} has no name: {FIX}")
        out[key.lower()] = Device(
            key=key.lower(), name=name, os=str(e.get("os", "")),
            ram_gib=number(e, "ram_gib", where, FIX),
            app_limit_gib=number(e, "app_limit_gib", where, FIX),
            bandwidth_gbs=number(e, "bandwidth_gbs", where, FIX, optional=True),
            app_limit_entitled_gib=number(e, "app_limit_entitled_gib", where, FIX, optional=True),
            sources={k.removesuffix("_source"): v for k, v in e.items()
                     if k.endswith("_source") and isinstance(v, str)})
    return out


def device(key: str, user_file: str | None = None) -> Device:
    table = profiles(user_file)
    if key.lower() not in table:
        raise HyflashError(f"unknown device {key!r}: choose one of {', '.join(table)}, or add "
                           "it to a JSON file like hyflash/budget/data/devices.json and pass "
                           "--devices FILE")
    return table[key.lower()]
