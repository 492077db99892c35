"""`hyflash generate`: stream text from the speculative engine and print its stats."""

from __future__ import annotations

import argparse

from hyflash.errors import HyflashError


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("what to run (--target with --drafter or --no-draft, or --bundle)")
    src.add_argument("--target", metavar="PATH_OR_HUB_ID",
                     help="a Hugging Face model folder (config.json, safetensors, tokenizer), "
                          "a hub id, or `pocket` (the embedded model); runs in plain torch")
    src.add_argument("--drafter", metavar="DIR", help="a drafter folder from `hyflash train`")
    src.add_argument("--bundle", metavar="DIR",
                     help="an exported ONNX bundle (`hyflash export`): runs its graphs with "
                          "ONNX Runtime, as the phone would")
    src.add_argument("--no-draft", action="store_true",
                     help="plain autoregressive decoding through the same engine (baseline)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="static KV cache length for --target (default: the model's, capped "
                        "at 4096)")


def open_engine(args: argparse.Namespace):
    """-> (engine, tokenizer, eos ids) for the torch pair or the ONNX bundle asked for."""
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime import SpeculativeEngine

    if args.bundle:
        if args.target or args.drafter:
            raise HyflashError("--bundle already holds the target and drafter: drop --target "
                               "and --drafter")
        from hyflash.runtime.onnx_backend import load_onnx_pair

        bundle, target, drafter = load_onnx_pair(args.bundle)
        eos = set(bundle.manifest["target"]["config"]["eos_token_ids"])
        tokenizer = load_tokenizer(bundle.folder)
    else:
        if not args.target:
            raise HyflashError("nothing to run: pass --target (with --drafter or --no-draft) "
                               "or --bundle")
        if bool(args.drafter) == bool(args.no_draft):
            raise HyflashError("pass exactly one of --drafter DIR or --no-draft with --target")
        from hyflash.models.target import Target, resolve_model_folder
        from hyflash.runtime import TorchTarget
        from hyflash.runtime.drafter_backend import load_torch_drafter

        folder = resolve_model_folder(args.target)
        tokenizer = load_tokenizer(folder)
        model = Target.from_pretrained(folder, max_seq_len=args.max_seq_len)
        target = TorchTarget(model)
        drafter = load_torch_drafter(args.drafter, model) if args.drafter else None
        eos = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    engine = SpeculativeEngine(target, None if args.no_draft else drafter)
    return engine, tokenizer, sorted(eos)


def run(args: argparse.Namespace) -> int:
    from hyflash.runtime import format_stats

    engine, tokenizer, eos = open_engine(args)
    prompt = tokenizer(args.prompt).input_ids
    text = TextStream(tokenizer, prompt)
    print(args.prompt, end="", flush=True)
    out = engine.generate(prompt, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, eos_ids=eos, on_token=text.push)
    text.flush()
    print("\n")
    print(format_stats(out.stats))
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
