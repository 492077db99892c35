"""Acceptance: tau and per-position acceptance of each drafter by context length.

Real speculative decoding through the reference engine (torch target + torch drafter,
as ``benchmarks/drafter_tau.py``), on windows of exactly N held-out tokens, greedy and
at temperature 1 (rejection sampling, a seed per prompt), every drafter on the same
prompts. A context that does not fit the target (N + new tokens + a block) is cut to the
longest that does, and the result says so.
"""

from __future__ import annotations

import math


def measure(target_path: str, drafters: dict[str, str], contexts: list[int], prompts: int,
            new_tokens: int, temperatures: list[float], threads: int,
            say=print) -> dict:
    import torch
    from tqdm import tqdm

    from hyflash.bench.prompts import context_windows
    from hyflash.models.drafter_folder import load_drafter
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime import SpeculativeEngine, TorchTarget
    from hyflash.runtime.drafter_backend import TorchDrafter

    torch.set_num_threads(threads)
    folder = resolve_model_folder(target_path)
    target = Target.from_pretrained(folder)
    tok = load_tokenizer(folder)
    loaded = {name: load_drafter(path, target) for name, path in drafters.items()}
    block = max(d.cfg.block_size for d in loaded.values())
    limit = target.cfg.max_seq_len - new_tokens - block
    fits = sorted({min(c, limit) for c in contexts})
    rows = []
    jobs = [(c, t, name) for c in fits for t in temperatures for name in loaded]
    for ctx, temp, name in tqdm(jobs, desc="acceptance", unit="run", disable=say is None):
        windows = context_windows(tok, ctx, prompts, seed=ctx)
        engine = SpeculativeEngine(TorchTarget(target), TorchDrafter(loaded[name]))
        stats = [engine.generate(p, max_new_tokens=new_tokens, temperature=temp, seed=i).stats
                 for i, p in enumerate(windows)]
        rounds = sum(s.rounds for s in stats)
        proposed = [sum(c) for c in zip(*(s.position_proposed for s in stats), strict=True)]
        taken = [sum(c) for c in zip(*(s.position_accepted for s in stats), strict=True)]
        rows.append({"drafter": name, "arch": loaded[name].cfg.arch, "context": ctx,
                     "temperature": temp, "prompts": len(windows), "new_tokens": new_tokens,
                     "tau": (sum(s.accepted_drafts for s in stats) + rounds) / rounds,
                     "acceptance": [a / n if n else math.nan for a, n in zip(taken, proposed,
                                                                              strict=True)]})
    return {"rows": rows, "contexts": fits, "cut": {c: limit for c in contexts if c > limit},
            "max_context": target.cfg.max_seq_len}
