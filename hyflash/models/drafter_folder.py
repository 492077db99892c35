"""Reading a drafter folder written by ``hyflash train``: its config (checked without
loading weights), the checks that it fits a target and a context, and its weights.

The model itself (``Drafter``, its state, ``save``) lives in ``drafter.py``.
"""

from __future__ import annotations

from pathlib import Path

from hyflash.errors import HyflashError
from hyflash.models.drafter import DERIVED, FORMAT_VERSION, Drafter, DrafterConfig
from hyflash.models.target import Target, TargetConfig


def resolve_drafter_folder(folder: str | Path) -> Path:
    """A drafter folder, or ``pocket`` / ``pocket-full``: the pocket model's shipped ones."""
    from hyflash.models import pocket

    if str(folder) in pocket.DRAFTERS:
        return pocket.drafter_path(pocket.DRAFTERS[str(folder)])
    return Path(folder)


RETRAIN = "pass a drafter folder written by `hyflash train` (or train one again)"


def read_drafter_config(folder: str | Path) -> tuple[Path, DrafterConfig, dict]:
    """-> (folder, config, the whole config.json with its training report) of a drafter
    folder, checked without loading weights: export checks the pair with it first."""
    from hyflash.models.folders import read_json_object

    folder = resolve_drafter_folder(folder)
    meta_file = folder / "config.json"
    if not meta_file.is_file() or not (folder / "model.safetensors").is_file():
        raise HyflashError(f"no drafter at {folder}: expected config.json + model.safetensors "
                           "written by `hyflash train`")
    meta = read_json_object(meta_file, RETRAIN)
    if not isinstance(meta.get("config"), dict):
        what = " (a model's config: pass that folder as --target)" if "model_type" in meta else ""
        raise HyflashError(f"{meta_file} is not a hyflash drafter config{what}: {RETRAIN}")
    version = meta.get("format_version", 0)
    if type(version) is not int or version > FORMAT_VERSION:
        raise HyflashError(f"drafter at {folder} has format {version!r}, newer than this "
                           f"hyflash ({FORMAT_VERSION}); upgrade hyflash")
    try:
        cfg = DrafterConfig(**meta["config"])
    except (TypeError, HyflashError) as e:  # keys missing or unknown, values out of range
        raise HyflashError(f"{meta_file} holds no usable drafter config ({e}): {RETRAIN}") \
            from None
    return folder, cfg, meta


def check_drafter_fits(cfg: DrafterConfig, t: TargetConfig, folder: Path) -> None:
    """A drafter conditions on its target's tap-layer features and shares its vocabulary:
    it fits only the target it was trained for (same taps, hence same depth)."""
    mismatch = [(name, a, b) for name, a, b in (
        ("vocab size", cfg.vocab_size, t.vocab_size),
        ("hidden size", cfg.hidden_size, t.hidden_size),
        ("tap layers", list(cfg.tap_layers), list(t.tap_layers)),
        ("feature size", cfg.feature_size, t.feature_size),
    ) if a != b]
    if mismatch:
        name, a, b = mismatch[0]
        verb = "are" if name == "tap layers" else "is"
        raise HyflashError(f"drafter at {folder} was trained for another target: its {name} "
                           f"{verb} {a}, this {t.num_hidden_layers}-layer target's {verb} {b}; "
                           "train one for this target with `hyflash train --target ...`")


def check_drafter_context(cfg: DrafterConfig, context: int, folder: Path) -> None:
    """The context must hold the drafter's window plus one block, or the window and memory
    it was trained with never fill; a full-context drafter (no memory) must see the whole
    context in its window, or it silently forgets what falls out of it."""
    if cfg.arch == "full" and context > cfg.window:
        raise HyflashError(f"the full-context drafter at {folder} sees {cfg.window} tokens; a "
                           f"context of {context} would drop older ones: pass --max-seq-len "
                           f"<= {cfg.window}")
    need = (cfg.window if cfg.arch == "hyflash" else 1) + cfg.block_size
    if context < need:
        raise HyflashError(f"a context of {context} tokens is too small for the drafter at "
                           f"{folder}: its window ({cfg.window}) and one block "
                           f"({cfg.block_size}) need {need}; pass --max-seq-len >= {need}")


def load_drafter(folder: str | Path, target: Target) -> Drafter:
    """Load a saved drafter onto the target it was trained for (checked, not assumed).
    ``pocket`` / ``pocket-full`` name the pocket model's shipped drafters."""
    from hyflash.models.drafter_store import unpack_rows
    from hyflash.models.folders import check_shapes, load_safetensors_file

    folder, cfg, _ = read_drafter_config(folder)
    check_drafter_fits(cfg, target.cfg, folder)
    drafter = Drafter(cfg, target.embed_tokens, target.lm_head)
    state = unpack_rows(load_safetensors_file(folder / "model.safetensors", RETRAIN),
                        folder / "model.safetensors", RETRAIN)  # int8 rows: the shipping form
    check_shapes(drafter, state, folder / "model.safetensors", RETRAIN)
    try:  # loading the draft vocabulary's ids derives their LM head rows (DraftHead)
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except HyflashError as e:
        raise HyflashError(f"drafter at {folder}: {e}; {RETRAIN}") from None
    missing = [k for k in missing if not k.startswith(DERIVED)]
    if missing or unexpected:
        raise HyflashError(f"drafter weights in {folder} do not match its config: missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}; {RETRAIN}")
    return drafter.to(target.embed_tokens.weight.dtype).eval()
