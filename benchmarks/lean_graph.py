"""What the lean target graph saves: ms per target call of the two ONNX target forms.

    python benchmarks/lean_graph.py --out benchmarks/results [--work /tmp/lean-graph] \
        [--models pocket,smollm2] [--quants fp32,int4] [--threads 1,2] \
        [--contexts 64,1024] [--repeats 15]

For each model it exports one bundle per target graph form (``--target-graph optimum``:
past/present KV as explicit I/O, concatenated and copied every call; ``lean``: static
KV buffers updated in place by GroupQueryAttention, fused rotary and norms) and times,
through the runtime backends the simulation uses, at each context length:

- decode: T=1 calls back to back (plain decoding);
- verify: T=8 calls, every draft accepted (the context advances by 8);
- verify after rollback: T=8 after rolling back 4 positions (half the drafts rejected,
  the usual case: the optimum form must copy its cache down to the kept length);
- prefill of the context itself (one call).

The two forms alternate call by call, so load from other processes hits both alike;
every figure is the median over ``--repeats`` calls after two warm-ups. The torch Target
(eager, 1 thread, static cache) is timed as the reference. Models: the pocket model, and
a randomly initialised target of SmolLM2-135M's shape (llama, vocab 49152, hidden 576,
intermediate 1536, 30 layers, 9/3 heads, head_dim 64, tied embeddings, context 2048:
0.13 B parameters, 540 MB fp32; random weights time like trained ones). Writes
``lean_graph.md`` and ``lean_graph.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
               num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5,
               rope_theta=100000.0)
FORMS = ("optimum", "lean")
BLOCK = 8


def model_folders(name: str, work: Path) -> tuple[Path, Path]:
    """(target folder, drafter folder): the pocket pair, or a random SmolLM2-shaped
    target with a random HyFlash drafter (only the target is timed)."""
    from hyflash.models import pocket

    if name == "pocket":
        return pocket.path(), pocket.drafter_path()
    folder, drafter = work / name / "target", work / name / "drafter"
    if not (drafter / "config.json").exists():
        from transformers import LlamaConfig, LlamaForCausalLM

        from hyflash.models.drafter import Drafter
        from hyflash.models.target import Target

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(head_dim=64, **SMOLLM2)).save_pretrained(folder)
        Drafter.for_target(Target.from_pretrained(folder), "hyflash",
                           num_layers=1).save(drafter)
    return folder, drafter


def bundles(name: str, work: Path, quant: str) -> dict[str, Path]:
    """One bundle per target graph form: exported at fp32 once, requantized from it for
    another recipe; reused by later runs."""
    from hyflash.export.bundle import export_onnx_bundle, requantize_bundle

    folder, drafter = model_folders(name, work)
    out = {}
    for form in FORMS:
        fp32 = work / name / f"bundle-{form}"
        out[form] = fp32 if quant == "fp32" else work / name / f"bundle-{form}-{quant}"
        t0 = time.perf_counter()
        if not (fp32 / "manifest.json").exists():
            export_onnx_bundle(folder, drafter, fp32, "fp32", progress=False,
                               target_graph=form)
        if not (out[form] / "manifest.json").exists():
            requantize_bundle(fp32, quant, out[form])
        print(f"{name}: the {form} {quant} bundle took {time.perf_counter() - t0:.0f} s",
              flush=True)
    return out


def interleaved(targets: dict, tokens: torch.Tensor, start: int, back: int,
                repeats: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) ms of one call of each target over tokens, medians, alternating
    targets call by call; each call starts where its target's cache ends, minus `back`
    positions. CPU time is the process's (all its threads): other processes do not
    inflate it, so on a shared machine it is the steadier measure of the work."""
    wall, cpu = ({k: [] for k in targets} for _ in range(2))
    for t in targets.values():
        t.rollback(start)
    for _ in range(repeats + 2):
        for k, t in targets.items():
            pos = max(start, t.length - back)
            t.rollback(pos)
            t0, c0 = time.perf_counter(), time.process_time()
            t.forward(tokens, pos)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: (1000 * statistics.median(wall[k][2:]), 1000 * statistics.median(cpu[k][2:]))
            for k in targets}


