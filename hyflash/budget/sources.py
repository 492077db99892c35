"""What `hyflash budget SOURCE` sizes: a bundle, a model's config, a GGUF file or a preset.

Every source becomes a ``Source``: the target's shape and, when the source fixes them,
the drafter, recipe, backend and context (a bundle fixes all four, from its manifest). No
weights are read: a model folder or hub id gives its config.json only, a GGUF file its
metadata and tensor shapes (the gguf reader memory-maps the file; nothing is dequantized).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hyflash.budget.data import load, section
from hyflash.budget.shapes import DrafterShape, TargetShape
from hyflash.errors import HyflashError

KINDS = ("a bundle folder, a model folder or its config.json, a .gguf file, a hub id "
         "(org/name: its config.json only), or a preset")


@dataclass(frozen=True)
class Source:
    kind: str  # bundle, preset, folder, gguf, hub
    name: str
    target: TargetShape
    drafter: DrafterShape | None = None  # fixed by the source (a bundle)
    recipe: str | None = None
    backend: str | None = None
    group_size: int | None = None
    context: int | None = None
    bundle: object | None = None  # hyflash.bundle.Bundle
    facts: dict = field(default_factory=dict)  # how a bundle runs: KV form, commit rows, ...


def presets() -> dict[str, dict]:
    return section(load("presets"), "presets", "hyflash/budget/data/presets.json",
                   "reinstall hyflash")


def resolve(source: str) -> Source:
    path = Path(source).expanduser()
    if (path / "manifest.json").is_file():
        return from_bundle(path)
    table = presets()
    if source.lower() in table:
        entry = table[source.lower()]
        shape = TargetShape.from_hf(entry["config"], source.lower(), f"preset {source}")
        return Source("preset", source.lower(), shape, facts={"source": entry["source"]})
    if source == "pocket" or path.is_dir() or path.name == "config.json":
        return from_folder(source, path)
    if path.suffix.lower() == ".gguf":
        return from_gguf(path)
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise HyflashError(f"{source!r} is no preset and no file hyflash budget reads: pass "
                           f"{KINDS} ({', '.join(table)})")
    return from_hub(source)


def from_bundle(folder: Path) -> Source:
    from hyflash.bundle import read_bundle

    bundle = read_bundle(folder, verify_hashes=False)
    m = bundle.manifest
    target = TargetShape.from_config(m.target.config, folder.name)
    drafter = DrafterShape.from_config(m.drafter.config, m.drafter.window_cache)
    graphs = m.quantization.graphs.get("target", {})
    step = m.models.get("drafter_step")
    facts = {"kv_form": m.kv_cache.form, "kv_dtype": m.kv_cache.dtype,
             "state_bytes": m.state_bytes, "commit_rows": step.commit_rows if step else None,
             "shared": sorted(m.shared_weights), "files": {n: e.bytes for n, e in m.files.items()},
             "models": {role: c.file for role, c in m.models.items()},
             "source_grid": graphs.get("source_grid")}
    return Source("bundle", str(folder), target, drafter, m.quantization.recipe, m.backend,
                  graphs.get("group_size"), m.max_context, bundle, facts)


def from_folder(source: str, path: Path) -> Source:
    from hyflash.models.folders import read_hf_config
    from hyflash.models.target import resolve_model_folder

    folder = path.parent if path.name == "config.json" else resolve_model_folder(source)
    hf = read_hf_config(folder)
    return Source("folder", str(folder), TargetShape.from_hf(hf, folder.name,
                                                              str(folder / "config.json")))


def from_gguf(path: Path) -> Source:
    """The config the GGUF converter would write, from metadata and tensor shapes only."""
    from hyflash.models.gguf import (
        ARCHITECTURES,
        SUPPORTED,
        GGUFError,
        hf_config,
        hf_tensor_name,
        open_reader,
        read_metadata,
    )

    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}: pass an existing .gguf file")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF'); "
                            f"{SUPPORTED}")
    reader = open_reader(path)
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path} holds architecture {arch!r}; {SUPPORTED}")
    shapes = {hf_tensor_name(t.name, path): tuple(reversed(t.shape.tolist()))
              for t in reader.tensors}
    hf = hf_config(meta, arch, shapes, path)
    return Source("gguf", str(path), TargetShape.from_hf(hf, path.stem, str(path)),
                  facts={"file_bytes": path.stat().st_size, "source_grid": gguf_grid(reader)})


def gguf_grid(reader) -> dict[str, bool]:
    """Which of a GGUF's weights the int4 recipes keep on their own grid
    (``hyflash.export.grid_blocks``): every projection Q4_0 / Q4_1; the LM head Q8_0."""
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    projections = [kind for name, kind in types.items()
                   if name.startswith("blk.") and name.endswith(".weight") and "norm" not in name]
    head = types.get("output.weight", types.get("token_embd.weight"))
    return {"int4": bool(projections) and all(k in ("Q4_0", "Q4_1") for k in projections),
            "int8": head == "Q8_0"}


def from_hub(repo: str) -> Source:
    """config.json of a hub model, nothing else (the weights stay on the hub)."""
    try:
        from huggingface_hub import hf_hub_download

        file = Path(hf_hub_download(repo, "config.json"))
    except Exception as e:  # network, auth, missing repo: all end the same way
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HyflashError(f"could not fetch config.json of hub model {repo} ({first}): check "
                           f"the id and the network, or pass {KINDS}") from None
    return from_folder(str(file), file)
