"""Reading a manifest field by field, so that a damaged entry is named, never a KeyError.

A manifest is JSON that a user can edit, truncate or copy half-way. Every record of
``hyflash.bundle`` reads its fields through ``Obj`` and the ``need_*`` checks here; each
problem raises ``ManifestError`` with the field's path (``models.target.inputs[3].shape``)
and what is wrong with it, which the CLI prints as one line.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from hyflash.errors import HyflashError

MANIFEST = "manifest.json"
REEXPORT = "re-export it with `hyflash export`"


class ManifestError(HyflashError):
    """A manifest field that is missing, of the wrong type or out of range."""

    def __init__(self, field: str, problem: str, source: str = MANIFEST):
        self.field, self.problem = field, problem
        super().__init__(f"{source}: {field} {problem}: the manifest is damaged; {REEXPORT}")

    def at(self, source: str) -> ManifestError:
        """The same error, naming the manifest file it came from."""
        return ManifestError(self.field, self.problem, source)


def kind(v: Any) -> str:
    """A JSON type name for messages."""
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def need_int(v: Any, path: str, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ManifestError(path, f"must be an integer, got {kind(v)}")
    if lo is not None and v < lo:
        raise ManifestError(path, f"is {v}: must be >= {lo}")
    return v


def need_float(v: Any, path: str) -> float:
    """A finite positive number (epsilons, rope bases)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ManifestError(path, f"must be a number, got {kind(v)}")
    if not math.isfinite(v) or v <= 0:
        raise ManifestError(path, f"is {v}: must be a finite number > 0")
    return float(v)


def need_str(v: Any, path: str, choices: typing.Iterable[str] | None = None) -> str:
    if not isinstance(v, str) or not v:
        raise ManifestError(path, f"must be a non-empty string, got {kind(v)}")
    if choices is not None and v not in choices:
        raise ManifestError(path, f"is {v!r}: must be one of {', '.join(choices)}")
    return v


def need_bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise ManifestError(path, f"must be true or false, got {kind(v)}")
    return v


def need_list(v: Any, path: str) -> list:
    if not isinstance(v, list):
        raise ManifestError(path, f"must be a list, got {kind(v)}")
    return v


class Obj:
    """One JSON object of the manifest. ``take`` marks a field as read; ``done`` refuses
    fields the format does not define (a typo or a foreign edit, not silently ignored)."""

    def __init__(self, value: Any, path: str):
        if not isinstance(value, dict):
            raise ManifestError(path or "the manifest", f"must be a JSON object, got {kind(value)}")
        self.d, self.path, self.seen = value, path, set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def __contains__(self, key: str) -> bool:
        return key in self.d

    def take(self, key: str) -> Any:
        if key not in self.d:
            raise ManifestError(self.at(key), "is missing")
        self.seen.add(key)
        return self.d[key]

    def integer(self, key: str, lo: int | None = 0) -> int:
        return need_int(self.take(key), self.at(key), lo)

    def text(self, key: str, choices: typing.Iterable[str] | None = None) -> str:
        return need_str(self.take(key), self.at(key), choices)

    def obj(self, key: str) -> Obj:
        return Obj(self.take(key), self.at(key))

    def items(self, key: str) -> list[tuple[Any, str]]:
        """A list field as (item, path of the item) pairs."""
        path = self.at(key)
        return [(v, f"{path}[{i}]") for i, v in enumerate(need_list(self.take(key), path))]

    def entries(self, key: str) -> list[tuple[str, Any, str]]:
        """An object field keyed by name (roles, files) as (name, value, path) triples."""
        sub = self.obj(key)
        return [(name, sub.take(name), sub.at(name)) for name in sub.d]

    def done(self) -> None:
        extra = sorted(set(self.d) - self.seen)
        if extra:
            raise ManifestError(self.at(extra[0]), "is not a field of this manifest format")


def read_config(cls: type, value: Any, path: str, nonneg: tuple[str, ...] = (),
                added: tuple[str, ...] = ()):
    """A config dataclass (TargetConfig, DrafterConfig) from its JSON object: every field
    present (but those in ``added``, fields newer than the format, which take their
    default when absent) and of its annotated type; integers >= 1 (sizes) except those in
    nonneg (token ids, layer indices, 0 = off) >= 0; floats finite and > 0. The class's
    own checks run last, and their message is kept."""
    obj = Obj(value, path)
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: typed(obj.take(f.name), hints[f.name], obj.at(f.name),
                            0 if f.name in nonneg else 1)
              for f in dataclasses.fields(cls) if f.init
              and not (f.name in added and f.name not in obj.d)}
    obj.done()
    try:
        return cls(**kwargs)
    except HyflashError as e:
        raise ManifestError(path, f"is not valid ({e})") from e


def typed(v: Any, hint: Any, path: str, lo: int) -> Any:
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        if v is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is tuple and args == (int, Ellipsis):
        return tuple(need_int(x, f"{path}[{i}]", lo) for i, x in enumerate(need_list(v, path)))
    if hint is dict or origin is dict:
        return dict(Obj(v, path).d)  # free-form (rope scaling): the config checks its keys
    readers = {int: lambda: need_int(v, path, lo), float: lambda: need_float(v, path),
               bool: lambda: need_bool(v, path), str: lambda: need_str(v, path)}
    if hint not in readers:
        raise TypeError(f"no manifest reader for {hint} ({path})")  # a new config field type
    return readers[hint]()