def measure(name: str, work: Path, quant: str, threads: list[int], contexts: list[int],
            repeats: int) -> list[dict]:
    from hyflash.models.target import Target
    from hyflash.runtime import TorchTarget
    from hyflash.runtime.onnx_backend import load_onnx_pair

    paths = bundles(name, work, quant)
    folder, _ = model_folders(name, work)
    reference = TorchTarget(Target.from_pretrained(folder))
    rows = []
    rng = np.random.default_rng(0)
    for n in threads:
        targets = {form: load_onnx_pair(path, threads=n, verify_hashes=False)[1]
                   for form, path in paths.items()}
        if n == 1 and quant == "fp32":
            targets["torch"] = reference
        for ctx in contexts:
            prompt = torch.from_numpy(rng.integers(1, targets["lean"].vocab_size, ctx))
            prefill = {}
            for k, t in targets.items():
                t0 = time.perf_counter()
                t.forward(prompt, 0)
                prefill[k] = (1000 * (time.perf_counter() - t0),) * 2
            calls = {"decode": interleaved(targets, prompt[:1], ctx, 0, repeats),
                     "verify": interleaved(targets, prompt[:BLOCK], ctx, 0, repeats),
                     "verify_rollback": interleaved(targets, prompt[:BLOCK], ctx, BLOCK // 2,
                                                    repeats),
                     "prefill": prefill}
            for form in targets:
                row = {"model": name, "quant": quant, "threads": n, "context": ctx, "form": form,
                       **{f"{c}_ms": round(v[form][0], 3) for c, v in calls.items()},
                       **{f"{c}_cpu_ms": round(v[form][1], 3) for c, v in calls.items()
                          if c != "prefill"}}
                row["verify_per_decode"] = round(row["verify_ms"] / row["decode_ms"], 2)
                row["verify_per_decode_cpu"] = round(row["verify_cpu_ms"] / row["decode_cpu_ms"],
                                                     2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    out = ["# Lean vs optimum target graph: ms per target call", "",
           f"`{command}`; medians over the repeats, the forms alternating call by "
           "call. Each cell: wall ms (CPU ms of the process, all threads). Other "
           "processes inflate wall time but not CPU time; at 1 thread CPU time is the "
           "call's cost on a quiet machine.",
           "", "| model | quant | threads | context | form | decode T=1 | verify T=8 | "
           "verify T=8 after rollback 4 | verify / decode | prefill | lean speedup "
           "(decode, verify) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    key = ("model", "quant", "threads", "context")
    base = {tuple(r[k] for k in key): r for r in rows if r["form"] == "optimum"}
    for r in rows:
        b = base[tuple(r[k] for k in key)]
        gain = ", ".join(f"{ratio(b, r, c)} ({ratio(b, r, c + '_cpu')})"
                         for c in ("decode", "verify")) if r["form"] == "lean" else ""
        cells = " | ".join(f"{r[f'{c}_ms']:.2f} ({r[f'{c}_cpu_ms']:.2f})"
                           for c in ("decode", "verify", "verify_rollback"))
        out.append(f"| {r['model']} | {r['quant']} | {r['threads']} | {r['context']} | "
                   f"{r['form']} | {cells} | "
                   f"{r['verify_per_decode']:.2f} ({r['verify_per_decode_cpu']:.2f}) | "
                   f"{r['prefill_ms']:.0f} | {gain} |")
    return "\n".join(out) + "\n"


def ratio(base: dict, row: dict, call: str) -> str:
    return f"{base[f'{call}_ms'] / row[f'{call}_ms']:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--work", type=Path, default=Path("/tmp/hyflash-lean-graph"))
    p.add_argument("--models", default="pocket,smollm2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--contexts", default="64,1024")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--quants", default="fp32", help="recipes, e.g. fp32,int4")
    a = p.parse_args()
    torch.set_num_threads(1)
    threads = [int(x) for x in a.threads.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    rows = []
    for name in a.models.split(","):
        for quant in a.quants.split(","):
            rows += measure(name, a.work, quant, threads, contexts, a.repeats)
    command = "python benchmarks/lean_graph.py " + " ".join(
        f"--{k} {getattr(a, k)}" for k in ("models", "quants", "threads", "contexts", "repeats"))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "lean_graph.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "lean_graph.md").write_text(markdown(rows, command))
    print(markdown(rows, command))


if __name__ == "__main__":
    main()
