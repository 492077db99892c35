"""`hyflash generate`: stream text from the speculative engine and print its stats."""

from __future__ import annotations

import argparse

from hyflash.argtypes import (
    DEFAULT_THREADS,
    nonneg_float,
    nonneg_int,
    positive_int,
    threads,
    unit_interval,
)
from hyflash.errors import HyflashError
from hyflash.runtime import round_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("what to run (--target with --drafter or --no-draft, or --bundle)")
    src.add_argument("--target", metavar="PATH_OR_HUB_ID",
                     help="a Hugging Face model folder (config.json, safetensors, tokenizer), "
                          "a .gguf file, a hub id, or `pocket` (the embedded model); runs "
                          "in plain torch")
    src.add_argument("--drafter", metavar="DIR", help="a drafter folder from `hyflash train`")
    src.add_argument("--bundle", metavar="DIR",
                     help="an exported bundle (`hyflash export`): runs its graphs with "
                          "ONNX Runtime, its program with ExecuTorch or its packages with "
                          "Core ML (macOS), as the phone would")
    src.add_argument("--no-draft", action="store_true",
                     help="plain autoregressive decoding through the same engine (baseline)")
    round_options.add_arguments(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=nonneg_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=nonneg_int, default=None,
                   help="sampling only: keep the k likeliest tokens (default 0 = off)")
    p.add_argument("--top-p", type=unit_interval, default=None,
                   help="sampling only: nucleus mass in (0, 1] (default 1 = off)")
    p.add_argument("--seed", type=nonneg_int, default=None, help="sampling only (default 0)")
    p.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="static KV cache length for --target (default: the model's, capped "
                        "at 4096); a bundle's is fixed at export")
    p.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"CPU threads of torch (--target) or ONNX Runtime (--bundle); default "
                        f"{DEFAULT_THREADS}, the fastest for small models (README)")


def check_modes(args: argparse.Namespace) -> None:
    """Flags that would be silently ignored in the chosen mode are errors."""
    if args.bundle:
        given = [f for f, v in (("--target", args.target), ("--drafter", args.drafter),
                                ("--max-seq-len", args.max_seq_len)) if v is not None]
        if given:
            raise HyflashError(f"--bundle already fixes the target, drafter and context: drop "
                               f"{' and '.join(given)}")
    elif not args.target:
        raise HyflashError("nothing to run: pass --target (with --drafter or --no-draft) "
                           "or --bundle")
    elif bool(args.drafter) == bool(args.no_draft):
        raise HyflashError("pass exactly one of --drafter DIR or --no-draft with --target")
    if args.no_draft and args.draft_rows != "all":
        raise HyflashError(f"--draft-rows {args.draft_rows} chooses among the drafter's rows, "
                           "and --no-draft runs no drafter: drop one of them")
    sampling = [f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p),
                               ("--seed", args.seed)) if v is not None]
    if sampling and args.temperature == 0:
        applies, them = ("apply", "them") if len(sampling) > 1 else ("applies", "it")
        raise HyflashError(f"{' and '.join(sampling)} {applies} to sampling, and --temperature "
                           f"0 decodes greedily: pass --temperature > 0 or drop {them}")


def open_engine(args: argparse.Namespace):
    """-> (engine, tokenizer, eos ids) for the torch pair or the ONNX bundle asked for."""
    import torch

    from hyflash.models.tokenizer import load_tokenizer

    check_modes(args)
    torch.set_num_threads(args.threads)  # the engine's own tensor work, in both modes
    if args.bundle:
        from hyflash.runtime.open_bundle import open_bundle

        bundle, target, drafter = open_bundle(args.bundle, threads=args.threads)
        eos = set(target.eos_token_ids)
        tokenizer = load_tokenizer(bundle.folder)
    else:
        from hyflash.models.drafter_folder import check_drafter_context
        from hyflash.models.target import Target, resolve_model_folder
        from hyflash.runtime import TorchTarget
        from hyflash.runtime.drafter_backend import load_torch_drafter

        folder = resolve_model_folder(args.target)
        model = Target.from_pretrained(folder, max_seq_len=args.max_seq_len)
        tokenizer = load_tokenizer(folder)
        target = TorchTarget(model)
        drafter = load_torch_drafter(args.drafter, model) if args.drafter else None
        if drafter is not None:
            check_drafter_context(drafter.drafter.cfg, model.cfg.max_seq_len, args.drafter)
        eos = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    drafter = None if args.no_draft else drafter
    engine = round_options.engine(args, target, drafter)
    return engine, tokenizer, sorted(eos)


def run(args: argparse.Namespace) -> int:
    from hyflash.runtime import format_stats

    engine, tokenizer, eos = open_engine(args)
    prompt = tokenizer(args.prompt).input_ids
    # stream() checks the prompt against the context before anything runs: a prompt that
    # does not fit is one line of error, not echoed in full first
    tokens = engine.stream(prompt, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k or 0,
                           top_p=args.top_p or 1.0, seed=args.seed or 0, eos_ids=eos)
    text = TextStream(tokenizer, prompt)
    print(args.prompt, end="", flush=True)
    while True:
        try:
            text.push(next(tokens))
        except StopIteration as done:
            stats = done.value.stats
            break
    text.flush()
    print("\n")
    print(format_stats(stats))
    return 0


class TextStream:
    """Print text as tokens commit. Decodes the new tokens behind the prompt's last few
    (so a word-initial space survives), prints what is new, and holds back an incomplete
    character (a token can end in the middle of a UTF-8 sequence)."""

    def __init__(self, tokenizer, prompt: list[int], context: int = 8):
        self.tokenizer, self.tokens = tokenizer, list(prompt[-context:])
        self.shown = len(self.decode())

    def decode(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def push(self, token: int) -> None:
        self.tokens.append(token)
        text = self.decode()
        if not text.endswith("\ufffd"):
            self.flush(text)

    def flush(self, text: str | None = None) -> None:
        text = self.decode() if text is None else text
        print(text[self.shown:], end="", flush=True)
        self.shown = max(self.shown, len(text))
