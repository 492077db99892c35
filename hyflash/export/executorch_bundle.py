"""Build an ExecuTorch bundle: one .pte (target + drafter methods), tokenizer, manifest.

The same layout and manifest format as an ONNX bundle (``hyflash.bundle``): the pair is
loaded and checked, quantized with the chosen torchao recipe, lowered into one program
(``hyflash.export.executorch``), the tokenizer and Hugging Face config files are copied,
and ``write_bundle`` checks the manifest with the readers' own checks, seals it and makes
the whole folder appear atomically.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from hyflash import __version__
from hyflash.bundle import Manifest, write_bundle
from hyflash.bundle.records import DrafterEntry, Quantization, StateSpec, TargetEntry
from hyflash.export import executorch as et


def export_executorch_bundle(target_path: str | Path, drafter_dir: str | Path,
                             out: str | Path, quant: str = "fp32",
                             group_size: int | None = None, max_seq_len: int | None = None,
                             progress: bool = True, window_cache: str = "kv") -> Manifest:
    """Export the target at target_path (a model folder, .gguf, hub id or ``pocket``) and
    the drafter trained for it into an ExecuTorch bundle at out; return the manifest."""
    from hyflash.export.bundle import copy_tokenizer, load_pair
    from hyflash.export.onnx import state_input, state_output

    et.check_recipe(quant, group_size)  # before the slow part
    folder, drafter_dir, target, drafter = load_pair(target_path, drafter_dir, max_seq_len,
                                                     window_cache)
    state = tuple(StateSpec(k, state_input(k), state_output(k), tuple(v.shape),
                            str(v.dtype).removeprefix("torch."))
                  for k, v in drafter.init_state().items())
    entries = (TargetEntry(str(folder), target.cfg),
               DrafterEntry(str(drafter_dir), drafter.cfg, window_cache, state))
    models = et.contracts(target, drafter)

    def fill(tmp: Path) -> Manifest:
        with tqdm(total=3, desc="export", unit="step", disable=not progress) as bar:
            bar.set_postfix_str(f"quantize {quant}")
            recipe = et.quantize_pair(target, drafter, quant, group_size)
            bar.update()
            bar.set_postfix_str("lower to ExecuTorch (XNNPACK)")
            et.export_program(target, drafter, tmp / et.PTE_FILE)
            bar.update()
            tok_files = copy_tokenizer(folder, tmp)
            bar.update()
        graphs = {role: {**recipe, "method": c.method} for role, c in models.items()}
        return Manifest(hyflash_version=__version__, backend="executorch",
                        target=entries[0], drafter=entries[1], kv_cache=et.KV_CACHE,
                        quantization=Quantization(quant, graphs),
                        tokenizer_files=tuple(tok_files), models=models)

    return write_bundle(out, fill)
