"""The bundle format, defined once: what ``export`` writes and every reader reads.

A bundle is one folder: the model files of one backend, the tokenizer and Hugging Face
config files, and ``manifest.json``. The manifest is ``Manifest`` and the typed records
of ``records``; each has a ``from_dict`` that checks every field (presence, type, range;
a problem names the field, e.g. ``models.target.inputs[3].shape``) and a ``to_dict``.
Older formats are read through ``upgrade``; ``describe`` is ``hyflash inspect``'s view.
Each fact lives in one place:
block size and window in the drafter config, tap layers and max context in the target
config, state and KV bytes derived from shapes and dtypes.

Format history (``FORMAT_VERSION``; bump on every change, keep a reader for the old one):

1. configs plus copies of block size, window, tap layers and max context; ``window_cache``
   added late (bundles without it hold fused features); no hash of its own.
2. each fact once; ``quantization.graphs`` per role; the KV cache's I/O names as
   patterns; ``manifest_sha256`` over the manifest's own canonical JSON, so a hand-edited
   ``block_size`` or ``max_seq_len`` is reported as an edit instead of failing later
   inside a runtime; ``kv_cache.form``: ``past_present`` (optimum's explicit KV I/O) or
   ``in_place`` (the lean target graph's static buffers, ``TARGET_ROLES``). Added
   later, optional: ``shared_weights`` (an initializer several graphs share, stored once:
   ``SharedWeight``), ``drafter.config.draft_vocab`` (0 when absent), the ``in_place``
   target's ``logits_rows`` input (``Role.optional_inputs``: logits of the last rows only,
   so a prefill skips the LM head over its other rows; without it a call returns all).

Backends plug in through ``ROLES``: the graph roles a backend's bundle holds, which model
of the pair each runs and the named I/O a runtime binds (an ExecuTorch program's methods
are roles with ``method`` set). Readers stay the same.

Writing is atomic (``write_bundle``). Reading (``read_bundle``) checks, in order: JSON, a
format this hyflash knows, every field, the manifest hash, consistency (the drafter fits
the target, every contract holds exactly the role's I/O, state and KV names), then every
file's presence, size and sha256. Each failure is one HyflashError naming the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hyflash.atomic import write_folder_atomically
from hyflash.bundle.fields import MANIFEST, REEXPORT, ManifestError, Obj, need_str
from hyflash.bundle.records import (
    DTYPE_BYTES,
    DrafterEntry,
    FileEntry,
    KVCacheSpec,
    ModelContract,
    Quantization,
    SharedWeight,
    TargetEntry,
    TensorSpec,
    relative_file,
)
from hyflash.bundle.upgrade import upgrade_v1
from hyflash.errors import HyflashError

FORMAT_VERSION = 2
HASH_FIELD = "manifest_sha256"


@dataclass(frozen=True)
class Role:
    """A graph of a backend's bundle: the model of the pair it runs (``target`` or
    ``drafter``) and the named I/O a runtime binds besides the KV cache (target) or the
    drafter state, which the manifest's kv_cache and drafter.state name."""

    model: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optional_inputs: tuple[str, ...] = ()  # added to the role later: older bundles lack them


ROLES: dict[str, dict[str, Role]] = {
    "onnx": {
        "target": Role("target", ("input_ids", "attention_mask", "position_ids"),
                       ("logits", "features", "argmax")),
        "drafter_step": Role("drafter", ("anchor", "features", "n_valid"), ("logits",)),
        "drafter_commit": Role("drafter", ("features", "n_valid"), ()),
    },
    # one .pte, a method per role (ModelContract.method); the KV cache and the feature
    # ring are mutable buffers inside the program, so they are no method's I/O; the
    # target role reads the ring that forward wrote (commit_rows: the ring's rows)
    "executorch": {
        "forward": Role("target", ("tokens", "input_pos"), ("logits",)),
        "target": Role("target", ("tokens", "input_pos"), ("features",)),
        "drafter_step": Role("drafter", ("anchor", "features", "n_valid"), ("logits",)),
        "drafter_commit": Role("drafter", ("features", "n_valid"), ()),
    },
    # one .mlpackage (a folder) per role; the KV cache is Core ML state (no I/O) or, for
    # iOS 17, explicit static_io inputs and outputs
    "coreml": {
        "target": Role("target", ("tokens", "input_pos"), ("logits", "features")),
        "drafter_step": Role("drafter", ("anchor", "features", "n_valid"), ("logits",)),
        "drafter_commit": Role("drafter", ("features", "n_valid"), ()),
    },
}
KV_IN_PROGRAM = ("mutable_buffers", "state")  # kv_cache.forms of a cache that is no graph I/O
# the target role's named I/O when its KV cache form is not ROLES' past/present one
TARGET_ROLES: dict[str, Role] = {
    "in_place": Role("target", ("input_ids", "seqlens_k", "total_sequence_length"),
                     ("logits", "argmax", "features"), optional_inputs=("logits_rows",)),
}


