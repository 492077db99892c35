"""Where an ONNX bundle's time goes: per-call cost of the target (decode T=1, verify T=B)
and the drafter step, split into kernel time and what is left (ONNX Runtime's per-node
dispatch and host copies), plus the op types that cost most. Either target graph form:
the lean graph (``model_lean.onnx``, KV form ``in_place``) is profiled with its static
KV buffers bound in place as ``OnnxLeanTarget`` binds them, the optimum form with its
past/present KV as explicit inputs and outputs.

    python benchmarks/onnx_profile.py --bundle benchmarks/results/onnx-pocket/bundles/fp32 \
        --out benchmarks/results/onnx-profile [--scaled] [--threads 1]

``--scaled`` also exports a randomly initialised target of phone-LLM shape (hidden 1024,
12 layers: 0.15 B parameters, 0.6 GB fp32, far beyond this CPU's 32 MiB L3) with a HyFlash
drafter sized for it, and measures the same calls. Its weights are random, so it has no
tau of its own: for every bundle the report gives the tau a drafter would need, at the
measured call costs, to break even and to double the speed.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from hyflash.export.bundle import export_onnx_bundle
from hyflash.runtime.onnx_backend import NP_DTYPES, load_onnx_pair

SCALED = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
              num_attention_heads=16, num_key_value_heads=8)


def wall_ms(fn, repeats: int) -> float:
    """Median wall time of fn() in ms over repeats calls, after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def advance(target, tokens: torch.Tensor) -> None:
    """One target call at the end of its cache."""
    target.forward(tokens, target.length)


def call_costs(bundle: Path, contexts: list[int], threads: int, repeats: int) -> list[dict]:
    """Wall ms per call starting at each context length, through the backends the
    simulation uses (IO binding, state I/O): plain decode (T=1 calls back to back), and
    speculative rounds (a drafter call, then a verify of T=B), interleaved as in the loop,
    so each graph finds the caches the other one left. Every draft counts as accepted:
    the context advances and no call copies the cache."""
    b, target, drafter = load_onnx_pair(bundle, threads)
    bsz = b.manifest.block_size
    rng = np.random.default_rng(0)
    rows = []
    for ctx in contexts:
        prompt = torch.from_numpy(rng.integers(1, target.vocab_size, ctx))
        target.reset()
        _, feats = target.forward(prompt, 0)
        decode_ms = wall_ms(partial(advance, target, prompt[:1]), repeats)
        target.rollback(ctx)
        drafter.reset()
        drafter.commit(feats)
        drafter.draft(int(prompt[-1]), ctx)  # absorbs the prompt (commit-only calls)
        times = {"drafter": [], "verify": []}
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            drafter.commit(feats[:bsz])  # the rows the last verify accepted
            drafter.draft(1, target.length + bsz)
            t1 = time.perf_counter()
            target.forward(prompt[:bsz], target.length)
            t2 = time.perf_counter()
            times["drafter"].append(t1 - t0)
            times["verify"].append(t2 - t1)
        rows.append({"context": ctx, "decode_ms": decode_ms,
                     **{f"{k}_ms": 1000 * statistics.median(v[2:]) for k, v in times.items()}})
    return rows


