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


def not_yet(what: str, issue: int | None = None) -> Callable[[argparse.Namespace], int]:
    tracked = f" (tracked in issue #{issue})" if issue else ""

    def run(args: argparse.Namespace) -> int:
        raise HyflashError(f"{what} is not implemented yet{tracked}")
    return run


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
    p.add_argument("path", help="a Hugging Face model folder (config.json + safetensors), or "
                                "a bundle written by `hyflash export` (manifest.json)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="static KV cache length to size (default: the model's, capped at 4096)")


def inspect_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if (Path(args.path) / "manifest.json").is_file():  # an exported bundle
        from hyflash.export.manifest import describe, read_bundle

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
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


# ------------------------------------------------------------------------- demo

DEMO_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"


def demo_run(args: argparse.Namespace) -> int:
    """Speculative decoding on the embedded pocket model with its shipped HyFlash drafter,
    offline. The full end-to-end demo (export, simulate, budget) lands with its issue."""
    print("HyFlash demo: the pocket code model + its HyFlash drafter, torch runtime, greedy\n")
    code = main(["generate", "--target", "pocket", "--drafter", "pocket", "--prompt",
                 DEMO_PROMPT, "--max-new-tokens", "96"])
    print("\nNext: hyflash export --target pocket --drafter pocket --backend onnx --quant int4 "
          "--out bundles/pocket-int4\n      hyflash simulate bundles/pocket-int4")
    return code


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
        lazy_args("hyflash.runtime.simulate"), lazy_run("hyflash.runtime.simulate")),
    "generate": Command(
        "generate text with speculative decoding and print the stats",
        "Stream tokens from a target (optionally with a drafter) and report tau, "
        "per-position acceptance, time split and tokens/s.",
        lazy_args("hyflash.runtime.command"), lazy_run("hyflash.runtime.command")),
    "bench": Command(
        "benchmark speculative vs plain decoding",
        "Measure tokens/s, tau and memory over a prompt set, side by side in one process.",
        lambda p: None, not_yet("hyflash bench", 6)),
    "budget": Command(
        "size the on-device memory budget against device profiles",
        "Add up weights, KV cache, drafter state and runtime overhead for a bundle and "
        "compare them with real device profiles.",
        lambda p: None, not_yet("hyflash budget")),
    "inspect": Command(
        "describe a model folder or an exported bundle",
        "Print what HyFlash reads from a Hugging Face model folder (architecture, sizes, "
        "tap layers and feature size, KV cache bytes) or an exported bundle's manifest.",
        inspect_args, inspect_run),
    "demo": Command(
        "run the end-to-end demo on the embedded pocket model",
        "Generate with the shipped pocket model and its HyFlash drafter, fully offline, and "
        "print the speculative decoding stats.",
        lambda p: None, demo_run),
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