@dataclass(frozen=True)
class Manifest:
    """The whole manifest. Readers use its records and the derived facts below; the
    raw JSON stays inside this package."""

    hyflash_version: str
    backend: str
    target: TargetEntry
    drafter: DrafterEntry
    kv_cache: KVCacheSpec
    quantization: Quantization
    tokenizer_files: tuple[str, ...]
    models: dict[str, ModelContract]
    files: dict[str, FileEntry] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION  # the version it was read from
    shared_weights: dict[str, SharedWeight] = field(default_factory=dict)  # by initializer

    # derived facts: each is stored once, in a config or spec

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size

    @property
    def window(self) -> int:
        return self.drafter.config.window

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.target.config.tap_layers)

    @property
    def max_context(self) -> int:
        return self.target.config.max_seq_len

    @property
    def state_bytes(self) -> int:
        """The drafter's fixed state, whatever the context length."""
        return sum(s.bytes for s in self.drafter.state)

    @property
    def kv_bytes_per_token(self) -> int:
        t = self.target.config
        return (2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim
                * DTYPE_BYTES[self.kv_cache.dtype])

    def kv_names(self) -> tuple[list[str], list[str]]:
        """The target graph's KV input and output names, layer by layer."""
        n, kv = self.target.config.num_hidden_layers, self.kv_cache
        return kv.names(kv.past_inputs, n), kv.names(kv.present_outputs, n)

    def role(self, role: str) -> Role:
        """A graph role's named I/O; the target's follows its KV cache form."""
        if role == "target" and self.kv_cache.form in TARGET_ROLES:
            return TARGET_ROLES[self.kv_cache.form]
        return ROLES[self.backend][role]

    def file_bytes(self, name: str) -> int | None:
        """Bytes of a listed file, or of all listed files in a folder (a Core ML
        .mlpackage); None if nothing is listed under name."""
        sizes = [e.bytes for n, e in self.files.items() if n == name or n.startswith(name + "/")]
        return sum(sizes) if sizes else None

    def model(self, role: str) -> ModelContract:
        if role not in self.models:
            raise HyflashError(f"this {self.backend} bundle has no {role} graph: {REEXPORT}")
        return self.models[role]

    @classmethod
    def from_dict(cls, v: Any) -> Manifest:
        """Every field of a format 2 manifest (``upgrade_v1`` first for format 1)."""
        o = Obj(v, "")
        version = o.integer("format_version", 1)
        if HASH_FIELD in o:
            need_str(o.take(HASH_FIELD), HASH_FIELD)
        tokenizer = o.obj("tokenizer")
        m = cls(hyflash_version=o.text("hyflash_version"), backend=o.text("backend"),
                target=TargetEntry.from_dict(o.take("target"), "target"),
                drafter=DrafterEntry.from_dict(o.take("drafter"), "drafter"),
                kv_cache=KVCacheSpec.from_dict(o.take("kv_cache"), "kv_cache"),
                quantization=Quantization.from_dict(o.take("quantization"), "quantization"),
                tokenizer_files=tuple(relative_file(f, p) for f, p in tokenizer.items("files")),
                models={role: ModelContract.from_dict(role, c, p)
                        for role, c, p in o.entries("models")},
                files={relative_file(n, p): FileEntry.from_dict(e, p)
                       for n, e, p in o.entries("files")},
                format_version=version,
                shared_weights={n: SharedWeight.from_dict(w, p)
                                for n, w, p in (o.entries("shared_weights")
                                                if "shared_weights" in o else ())})
        tokenizer.done()
        o.done()
        return m

    def to_dict(self) -> dict:
        return {"format_version": FORMAT_VERSION, "hyflash_version": self.hyflash_version,
                "backend": self.backend, "target": self.target.to_dict(),
                "drafter": self.drafter.to_dict(), "kv_cache": self.kv_cache.to_dict(),
                "quantization": self.quantization.to_dict(),
                "tokenizer": {"files": list(self.tokenizer_files)},
                "models": {r: c.to_dict() for r, c in self.models.items()},
                "files": {n: e.to_dict() for n, e in self.files.items()},
                **({"shared_weights": {n: w.to_dict() for n, w in self.shared_weights.items()}}
                   if self.shared_weights else {})}

    # ------------------------------------------------------------ consistency

    def check(self, where: str = "the bundle") -> None:
        """Facts that must agree across records: the drafter fits the target, the graph
        roles are the backend's, each contract holds exactly its role's I/O, and the
        state / KV entries match the contracts."""
        roles = ROLES.get(self.backend)
        if roles is None:
            raise HyflashError(f"{where} is for backend {self.backend!r}, which this hyflash "
                               f"does not know ({', '.join(ROLES)}): upgrade hyflash")
        check_drafter_fits_target(self.drafter.config, self.target.config, where)
        for role in roles:
            if role not in self.models:
                raise ManifestError(f"models.{role}", "is missing")
        past, present = self.kv_names()
        for role, c in self.models.items():
            path = f"models.{role}"
            if role not in roles:
                raise ManifestError(path, f"is not a graph role of {self.backend} bundles "
                                          f"({', '.join(roles)})")
            if self.file_bytes(c.file) is None:
                raise ManifestError(f"{path}.file", f"names {c.file}, which files does not list")
            spec = self.role(role)
            have = {s.name for s in c.inputs}
            ins = [*spec.inputs, *(n for n in spec.optional_inputs if n in have)]
            outs = list(spec.outputs)
            if spec.model == "target":
                if self.kv_cache.form not in KV_IN_PROGRAM:
                    ins, outs = ins + past, outs + present
            else:
                if c.commit_rows is None:
                    raise ManifestError(f"{path}.commit_rows", "is missing")
                ins += [s.input for s in self.drafter.state]
                outs += [s.output for s in self.drafter.state]
                self.check_state_specs(c, path)
            same_names(c.inputs, ins, f"{path}.inputs")
            same_names(c.outputs, outs, f"{path}.outputs")
        for role in self.quantization.graphs:
            if role not in self.models:
                raise ManifestError(f"quantization.graphs.{role}", "is not a graph of the bundle")
        for name in self.tokenizer_files:
            if name not in self.files:
                raise ManifestError("tokenizer.files", f"lists {name}, which files does not list")
        for name, w in self.shared_weights.items():
            path = f"shared_weights.{name}"
            if w.file not in self.files:
                raise ManifestError(f"{path}.file", f"names {w.file}, which files does not list")
            if self.files[w.file].bytes != w.bytes:
                raise ManifestError(f"{path}.file", f"holds {self.files[w.file].bytes} bytes, "
                                                    f"not the {w.bytes} of its shape and dtype")
            for role in w.roles:
                if role not in self.models:
                    raise ManifestError(f"{path}.roles", f"names {role!r}, not a graph of the "
                                                         "bundle")

    def check_state_specs(self, c: ModelContract, path: str) -> None:
        """Each state tensor enters and leaves a drafter graph with its recorded shape."""
        for key, specs, attr in (("inputs", c.inputs, "input"), ("outputs", c.outputs, "output")):
            for i, got in enumerate(specs):
                s = next((s for s in self.drafter.state if getattr(s, attr) == got.name), None)
                if s is not None and (got.shape, got.dtype) != (s.shape, s.dtype):
                    raise ManifestError(f"{path}.{key}[{i}]",
                                        f"is {list(got.shape)} {got.dtype}, but drafter.state "
                                        f"records {s.name} as {list(s.shape)} {s.dtype}")


