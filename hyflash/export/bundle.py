"""Build an ONNX bundle: target + drafter graphs, quantized, with tokenizer and manifest.

The order is the pipeline's: load the pair (checked against each other), export fp32
graphs into a scratch folder, quantize each into the bundle with the chosen recipe,
store once the weights several graphs hold (``shared_weights``: the tied token
embedding), check every file with onnx.checker, copy the tokenizer and Hugging Face config files
(optimum's ORTModelForCausalLM loads the target from the bundle folder with them), then
build the manifest from the records of ``hyflash.bundle``, the one definition of the
format. ``hyflash.bundle.write_bundle`` checks it with the readers' own checks, seals it
with its hash and makes the whole thing atomic.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from hyflash import __version__
from hyflash.bundle import Manifest, read_bundle, write_bundle
from hyflash.bundle.records import DrafterEntry, Quantization, StateSpec, TargetEntry
from hyflash.errors import HyflashError
from hyflash.export import onnx as ox
from hyflash.export.onnx_lean import target_graph_form
from hyflash.export.quantize import (
    check_recipe,
    check_source_blocks,
    quantize,
    quiet_logger,
    record_min_rows,
)
from hyflash.export.shared_weights import share_weights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")


def load_pair(target_path: str | Path, drafter_dir: str | Path, max_seq_len: int | None,
              window_cache: str):
    """What every exporter starts from: -> (target folder, drafter folder, Target, Drafter),
    both float32, the drafter's window layout set, its context checked. The target keeps
    its own tap layers: load_drafter refuses a drafter trained on others."""
    from hyflash.models.drafter import check_window_cache
    from hyflash.models.drafter_folder import (
        check_drafter_context,
        load_drafter,
        resolve_drafter_folder,
    )
    from hyflash.models.target import Target, resolve_model_folder

    check_window_cache(window_cache)
    folder = resolve_model_folder(target_path)
    drafter_dir = resolve_drafter_folder(drafter_dir)
    target = Target.from_pretrained(folder, dtype="float32", max_seq_len=max_seq_len)
    drafter = load_drafter(drafter_dir, target).float()
    check_drafter_context(drafter.cfg, target.cfg.max_seq_len, drafter_dir)
    drafter.window_cache = window_cache
    return folder, drafter_dir, target, drafter


def export_onnx_bundle(target_path: str | Path, drafter_dir: str | Path, out: str | Path,
                       quant: str = "fp32", max_seq_len: int | None = None,
                       progress: bool = True, window_cache: str = "kv",
                       target_graph: str = "auto", source_blocks: str = "keep") -> Manifest:
    """Export the target at target_path (a model folder, hub id or ``pocket``) and the
    drafter trained for it into a bundle at out; return the manifest. ``window_cache``
    picks the drafter's window layout (see ``hyflash.models.drafter``), ``target_graph``
    the target graph's form (``hyflash.export.onnx_lean``: ``lean``, ``optimum`` or
    ``auto``, lean where the model allows it), ``source_blocks`` what the 4-bit recipes do
    with weights that already are 4-bit blocks (``hyflash.export.quantize.quantize``)."""
    import torch

    check_recipe(quant)  # before the slow part
    check_source_blocks(quant, source_blocks)
    folder, drafter_dir, target, drafter = load_pair(target_path, drafter_dir, max_seq_len,
                                                     window_cache)
    target_file, kv_cache, export_target = target_graph_form(target_graph, target)
    files = {**ox.FILES, "target": target_file}

    def fill(tmp: Path) -> Manifest:
        import onnx

        with tqdm(total=4, desc="export", unit="step", disable=not progress) as bar, \
                tempfile.TemporaryDirectory(prefix="hyflash-fp32-") as scratch, \
                quiet_logger("torch.onnx"), torch.no_grad():
            s = Path(scratch)
            bar.set_postfix_str("target graph")
            export_target(target, s / target_file)
            bar.update()
            bar.set_postfix_str("drafter graphs")
            ox.export_drafter(drafter, s / ox.DRAFTER_FILE, s / ox.COMMIT_FILE)
            bar.update()
            bar.set_postfix_str(f"quantize {quant}")
            recipe = record_min_rows(strip_recipe({role: quantize(quant, s / name, tmp / name,
                                                                  source_blocks)
                                                   for role, name in files.items()}))
            shared = share_weights(tmp, files)
            bar.update()
            bar.set_postfix_str("check + tokenizer")
            for name in files.values():
                onnx.checker.check_model(str(tmp / name), full_check=True)
            tok_files = copy_tokenizer(folder, tmp)
            bar.update()
        manifest = build_manifest(target, drafter, folder, drafter_dir, tmp, quant, recipe,
                                  tok_files, files, kv_cache)
        return replace(manifest, shared_weights=shared)

    return write_bundle(out, fill)


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Tokenizer files plus config.json / generation_config.json (what optimum and
    transformers read from a model folder). Returns the tokenizer files copied."""
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for name in copied + ["config.json"]:
        shutil.copyfile(src / name, dst / name)
    if "tokenizer_config.json" in copied:  # the target graph takes no token_type_ids
        from hyflash.models.tokenizer import fix_model_input_names

        fix_model_input_names(dst / "tokenizer_config.json")
    if (src / "generation_config.json").is_file():
        shutil.copyfile(src / "generation_config.json", dst / "generation_config.json")
    else:
        from transformers import AutoConfig, GenerationConfig

        GenerationConfig.from_model_config(AutoConfig.from_pretrained(src)).save_pretrained(dst)
    return copied


