"""One system's run in its own process: `python -m hyflash.bench.worker REQUEST.json OUT.json`.

A fresh process per configuration and round, so each peak RSS is that configuration's
alone (a process's high-water mark never drops) and no system's thread pools or caches
help another. The request names the system, its folder, the prompts as token ids (the
driver tokenized them once: every system gets the same ids), the tokens to generate and
the threads. EOS never stops a run, so every system decodes the same number of tokens.

Timing is the same for every system: the wall time of the whole generate call, prefill
included; tokens/s = new tokens / that. Ours also report each call's prefill time, so the
decode phase can be rated apart (``runs.decode_rate``). One warm-up generate (8 tokens)
per mode first.

Systems: ``ours`` (a bundle through our engine: plain, speculative with the drafter (all
its rows, and as many as pay: ``runtime/draft_rows.py``'s ``auto``), lookup
(drafts copied from the context, ``runtime/lookup.py``) and speculative+lookup (copies
where the context has a match, the drafter elsewhere) and adaptive (a rate gate,
``runtime/gate.py``, picks lookup, drafter or a plain decode by measured tokens per
second), same process and target: each checked against plain), ``transformers``
(``generate``, plain and with ``prompt_lookup_num_tokens``, same model and process),
``optimum`` (``ORTModelForCausalLM.generate``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

WARMUP_TOKENS = 8


def mode_result(gens: list[dict]) -> dict:
    return {key: [g[key] for g in gens] for key in ("tokens", "seconds", "prefill_seconds")
            if key in gens[0]}


# ------------------------------------------------------------------------- ours

def run_ours(req: dict) -> dict:
    import torch

    from hyflash.runtime.draft_rows import ExpectedRate
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.gate import RateGate
    from hyflash.runtime.lookup import ContextLookup
    from hyflash.runtime.open_bundle import open_bundle

    torch.set_num_threads(req["threads"])
    _, target, drafter = open_bundle(req["folder"], threads=req["threads"])
    B = drafter.block_size
    out = {}
    for mode, engine in (("plain", SpeculativeEngine(target)),
                         ("speculative", SpeculativeEngine(target, drafter)),
                         ("speculative+auto-rows",
                          SpeculativeEngine(target, drafter, draft_rows=ExpectedRate())),
                         ("lookup", SpeculativeEngine(target, None, ContextLookup(block_size=B))),
                         ("speculative+lookup",
                          SpeculativeEngine(target, drafter, ContextLookup(block_size=B))),
                         ("adaptive", SpeculativeEngine(target, drafter,
                                                        ContextLookup(block_size=B),
                                                        RateGate()))):
        engine.generate(req["prompts"][0], max_new_tokens=WARMUP_TOKENS)
        gens, stats = [], []
        for ids in req["prompts"]:
            g = engine.generate(ids, max_new_tokens=req["max_new_tokens"])
            gens.append({"tokens": g.tokens, "seconds": g.stats.total_s,
                         "prefill_seconds": g.stats.prefill_s})
            stats.append(g.stats)
        out[mode] = {**mode_result(gens), **call_costs(stats)}
    return out


def call_costs(stats) -> dict:
    """tau, acceptance by position and ms per call over all prompts of one mode."""
    def total(field):
        return sum(getattr(s, field) for s in stats)

    rounds = total("rounds")
    proposed = [sum(c) for c in zip(*(s.position_proposed for s in stats), strict=True)]
    accepted = [sum(c) for c in zip(*(s.position_accepted for s in stats), strict=True)]
    out = {"ms_per_target_call": 1000 * total("verify_s") / rounds if rounds else None}
    if proposed:  # speculative
        out.update(tau=(total("accepted_drafts") + rounds) / rounds,
                   acceptance=[a / n if n else None for a, n in zip(accepted, proposed,
                                                                     strict=True)],
                   ms_per_drafter_call=1000 * total("draft_s") / max(total("drafter_calls"), 1))
    return out


# ----------------------------------------------------------------- transformers

def timed_generate(model, ids: list[int], new: int, **kw) -> dict:
    import torch

    x = torch.tensor([ids])
    t0 = time.perf_counter()
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                         max_new_tokens=new, **kw)
    seconds = time.perf_counter() - t0
    return {"tokens": out[0, len(ids):].tolist(), "seconds": seconds}


def run_transformers(req: dict) -> dict:
    import torch
    import transformers

    torch.set_num_threads(req["threads"])
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        req["folder"], torch_dtype=torch.float32).eval()
    # never stop early, like every system; prompt lookup needs some EOS id, so the last
    # vocabulary id stands in (as for onnxruntime-genai); a run it stops shows as short
    model.generation_config.eos_token_id = model.config.vocab_size - 1
    out = {}
    for mode, lookup in (("plain", 0), ("lookup", req.get("prompt_lookup", 0))):
        if mode == "lookup" and not lookup:
            continue
        kw = {"pad_token_id": 0, **({"prompt_lookup_num_tokens": lookup} if lookup else {})}
        with torch.inference_mode():
            timed_generate(model, req["prompts"][0], WARMUP_TOKENS, **kw)
            gens = [timed_generate(model, ids, req["max_new_tokens"], **kw)
                    for ids in req["prompts"]]
        out[mode] = mode_result(gens)
    return out


# ---------------------------------------------------------------------- optimum

def run_optimum(req: dict) -> dict:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    torch.set_num_threads(req["threads"])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = req["threads"]
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    model = ORTModelForCausalLM.from_pretrained(req["folder"], session_options=opts,
                                                provider="CPUExecutionProvider",
                                                local_files_only=True)
    model.generation_config.eos_token_id = None
    timed_generate(model, req["prompts"][0], WARMUP_TOKENS, pad_token_id=0)
    gens = [timed_generate(model, ids, req["max_new_tokens"], pad_token_id=0)
            for ids in req["prompts"]]
    return {"plain": mode_result(gens)}


SYSTEMS = {"ours": run_ours, "transformers": run_transformers, "optimum": run_optimum}


def main(argv: list[str]) -> int:
    from hyflash.runtime.stats import peak_rss_mib

    req = json.loads(Path(argv[0]).read_text())
    result = SYSTEMS[req["system"]](req)
    Path(argv[1]).write_text(json.dumps({"modes": result, "peak_rss_mib": peak_rss_mib()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
