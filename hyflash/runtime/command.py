"""`hyflash generate`: stream text from the speculative engine and print its stats."""

from __future__ import annotations

import argparse

from hyflash.errors import HyflashError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="PATH_OR_HUB_ID",
                   help="a Hugging Face model folder (config.json, safetensors, tokenizer), "
                        "a hub id, or `pocket` (the embedded model)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--drafter", metavar="DIR", help="a trained HyFlash drafter folder")
    how.add_argument("--no-draft", action="store_true",
                     help="plain autoregressive decoding through the same engine (baseline)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="static KV cache length (default: the model's, capped at 4096)")


def run(args: argparse.Namespace) -> int:
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime import SpeculativeEngine, TorchTarget, format_stats

    folder = resolve_model_folder(args.target)
    tokenizer = load_tokenizer(folder)
    model = Target.from_pretrained(folder, max_seq_len=args.max_seq_len)
    drafter = None
    if args.drafter:
        try:
            from hyflash.runtime.drafter_backend import load_torch_drafter
        except ModuleNotFoundError as e:
            if e.name != "hyflash.runtime.drafter_backend":
                raise  # a real missing dependency inside it: show it, do not mask it
            raise HyflashError("--drafter needs a trained drafter; drafter loading lands with "
                               "issue #4, use --no-draft") from e
        drafter = load_torch_drafter(args.drafter, model)
    engine = SpeculativeEngine(TorchTarget(model), drafter)
    eos = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)

    prompt = tokenizer(args.prompt).input_ids
    text = TextStream(tokenizer, prompt)
    print(args.prompt, end="", flush=True)
    out = engine.generate(prompt, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, eos_ids=sorted(eos), on_token=text.push)
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
