"""Model and drafter folders as users hold them: config JSON and safetensors weights.

Users copy, download and edit these folders, so a file can be cut short by a full disk, be
an HTML error page saved under the right name, or hold a list where an object belongs.
Every reader here turns such a file into one HyflashError that names the file, what is
wrong with it and the fix, instead of a JSONDecodeError or a SafetensorError traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hyflash.errors import HyflashError


class TargetLoadError(HyflashError):
    """A model folder or config this package cannot load; the message says why and what to do."""


JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def read_json_object(path: Path, fix: str,
                     error: type[HyflashError] = HyflashError) -> dict:
    """The JSON object in path; anything else raises ``error`` ending in ``fix``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise error(f"{path} is not a text file (not UTF-8): {fix}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                    f"{fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path} holds a JSON {JSON_TYPES.get(type(data), 'value')}, not an "
                    f"object: {fix}")
    return data


def safetensors_problem(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def load_safetensors_file(path: Path, fix: str, error: type[HyflashError] = HyflashError):
    """-> {name: tensor} of a safetensors file; a truncated or garbage file raises ``error``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError) as e:
        raise error(f"{path} is truncated or corrupt ({safetensors_problem(e)}): {fix}") from None


def safetensors_shapes(path: Path, fix: str,
                       error: type[HyflashError] = HyflashError) -> dict[str, list[int]]:
    """-> {name: shape} from the file's header only (cheap: no tensor is read). The header
    records every tensor's byte range, so a truncated file fails here too."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise error(f"{path} is truncated or corrupt ({safetensors_problem(e)}): {fix}") from None


def check_shapes(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
                 fix: str, error: type[HyflashError] = HyflashError) -> None:
    """Weights whose shapes disagree with the module the config built: load_state_dict
    would raise a RuntimeError listing every tensor."""
    own = module.state_dict()
    for k, v in state.items():
        if k in own and tuple(v.shape) != tuple(own[k].shape):
            raise error(f"weight {k} in {source} has shape {list(v.shape)}, but the config "
                        f"says {list(own[k].shape)}: {fix}")


# ------------------------------------------------------- Hugging Face model folders

REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings",
                  "sliding_window")
RESTORE = "restore it from the model's source (or re-save the model with transformers)"


def read_hf_config(folder: Path) -> dict:
    """config.json of a model folder, checked to be a model config with usable sizes."""
    f = folder / "config.json"
    if not f.exists():
        raise TargetLoadError(f"no config.json in {folder}: not a Hugging Face model folder")
    hf = read_json_object(f, RESTORE, TargetLoadError)
    if "format_version" in hf and isinstance(hf.get("config"), dict):
        raise TargetLoadError(f"{folder} is a hyflash drafter, not a model: pass it as "
                              "--drafter and the model it was trained for as --target")
    missing = [k for k in REQUIRED_SIZES if hf.get(k) is None]
    if missing:
        raise TargetLoadError(f"{f} lacks {', '.join(missing)}: not a complete model config; "
                              f"{RESTORE}")
    bad = [k for k in REQUIRED_SIZES + OPTIONAL_SIZES if hf.get(k) is not None
           and (type(hf[k]) is not int or hf[k] < 1)]
    if bad:
        raise TargetLoadError(f"{f} has {bad[0]} = {hf[bad[0]]!r}, not a whole number >= 1; "
                              f"{RESTORE}")
    return hf


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder: the shards its index lists, or every
    *.safetensors file."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(index, RESTORE, TargetLoadError).get("weight_map")
        if not isinstance(weight_map, dict):
            raise TargetLoadError(f"{index} has no weight_map object: {RESTORE}")
        files = sorted(set(map(str, weight_map.values())))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise TargetLoadError(f"no weights in {folder}: expected model.safetensors or a "
                              "sharded model.safetensors.index.json (convert .bin with "
                              "transformers' save_pretrained(safe_serialization=True))")
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise TargetLoadError(f"missing weight shard {missing[0]} in {folder}: {RESTORE}")
    return [folder / name for name in files]


def load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        state.update(load_safetensors_file(f, "re-download or re-save the model",
                                           TargetLoadError))
    return state
