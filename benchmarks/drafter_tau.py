"""Online tau of the HyFlash drafter vs the full-context baseline on held-out code.

Real speculative decoding through the engine (torch runtime, greedy), on prompts cut
from the pocket model's held-out stdlib files at short and long contexts, plus:

- the memory ablation: the same HyFlash drafter with its memory read-out zeroed;
- draft-side memory in bytes against context length, for both drafters.

    python benchmarks/drafter_tau.py --drafter hyflash=DIR --drafter full=DIR \
        [--drafter slots=DIR] [--prompts 12]

Every drafter with a memory is also run with its memory read-out zeroed ("NAME, memory
off"), and every full-context drafter also with its attention cut to the last W context
features, W the HyFlash window ("NAME, last W only"): if that costs it nothing, the
drafters find no use for context older than W, and no memory can add tau.

Writes benchmarks/results/NAME.{json,md,png} (NAME: --name, default drafter_tau).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.models.drafter import WINDOW_CACHES, Drafter
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target, resolve_model_folder
from hyflash.models.tokenizer import load_tokenizer
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.drafter_backend import TorchDrafter
from hyflash.train.corpus import read_text, split_files

OUT = Path(__file__).parent / "results"


def heldout_prompts(tokenizer, length: int, n: int, seed: int) -> list[list[int]]:
    """n windows of `length` tokens from the held-out files (never seen in training)."""
    _, held, _ = split_files()
    ids: list[int] = []
    for f in held:
        ids.extend(tokenizer(read_text(f), add_special_tokens=False).input_ids)
        ids.append(tokenizer.eos_token_id or 0)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - length, n)
    return [ids[s:s + length] for s in starts]


def run(engine: SpeculativeEngine, prompts, new_tokens: int) -> dict:
    rounds = accepted = 0
    proposed_pos = accepted_pos = None
    t0 = time.perf_counter()
    for p in prompts:
        s = engine.generate(p, max_new_tokens=new_tokens).stats
        rounds += s.rounds
        accepted += s.accepted_drafts
        pp, ap = np.array(s.position_proposed), np.array(s.position_accepted)
        proposed_pos = pp if proposed_pos is None else proposed_pos + pp
        accepted_pos = ap if accepted_pos is None else accepted_pos + ap
    return {"tau": (accepted + rounds) / rounds,
            "acceptance": (accepted_pos / np.maximum(proposed_pos, 1)).round(4).tolist(),
            "rounds": int(rounds), "seconds": round(time.perf_counter() - t0, 1)}


def windowed(d: Drafter, window: int) -> Drafter:
    """The same weights attending only to the last `window` context features."""
    cut = Drafter(dataclasses.replace(d.cfg, window=window), d.embed_tokens, d.lm_head)
    cut.load_state_dict(d.state_dict())
    return cut.eval()


def ablations(drafters: dict[str, Drafter]) -> list[tuple[str, Drafter, bool]]:
    """(name, drafter, memory off) for every drafter as trained, then every drafter with
    a memory with it zeroed, then every full-context one cut to the smallest window W."""
    variants = [(name, d, False) for name, d in drafters.items()]
    variants += [(f"{name}, memory off", d, True) for name, d in drafters.items()
                 if d.cfg.memory != "none"]
    window = min(d.cfg.window for d in drafters.values())
    variants += [(f"{name}, last {window} only", windowed(d, window), False)
                 for name, d in drafters.items() if d.cfg.arch == "full"]
    return variants


def memory_table(drafters: dict, contexts) -> dict:
    """Bytes of draft-side context memory (fp32) when the context holds n tokens, for both
    window layouts (per-layer K/V, fused features): HyFlash holds window + state whatever
    n; full-context holds one window row per token (its fixed-shape export allocates the
    maximum, ``allocated``)."""
    out = {}
    for name, d in drafters.items():
        layout = d.window_cache
        for cache in WINDOW_CACHES:
            d.window_cache = cache
            fixed = d.state_bytes()
            label = f"{name} ({cache})"
            if d.cfg.arch == "full":
                per_token = (fixed - 8) // d.cfg.max_seq_len  # the window is all there is
                out[label] = {n: min(n, d.cfg.max_seq_len) * per_token + 8 for n in contexts}
                out[label + " allocated"] = {n: fixed for n in contexts}
            else:
                out[label] = {n: fixed for n in contexts}
        d.window_cache = layout
    return out


def load_pair(target_name: str, specs: list[str]):
    """--target and every --drafter NAME=DIR -> (folder, target, tokenizer, {name: drafter})."""
    folder = resolve_model_folder(target_name)
    target = Target.from_pretrained(folder)
    drafters = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        drafters[name] = load_drafter(path, target)
    return folder, target, load_tokenizer(folder), drafters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="pocket")
    ap.add_argument("--drafter", action="append", required=True, metavar="NAME=DIR",
                    help="a trained drafter to measure (repeat)")
    ap.add_argument("--prompts", type=int, default=12, help="prompts per context length")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--contexts", default="64,1024,1900",
                    help="prompt lengths (prompt + new tokens must fit the context)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="drafter_tau", help="stem of the result files")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    folder, target, tok, drafters = load_pair(args.target, args.drafter)
    variants = ablations(drafters)
    contexts = [int(c) for c in args.contexts.split(",")]
    results: dict = {"target": str(folder), "new_tokens": args.new_tokens,
                     "prompts_per_context": args.prompts, "runs": {}}
    for ctx in contexts:
        prompts = heldout_prompts(tok, ctx, args.prompts, seed=ctx)
        for name, d, off in variants:
            d.memory_off = off
            engine = SpeculativeEngine(TorchTarget(target), TorchDrafter(d))
            r = run(engine, prompts, args.new_tokens)
            d.memory_off = False
            results["runs"][f"{name} @ {ctx}"] = r
            print(f"{name:22s} ctx {ctx:5d}: tau {r['tau']:.3f}  acc {r['acceptance']}",
                  flush=True)
    results["memory_bytes"] = memory_table(drafters, [64, 256, 512, 1024, 2048])
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    names = [name for name, _, _ in variants]
    write_markdown(results, contexts, names, args.name)
    plot(results, contexts, names, args.name)


def write_markdown(results: dict, contexts, names, stem: str) -> None:
    lines = ["| drafter | " + " | ".join(f"tau @ {c}" for c in contexts) + " |",
             "|---|" + "---|" * len(contexts)]
    for name in names:
        row = [f"{results['runs'][f'{name} @ {c}']['tau']:.3f}" for c in contexts]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", "| run | acceptance by draft position 1..B-1 |", "|---|---|"]
    for key, r in results["runs"].items():
        lines.append(f"| {key} | " + " ".join(f"{x:.2f}" for x in r["acceptance"]) + " |")
    lines += ["", "| drafter | " + " | ".join(f"{n} tok" for n in [64, 256, 512, 1024, 2048])
              + " |", "|---|" + "---|" * 5]
    for name, row in results["memory_bytes"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v / 1024:.0f} KiB" for v in row.values())
                     + " |")
    (OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(results: dict, contexts, names, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        a.plot(contexts, [results["runs"][f"{name} @ {c}"]["tau"] for c in contexts], "o-",
               label=name)
    a.set(xlabel="prompt length (tokens)", ylabel="tau (tokens / verify)",
          title="online tau, greedy, B=8")
    a.legend()
    for name, row in results["memory_bytes"].items():
        b.plot(list(row), [v / 1024 for v in row.values()], "o-", label=name)
    b.set(xlabel="context length (tokens)", ylabel="KiB (fp32)", yscale="log",
          title="draft-side memory")
    b.legend()
    fig.tight_layout()
    fig.savefig(OUT / f"{stem}.png", dpi=120)


if __name__ == "__main__":
    main()