def build_manifest(target, drafter, target_folder: Path, drafter_dir: Path, tmp: Path,
                   quant: str, recipe: dict, tok_files: list[str], files: dict[str, str],
                   kv_cache) -> Manifest:
    """The manifest of a freshly exported ONNX bundle in tmp (files are hashed later)."""
    dtype = str(target.embed_tokens.weight.dtype).removeprefix("torch.")
    state = tuple(StateSpec(k, ox.state_input(k), ox.state_output(k), tuple(v.shape),
                            str(v.dtype).removeprefix("torch."))
                  for k, v in drafter.init_state(drafter.fc.weight.dtype).items())
    return Manifest(
        hyflash_version=__version__, backend="onnx",
        target=TargetEntry(str(target_folder), target.cfg),
        drafter=DrafterEntry(str(drafter_dir), drafter.cfg, drafter.window_cache, state),
        kv_cache=replace(kv_cache, dtype=dtype),
        quantization=Quantization(quant, recipe), tokenizer_files=tuple(tok_files),
        models=contracts(tmp, {"drafter_step": drafter.cfg.commit_size,
                               "drafter_commit": ox.commit_rows(drafter)}, files))


def contracts(folder: Path, commit_rows: dict[str, int], files: dict[str, str]) -> dict:
    """Each graph's I/O contract as written in folder; drafter roles with their rows."""
    return {role: ox.io_contract(folder / name, role, commit_rows.get(role))
            for role, name in files.items()}


def requantize_bundle(src: str | Path, quant: str, out: str | Path,
                      roles: tuple[str, ...] | None = None,
                      source_blocks: str = "keep") -> Manifest:
    """A new bundle at out with the graphs of the fp32 bundle src quantized by ``quant``;
    everything else is copied. Exporting once and quantizing many times saves the
    export (the slow part) when comparing recipes. ``roles`` quantizes only those graphs
    (the others stay fp32; the recipe is then named ``quant:role+role``), to measure what
    quantizing one model of the pair costs (``benchmarks/quant_roles.py``)."""
    bundle = read_bundle(src)
    old = bundle.manifest
    if old.quantization.recipe != "fp32":
        raise HyflashError(f"bundle {src} is already {old.quantization.recipe}: requantize an "
                           "fp32 bundle")
    check_recipe(quant)  # before the slow part
    check_source_blocks(quant, source_blocks)
    unknown = sorted(set(roles or ()) - set(old.models))
    if unknown:
        raise HyflashError(f"bundle {src} has no graph {', '.join(unknown)}: its roles are "
                           f"{', '.join(old.models)}")
    chosen = set(old.models) if roles is None else set(roles)
    recipe_name = quant if chosen == set(old.models) else f"{quant}:{'+'.join(sorted(chosen))}"

    def fill(tmp: Path) -> Manifest:
        import onnx

        recipe = {}
        for role, model in old.models.items():  # the graphs come out with all their data
            recipe[role] = quantize(quant if role in chosen else "fp32",
                                    bundle.folder / model.file, tmp / model.file,
                                    source_blocks if role in chosen else "keep")
        graphs = {m.file for m in old.models.values()}
        stored = {w.file for w in old.shared_weights.values()}
        for name in old.files:
            if name not in graphs and name not in stored:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bundle.folder / name, tmp / name)
        shared = share_weights(tmp, {role: m.file for role, m in old.models.items()})
        for model in old.models.values():
            onnx.checker.check_model(str(tmp / model.file), full_check=True)
        models = {role: ox.io_contract(tmp / m.file, role, m.commit_rows)
                  for role, m in old.models.items()}
        return replace(old, hyflash_version=__version__, models=models, files={},
                       quantization=Quantization(recipe_name, record_min_rows(
                           strip_recipe(recipe))),
                       shared_weights=shared)

    return write_bundle(out, fill)


def strip_recipe(graphs: dict[str, dict]) -> dict[str, dict]:
    """Per-graph quantization details without the recipe name, which the manifest keeps
    once (``quantization.recipe``)."""
    return {role: {k: v for k, v in d.items() if k != "recipe"} for role, d in graphs.items()}
