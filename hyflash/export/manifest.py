"""The bundle manifest: what every consumer (runtime, budget, inspect) reads.

A bundle is one folder: the model files, the tokenizer and Hugging Face config files,
and ``manifest.json``, which records everything a runtime would otherwise have to guess:

- ``format_version`` (this module's FORMAT_VERSION) and the hyflash version that wrote it;
- the target config (``TargetConfig.to_dict()``) and the drafter config;
- tap layers, block size, window, what the window holds, the drafter state tensors
  (graph input / output names, shapes, dtypes, bytes), the KV cache layout, max context;
- the quantization recipe, the tokenizer files, sha256 and size of every file;
- the I/O contract of each model file (names, shapes with symbolic dims, dtypes).

Writing is atomic (``write_bundle``): the files go into a temp folder beside the output,
which is renamed into place only once complete, so a crash or a bad input never leaves a
half-written bundle. Reading (``read_bundle``) validates before anyone loads a graph:
missing file, hash mismatch, a format newer than this hyflash, a drafter trained for
another target. Each is a one-line HyflashError naming the problem and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hyflash.atomic import write_folder_atomically
from hyflash.errors import HyflashError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REEXPORT = "re-export it with `hyflash export`"


# ------------------------------------------------------------------------ writing

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_table(folder: Path) -> dict[str, dict]:
    """sha256 and size of every file in folder (recursively) except the manifest."""
    return {p.relative_to(folder).as_posix(): {"sha256": sha256(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def write_bundle(out: Path, fill: Callable[[Path], dict]) -> dict:
    """Build a bundle atomically. ``fill(tmp)`` writes the files into tmp and returns the
    manifest without its ``files`` table; this adds the hashes, writes manifest.json and
    renames tmp to out. An existing bundle at out is replaced only after the new one is
    complete; any other existing non-empty folder is refused (never deleted)."""
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / MANIFEST).exists())):
        raise HyflashError(f"{out} exists and is not a hyflash bundle: choose a new --out "
                           "folder (an existing bundle there would be replaced)")
    def write(tmp: Path) -> dict:
        manifest = fill(tmp)
        manifest["files"] = file_table(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest

    return write_folder_atomically(out, write)


# ------------------------------------------------------------------------ reading

@dataclass
class Bundle:
    """A validated bundle: its folder and manifest, with typed views of the configs."""

    folder: Path
    manifest: dict

    def path(self, role: str) -> Path:
        """The file of a model role: ``target``, ``drafter_step`` or ``drafter_commit``."""
        return self.folder / self.manifest["models"][role]["file"]

    def contract(self, role: str) -> dict:
        return self.manifest["models"][role]

    @property
    def target_config(self):
        from hyflash.models.target import TargetConfig

        return TargetConfig.from_dict(self.manifest["target"]["config"])

    @property
    def window_cache(self) -> str:
        """What the drafter window holds; bundles from before the field held features."""
        return self.manifest.get("window_cache", "features")

    @property
    def drafter_config(self):
        from hyflash.models.drafter import DrafterConfig

        return DrafterConfig(**self.manifest["drafter"]["config"])


def read_bundle(folder: str | Path, verify_hashes: bool = True) -> Bundle:
    """Load and validate a bundle's manifest; raise a one-line HyflashError if it is
    unusable. ``verify_hashes`` reads every file once (about 1 GB/s)."""
    folder = Path(folder)
    mf = folder / MANIFEST
    if not mf.is_file():
        raise HyflashError(f"no {MANIFEST} in {folder}: not a hyflash bundle; write one with "
                           "`hyflash export`")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HyflashError(f"{mf} is not valid JSON ({e.msg if hasattr(e, 'msg') else e}): "
                           f"the bundle is damaged; {REEXPORT}") from e
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise HyflashError(f"{mf} has no format_version: not a hyflash bundle manifest; "
                           f"{REEXPORT}")
    if version > FORMAT_VERSION:
        raise HyflashError(f"bundle {folder} has format version {version}, newer than this "
                           f"hyflash supports ({FORMAT_VERSION}): upgrade hyflash")
    missing = [k for k in ("target", "drafter", "models", "files", "state", "kv_cache")
               if k not in manifest]
    if missing:
        raise HyflashError(f"{mf} lacks {', '.join(missing)}: the manifest is damaged; "
                           f"{REEXPORT}")
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise HyflashError(f"bundle {folder} is missing {name} (listed in {MANIFEST}): "
                               f"copy the whole bundle folder, or {REEXPORT}")
        if path.stat().st_size != entry["bytes"] or (verify_hashes
                                                     and sha256(path) != entry["sha256"]):
            raise HyflashError(f"bundle file {path} is corrupted: its sha256 does not match "
                               f"{MANIFEST}; copy it again, or {REEXPORT}")
    for role, model in manifest["models"].items():
        if model["file"] not in manifest["files"]:
            raise HyflashError(f"{MANIFEST} names {model['file']} for the {role} graph but "
                               f"lists no hash for it: the manifest is damaged; {REEXPORT}")
    check_drafter_fits_target(manifest["drafter"]["config"], manifest["target"]["config"],
                              folder)
    return Bundle(folder, manifest)


def check_drafter_fits_target(drafter: dict, target: dict, folder: Path) -> None:
    """The drafter conditions on the target's features and shares its vocabulary."""
    feature_size = len(target["tap_layers"]) * target["hidden_size"]
    for name, a, b in (("vocab size", drafter["vocab_size"], target["vocab_size"]),
                       ("hidden size", drafter["hidden_size"], target["hidden_size"]),
                       ("feature size", drafter["feature_size"], feature_size),
                       ("tap layers", list(drafter["tap_layers"]), list(target["tap_layers"]))):
        if a != b:
            raise HyflashError(f"the drafter in bundle {folder} was trained for another "
                               f"target: its {name} is {a}, the target's is {b}; export the "
                               "drafter trained for this target")


