"""`hyflash`: the one entry point.

Each subcommand is a (help, description, add_arguments, run) entry in COMMANDS; the
heavy modules are imported only when their command runs, so `hyflash --help` is fast.
Problems the user can fix (HyflashError) print as one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from hyflash import __version__
from hyflash.argtypes import positive_int
from hyflash.errors import HyflashError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the fix, not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass
class Command:
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def lazy_args(module: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_arguments(p)
    return add


def lazy_run(module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).run(args)
    return run


# ---------------------------------------------------------------------- inspect

def inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a Hugging Face model folder (config.json + safetensors), a "
                                "drafter folder (`hyflash train --out`), or a bundle written "
                                "by `hyflash export` (manifest.json)")
    p.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="static KV cache length to size, for model folders (default: the "
                        "model's, capped at 4096)")


def folder_kind(path: str) -> str:
    """bundle, drafter or model: what inspect describes. A config.json that is not JSON
    counts as a model's, so that the model reader reports what is wrong with it."""
    import json
    from pathlib import Path

    from hyflash.models import pocket

    if (Path(path) / "manifest.json").is_file():
        return "bundle"
    if path in pocket.DRAFTERS and path != "pocket":  # `pocket` alone names the model
        return "drafter"
    try:
        meta = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "model"
    return "drafter" if isinstance(meta, dict) and isinstance(meta.get("config"), dict) \
        and "format_version" in meta else "model"


def inspect_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    kind = folder_kind(args.path)
    if args.max_seq_len is not None and kind != "model":
        raise HyflashError(f"--max-seq-len sizes a model folder's KV cache, and {args.path} is "
                           f"a {kind} (its context is fixed): drop --max-seq-len")
    if kind == "drafter":
        print_rows(drafter_rows(args.path))
        return 0
    if (Path(args.path) / "manifest.json").is_file():  # an exported bundle
        from hyflash.bundle import read_bundle
        from hyflash.bundle.describe import describe

        print(describe(read_bundle(args.path)))
        return 0
    from hyflash.models.target import TargetConfig, read_hf_config, resolve_model_folder

    folder = resolve_model_folder(args.path)
    cfg = TargetConfig.from_hf(read_hf_config(folder), args.max_seq_len)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    rows = [
        ("folder", str(folder)),
        ("architecture", cfg.model_type),
        ("layers", cfg.num_hidden_layers),
        ("hidden size", cfg.hidden_size),
        ("heads / kv heads / head dim",
         f"{cfg.num_attention_heads} / {cfg.num_key_value_heads} / {cfg.head_dim}"),
        ("vocabulary", cfg.vocab_size),
        ("tied embeddings", cfg.tie_word_embeddings),
        ("rope", f"theta {cfg.rope_theta:g}, scaling {cfg.rope_scaling or 'none'}"),
        ("max context (static cache)", cfg.max_seq_len),
        ("tap layers -> feature size", f"{list(cfg.tap_layers)} -> {cfg.feature_size}"),
        ("KV cache, fp16", f"{kv_per_token * 2} B/token, "
                           f"{kv_per_token * 2 * cfg.max_seq_len / 2**20:.1f} MiB at max context"),
        ("eos ids", list(cfg.eos_token_ids)),
        ("weights", weights_summary(folder)),
    ]
    print_rows(rows)
    return 0


