"""What the lean drafter saves on SmolLM2-135M: shared weights and a reduced draft vocabulary.

    python benchmarks/setup_models.py          # the SmolLM2 GGUF, once
    python benchmarks/lean_drafter.py --out benchmarks/results [--work /tmp/lean-drafter] \
        [--data DISTILL_DATA_FOLDER] [--draft-vocab 8192] [--quants fp32,int4] [--repeats 30]

Two drafters for the real SmolLM2-135M-Instruct target (GGUF), same random weights
(costs and sizes do not depend on training; tau does, and is reported by the training
run): the full-vocabulary one, and one scoring ``--draft-vocab`` ids, the most frequent
in the self-distillation data folder ``--data`` (``hyflash train`` writes it; without
it the first ids are used, which times the same). Each is exported with the lean target
at context 2048, fp32 and int4, and measured in a fresh process per configuration:

- bundle size on disk, and what it would be with every shared weight stored per graph
  (the bundle before ``shared_weights``);
- peak RSS after opening the pair and generating 64 tokens, from the bundle as it is,
  and from a copy whose graphs each hold their own copy of every weight (the layout
  before ``shared_weights``, made here with onnx.load + onnx.save);
- ms per drafter step call (commit 8 rows + draft), per target verify (T=8) and decode
  (T=1) at ~300 tokens of context, medians over ``--repeats`` calls, calls interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GGUF = Path.home() / ".cache/hyflash/models/SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXT = 2048


def make_drafters(work: Path, data: Path | None, draft_vocab: int) -> dict[str, Path]:
    import torch

    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    out = {"full": work / "drafter-full", f"dv{draft_vocab}": work / f"drafter-dv{draft_vocab}"}
    if all((p / "config.json").exists() for p in out.values()):
        return out
    target = Target.from_pretrained(str(GGUF), max_seq_len=CONTEXT)
    for name, folder in out.items():
        torch.manual_seed(0)
        d = Drafter.for_target(target, draft_vocab=0 if name == "full" else draft_vocab)
        if d.draft_head is not None:
            ids = torch.arange(draft_vocab)
            if data is not None:
                from hyflash.train.data import DistillSet

                ids = DistillSet(data).draft_vocabulary(draft_vocab, target.cfg.vocab_size)
            d.draft_head.set_ids(ids)
        d.save(folder)
    return out


def export(work: Path, drafters: dict[str, Path], quants: list[str]) -> dict[str, Path]:
    from hyflash.export.bundle import export_onnx_bundle, requantize_bundle

    bundles = {}
    for name, folder in drafters.items():
        fp32 = work / f"bundle-{name}-fp32"
        if not (fp32 / "manifest.json").exists():
            export_onnx_bundle(str(GGUF), folder, fp32, "fp32", max_seq_len=CONTEXT,
                               target_graph="lean")
        for quant in quants:
            b = work / f"bundle-{name}-{quant}"
            if quant != "fp32" and not (b / "manifest.json").exists():
                requantize_bundle(fp32, quant, b)
            bundles[f"{name}-{quant}"] = b
    return bundles


def sizes(bundle: Path) -> dict:
    from hyflash.bundle import read_bundle

    m = read_bundle(bundle, verify_hashes=False).manifest
    on_disk = sum(e.bytes for e in m.files.values())
    per_graph = on_disk + sum((len(w.roles) - 1) * w.bytes for w in m.shared_weights.values())
    return {"bundle_mb": round(on_disk / 1e6, 1), "unshared_bundle_mb": round(per_graph / 1e6, 1)}


def per_graph_copy(bundle: Path) -> Path:
    """A copy of bundle whose graphs hold every weight themselves (no shared files)."""
    import shutil

    import onnx

    from hyflash.bundle import MANIFEST, file_table, read_bundle, seal

    out = bundle.with_name(bundle.name + "-pergraph")
    if not (out / MANIFEST).exists():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(bundle, out)
        for model in read_bundle(bundle, verify_hashes=False).manifest.models.values():
            onnx.save_model(onnx.load(str(bundle / model.file)), str(out / model.file))
        shutil.rmtree(out / "shared")
        data = json.loads((out / MANIFEST).read_text())
        data.pop("shared_weights")
        data["files"] = {n: e.to_dict() for n, e in file_table(out).items()}
        (out / MANIFEST).write_text(json.dumps(seal(data)))
    return out


def child(bundle: str, repeats: int) -> dict:
    """Runs in its own process: peak RSS of one configuration, and call costs."""
    import numpy as np
    import torch

    from hyflash.runtime import SpeculativeEngine
    from hyflash.runtime.onnx_backend import load_onnx_pair
    from hyflash.runtime.stats import peak_rss_mib

    _, target, drafter = load_onnx_pair(bundle, threads=1, verify_hashes=False)
    prompt = np.random.default_rng(0).integers(100, 20000, 300).tolist()
    SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=64)
    rss = peak_rss_mib()  # VmHWM: ru_maxrss would count the parent's at fork
    times = {"draft": [], "verify": [], "decode": []}
    target.rollback(0)
    drafter.reset()
    _, feats = target.forward(torch.tensor(prompt), 0)
    drafter.commit(feats)
    drafter.draft(5, len(prompt))  # runs the pending commits
    pos = len(prompt)
    rows = torch.zeros(8, drafter.feature_size)
    for _ in range(repeats):  # the three calls interleaved; the context stays ~300
        t0 = time.perf_counter()
        drafter.commit(rows)
        drafter.draft(5, pos + 8)
        times["draft"].append(time.perf_counter() - t0)
        drafter.reset()  # back to the same position every time, its commits done
        drafter.commit(feats)
        drafter.draft(5, pos)
        t0 = time.perf_counter()
        target.forward(torch.full((8,), 5), pos)
        times["verify"].append(time.perf_counter() - t0)
        target.rollback(pos)
        t0 = time.perf_counter()
        target.forward(torch.tensor([5]), pos)
        times["decode"].append(time.perf_counter() - t0)
        target.rollback(pos)
    return {"peak_rss_mib": round(rss),
            **{f"{k}_ms": round(1e3 * statistics.median(v), 2) for k, v in times.items()}}


def measure(bundle: Path, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(bundle), "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                                                                    "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{bundle.name}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rows: list[dict], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "lean_drafter.json").write_text(json.dumps(rows, indent=1))
    lines = ["# Lean drafter on SmolLM2-135M-Instruct: shared weights, reduced draft vocabulary",
             "", f"`{command}`", "",
             "Peak RSS after opening the pair and generating 64 tokens; call costs at ~300 "
             "tokens of context, medians, 1 thread, calls interleaved. 'per-graph' = every "
             "shared weight stored / loaded by each graph that uses it (before "
             "shared_weights).", "",
             "| bundle | size MB | per-graph size MB | peak RSS MiB | per-graph RSS MiB | "
             "drafter ms | verify ms (T=8) | decode ms | drafter / verify | verify / decode |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bundle']} | {r['bundle_mb']} | {r['unshared_bundle_mb']} | "
                     f"{r['shared']['peak_rss_mib']} | {r['unshared']['peak_rss_mib']} | "
                     f"{r['shared']['draft_ms']} | {r['shared']['verify_ms']} | "
                     f"{r['shared']['decode_ms']} | "
                     f"{r['shared']['draft_ms'] / r['shared']['verify_ms']:.2f} | "
                     f"{r['shared']['verify_ms'] / r['shared']['decode_ms']:.2f} |")
    (out / "lean_drafter.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--work", type=Path, default=Path("/tmp/lean-drafter"))
    p.add_argument("--data", type=Path, default=None,
                   help="a self-distillation data folder (shard*.json), to pick the ids")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--quants", default="fp32,int4")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return
    if not GGUF.exists():
        raise SystemExit(f"no {GGUF}: run `python benchmarks/setup_models.py` first")
    args.work.mkdir(parents=True, exist_ok=True)
    drafters = make_drafters(args.work, args.data, args.draft_vocab)
    bundles = export(args.work, drafters, args.quants.split(","))
    rows = []
    for name, bundle in bundles.items():
        row = {"bundle": name, **sizes(bundle)}
        row["shared"] = measure(bundle, args.repeats)
        row["unshared"] = measure(per_graph_copy(bundle), args.repeats)
        rows.append(row)
        print(row, flush=True)
    report(rows, args.out, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
