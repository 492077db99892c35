"""The records a manifest is made of, each read field by field (``from_dict``, which
names the field of any problem) and written back (``to_dict``).

Configs are the models' own dataclasses (``TargetConfig``, ``DrafterConfig``), imported
only when a manifest is read, so this package stays below ``hyflash.models``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from hyflash.bundle.fields import ManifestError, Obj, need_int, need_str, read_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1,
               "uint8": 1, "int8": 1}
KV_FORMS = {"past_present": "[1, kv_heads, positions, head_dim] per layer, keys and values; "
                            "the past goes in, past + new comes out",
            "in_place": "[1, kv_heads, max_seq_len, head_dim] per layer, keys and values; one "
                        "static buffer bound as both past input and present output, written "
                        "in place at the call's positions (GroupQueryAttention)",
            "mutable_buffers": "keys (k) [kv_heads, max_seq_len, head_dim] and values (v) "
                               "transposed [kv_heads, head_dim, max_seq_len] per layer; "
                               "mutable buffers inside the program, shared by its target "
                               "methods and written at input_pos; not method I/O",
            "state": "[1, kv_heads, max_seq_len, head_dim] per layer, keys and values; Core ML "
                     "states (iOS 18) inside the model, written at input_pos; not model I/O",
            "static_io": "[1, kv_heads, max_seq_len, head_dim] per layer, keys and values; "
                         "the whole cache goes in and comes out with the call's rows written "
                         "at input_pos (Core ML without states, iOS 17)"}
SHA256 = re.compile(r"[0-9a-f]{64}")


def relative_file(v: Any, path: str) -> str:
    """A file name inside the bundle (no absolute path, no ``..``)."""
    name = need_str(v, path)
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name:
        raise ManifestError(path, f"is {name!r}: must be a path inside the bundle")
    return name


# ------------------------------------------------------------------------ records

@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output; a dim is an int or a symbolic name (dynamic)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    @classmethod
    def from_dict(cls, v: Any, path: str) -> TensorSpec:
        o = Obj(v, path)
        spec = cls(o.text("name"), tuple(dim(d, p) for d, p in o.items("shape")),
                   o.text("dtype", DTYPE_BYTES))
        o.done()
        return spec

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def dim(v: Any, path: str) -> int | str:
    return v if isinstance(v, str) and v else need_int(v, path, 0)


@dataclass(frozen=True)
class StateSpec:
    """One drafter state tensor: fixed shape, graph input and output names."""

    name: str
    input: str
    output: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @classmethod
    def from_dict(cls, v: Any, path: str) -> StateSpec:
        o = Obj(v, path)
        spec = cls(o.text("name"), o.text("input"), o.text("output"),
                   tuple(need_int(d, p, 1) for d, p in o.items("shape")),
                   o.text("dtype", DTYPE_BYTES))
        o.done()
        return spec

    def to_dict(self) -> dict:
        return {"name": self.name, "input": self.input, "output": self.output,
                "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class KVCacheSpec:
    """The target's KV cache: its form (``KV_FORMS``), dtype, and the patterns of its
    per-layer input / output names (``{layer}`` and ``{kind}`` = key or value)."""

    form: str
    dtype: str
    past_inputs: str
    present_outputs: str

    @classmethod
    def from_dict(cls, v: Any, path: str) -> KVCacheSpec:
        o = Obj(v, path)
        spec = cls(o.text("form", KV_FORMS), o.text("dtype", DTYPE_BYTES),
                   o.text("past_inputs"), o.text("present_outputs"))
        for key in ("past_inputs", "present_outputs"):
            pattern = getattr(spec, key)
            try:
                ok = pattern.format(layer=0, kind="key") != pattern.format(layer=1, kind="key")
            except (KeyError, IndexError, ValueError):
                ok = False
            if not ok or "{kind}" not in pattern:
                raise ManifestError(o.at(key), f"is {pattern!r}: must name each layer's key and "
                                               "value with {layer} and {kind}")
        o.done()
        return spec

    def to_dict(self) -> dict:
        return {"form": self.form, "dtype": self.dtype, "past_inputs": self.past_inputs,
                "present_outputs": self.present_outputs}

    def names(self, pattern: str, layers: int) -> list[str]:
        return [pattern.format(layer=i, kind=k) for i in range(layers) for k in ("key", "value")]


@dataclass(frozen=True)
class ModelContract:
    """The I/O contract of one graph: its file, inputs and outputs as exported, the
    feature rows a drafter graph takes per call (``commit_rows``; for an ExecuTorch
    target, the rows of its feature ring), and for a program with several methods
    (ExecuTorch) the method."""

    role: str
    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    commit_rows: int | None = None
    method: str | None = None

    @classmethod
    def from_dict(cls, role: str, v: Any, path: str) -> ModelContract:
        o = Obj(v, path)
        c = cls(role, relative_file(o.take("file"), o.at("file")),
                tuple(TensorSpec.from_dict(s, p) for s, p in o.items("inputs")),
                tuple(TensorSpec.from_dict(s, p) for s, p in o.items("outputs")),
                o.integer("commit_rows", 1) if "commit_rows" in o else None,
                o.text("method") if "method" in o else None)
        o.done()
        for key, specs in (("inputs", c.inputs), ("outputs", c.outputs)):
            names = [s.name for s in specs]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup:
                raise ManifestError(o.at(key), f"name {dup!r} twice")
        return c

    def to_dict(self) -> dict:
        d = {"file": self.file, "inputs": [s.to_dict() for s in self.inputs],
             "outputs": [s.to_dict() for s in self.outputs]}
        d.update({k: getattr(self, k) for k in ("commit_rows", "method")
                  if getattr(self, k) is not None})
        return d


@dataclass(frozen=True)
class SharedWeight:
    """One initializer that several graphs hold (the tied token embedding of the target
    and the drafter): stored once, as raw little-endian bytes in ``file``, which each of
    ``roles``' graphs references as ONNX external data under the same initializer name.
    A runtime loads it once and hands the same buffer to every session."""

    file: str
    shape: tuple[int, ...]
    dtype: str
    roles: tuple[str, ...]

    @classmethod
    def from_dict(cls, v: Any, path: str) -> SharedWeight:
        o = Obj(v, path)
        w = cls(relative_file(o.take("file"), o.at("file")),
                tuple(need_int(d, p, 1) for d, p in o.items("shape")),
                o.text("dtype", DTYPE_BYTES), tuple(need_str(r, p) for r, p in o.items("roles")))
        o.done()
        return w

    def to_dict(self) -> dict:
        return {"file": self.file, "shape": list(self.shape), "dtype": self.dtype,
                "roles": list(self.roles)}

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int

    @classmethod
    def from_dict(cls, v: Any, path: str) -> FileEntry:
        o = Obj(v, path)
        digest = o.text("sha256")
        if not SHA256.fullmatch(digest):
            raise ManifestError(o.at("sha256"), "must be 64 lowercase hex digits")
        entry = cls(digest, o.integer("bytes", 0))
        o.done()
        return entry

    def to_dict(self) -> dict:
        return {"sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class Quantization:
    """The recipe, and per graph role what the tool did (free-form: tool, weights, ...)."""

    recipe: str
    graphs: dict[str, dict]

    @classmethod
    def from_dict(cls, v: Any, path: str) -> Quantization:
        o = Obj(v, path)
        q = cls(o.text("recipe"), {role: dict(Obj(g, p).d) for role, g, p in o.entries("graphs")})
        o.done()
        return q

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "graphs": self.graphs}

    def min_rows(self, role: str = "target") -> int:
        """The fewest rows a call of the role's graph may have to compute what the same rows
        compute inside a longer call (``hyflash.export.quantize``): as recorded, else 2 for
        a graph with int8 activations (optimum-form 8da bundles exported before the record
        covered that form), else 1."""
        graph = self.graphs.get(role, {})
        return int(graph.get("min_rows", 2 if graph.get("accuracy_level") else 1))


@dataclass(frozen=True)
class TargetEntry:
    source: str
    config: Any  # hyflash.models.target.TargetConfig: tap layers, max context (max_seq_len)

    @classmethod
    def from_dict(cls, v: Any, path: str) -> TargetEntry:
        from hyflash.models.target import TargetConfig

        o = Obj(v, path)
        entry = cls(o.text("source"), read_config(TargetConfig, o.take("config"), o.at("config"),
                                                  ("bos_token_id", "eos_token_ids", "tap_layers")))
        o.done()
        return entry

    def to_dict(self) -> dict:
        cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in self.config.to_dict().items()}
        return {"source": self.source, "config": cfg}  # JSON-ready: tuples as lists


@dataclass(frozen=True)
class DrafterEntry:
    source: str
    config: Any  # hyflash.models.drafter.DrafterConfig: block size, window
    window_cache: str  # what the window state holds (hyflash.models.drafter.WINDOW_CACHES)
    state: tuple[StateSpec, ...]

    @classmethod
    def from_dict(cls, v: Any, path: str) -> DrafterEntry:
        from hyflash.models.drafter import WINDOW_CACHES, DrafterConfig

        o = Obj(v, path)
        entry = cls(o.text("source"),
                    read_config(DrafterConfig, o.take("config"), o.at("config"),
                                ("tap_layers", "draft_vocab"), added=("draft_vocab",)),
                    o.text("window_cache", WINDOW_CACHES),
                    tuple(StateSpec.from_dict(s, p) for s, p in o.items("state")))
        o.done()
        return entry

    def to_dict(self) -> dict:
        return {"source": self.source, "config": self.config.to_dict(),
                "window_cache": self.window_cache, "state": [s.to_dict() for s in self.state]}

    @property
    def window_holds(self) -> str:
        from hyflash.models.drafter import WINDOW_CACHES

        return WINDOW_CACHES[self.window_cache]