def same_names(specs: tuple[TensorSpec, ...], want: list[str], path: str) -> None:
    have = [s.name for s in specs]
    missing = [n for n in want if n not in have]
    if missing:
        raise ManifestError(path, f"lack {missing[0]!r}")
    extra = [n for n in have if n not in want]
    if extra:
        raise ManifestError(path, f"hold {extra[0]!r}, which this graph role does not take")


def check_drafter_fits_target(drafter, target, where: str) -> None:
    """The drafter conditions on the target's features and shares its vocabulary."""
    for name, a, b in (("vocab size", drafter.vocab_size, target.vocab_size),
                       ("hidden size", drafter.hidden_size, target.hidden_size),
                       ("feature size", drafter.feature_size, target.feature_size),
                       ("tap layers", list(drafter.tap_layers), list(target.tap_layers))):
        if a != b:
            raise HyflashError(f"the drafter in {where} was trained for another target: its "
                               f"{name} is {a}, the target's is {b}; export the drafter trained "
                               "for this target")


# ------------------------------------------------------------------- hashing

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(data: dict) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no spaces), hash field left out."""
    rest = {k: v for k, v in data.items() if k != HASH_FIELD}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(data: dict) -> dict:
    """The manifest dict with its content hash."""
    return {**data, HASH_FIELD: content_hash(data)}


def file_table(folder: Path) -> dict[str, FileEntry]:
    """sha256 and size of every file in folder (recursively) except the manifest."""
    return {p.relative_to(folder).as_posix(): FileEntry(sha256(p), p.stat().st_size)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


# ------------------------------------------------------------------- reading

@dataclass(frozen=True)
class Bundle:
    """A validated bundle: its folder and manifest."""

    folder: Path
    manifest: Manifest

    def path(self, role: str) -> Path:
        """The file of a graph role (``ROLES``)."""
        return self.folder / self.manifest.model(role).file

    def contract(self, role: str) -> ModelContract:
        return self.manifest.model(role)


def parse_manifest(data: Any, source: str = MANIFEST, where: str = "the bundle") -> Manifest:
    """A checked Manifest from manifest.json's parsed JSON (any known format version)."""
    try:
        version = Obj(data, "").integer("format_version", 1)
    except ManifestError as e:
        raise HyflashError(f"{source} has no valid format_version ({e.problem}): not a hyflash "
                           f"bundle manifest; {REEXPORT}") from None
    if version > FORMAT_VERSION:
        raise HyflashError(f"{where} has format version {version}, newer than this hyflash "
                           f"supports ({FORMAT_VERSION}): upgrade hyflash")
    try:
        manifest = Manifest.from_dict(upgrade_v1(data) if version == 1 else data)
        if version >= 2:
            if HASH_FIELD not in data:
                raise ManifestError(HASH_FIELD, "is missing")
            if data[HASH_FIELD] != content_hash(data):
                raise HyflashError(f"{source} was edited after export (its content hash does "
                                   f"not match): {REEXPORT}")
        manifest.check(where)
    except ManifestError as e:
        raise e.at(source) from None
    return manifest


