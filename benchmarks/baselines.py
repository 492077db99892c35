"""Plain greedy decoding of SmolLM2-135M-Instruct: our lean target graph against the
baselines issue #11 names, onnxruntime-genai and optimum's ORTModelForCausalLM.

    python benchmarks/setup_baselines.py     # once: builds every model (see its docstring)
    python benchmarks/baselines.py --out benchmarks/results [--threads 1] [--repeats 3] \
        [--quants fp32,int4] [--new-tokens 128] [--long-tokens 1000]

Systems (same weights: the dequantized Q4_1 GGUF; same ONNX Runtime release, 1.32.0):

- ``hyflash lean``: a ``hyflash export --target-graph lean`` bundle through our runtime
  as ``hyflash generate --bundle ... --no-draft`` runs it (``load_onnx_pair`` +
  ``SpeculativeEngine`` without a drafter: ``OnnxLeanTarget``, static KV updated in place);
- ``hyflash optimum-form``: the ``--target-graph optimum`` bundle, same runtime;
- ``optimum``: ``ORTModelForCausalLM.from_pretrained(optimum-cli export).generate``;
- ``genai``: onnxruntime-genai 0.18.0's own loop (``append_tokens``, then
  ``generate_next_token`` until done) on its model builder's output, in its own venv: a
  worker subprocess (this file, ``--genai-worker``) serves one model over stdin/stdout.

Every system gets the same token ids (tokenized once here), decodes greedily, never
stops early (EOS handling off: our engine gets no stop ids, optimum's generation config
no ``eos_token_id``, genai an EOS id it never produces, see ``genai_worker``) and runs with
``intra_op_num_threads = --threads``, ``inter_op_num_threads = 1``,
``session.intra_op.allow_spinning = 0`` (optimum: a SessionOptions with those; genai: the
same keys in its config's ``decoder.session_options`` through ``Config.overlay``).

Timing is the same for all, taken from outside: prefill = start of the call until the
first new token is available; decode = first to last new token over the remaining
``new - 1`` tokens (ms/token, and tokens/s = 1000 / that). One warm-up run per system
and prompt (8 tokens), then ``--repeats`` rounds; in each round every prompt runs on
every system, in an order that rotates by round, so load from other processes hits all
alike. Medians are reported. Greedy outputs are compared with the lean graph's at the
same quantization: the fp32 outputs of ours (both forms) and optimum must be equal
token for token (asserted); the rest is reported as the first differing position.
Writes ``baselines.md`` and ``baselines.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHORT_PROMPT = 'def quicksort(items):\n    """Sort a list with quicksort; return a new list."""\n'
LONG_SOURCE = "textwrap"  # the long prompt: this stdlib module's source, cut to --long-tokens
MUST_MATCH = ("hyflash optimum-form", "optimum")  # fp32: equal to the lean graph (asserted)
LEGEND = {
    "hyflash lean": "`hyflash export --target-graph lean` bundle, our runtime (plain decoding)",
    "hyflash optimum-form": "`hyflash export --target-graph optimum` bundle, our runtime",
    "optimum": "`ORTModelForCausalLM.generate` on `optimum-cli export onnx` (int4: our "
               "recipe applied to its model.onnx)",
    "genai": "onnxruntime-genai 0.18.0, its model builder's defaults (int4: accuracy_level=4, "
             "int8 activations, token embedding read from the int4 LM head)",
    "genai acc1": "onnxruntime-genai int4 built with accuracy_level=1 shared_embeddings=false: "
                  "fp32 activations and embedding, the arithmetic of our int4 recipe"}


def ort_options(threads: int) -> dict:
    """The session settings every system gets (genai reads the same keys from its config)."""
    return {"intra_op_num_threads": threads, "inter_op_num_threads": 1,
            "session.intra_op.allow_spinning": "0"}


# ------------------------------------------------------------------ the genai worker

def genai_worker(model_dir: str, threads: int) -> None:
    """Runs in the genai venv: load one model, then answer one JSON line per request
    ({"ids": [...], "new": n}) with the tokens and the two timings."""
    import onnxruntime_genai as og

    vocab = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"]
    config = og.Config(model_dir)
    # genai cannot be told to ignore EOS (an empty eos_token_id list falls back to the
    # config's, -1 is refused, min_length masks EOS and so changes the greedy choice): the
    # last vocabulary id stands in as EOS. Were it ever produced, the run would stop short
    # and measure() would say so.
    config.overlay(json.dumps({"model": {"eos_token_id": vocab - 1, "decoder": {
        "session_options": ort_options(threads)}}}))
    model = og.Model(config)
    print(json.dumps({"ready": og.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids, n = req["ids"], req["new"]
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + n)
        gen = og.Generator(model, params)
        tokens, stamps = [], []
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
            stamps.append(time.perf_counter())
        del gen
        print(json.dumps({"tokens": tokens, "prefill_s": stamps[0] - t0,
                          "decode_s": stamps[-1] - stamps[0]}), flush=True)


class Genai:
    def __init__(self, python: Path, model_dir: Path, threads: int):
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).resolve()), "--genai-worker", str(model_dir),
             "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": ""})
        hello = self.proc.stdout.readline()
        if not hello:
            sys.exit(f"baselines: the genai worker for {model_dir} died while loading")
        self.version = json.loads(hello)["ready"]

    def run(self, ids: list[int], new: int) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids, "new": new}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ------------------------------------------------------------------ in-process systems

class Ours:
    """A bundle decoded plainly by our engine, as ``hyflash generate --bundle --no-draft``."""

    def __init__(self, bundle: Path, threads: int):
        from hyflash.runtime import SpeculativeEngine
        from hyflash.runtime.onnx_backend import load_onnx_pair

        b, target, _ = load_onnx_pair(bundle, threads=threads, verify_hashes=False)
        self.form = b.manifest.kv_cache.form
        self.engine = SpeculativeEngine(target)

    def run(self, ids: list[int], new: int) -> dict:
        stamps = []
        t0 = time.perf_counter()
        g = self.engine.generate(ids, max_new_tokens=new, eos_ids=(),
                                 on_token=lambda _: stamps.append(time.perf_counter()))
        return {"tokens": g.tokens, "prefill_s": stamps[0] - t0,
                "decode_s": stamps[-1] - stamps[0]}


class Stamps:
    """A transformers streamer: ``put`` gets the prompt first, then each new token."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, _value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class Optimum:
    """ORTModelForCausalLM on an optimum export, decoded by its ``generate``."""

    def __init__(self, folder: Path, threads: int):
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForCausalLM

        opts = ort.SessionOptions()
        settings = ort_options(threads)
        opts.intra_op_num_threads = settings["intra_op_num_threads"]
        opts.inter_op_num_threads = settings["inter_op_num_threads"]
        opts.add_session_config_entry("session.intra_op.allow_spinning",
                                      settings["session.intra_op.allow_spinning"])
        opts.log_severity_level = 3
        self.model = ORTModelForCausalLM.from_pretrained(
            folder, session_options=opts, provider="CPUExecutionProvider", local_files_only=True)
        self.model.generation_config.eos_token_id = None  # never stop early, like the others
        self.model.generation_config.pad_token_id = 0

    def run(self, ids: list[int], new: int) -> dict:
        import torch

        x = torch.tensor([ids])
        s = Stamps()
        t0 = time.perf_counter()
        out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                  max_new_tokens=new, streamer=s)
        return {"tokens": out[0, len(ids):].tolist(), "prefill_s": s.times[1] - t0,
                "decode_s": s.times[-1] - s.times[1]}


