"""`hyflash export`: write a bundle (model files + manifest.json) for a phone runtime."""

from __future__ import annotations

import argparse

from hyflash.argtypes import DEFAULT_THREADS, positive_int, threads
from hyflash.errors import HyflashError
from hyflash.extras import require_onnx_extra

BACKENDS = ("onnx", "executorch", "coreml")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hyflash.export.coreml import DEPLOYMENTS, KV_FORMS
    from hyflash.export.coreml import RECIPES as COREML_RECIPES
    from hyflash.export.executorch import RECIPES as ET_RECIPES
    from hyflash.export.onnx_lean import TARGET_GRAPHS
    from hyflash.export.quantize import RECIPES  # light: the heavy imports are in handlers

    p.add_argument("--target", required=True, metavar="PATH_OR_HUB_ID",
                   help="a Hugging Face model folder (config.json, safetensors, tokenizer), "
                        "a .gguf file, a hub id, or `pocket` (the embedded model)")
    p.add_argument("--drafter", required=True, metavar="DIR",
                   help="the drafter trained for this target (`hyflash train --out DIR`)")
    p.add_argument("--backend", choices=BACKENDS, default="onnx",
                   help="runtime to export for (default onnx)")
    p.add_argument("--quant", choices=list(dict.fromkeys([*RECIPES, *ET_RECIPES,
                                                          *COREML_RECIPES])),
                   default=None,
                   help="quantization recipe (default fp32; coreml: fp16): onnx takes fp32, "
                        "int8, int4 (weight-only), 8da4w, 8da8w (int4 / int8 weights, int8 "
                        "activations per block of 32 at run time: faster on CPUs with int8 "
                        "dot products); "
                        "executorch takes fp32, 8da4w (int4 grouped "
                        "weights, int8 per-token activations); coreml takes fp16, int8 "
                        "(per channel), int4 (blocks of 32, iOS 18), weight-only")
    p.add_argument("--source-blocks", choices=("keep", "requantize"), default=None,
                   help="onnx int4 / 8da4w only: weights that already are 4-bit blocks of 32 "
                        "(a GGUF's Q4_0 / Q4_1 layers; with 8da4w also a Q8_0 LM head at 8 "
                        "bits) are kept, so the bundle computes the GGUF's own model "
                        "(default keep: exactly at int4; at 8da4w the blocks' offsets are "
                        "folded into the same kernel to ~1e-4; on SmolLM2 a call 18-28%% "
                        "slower at 2 threads), or requantize them onto the recipe's own grid "
                        "like any weight (faster, ~9%% off per layer: another model)")
    p.add_argument("--group-size", type=positive_int, default=None,
                   help="executorch 8da4w only: weights per int4 group (default 32); a "
                        "multiple of 32 (XNNPACK) that divides every layer's input size")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle folder to write")
    p.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="max context of the exported target (default: the model's, capped "
                        "at 4096); at least the drafter's window + block")
    p.add_argument("--window-cache", choices=("kv", "features"), default="kv",
                   help="what the drafter's window state holds: kv = each layer's keys and "
                        "values (faster: a draft projects only the new rows), features = the "
                        "fused context features (1/(2 x layers) of the window bytes, every "
                        "draft re-projects the whole window). Default kv")
    p.add_argument("--target-graph", choices=TARGET_GRAPHS, default="auto",
                   help="form of the target graph: lean = static KV buffers updated in place "
                        "by ONNX Runtime's fused attention (GroupQueryAttention; fastest, "
                        "rollback free; needs a head_dim that is a multiple of 16), optimum = "
                        "past/present KV as explicit I/O, which optimum's "
                        "ORTModelForCausalLM loads. Default auto: lean where the model "
                        "allows it, else optimum")
    p.add_argument("--coreml-kv", choices=KV_FORMS, default=None,
                   help="coreml only: the target's KV cache as Core ML state (default; iOS "
                        "18) or as explicit inputs and outputs (io; iOS 17)")
    p.add_argument("--coreml-target", choices=DEPLOYMENTS, default=None,
                   help="coreml only: minimum deployment target (default: the lowest that "
                        "holds the KV form and recipe: ios18 for state or int4, else ios17)")
    p.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"torch CPU threads while exporting (default {DEFAULT_THREADS})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.quant is None:
        args.quant = "fp16" if args.backend == "coreml" else "fp32"
    if args.backend == "coreml":
        return run_coreml(args)
    if args.coreml_kv or args.coreml_target:
        flag = "--coreml-kv" if args.coreml_kv else "--coreml-target"
        raise HyflashError(f"{flag} applies to --backend coreml: drop it")
    if args.backend == "executorch":
        return run_executorch(args)
    if args.backend != "onnx":
        raise HyflashError(f"--backend {args.backend} is not implemented yet: use --backend "
                           "onnx or executorch")
    if args.group_size is not None:
        raise HyflashError("--group-size applies to --backend executorch --quant 8da4w: drop it")
    from hyflash.export.quantize import check_recipe, check_source_blocks

    check_recipe(args.quant)
    check_source_blocks(args.quant, args.source_blocks or "keep")
    require_onnx_extra("ONNX export")
    check_pair(args.target, args.drafter, args.max_seq_len)
    import torch

    torch.set_num_threads(args.threads)
    from hyflash.bundle import read_bundle
    from hyflash.bundle.describe import describe
    from hyflash.export.bundle import export_onnx_bundle

    export_onnx_bundle(args.target, args.drafter, args.out, args.quant, args.max_seq_len,
                       progress=not args.no_progress, window_cache=args.window_cache,
                       target_graph=args.target_graph,
                       source_blocks=args.source_blocks or "keep")
    print(describe(read_bundle(args.out)))
    return 0


