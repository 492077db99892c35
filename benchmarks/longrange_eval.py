"""Online tau where memory can matter: the long-range evaluation set.

Each item is a held-out stdlib position whose next tokens repeat something that left the
drafter's window W long ago, nothing in the window gives it away, and the target itself
writes the repeat (``hyflash.train.longrange``: the selection rule). The set is built once
(one teacher-forced target pass per 1024-token chunk of the held-out files) and saved as
positions, with a hash of each item's tokens, in benchmarks/results/longrange_set.json.

Every drafter variant of ``drafter_tau.ablations`` (as trained, memory zeroed,
full-context cut to the last W) decodes every item greedily through the real engine
(torch runtime) for --new-tokens tokens, and the script reports

- tau over all rounds of those tokens, and per-position acceptance;
- *first block*: tau and per-position acceptance of the first draft round alone, the one
  that drafts exactly the repeated span (its anchor is the repeat's first token);
- paired differences (memory on - off, full - full cut to W) of the first block's
  accepted drafts, with a 95% bootstrap interval over items;
- the same variants on ordinary held-out prompts (``drafter_tau.run``) for comparison.

    python benchmarks/longrange_eval.py --drafter slots=pocket --drafter window=DIR \
        --drafter full=pocket-full [--items 150]

Writes benchmarks/results/NAME.{json,md} (NAME: --name, default longrange).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from drafter_tau import ablations, heldout_prompts, load_pair, run  # noqa: E402

from hyflash.argtypes import positive_int, threads  # noqa: E402
from hyflash.errors import HyflashError  # noqa: E402
from hyflash.models.target import Target  # noqa: E402
from hyflash.runtime import SpeculativeEngine, TorchTarget  # noqa: E402
from hyflash.runtime.drafter_backend import TorchDrafter  # noqa: E402
from hyflash.train.corpus import read_text, split_files  # noqa: E402
from hyflash.train.longrange import KINDS, SPAN, LongRangeItem, build_set  # noqa: E402

OUT = Path(__file__).parent / "results"
SET = OUT / "longrange_set.json"


# ------------------------------------------------------------------ the set on disk

def digest(ids) -> str:
    return hashlib.sha1(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:16]


def make_set(target: Target, tok, n: int, window: int, room: int, path: Path) -> None:
    """Build the set (rule 6 needs the target: one teacher-forced pass per chunk)."""
    target.drop_cache()

    @torch.inference_mode()
    def next_tokens(ids):
        logits, _ = target.prefill(torch.tensor([ids]))
        return logits[0].argmax(-1).tolist()

    t0 = time.perf_counter()
    items, files, counts = build_set(tok, next_tokens, n, window, room,
                                     progress=lambda m: print(m, flush=True))
    path.write_text(json.dumps({
        "window": window, "span": SPAN, "room": room, "n": n, "counts": counts,
        "build_seconds": round(time.perf_counter() - t0), "python": sys.version.split()[0],
        "items": [{**vars(it), "distance": it.distance,
                   "sha1": digest(files[it.file][it.start:it.pos + it.length])}
                  for it in items]}, indent=1))


def load_set(tok, path: Path) -> tuple[dict, list[tuple[LongRangeItem, list[int]]]]:
    """-> (the set's header, [(item, the file's token ids)]), every item's tokens checked
    against the hash recorded when the set was built."""
    meta = json.loads(path.read_text())
    _, _, root = split_files()
    ids_of: dict[str, list[int]] = {}
    out = []
    for rec in meta["items"]:
        it = LongRangeItem(**{k: rec[k] for k in ("file", "start", "pos", "length", "source",
                                                  "kind")})
        if it.file not in ids_of:
            ids_of[it.file] = tok(read_text(root / it.file), add_special_tokens=False).input_ids
        ids = ids_of[it.file]
        if digest(ids[it.start:it.pos + it.length]) != rec["sha1"]:
            raise HyflashError(f"{path}: {it.file} tokenizes differently here than where the "
                               "set was built (another Python's stdlib?): pass --rebuild-set")
        out.append((it, ids))
    return meta, out


# ------------------------------------------------------------------- measurement

class RecordingDrafter(TorchDrafter):
    """The torch drafter, remembering the greedy drafts of every call by position."""

    def reset(self) -> None:
        super().reset()
        self.calls: list[tuple[int, list[int]]] = []

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        logits = super().draft(anchor, pos)
        self.calls.append((pos, logits.argmax(-1).tolist()))
        return logits


def first_block(calls, committed: list[int]) -> int:
    """Drafts of the first round that the target kept: the longest prefix of its drafts
    equal to the committed tokens (greedy verification keeps exactly those)."""
    pos, drafts = calls[0]
    k = 0
    while k < len(drafts) and pos + 1 + k < len(committed) and \
            drafts[k] == committed[pos + 1 + k]:
        k += 1
    return k


class ReusedPrefill(TorchTarget):
    """The torch target, restoring (not recomputing) the prefill of the prompt it saw
    last: the KV rows and outputs are the same tensors, so every variant of an item starts
    from the identical target state, and the prefill (most of a 32-token run at ~1500
    tokens of context) is paid once per item instead of once per variant."""

    saved: tuple | None = None

    def forward(self, tokens, start_pos, logits_rows=None):
        if start_pos != 0:
            return super().forward(tokens, start_pos, logits_rows)
        key = torch.as_tensor(tokens).reshape(-1).tolist()
        caches = [layer.self_attn.kv_cache for layer in self.model.layers]
        t = len(key)
        if self.saved is not None and self.saved[0] == key:
            for c, (k, v) in zip(caches, self.saved[2], strict=True):
                c.k[:, :, :t], c.v[:, :, :t] = k, v
            self.length = t
            return self.saved[1]
        out = super().forward(tokens, start_pos, logits_rows)
        self.saved = (key, out, [(c.k[:, :, :t].clone(), c.v[:, :, :t].clone()) for c in caches])
        return out


def run_items(target: Target, variants, items, new_tokens: int):
    """Every item through every variant (items outer: one prefill per item) -> per
    variant: (first-round accepted drafts per item, whether the run wrote the repeat,
    all-rounds tau and per-position acceptance, seconds); and the first round an oracle
    would get that drafts what followed the earlier occurrence (perfect recall)."""
    backend = ReusedPrefill(target)
    block = variants[0][1].cfg.block_size
    oracle = []
    runs = []
    for _, d, off in variants:
        rec = RecordingDrafter(d)
        runs.append({"d": d, "off": off, "rec": rec, "engine": SpeculativeEngine(backend, rec),
                     "firsts": [], "copies": [], "rounds": 0, "accepted": 0, "seconds": 0.0,
                     "proposed_pos": 0, "accepted_pos": 0})
    for i, (it, ids) in enumerate(items):
        prompt = it.prompt(ids)
        written = None
        for r in runs:
            r["d"].memory_off = r["off"]
            t0 = time.perf_counter()
            g = r["engine"].generate(prompt, max_new_tokens=new_tokens)
            r["seconds"] += time.perf_counter() - t0
            r["d"].memory_off = False
            written = written or g.tokens
            if g.tokens != written:  # lossless decoding, the same restored prefill
                raise HyflashError(f"item {i}: variants wrote different tokens")
            r["firsts"].append(first_block(r["rec"].calls, prompt + g.tokens))
            r["copies"].append(g.tokens[:SPAN + 1] == it.expected(ids)[:SPAN + 1])
            s = g.stats
            r["rounds"] += s.rounds
            r["accepted"] += s.accepted_drafts
            r["proposed_pos"] = r["proposed_pos"] + np.array(s.position_proposed)
            r["accepted_pos"] = r["accepted_pos"] + np.array(s.position_accepted)
        recall = ids[it.source + 1:it.source + block]
        oracle.append(first_block([(len(prompt), recall)], prompt + written))
        if (i + 1) % 25 == 0:
            print(f"{i + 1}/{len(items)} items", flush=True)
    return np.array(oracle), [(np.array(r["firsts"]), np.array(r["copies"]), {
        "tau": round((r["accepted"] + r["rounds"]) / r["rounds"], 4),
        "acceptance": (r["accepted_pos"] / np.maximum(r["proposed_pos"], 1)).round(4).tolist(),
        "seconds": round(r["seconds"], 1)}) for r in runs]


def summary(firsts: np.ndarray, block: int) -> dict:
    if not len(firsts):
        return {"n": 0}
    return {"n": int(len(firsts)), "first_tau": round(float(firsts.mean() + 1), 3),
            "first_acceptance": [round(float((firsts > i).mean()), 4) for i in range(block - 1)]}


def paired(a: np.ndarray, b: np.ndarray, seed: int = 0) -> dict:
    """Mean of a - b (accepted drafts per first block) with a 95% bootstrap interval."""
    d = a.astype(float) - b
    boots = np.random.default_rng(seed).choice(d, size=(2000, len(d))).mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 3), "ci95": [round(float(lo), 3), round(float(hi), 3)],
            "relative_first_tau": round(float((a.mean() + 1) / (b.mean() + 1) - 1), 4)}


def paired_table(variants, firsts_by, window) -> dict:
    """Every other drafter - the first one (as trained); memory on - off for each drafter
    with a memory; full - full cut to the last W."""
    trained = [n for n, _, off in variants if not off and not n.endswith(f"last {window} only")]
    pairs = [(n, trained[0]) for n in trained[1:]]
    pairs += [(n, f"{n}, memory off") for n, _, off in variants
              if not off and f"{n}, memory off" in firsts_by]
    pairs += [(n, f"{n}, last {window} only") for n in firsts_by
              if f"{n}, last {window} only" in firsts_by]
    return {f"{a} - {b}": paired(firsts_by[a], firsts_by[b]) for a, b in pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="pocket")
    ap.add_argument("--drafter", action="append", required=True, metavar="NAME=DIR",
                    help="a trained drafter to measure (repeat)")
    ap.add_argument("--items", type=positive_int, default=150,
                    help="long-range positions in the set (when it is built)")
    ap.add_argument("--new-tokens", type=positive_int, default=32,
                    help="tokens each long-range run writes (when the set is built)")
    ap.add_argument("--set", type=Path, default=SET, help="the set file (built if missing)")
    ap.add_argument("--rebuild-set", action="store_true")
    ap.add_argument("--heldout-contexts", default="64,1024,1900",
                    help="ordinary held-out prompt lengths ('' to skip)")
    ap.add_argument("--heldout-prompts", type=positive_int, default=12)
    ap.add_argument("--heldout-new-tokens", type=positive_int, default=128)
    ap.add_argument("--threads", type=threads, default=1)
    ap.add_argument("--name", default="longrange", help="stem of the result files")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    folder, target, tok, drafters = load_pair(args.target, args.drafter)
    variants = ablations(drafters)
    window = min(d.cfg.window for d in drafters.values())
    block = next(iter(drafters.values())).cfg.block_size
    if args.rebuild_set or not args.set.exists():
        make_set(target, tok, args.items, window, args.new_tokens, args.set)
    meta, items = load_set(tok, args.set)
    if meta["window"] != window:
        raise HyflashError(f"{args.set} was built for W={meta['window']}, the drafters' "
                           f"window is {window}: pass --rebuild-set")
    kinds = np.array([it.kind for it, _ in items])
    lr: dict = {"items": len(items), "counts": meta["counts"],
                "kinds": {k: int((kinds == k).sum()) for k in KINDS},
                "median_distance": float(np.median([it.distance for it, _ in items])),
                "median_prompt": float(np.median([it.pos - it.start for it, _ in items])),
                "runs": {}}
    firsts_by: dict = {}
    oracle, per_variant = run_items(target, variants, items, meta["room"])
    lr["oracle"] = summary(oracle, block)
    for (name, _, _), (firsts, copies, allr) in zip(variants, per_variant, strict=True):
        firsts_by[name] = firsts
        lr["runs"][name] = {**allr, **summary(firsts, block), "wrote_repeat": int(copies.sum()),
                            "by_kind": {k: summary(firsts[kinds == k], block) for k in KINDS},
                            "first_accepted": firsts.tolist()}
        print(f"longrange {name:24s} tau {allr['tau']:.3f} first block "
              f"{lr['runs'][name]['first_tau']:.3f} (target wrote the repeat "
              f"{int(copies.sum())}/{len(items)})", flush=True)
    lr["paired"] = paired_table(variants, firsts_by, window)
    results: dict = {"target": str(folder), "window": window, "span": SPAN,
                     "new_tokens": meta["room"], "longrange": lr, "heldout": {},
                     "command": " ".join(sys.argv[1:])}
    for ctx in [int(c) for c in args.heldout_contexts.split(",") if c]:
        prompts = heldout_prompts(tok, ctx, args.heldout_prompts, seed=ctx)
        for name, d, off in variants:
            d.memory_off = off
            r = run(SpeculativeEngine(TorchTarget(target), TorchDrafter(d)), prompts,
                    args.heldout_new_tokens)
            d.memory_off = False
            results["heldout"][f"{name} @ {ctx}"] = r
            print(f"heldout {ctx} {name:24s} tau {r['tau']:.3f}", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (OUT / f"{args.name}.md").write_text(markdown(results, [n for n, _, _ in variants]))
    print((OUT / f"{args.name}.md").read_text())


def markdown(r: dict, names: list[str]) -> str:
    lr = r["longrange"]
    c = lr["counts"]
    lines = [f"# Long-range evaluation set (W={r['window']}, span {r['span']})", "",
             f"`python benchmarks/longrange_eval.py {r['command']}`", "",
             f"{lr['items']} items drawn from {c['target_writes']} positions where the target "
             f"writes the repeat ({c['candidates']} candidates with a 1024-2047-token prompt, "
             f"{c['positions']} long-range positions in the held-out files); kinds "
             f"{lr['kinds']}; median distance to the earlier occurrence "
             f"{lr['median_distance']:.0f} tokens, median prompt {lr['median_prompt']:.0f} "
             f"tokens; {r['new_tokens']} new tokens per item.", "",
             "| drafter | tau | first block tau | first-block acceptance by position | "
             "target wrote the repeat |", "|---|---|---|---|---|"]
    for n in names:
        x = lr["runs"][n]
        acc = " ".join(f"{v:.2f}" for v in x["first_acceptance"])
        lines.append(f"| {n} | {x['tau']:.3f} | {x['first_tau']:.3f} | {acc} | "
                     f"{x['wrote_repeat']}/{lr['items']} |")
    acc = " ".join(f"{v:.2f}" for v in lr["oracle"]["first_acceptance"])
    lines.append(f"| oracle: drafts what followed the earlier occurrence | - | "
                 f"{lr['oracle']['first_tau']:.3f} | {acc} | - |")
    lines += ["", "| first block tau, by kind | " + " | ".join(KINDS) + " |",
              "|---|" + "---|" * len(KINDS)]
    for n in names:
        row = [f"{v['first_tau']:.2f} (n={v['n']})" if v["n"] else "-"
               for v in lr["runs"][n]["by_kind"].values()]
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    lines += ["", "| paired, accepted drafts per first block | mean [95% CI] | first block tau |",
              "|---|---|---|"]
    for k, v in lr["paired"].items():
        lines.append(f"| {k} | {v['mean']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] | "
                     f"{v['relative_first_tau']:+.1%} |")
    if r["heldout"]:
        ctxs = sorted({int(k.rsplit("@ ", 1)[1]) for k in r["heldout"]})
        lines += ["", "Ordinary held-out prompts (drafter_tau.py's), 128 new tokens:", "",
                  "| drafter | " + " | ".join(f"tau @ {c}" for c in ctxs) + " |",
                  "|---|" + "---|" * len(ctxs)]
        for n in names:
            lines.append(f"| {n} | " + " | ".join(
                f"{r['heldout'][f'{n} @ {c}']['tau']:.3f}" for c in ctxs) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