# ---------------------------------------------------------------------- inspecting

def describe(bundle: Bundle) -> str:
    """A readable summary of a bundle for ``hyflash inspect``."""
    m = bundle.manifest
    t, d = m["target"]["config"], m["drafter"]["config"]
    kv, q = m["kv_cache"], m["quantization"]
    mib = 2 ** 20
    rows = [
        ("bundle", f"{bundle.folder} (format {m['format_version']}, hyflash "
                   f"{m.get('hyflash_version', '?')}, backend {m.get('backend', '?')})"),
        ("target", f"{t['model_type']}, {t['num_hidden_layers']} layers, hidden "
                   f"{t['hidden_size']}, vocab {t['vocab_size']}  ({m['target'].get('source')})"),
        ("drafter", f"{d['arch']}, {d['num_layers']} layers, block {d['block_size']}, window "
                    f"{d['window']}, window cache {bundle.window_cache} "
                    f"({m.get('window_holds', '?')}), memory {d['memory']}"),
        ("tap layers -> features", f"{t['tap_layers']} -> {d['feature_size']}"),
        ("max context", m.get("max_context")),
        ("quantization", f"{q['recipe']}: {q['target'].get('weights', '')}"),
        ("KV cache", f"{kv['layout']}, {kv['dtype']}, {kv['bytes_per_token']} B/token, "
                     f"{kv['bytes_per_token'] * m['max_context'] / mib:.1f} MiB at max context"),
        ("drafter state", f"{m['state_bytes']} B, fixed: "
                          + ", ".join(f"{s['name']} {s['shape']} {s['dtype']}"
                                      for s in m["state"])),
        ("tokenizer", ", ".join(m.get("tokenizer", {}).get("files", [])) or "-"),
    ]
    for role, model in m["models"].items():
        ins = ", ".join(f"{i['name']}{i['shape']}" for i in compact(model["inputs"]))
        outs = ", ".join(f"{o['name']}{o['shape']}" for o in compact(model["outputs"]))
        size = m["files"][model["file"]]["bytes"] / mib
        rows.append((f"{role} ({model['file']}, {size:.1f} MiB)", f"{ins} -> {outs}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def compact(specs: list[dict]) -> list[dict]:
    """Fold per-layer KV entries (past_key_values.N.key ...) into one line each."""
    out, seen = [], set()
    for s in specs:
        parts = s["name"].split(".")
        if len(parts) == 3 and parts[1].isdigit():
            key = f"{parts[0]}.*.{parts[2]}"
            if key in seen:
                continue
            seen.add(key)
            s = {**s, "name": key}
        out.append(s)
    return out