def print_rows(rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def weights_summary(folder) -> str:
    """Parameter count and bytes from the safetensors headers (no tensor is read; a
    truncated or garbage file fails here, as it would when loading)."""
    import math

    from hyflash.models.folders import TargetLoadError, safetensors_shapes, weight_files

    if not any(folder.glob("*.safetensors*")):
        return "none in this folder (config only)"
    files = weight_files(folder)
    params = sum(math.prod(shape) for f in files
                 for shape in safetensors_shapes(f, "re-download or re-save the model",
                                                 TargetLoadError).values())
    size = sum(f.stat().st_size for f in files)
    count = f"{len(files)} files" if len(files) > 1 else files[0].name
    return f"{params / 1e6:.1f}M parameters in {count}, {size / 2**20:.1f} MiB"


def drafter_rows(path: str) -> list[tuple[str, object]]:
    """What a drafter folder holds, and what to do with it (it is not a model to inspect)."""
    import torch

    from hyflash.models import pocket
    from hyflash.models.drafter import Drafter
    from hyflash.models.drafter_folder import read_drafter_config

    folder, cfg, meta = read_drafter_config(path)
    training = meta.get("training") if isinstance(meta.get("training"), dict) else {}
    target = str(training.get("target", "T"))
    if pocket.is_pocket_folder(target):
        target = "pocket"
    grows = "fixed, any context" if cfg.arch == "hyflash" else "its window is the whole context"
    with torch.device("meta"):  # sizes only: no weights, no embedding table
        drafter = Drafter(cfg, torch.nn.Embedding(1, 1), torch.nn.Linear(1, 1))
    kib = {}
    for layout in ("kv", "features"):
        drafter.window_cache = layout
        kib[layout] = drafter.state_bytes() / 2**10
    memory = "none (window = the whole context)" if cfg.arch == "full" else cfg.memory
    return [
        ("folder", str(folder)),
        ("what", f"a hyflash drafter (not a model): inspect its target, or export the pair "
                 f"with `hyflash export --target {target} --drafter {path} --out BUNDLE`"),
        ("architecture", f"{cfg.arch}, memory {memory}"),
        ("layers / heads / hidden", f"{cfg.num_layers} / {cfg.num_heads} / {cfg.hidden_size}"),
        ("block size", f"{cfg.block_size} (drafts {cfg.block_size - 1} tokens per call)"),
        ("window", f"{cfg.window} context features"),
        ("tap layers -> feature size", f"{list(cfg.tap_layers)} -> {cfg.feature_size}"),
        ("trained for target", f"{target} (vocabulary {cfg.vocab_size}, context "
                               f"{cfg.max_seq_len})"),
        ("draft-side state, fp32", f"{kib['kv']:.0f} KiB (--window-cache kv), "
                                   f"{kib['features']:.0f} KiB (features); {grows}"),
    ]


# ------------------------------------------------------------------------ table

COMMANDS: dict[str, Command] = {
    "train": Command(
        "train a HyFlash (or full-context baseline) drafter for a target",
        "Self-distil a compact parallel drafter from a target model: the target writes "
        "the continuations, the drafter learns to predict whole blocks of them.",
        lazy_args("hyflash.train.command"), lazy_run("hyflash.train.command")),
    "export": Command(
        "export a target + drafter pair to ONNX, ExecuTorch or Core ML",
        "Write one artifact bundle (model files + manifest.json) for a phone runtime, "
        "quantized, with the drafter's fixed-size state as explicit model I/O.",
        lazy_args("hyflash.export.command"), lazy_run("hyflash.export.command")),
    "simulate": Command(
        "run the phone's speculative loop on the desktop with ONNX Runtime",
        "Run the exported graphs exactly as the phone would and report acceptance (tau), "
        "speed against plain decoding, and memory.",
        lazy_args("hyflash.simulate.command"), lazy_run("hyflash.simulate.command")),
    "generate": Command(
        "generate text with speculative decoding and print the stats",
        "Stream tokens from a target (optionally with a drafter) and report tau, "
        "per-position acceptance, time split and tokens/s.",
        lazy_args("hyflash.runtime.command"), lazy_run("hyflash.runtime.command")),
    "bench": Command(
        "benchmark our runtimes against the peers users would pick instead",
        "Export (or reuse) the bundles, run every configuration and peer side by side in "
        "fresh processes (medians), measure acceptance by context and draft-side memory, and "
        "write Markdown, JSON and PNG results with the goals judged in plain words.",
        lazy_args("hyflash.bench.command"), lazy_run("hyflash.bench.command")),
    "budget": Command(
        "size the on-device memory budget against device profiles",
        "Add up weights, KV cache, drafter state, activations and runtime overhead for a "
        "bundle or a model, check them against device profiles, and project phone decode "
        "speed; --measure runs a bundle and compares.",
        lazy_args("hyflash.budget.command"), lazy_run("hyflash.budget.command")),
    "inspect": Command(
        "describe a model folder or an exported bundle",
        "Print what HyFlash reads from a Hugging Face model folder (architecture, sizes, "
        "tap layers and feature size, KV cache bytes) or an exported bundle's manifest.",
        inspect_args, inspect_run),
    "demo": Command(
        "run the end-to-end demo on the embedded pocket model",
        "Export the shipped pocket model and its HyFlash drafter for a phone (ONNX int4, "
        "ExecuTorch 8da4w), simulate them on held-out code prompts with streaming output, "
        "size the memory budget and project phone speed; offline, one report folder.",
        lazy_args("hyflash.bench.demo"), lazy_run("hyflash.bench.demo")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hyflash",
        description="On-device speculative decoding with a HyFlash drafter: train, export "
                    "(ExecuTorch, Core ML, ONNX), simulate on the desktop, size the memory "
                    "budget.",
    )
    parser.add_argument("--version", action="version", version=f"hyflash {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.description)
        cmd.add_arguments(p)
        p.set_defaults(run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except HyflashError as e:
        print(f"hyflash {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hyflash {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
