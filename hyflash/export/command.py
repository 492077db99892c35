"""`hyflash export`: write a bundle (model files + manifest.json) for a phone runtime."""

from __future__ import annotations

import argparse

from hyflash.errors import HyflashError

BACKENDS = ("onnx", "executorch", "coreml")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hyflash.export.quantize import RECIPES  # light: the heavy imports are in handlers

    p.add_argument("--target", required=True, metavar="PATH_OR_HUB_ID",
                   help="a Hugging Face model folder (config.json, safetensors, tokenizer), "
                        "a hub id, or `pocket` (the embedded model)")
    p.add_argument("--drafter", required=True, metavar="DIR",
                   help="the drafter trained for this target (`hyflash train --out DIR`)")
    p.add_argument("--backend", choices=BACKENDS, default="onnx",
                   help="runtime to export for (default onnx; executorch and coreml are "
                        "not implemented yet)")
    p.add_argument("--quant", choices=list(RECIPES), default="fp32",
                   help="weight quantization recipe (default fp32)")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle folder to write")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="max context of the exported target (default: the model's, capped "
                        "at 4096)")
    p.add_argument("--window-cache", choices=("kv", "features"), default="kv",
                   help="what the drafter's window state holds: kv = each layer's keys and "
                        "values (faster: a draft projects only the new rows), features = the "
                        "fused context features (1/(2 x layers) of the window bytes, every "
                        "draft re-projects the whole window). Default kv")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.backend != "onnx":
        raise HyflashError(f"--backend {args.backend} is not implemented yet: use --backend "
                           "onnx")
    require_onnx_extra("ONNX export")
    from hyflash.export.bundle import export_onnx_bundle
    from hyflash.export.manifest import describe, read_bundle

    export_onnx_bundle(args.target, args.drafter, args.out, args.quant, args.max_seq_len,
                       progress=not args.no_progress, window_cache=args.window_cache)
    print(describe(read_bundle(args.out)))
    return 0


def require_onnx_extra(what: str) -> None:
    """onnx, onnxruntime and onnxscript are the optional `onnx` extra."""
    from importlib.util import find_spec

    missing = [m for m in ("onnx", "onnxruntime", "onnxscript") if find_spec(m) is None]
    if missing:
        raise HyflashError(f"{what} needs the onnx extra ({', '.join(missing)} missing): "
                           "pip install 'hyflash[onnx]'")