def open_systems(paths: dict, quants: list[str], threads: int) -> dict[tuple[str, str], object]:
    """(quant, name) -> a loaded system, and how long each took to load."""
    plan = []
    for q in quants:
        plan += [(q, "hyflash lean", Ours, paths[f"ours-lean-{q}"]),
                 (q, "hyflash optimum-form", Ours, paths[f"ours-optimum-{q}"]),
                 (q, "optimum", Optimum, paths[f"optimum-{q}"])]
        genai = ["genai"] if q == "fp32" else ["genai", "genai acc1"]
        for name in genai:
            folder = paths[f"genai-{q}" + ("-acc1" if name.endswith("acc1") else "")]
            plan.append((q, name, lambda f, t: Genai(paths["genai_python"], f, t), folder))
    systems = {}
    for q, name, make, folder in plan:
        if not Path(folder).exists():
            sys.exit(f"baselines: {folder} is missing: run python benchmarks/setup_baselines.py")
        t0 = time.perf_counter()
        systems[q, name] = make(Path(folder), threads)
        print(f"loaded {q} {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return systems


# ------------------------------------------------------------------ prompts and runs

def prompts(folder: Path, long_tokens: int) -> dict[str, list[int]]:
    import importlib

    from hyflash.models.tokenizer import load_tokenizer

    tok = load_tokenizer(folder)
    source = Path(importlib.import_module(LONG_SOURCE).__file__).read_text()
    long = tok(source).input_ids[:long_tokens]
    return {"short": tok(SHORT_PROMPT).input_ids, "long": long}


def measure(systems: dict, ids: dict[str, list[int]], new: int, repeats: int) -> list[dict]:
    keys = list(systems)
    for key in keys:  # warm-up: first-run allocations stay out of the medians
        for p in ids.values():
            systems[key].run(p, 8)
    rows = []
    for r in range(repeats):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for pname, p in ids.items():
            for key in order:
                out = systems[key].run(p, new)
                if len(out["tokens"]) != new:
                    sys.exit(f"baselines: {key} gave {len(out['tokens'])} tokens, not {new}")
                rows.append({"round": r, "prompt": pname, "quant": key[0], "system": key[1],
                             **out})
                print(f"round {r} {pname} {key[0]} {key[1]}: prefill "
                      f"{1000 * out['prefill_s']:.0f} ms, decode "
                      f"{1000 * out['decode_s'] / (new - 1):.1f} ms/token", flush=True)
    return rows


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def summarize(rows: list[dict], new: int, threads: int) -> list[dict]:
    """Medians per (prompt, quant, system), the lean graph's speed over each, and whether
    each system's greedy tokens equal the lean graph's."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["prompt"], r["quant"], r["system"]), []).append(r)
    out = []
    for (prompt, quant, system), rs in groups.items():
        lean = groups[prompt, quant, "hyflash lean"]
        decode = statistics.median(r["decode_s"] for r in rs) * 1000 / (new - 1)
        lean_decode = statistics.median(r["decode_s"] for r in lean) * 1000 / (new - 1)
        diffs = {first_difference(r["tokens"], lean[0]["tokens"]) for r in rs}
        steady = len({tuple(r["tokens"]) for r in rs}) == 1
        out.append({"threads": threads, "prompt": prompt, "quant": quant, "system": system,
                    "runs": len(rs),
                    "prefill_ms": round(statistics.median(r["prefill_s"] for r in rs) * 1000, 1),
                    "decode_ms_per_token": round(decode, 2),
                    "tokens_per_s": round(1000 / decode, 1),
                    "lean_speedup": round(decode / lean_decode, 3),
                    "first_diff_vs_lean": None if diffs == {None} else min(
                        d if d is not None else new for d in diffs),
                    "deterministic": steady})
    return out


def check_matches(summary: list[dict]) -> None:
    """fp32: our optimum-form graph and optimum itself decode exactly what the lean graph does."""
    for s in summary:
        if s["quant"] == "fp32" and s["system"] in MUST_MATCH:
            assert s["first_diff_vs_lean"] is None, (
                f"{s['system']} fp32 greedy output differs from the lean graph at token "
                f"{s['first_diff_vs_lean']} on the {s['prompt']} prompt")


def markdown(result: dict) -> str:
    new = result["settings"]["new_tokens"]
    out = ["# Plain decoding: our lean graph vs onnxruntime-genai and optimum", "",
           f"Command: `{result['command']}` (models: `python benchmarks/setup_baselines.py`).",
           "", result["note"], "",
           "Columns: prefill = call start to first new token; decode = per token after the "
           f"first ({new - 1} tokens); *lean ÷ this* = lean tokens/s over this system's (> 1: "
           "the lean graph is faster); *tokens vs lean* = greedy output compared with the "
           "lean graph's at the same quantization (`=` identical, else the first differing "
           "position).", "", *[f"- **{k}**: {v}" for k, v in LEGEND.items()], ""]
    for (threads, prompt, length) in result["cases"]:
        out += [f"## {prompt} prompt ({length} tokens), {threads} thread(s), {new} new tokens",
                "", "| quant | system | prefill ms | decode ms/token | tokens/s | lean ÷ this | "
                "tokens vs lean |", "|---|---|---|---|---|---|---|"]
        for s in result["summary"]:
            if (s["threads"], s["prompt"]) == (threads, prompt):
                d = s["first_diff_vs_lean"]
                out.append(f"| {s['quant']} | {s['system']} | {s['prefill_ms']:.0f} | "
                           f"{s['decode_ms_per_token']:.1f} | {s['tokens_per_s']:.1f} | "
                           f"{s['lean_speedup']:.2f} | {'=' if d is None else d} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--genai-worker"]:  # in the genai venv, where hyflash is not installed
        genai_worker(argv[1], int(argv[3]))
        return 0
    from hyflash.argtypes import positive_int, threads

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--threads", type=lambda t: [threads(x) for x in t.split(",")],
                    default=[1], help="comma-separated ONNX Runtime thread counts (default 1)")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--quants", type=lambda t: t.split(","), default=["fp32", "int4"],
                    help="comma-separated: fp32, int4")
    ap.add_argument("--new-tokens", type=positive_int, default=128)
    ap.add_argument("--long-tokens", type=positive_int, default=1000)
    ap.add_argument("--note", default="", help="conditions of the run, for the report")
    args = ap.parse_args(argv)
    if args.new_tokens < 2:
        ap.error("--new-tokens must be >= 2: decode is timed from the first new token on")
    if set(args.quants) - {"fp32", "int4"}:
        ap.error(f"--quants takes fp32 and int4, not {','.join(args.quants)}")

    import torch

    sys.path.insert(0, str(HERE))
    from setup_baselines import layout

    from hyflash.models.gguf import cache_root

    torch.set_num_threads(1)
    paths = layout(cache_root())
    quants = args.quants
    ids = prompts(paths["ours-lean-fp32"], args.long_tokens)
    rows, summary = [], []
    for n in args.threads:
        systems = open_systems(paths, quants, n)
        part = measure(systems, ids, args.new_tokens, args.repeats)
        for s in systems.values():
            if isinstance(s, Genai):
                s.close()
        del systems
        rows += [{"threads": n, **r} for r in part]
        summary += summarize(part, args.new_tokens, n)
    check_matches(summary)
    result = {"command": shlex.join(["python", "benchmarks/baselines.py",
                                      *argv]),
              "note": args.note,
              "settings": {"new_tokens": args.new_tokens, "repeats": args.repeats,
                           "short_prompt": SHORT_PROMPT,
                           "long_prompt": f"the first {len(ids['long'])} tokens of the source "
                                          f"of Python {sys.version.split()[0]}'s {LONG_SOURCE}",
                           "session_options": ort_options(0) | {"intra_op_num_threads":
                                                                args.threads}},
              "cases": [(t, p, len(ids[p])) for t in args.threads for p in ids],
              "summary": summary, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "baselines.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (args.out / "baselines.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