def kernel_profile(path: Path, make_call, threads: int, runs: int) -> dict:
    """ONNX Runtime's own profiler: kernel time per op type, per call, and node counts.
    make_call(session) -> a function making one call of the graph on that session."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the runtime
        opts.enable_profiling = True
        opts.profile_file_prefix = f"{tmp}/p"
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        call = make_call(sess)
        for _ in range(runs):
            call()
        events = json.loads(Path(sess.end_profiling()).read_text())
    by_op, by_node = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
            by_node[e["name"]] += e["dur"]
    total = sum(by_op.values())
    tiny = [d for d in by_node.values() if d / runs < 5]
    return {"nodes": len(by_node), "kernel_ms": total / runs / 1000,
            "tiny_nodes": len(tiny), "tiny_nodes_ms": sum(tiny) / runs / 1000,
            "top_ops": [(op, round(d / runs / 1000, 3)) for op, d in by_op.most_common(6)]}


def target_call(bundle, ctx: int, t: int):
    """make(session) -> one call of t tokens after ctx cached positions, made the way the
    runtime makes it for the bundle's target graph form. The cached positions hold zeros,
    which cost the same as real keys/values."""
    m = bundle.manifest
    cfg = m.target.config
    past_names, _ = m.kv_names()
    if m.kv_cache.form == "in_place":  # the lean graph: static buffers, updated in place
        from hyflash.runtime.onnx_lean import OnnxLeanTarget

        def make_lean(session):
            lean = OnnxLeanTarget(session, cfg, m.kv_names())
            tokens = np.ones(t, np.int64)

            def call():
                lean.length = ctx  # every call writes the same rows after ctx positions
                lean.run(tokens, ctx)
            return call
        return make_lean
    past = np.zeros((1, cfg.num_key_value_heads, ctx, cfg.head_dim),
                    NP_DTYPES[m.kv_cache.dtype])
    feeds = {"input_ids": np.ones((1, t), np.int64),
             "attention_mask": np.ones((1, ctx + t), np.int64),
             "position_ids": np.arange(ctx, ctx + t, dtype=np.int64)[None],
             **{n: past for n in past_names}}
    return lambda session: partial(session.run, None, feeds)


def graph_calls(bundle: Path, ctx: int) -> dict[str, tuple]:
    """label -> (graph role, make_call) for profiling each graph on its own: the target at
    T=1 and T=B, and the drafter step."""
    b, _, drafter = load_onnx_pair(bundle, verify_hashes=False)
    bsz = b.manifest.block_size
    step = {"anchor": np.array([1], np.int64), "n_valid": np.array([bsz], np.int64),
            "features": np.zeros((drafter.step_rows, drafter.feature_size), np.float32),
            **drafter.state}
    step["state.count"] = np.array([ctx], np.int64)
    return {"target T=1": ("target", target_call(b, ctx, 1)),
            f"target T={bsz}": ("target", target_call(b, ctx, bsz)),
            "drafter step": ("drafter_step", lambda session: partial(session.run, None, step))}


def profile_bundle(bundle: Path, contexts: list[int], threads: int, repeats: int) -> dict:
    from hyflash.bundle import read_bundle

    b = read_bundle(bundle, verify_hashes=False)
    kernels = {}
    for label, (role, make_call) in graph_calls(bundle, contexts[0]).items():
        kernels[label] = kernel_profile(b.path(role), make_call, threads, repeats)
    return {"bundle": str(bundle), "target_graph": b.manifest.kv_cache.form,
            "calls": call_costs(bundle, contexts, threads, repeats),
            "kernels": kernels, "block_size": b.manifest.block_size}


def scaled_bundle(root: Path) -> Path:
    """A random phone-shaped target (pocket tokenizer and vocab) plus a HyFlash drafter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hyflash.models import pocket
    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    out = root / "bundle"
    if (out / "manifest.json").exists():
        return out
    folder = root / "target"
    src = json.loads((pocket.path() / "config.json").read_text())
    cfg = LlamaConfig(vocab_size=src["vocab_size"], max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=src.get("bos_token_id"),
                      eos_token_id=src.get("eos_token_id"), **SCALED)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (pocket.path() / name).exists():
            shutil.copyfile(pocket.path() / name, folder / name)
    target = Target.from_pretrained(folder, dtype="float32")
    Drafter.for_target(target, "hyflash").save(root / "drafter")
    export_onnx_bundle(folder, root / "drafter", out, "fp32", target_graph="optimum")
    return out


def tau_for(speedup: float, call: dict) -> float:
    """The tau at which a round (one drafter call + one verify) yielding tau tokens beats
    plain decoding (one token per decode call) by `speedup`, prefill aside."""
    return speedup * (call["verify_ms"] + call["drafter_ms"]) / call["decode_ms"]


def markdown(results: dict) -> str:
    out = []
    for name, r in results.items():
        b = r["block_size"]
        out += [f"## {name}: `{r['bundle']}` (target KV: {r.get('target_graph', 'past_present')})",
                "",
                f"| context | ms decode (T=1) | ms verify (T={b}) | ms drafter call | "
                "verify / decode | drafter / verify | tau to break even | tau for 2x |",
                "|---|---|---|---|---|---|---|---|"]
        for c in r["calls"]:
            out.append(f"| {c['context']} | {c['decode_ms']:.2f} | {c['verify_ms']:.2f} | "
                       f"{c['drafter_ms']:.2f} | {c['verify_ms'] / c['decode_ms']:.2f} | "
                       f"{c['drafter_ms'] / c['verify_ms']:.2f} | "
                       f"{tau_for(1, c):.2f} | {tau_for(2, c):.2f} |")
        out += ["", "| graph (ORT profiler) | nodes | kernel ms | nodes < 5 us (their ms) | "
                "top op types (ms) |", "|---|---|---|---|---|"]
        for label, k in r["kernels"].items():
            top = ", ".join(f"{op} {ms:.2f}" for op, ms in k["top_ops"])
            out.append(f"| {label} | {k['nodes']} | {k['kernel_ms']:.2f} | {k['tiny_nodes']} "
                       f"({k['tiny_nodes_ms']:.2f}) | {top} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, required=True,
                   help="an ONNX bundle, either target graph form")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--scaled", action="store_true",
                   help="also profile a random phone-shaped target (exported once to --out)")
    p.add_argument("--contexts", default="64,1024")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=40)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    contexts = [int(c) for c in args.contexts.split(",")]
    results = {args.bundle.name: profile_bundle(args.bundle, contexts, args.threads, args.repeats)}
    if args.scaled:
        bundle = scaled_bundle(args.out / "bundles" / "scaled")
        results["scaled"] = profile_bundle(bundle, contexts, args.threads,
                                           max(5, args.repeats // 4))
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    md = markdown(results)
    (args.out / "profile.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
