"""onnxruntime-genai's own loop, run by its venv's Python (hyflash is not installed there):

    <genai venv>/bin/python genai_worker.py REQUEST.json OUT.json

Standard library and onnxruntime_genai only. The request is the one ``worker`` reads
(folder, prompts as token ids, max_new_tokens, threads) plus ``ngram``: 0 for plain
decoding only, else plain decoding and then, with the same model, genai's draft-free
n-gram speculative mode with that n-gram size (``set_speculative_options``).

genai cannot be told to ignore EOS (an empty list falls back to the config's, -1 is
refused, min_length masks EOS and so changes the greedy choice): the last vocabulary id
stands in as EOS, as in ``benchmarks/baselines.py``; were it produced, the run would stop
short and the driver says so. Session options as every system gets them: intra-op
threads, one inter-op thread, no spinning.
"""

import json
import resource
import sys
import time
from pathlib import Path

WARMUP_TOKENS = 8


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def main(argv) -> int:
    import onnxruntime_genai as og

    req = json.loads(Path(argv[0]).read_text())
    folder = req["folder"]
    vocab = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"]
    config = og.Config(folder)
    config.overlay(json.dumps({"model": {"eos_token_id": vocab - 1, "decoder": {
        "session_options": {"intra_op_num_threads": req["threads"], "inter_op_num_threads": 1,
                            "session.intra_op.allow_spinning": "0"}}}}))
    model = og.Model(config)

    def generate(ids, new, ngram):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + new)
        if ngram:
            params.set_speculative_options(ngram_size=ngram,
                                           max_draft_tokens=req.get("max_draft_tokens", 7))
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        seconds = time.perf_counter() - t0
        tokens = [int(t) for t in gen.get_sequence(0)[len(ids):]]
        stats = gen.get_speculative_stats() if ngram else {}
        return {"tokens": tokens, "seconds": seconds, "stats": stats}

    modes = {}
    for name, ngram in (("plain", 0), ("lookup", req.get("ngram", 0))):
        if name == "lookup" and not ngram:
            continue
        generate(req["prompts"][0], WARMUP_TOKENS, ngram)
        gens = [generate(ids, req["max_new_tokens"], ngram) for ids in req["prompts"]]
        mode = {"tokens": [g["tokens"] for g in gens], "seconds": [g["seconds"] for g in gens]}
        if ngram:  # rounds = verify passes with a proposal; the rest decoded one token
            mode["proposed_drafts"] = sum(g["stats"].get("draft_tokens_proposed", 0)
                                          for g in gens)
            mode["accepted_drafts_total"] = sum(g["stats"].get("draft_tokens_accepted", 0)
                                                for g in gens)
        modes[name] = mode
    Path(argv[1]).write_text(json.dumps({"modes": modes, "peak_rss_mib": peak_rss_mib(),
                                         "version": og.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
