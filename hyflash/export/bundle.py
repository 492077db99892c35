"""Build an ONNX bundle: target + drafter graphs, quantized, with tokenizer and manifest.

The order is the pipeline's: load the pair (checked against each other), export fp32
graphs into a scratch folder, quantize each into the bundle with the chosen recipe,
check every file with onnx.checker, copy the tokenizer and Hugging Face config files
(optimum's ORTModelForCausalLM loads the target from the bundle folder with them), then
write the manifest. ``manifest.write_bundle`` makes the whole thing atomic.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from hyflash import __version__
from hyflash.errors import HyflashError
from hyflash.export import manifest as mf
from hyflash.export import onnx as ox
from hyflash.export.quantize import check_recipe, quantize, quiet_logger

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")


def export_onnx_bundle(target_path: str | Path, drafter_dir: str | Path, out: str | Path,
                       quant: str = "fp32", max_seq_len: int | None = None,
                       progress: bool = True, window_cache: str = "kv") -> dict:
    """Export the target at target_path (a model folder, hub id or ``pocket``) and the
    drafter trained for it into a bundle at out; return the manifest. ``window_cache``
    picks the drafter's window layout (see ``hyflash.models.drafter``)."""
    import torch

    from hyflash.models.drafter import check_window_cache, load_drafter, resolve_drafter_folder
    from hyflash.models.target import Target, resolve_model_folder

    check_recipe(quant)  # before the slow part
    folder = resolve_model_folder(target_path)
    drafter_dir = resolve_drafter_folder(drafter_dir)
    taps = read_drafter_taps(drafter_dir)
    target = Target.from_pretrained(folder, dtype="float32", max_seq_len=max_seq_len,
                                    tap_layers=taps)
    drafter = load_drafter(drafter_dir, target).float()
    check_window_cache(window_cache)
    drafter.window_cache = window_cache

    def fill(tmp: Path) -> dict:
        import onnx

        graphs = (("target", ox.TARGET_FILE), ("drafter_step", ox.DRAFTER_FILE),
                  ("drafter_commit", ox.COMMIT_FILE))
        with tqdm(total=4, desc="export", unit="step", disable=not progress) as bar, \
                tempfile.TemporaryDirectory(prefix="hyflash-fp32-") as scratch, \
                quiet_logger("torch.onnx"), torch.no_grad():
            s = Path(scratch)
            bar.set_postfix_str("target graph")
            ox.export_target(target, s / ox.TARGET_FILE)
            bar.update()
            bar.set_postfix_str("drafter graphs")
            ox.export_drafter(drafter, s / ox.DRAFTER_FILE, s / ox.COMMIT_FILE)
            bar.update()
            bar.set_postfix_str(f"quantize {quant}")
            recipe = {role: quantize(quant, s / name, tmp / name) for role, name in graphs}
            bar.update()
            bar.set_postfix_str("check + tokenizer")
            for _, name in graphs:
                onnx.checker.check_model(str(tmp / name), full_check=True)
            tok_files = copy_tokenizer(folder, tmp)
            bar.update()
        return build_manifest(target, drafter, folder, drafter_dir, tmp, quant, recipe,
                              tok_files)

    return mf.write_bundle(Path(out), fill)


