"""Build a Core ML bundle: target, drafter and drafter-commit .mlpackage, tokenizer, manifest.

The same layout and manifest format as the other backends (``hyflash.bundle``): the pair
is loaded and checked, converted (``hyflash.export.coreml``), quantized, each package gets
its description and hyflash's metadata, the tokenizer and Hugging Face config files are
copied, and ``write_bundle`` checks the manifest with the readers' own checks, seals it and
makes the folder appear atomically. Each contract is read back from the package as saved
(``hyflash.runtime.coreml_spec``), so the manifest records what the file declares.

``requantize_coreml_bundle`` quantizes the packages of an fp16 bundle into a new bundle:
comparing recipes costs one conversion.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from hyflash import __version__
from hyflash.bundle import Manifest, read_bundle, write_bundle
from hyflash.bundle.records import DrafterEntry, Quantization, StateSpec, TargetEntry
from hyflash.errors import HyflashError
from hyflash.export import coreml as cm

IOS = {"ios17": "iOS 17", "ios18": "iOS 18"}


def export_coreml_bundle(target_path: str | Path, drafter_dir: str | Path, out: str | Path,
                         quant: str = "fp16", kv: str = "state", deployment: str | None = None,
                         max_seq_len: int | None = None, progress: bool = True,
                         window_cache: str = "kv") -> Manifest:
    """Export the target at target_path (a model folder, .gguf, hub id or ``pocket``) and
    the drafter trained for it into a Core ML bundle at out; return the manifest."""
    from hyflash.export.bundle import copy_tokenizer, load_pair
    from hyflash.export.onnx import commit_rows
    from hyflash.runtime.coreml_spec import import_coremltools

    deployment = cm.check_options(quant, kv, deployment)  # before the slow part
    import_coremltools("Core ML export")
    folder, drafter_dir, target, drafter = load_pair(target_path, drafter_dir, max_seq_len,
                                                     window_cache)
    if quant == "int4":
        cm.check_int4_blocks(target, drafter)
    counts = cm.token_counts(drafter.cfg.block_size, target.cfg.max_seq_len)
    rows = {"target": max(counts), "drafter_step": drafter.cfg.commit_size,
            "drafter_commit": commit_rows(drafter)}
    state = tuple(StateSpec(k, cm.state_input(k), cm.state_output(k), tuple(v.shape),
                            "int32" if k == "count" else "float16")
                  for k, v in drafter.init_state().items())
    entries = (TargetEntry(str(folder), target.cfg),
               DrafterEntry(str(drafter_dir), drafter.cfg, window_cache, state))

    def fill(tmp: Path) -> Manifest:
        with tqdm(total=4, desc="export", unit="step", disable=not progress) as bar:
            bar.set_postfix_str("drafter -> Core ML")  # small: a bad op shows up early
            models = dict(zip(("drafter_step", "drafter_commit"),
                              cm.convert_drafter(drafter, deployment, rows["drafter_commit"]),
                              strict=True))
            bar.update()
            bar.set_postfix_str("target -> Core ML")
            models["target"] = cm.convert_target(target, kv, deployment, counts)
            bar.update()
            bar.set_postfix_str(f"quantize {quant}, save")
            quantization = {}
            for role, ml in models.items():
                if quant != "fp16":
                    ml, quantization[role] = cm.quantize(ml, quant)
                else:
                    quantization[role] = {"weights": "float16"}
                quantization[role].update(compute_precision="float16",
                                          deployment_target=IOS[deployment])
                cm.describe(ml, f"hyflash {__version__}", __version__, SUMMARIES[role],
                            package_metadata(role, entries, kv, counts, quant),
                            descriptions(role, entries, kv, counts))
                cm.save(ml, tmp / cm.FILES[role])
            bar.update()
            tok_files = copy_tokenizer(folder, tmp)
            bar.update()
        return Manifest(hyflash_version=__version__, backend="coreml", target=entries[0],
                        drafter=entries[1], kv_cache=cm.KV_CACHES[kv],
                        quantization=Quantization(quant, quantization),
                        tokenizer_files=tuple(tok_files), models=contracts(tmp, rows))

    return write_bundle(out, fill)


def contracts(folder: Path, rows: dict[str, int]) -> dict:
    """Each package's I/O contract as saved (names, shapes, dtypes)."""
    from hyflash.runtime.coreml_spec import read_package

    return {role: read_package(folder / name).contract(role, name, rows[role])
            for role, name in cm.FILES.items()}


