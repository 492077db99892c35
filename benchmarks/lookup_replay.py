"""Which drafts would the target accept? An exact offline replay of greedy rounds.

Greedy speculative decoding commits the target's greedy continuation whatever the drafts,
so the rounds of any proposal rule can be replayed offline on that continuation: decode
it once (plain, torch), compute the drafter's block at every possible anchor in one
parallel pass (its step form gives the same blocks), then walk the rounds: a round at
anchor a accepts the longest prefix of its drafts that matches the continuation and
moves a on by that plus the bonus token. tau = tokens per round, as the engine counts it
(the replay's drafter-only tau matches `hyflash bench --parts acceptance` within 0.02).

Rules compared, on held-out code windows of exactly N tokens (``bench.prompts``):
- drafter: the HyFlash drafter alone;
- copy: the tokens after the latest earlier occurrence of the last 3..1 tokens, cut at
  the end of the context (prompt-lookup decoding as transformers does it);
- lookup: ``runtime.lookup.ContextLookup`` (the same, continued through its own copy);
- lookup + drafter: the lookup where it matches, the drafter elsewhere (the engine's
  ``speculative+lookup``).

    python benchmarks/lookup_replay.py --drafter DIR [--contexts 64,256,1024,2048]
        [--windows 4] [--seed-offset 0] [--out benchmarks/results/lookup_replay]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hyflash.bench.prompts import context_windows
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target, resolve_model_folder
from hyflash.models.tokenizer import load_tokenizer
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.lookup import ContextLookup
from hyflash.train.features import target_features

HERE = Path(__file__).resolve().parent


@torch.no_grad()
def record(target, drafter, prompt: list[int], new: int) -> dict:
    """The greedy continuation and the drafter's argmax block at every anchor after it."""
    B = drafter.cfg.block_size
    out = SpeculativeEngine(TorchTarget(target)).generate(prompt, max_new_tokens=new)
    full = torch.tensor(prompt + out.tokens)
    feats = target_features(target, full[None, :-1])
    feats = torch.cat([feats, feats.new_zeros(1, 1, feats.shape[-1])], 1)
    anchors = torch.arange(len(prompt), len(full) - B + 1)
    arg = drafter(full[None], feats, anchors[None])[0].argmax(-1)
    if drafter.draft_head is not None:
        arg = drafter.draft_head.ids[arg]
    return {"tokens": full.tolist(), "plen": len(prompt),
            "blocks": dict(zip(anchors.tolist(), arg.tolist(), strict=True))}


def copy_cut(toks: list[int], r: int) -> list[int]:
    last = len(toks) - 1
    for n in (3, 2, 1):
        for end in range(last - 1, n - 2, -1):
            if last - n + 1 >= 0 and toks[end - n + 1:end + 1] == toks[last - n + 1:]:
                return toks[end + 1:min(end + 1 + r, last + 1)]
    return []


def lookup(toks: list[int], r: int) -> list[int]:
    table = ContextLookup()
    table.reset(toks)
    return table.propose(r)


RULES = {
    "drafter": lambda toks, block, r: block,
    "copy": lambda toks, block, r: copy_cut(toks, r),
    "lookup": lambda toks, block, r: lookup(toks, r),
    "lookup + drafter": lambda toks, block, r: lookup(toks, r) or block,
}


def replay(rec: dict, rule) -> tuple[int, int]:
    toks, a = rec["tokens"], rec["plen"]
    rounds = committed = 0
    while a in rec["blocks"]:
        block = rec["blocks"][a]
        drafts = rule(toks[:a + 1], block, len(block))
        k = 0
        while k < len(drafts) and toks[a + 1 + k] == drafts[k]:
            k += 1
        rounds, committed, a = rounds + 1, committed + k + 1, a + k + 1
    return rounds, committed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="default: the SmolLM2 GGUF of setup_models")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--contexts", default="64,256,1024,2048")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="windows seeded by context + this (0: the bench's windows)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "lookup_replay")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.target is None:
        from hyflash.models.gguf import cache_root
        args.target = str(cache_root() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    folder = resolve_model_folder(args.target)
    target = Target.from_pretrained(folder)
    tok = load_tokenizer(folder)
    drafter = load_drafter(args.drafter, target)
    contexts = [int(c) for c in args.contexts.split(",")]
    table = {}
    for ctx in contexts:
        recs = [record(target, drafter, p, args.new_tokens)
                for p in context_windows(tok, ctx, args.windows, seed=ctx + args.seed_offset)]
        for name, rule in RULES.items():
            r, c = map(sum, zip(*(replay(x, rule) for x in recs), strict=True))
            table.setdefault(name, {})[ctx] = round(c / r, 3)
        print(ctx, {k: v[ctx] for k, v in table.items()}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"replay-seed{args.seed_offset}"
    (args.out / f"{name}.json").write_text(json.dumps(
        {"drafter": args.drafter, "target": args.target, "windows": args.windows,
         "new_tokens": args.new_tokens, "seed_offset": args.seed_offset, "tau": table},
        indent=1))
    lines = [f"# Offline replay of greedy rounds (windows seeded by context + "
             f"{args.seed_offset})", "",
             f"`python benchmarks/lookup_replay.py --drafter {args.drafter} --contexts "
             f"{args.contexts} --windows {args.windows} --seed-offset {args.seed_offset}`", "",
             "| rule | " + " | ".join(f"tau @ {c}" for c in contexts) + " |",
             "|---|" + "---|" * len(contexts)]
    lines += [f"| {k} | " + " | ".join(f"{v[c]:.2f}" for c in contexts) + " |"
              for k, v in table.items()]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / name}.md")


if __name__ == "__main__":
    main()