def run_executorch(args: argparse.Namespace) -> int:
    from hyflash.export.executorch import check_recipe

    check_recipe(args.quant, args.group_size)
    for flag, given in (("--target-graph", args.target_graph != "auto"),
                        ("--source-blocks", args.source_blocks is not None)):
        if given:
            raise HyflashError(f"{flag} applies to --backend onnx: drop it")
    check_pair(args.target, args.drafter, args.max_seq_len)
    import torch

    torch.set_num_threads(args.threads)
    from hyflash.bundle import read_bundle
    from hyflash.bundle.describe import describe
    from hyflash.export.executorch_bundle import export_executorch_bundle

    export_executorch_bundle(args.target, args.drafter, args.out, args.quant, args.group_size,
                             args.max_seq_len, progress=not args.no_progress,
                             window_cache=args.window_cache)
    print(describe(read_bundle(args.out)))
    return 0


def run_coreml(args: argparse.Namespace) -> int:
    from hyflash.export.coreml import check_options
    from hyflash.extras import require_coreml_extra

    check_options(args.quant, args.coreml_kv or "state", args.coreml_target)
    for flag, value, applies in (("--group-size", args.group_size, "--backend executorch"),
                                 ("--target-graph", args.target_graph != "auto",
                                  "--backend onnx"),
                                 ("--source-blocks", args.source_blocks, "--backend onnx")):
        if value:
            raise HyflashError(f"{flag} applies to {applies}: drop it")
    require_coreml_extra("Core ML export")
    check_pair(args.target, args.drafter, args.max_seq_len)
    import torch

    torch.set_num_threads(args.threads)
    from hyflash.bundle import read_bundle
    from hyflash.bundle.describe import describe
    from hyflash.export.coreml_bundle import export_coreml_bundle

    export_coreml_bundle(args.target, args.drafter, args.out, args.quant,
                         args.coreml_kv or "state", args.coreml_target, args.max_seq_len,
                         progress=not args.no_progress, window_cache=args.window_cache)
    print(describe(read_bundle(args.out)))
    return 0


def check_pair(target: str, drafter: str, max_seq_len: int | None) -> None:
    """Refuse, from the two config files alone, a pair that cannot make a usable bundle,
    before the slow export: the drafter must be the one trained for this target (same
    vocabulary, hidden size and tap layers; the target is never re-tapped to suit a
    drafter), and the bundle's context must hold the drafter's window and one block."""
    from hyflash.models.drafter_folder import (
        check_drafter_context,
        check_drafter_fits,
        read_drafter_config,
    )
    from hyflash.models.target import TargetConfig, read_hf_config, resolve_model_folder

    target_cfg = TargetConfig.from_hf(read_hf_config(resolve_model_folder(target)), max_seq_len)
    folder, cfg, _ = read_drafter_config(drafter)
    check_drafter_fits(cfg, target_cfg, folder)
    check_drafter_context(cfg, target_cfg.max_seq_len, folder)