def read_drafter_taps(drafter_dir: Path) -> tuple[int, ...]:
    """The tap layers the drafter was trained on: the target must expose the same."""
    cfg = drafter_dir / "config.json"
    if not cfg.is_file():
        raise HyflashError(f"no drafter at {drafter_dir}: expected config.json + "
                           "model.safetensors written by `hyflash train`")
    try:
        return tuple(json.loads(cfg.read_text())["config"]["tap_layers"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise HyflashError(f"{cfg} is not a hyflash drafter config: retrain or re-save the "
                           "drafter with `hyflash train`") from e


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Tokenizer files plus config.json / generation_config.json (what optimum and
    transformers read from a model folder). Returns the tokenizer files copied."""
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for name in copied + ["config.json"]:
        shutil.copyfile(src / name, dst / name)
    if (src / "generation_config.json").is_file():
        shutil.copyfile(src / "generation_config.json", dst / "generation_config.json")
    else:
        from transformers import AutoConfig, GenerationConfig

        GenerationConfig.from_model_config(AutoConfig.from_pretrained(src)).save_pretrained(dst)
    return copied


def build_manifest(target, drafter, target_folder: Path, drafter_dir: Path, tmp: Path,
                   quant: str, recipe: dict, tok_files: list[str]) -> dict:
    from hyflash.models.drafter import WINDOW_CACHES

    tc, dc = target.cfg, drafter.cfg
    kv_dtype = str(target.embed_tokens.weight.dtype).removeprefix("torch.")
    elem = target.embed_tokens.weight.element_size()
    state = [{"name": k, "input": ox.state_input(k), "output": ox.state_output(k),
              "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
              "bytes": v.numel() * v.element_size()}
             for k, v in drafter.init_state(drafter.fc.weight.dtype).items()]
    models = {
        "target": {"file": ox.TARGET_FILE, **ox.io_contract(tmp / ox.TARGET_FILE)},
        "drafter_step": {"file": ox.DRAFTER_FILE, "commit_rows": dc.commit_size,
                         **ox.io_contract(tmp / ox.DRAFTER_FILE)},
        "drafter_commit": {"file": ox.COMMIT_FILE, "commit_rows": ox.commit_rows(drafter),
                           **ox.io_contract(tmp / ox.COMMIT_FILE)},
    }
    return {
        "format_version": mf.FORMAT_VERSION,
        "hyflash_version": __version__,
        "backend": "onnx",
        "target": {"source": str(target_folder), "config": tc.to_dict()},
        "drafter": {"source": str(drafter_dir), "config": drafter.cfg.to_dict()},
        "tap_layers": list(tc.tap_layers),
        "block_size": dc.block_size,
        "window": dc.window,
        "window_cache": drafter.window_cache,
        "window_holds": WINDOW_CACHES[drafter.window_cache],
        "max_context": tc.max_seq_len,
        "state": state,
        "state_bytes": sum(s["bytes"] for s in state),
        "kv_cache": {
            "layout": "[1, kv_heads, positions, head_dim] per layer, keys and values",
            "layers": tc.num_hidden_layers, "kv_heads": tc.num_key_value_heads,
            "head_dim": tc.head_dim, "dtype": kv_dtype,
            "past_inputs": "past_key_values.{layer}.key / .value",
            "present_outputs": "present.{layer}.key / .value",
            "bytes_per_token": 2 * tc.num_hidden_layers * tc.num_key_value_heads
            * tc.head_dim * elem,
        },
        "quantization": {"recipe": quant, **recipe},
        "tokenizer": {"files": tok_files},
        "models": models,
    }


def requantize_bundle(src: str | Path, quant: str, out: str | Path) -> dict:
    """A new bundle at out with the graphs of the fp32 bundle src quantized by ``quant``;
    everything else is copied. Exporting once and quantizing many times saves the
    export (the slow part) when comparing recipes."""
    import copy

    bundle = mf.read_bundle(src)
    if bundle.manifest["quantization"]["recipe"] != "fp32":
        raise HyflashError(f"bundle {src} is already {bundle.manifest['quantization']['recipe']}"
                           ": requantize an fp32 bundle")
    check_recipe(quant)  # before the slow part

    def fill(tmp: Path) -> dict:
        import onnx

        manifest = copy.deepcopy(bundle.manifest)
        models = manifest["models"]
        recipe = {}
        for role, model in models.items():
            recipe[role] = quantize(quant, bundle.folder / model["file"], tmp / model["file"])
            onnx.checker.check_model(str(tmp / model["file"]), full_check=True)
            model.update(ox.io_contract(tmp / model["file"]))
        graphs = {m["file"] for m in models.values()}
        for name in manifest["files"]:
            if name not in graphs:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bundle.folder / name, tmp / name)
        manifest["quantization"] = {"recipe": quant, **recipe}
        manifest["hyflash_version"] = __version__
        del manifest["files"]
        return manifest

    return mf.write_bundle(Path(out), fill)