def read_bundle(folder: str | Path, verify_hashes: bool = True) -> Bundle:
    """Open and check a bundle; raise a one-line HyflashError if it is unusable.
    ``verify_hashes`` reads every file once (about 1 GB/s)."""
    folder = Path(folder)
    mf = folder / MANIFEST
    if not mf.is_file():
        raise HyflashError(f"no {MANIFEST} in {folder}: not a hyflash bundle; write one with "
                           "`hyflash export`")
    try:
        data = json.loads(mf.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HyflashError(f"{mf} is not valid JSON ({getattr(e, 'msg', e)}): the bundle is "
                           f"damaged; {REEXPORT}") from e
    manifest = parse_manifest(data, str(mf), f"bundle {folder}")
    for name, entry in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise HyflashError(f"bundle {folder} is missing {name} (listed in {MANIFEST}): "
                               f"copy the whole bundle folder, or {REEXPORT}")
        if path.stat().st_size != entry.bytes or (verify_hashes and sha256(path) != entry.sha256):
            raise HyflashError(f"bundle file {path} is corrupted: its sha256 does not match "
                               f"{MANIFEST}; copy it again, or {REEXPORT}")
    return Bundle(folder, manifest)


# ------------------------------------------------------------------- writing

def write_bundle(out: str | Path, fill: Callable[[Path], Manifest]) -> Manifest:
    """Build a bundle atomically. ``fill(tmp)`` writes the files into tmp and returns the
    manifest (its ``files`` table is filled in here); the manifest is checked by the same
    reader every consumer uses, sealed with its hash and written; then tmp is renamed to
    out. An existing bundle at out is replaced only after the new one is complete; any
    other existing non-empty folder, or a file, is refused (never deleted)."""
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / MANIFEST).exists())):
        raise HyflashError(f"{out} exists and is not a hyflash bundle: choose a new --out "
                           "folder (an existing bundle there would be replaced)")

    def write(tmp: Path) -> Manifest:
        data = seal(replace(fill(tmp), files=file_table(tmp)).to_dict())
        text = json.dumps(data, indent=1) + "\n"
        manifest = parse_manifest(json.loads(text), f"the {MANIFEST} being written")
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        return manifest

    return write_folder_atomically(out, write)