def requantize_coreml_bundle(src: str | Path, quant: str, out: str | Path) -> Manifest:
    """A new bundle at out with the packages of the fp16 bundle src quantized by quant;
    everything else is copied. The deployment target stays src's."""
    from hyflash.runtime.coreml_spec import import_coremltools

    bundle = read_bundle(src)
    old = bundle.manifest
    if old.backend != "coreml" or old.quantization.recipe != "fp16":
        raise HyflashError(f"bundle {src} is not an fp16 Core ML bundle: requantize one written "
                           "by `hyflash export --backend coreml --quant fp16`")
    ios = old.quantization.graphs["target"]["deployment_target"]
    deployment = next(k for k, v in IOS.items() if v == ios)
    kv = next(k for k, v in cm.KV_CACHES.items() if v.form == old.kv_cache.form)
    cm.check_options(quant, kv, deployment)
    ct = import_coremltools("Core ML quantization")

    def fill(tmp: Path) -> Manifest:
        packages = {c.file for c in old.models.values()}
        for name in old.files:  # tokenizer and config files
            if name.split("/")[0] not in packages:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bundle.folder / name, tmp / name)
        graphs = {}
        for role, c in old.models.items():
            ml = ct.models.MLModel(str(bundle.folder / c.file), skip_model_load=True)
            ml, graphs[role] = cm.quantize(ml, quant)
            graphs[role].update(compute_precision="float16", deployment_target=ios)
            ml.user_defined_metadata["hyflash.quantization"] = quant  # the rest is kept
            cm.save(ml, tmp / c.file)
        return replace(old, hyflash_version=__version__, files={},
                       quantization=Quantization(quant, graphs))

    return write_bundle(out, fill)


# ------------------------------------------------------------------ descriptions

SUMMARIES = {
    "target": "HyFlash target: logits and tap-layer features of T tokens at input_pos, KV "
              "cache inside (state) or in and out (io)",
    "drafter_step": "HyFlash drafter: commit up to B verified feature rows, then draft B-1 "
                    "tokens after the anchor; window and memory state in and out",
    "drafter_commit": "HyFlash drafter, commit only: absorb up to C feature rows (a prompt's) "
                      "into the window and memory state",
}


def package_metadata(role: str, entries, kv: str, counts, quant: str) -> dict[str, str]:
    """hyflash.* user-defined metadata: what an app needs without the manifest."""
    t, d = entries[0].config, entries[1]
    spec = cm.KV_CACHES[kv]
    return {"format": str(cm.FORMAT), "role": role, "quantization": quant,
            "block_size": str(d.config.block_size), "window": str(d.config.window),
            "window_cache": d.window_cache, "tap_layers": json.dumps(list(t.tap_layers)),
            "feature_size": str(t.feature_size), "vocab_size": str(t.vocab_size),
            "max_seq_len": str(t.max_seq_len), "eos_ids": json.dumps(list(t.eos_token_ids)),
            "token_counts": json.dumps(list(counts)),
            "kv_cache": json.dumps({"form": spec.form, "dtype": spec.dtype,
                                    "past": spec.past_inputs, "present": spec.present_outputs}),
            "state": json.dumps([s.to_dict() for s in d.state])}


def descriptions(role: str, entries, kv: str, counts) -> dict[str, str]:
    t, d = entries[0].config, entries[1]
    b = d.config.block_size
    text = {"features": f"[1, T, {t.feature_size}] tap-layer hidden states (layers "
                        f"{list(t.tap_layers)}) of each position: the drafter's context",
            "n_valid": "[1] how many feature rows are real (the rest is zero padding)"}
    if role == "target":
        text.update(tokens=f"[1, T] token ids, T in {list(counts)} (decode, verify, prefill "
                           "chunk); pad a shorter call with any id",
                    input_pos="[1] position of tokens[0]; the KV cache is written at "
                              "input_pos .. input_pos+T-1 (a rollback is a smaller input_pos)",
                    logits=f"[1, T, {t.vocab_size}] row i scores the token after position "
                           "input_pos+i")
        spec = cm.KV_CACHES[kv]
        for i in range(t.num_hidden_layers):
            for k in ("key", "value"):
                past = spec.past_inputs.format(layer=i, kind=k)
                text[spec.present_outputs.format(layer=i, kind=k)] = \
                    f"layer {i} {k}s with this call's rows written"
                text[past] = (f"layer {i} {k}s, all positions" if kv == "io" else
                              f"layer {i} {k}s, all positions; each call writes its rows")
        return text
    rows = b if role == "drafter_step" else None
    text["features"] = (f"[{rows or 'C'}, {t.feature_size}] verified features to commit, "
                        "zero-padded")
    text.update(anchor="[1] the last committed token (block position 0)",
                logits=f"[{b - 1}, {t.vocab_size}] draft scores of the next {b - 1} tokens")
    for s in d.state:
        text[s.input] = f"drafter state {s.name} {list(s.shape)} (start: zeros)"
        text[s.output] = f"drafter state {s.name} after this call: feed it back next call"
    return text
