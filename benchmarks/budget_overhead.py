"""Measure what each runtime costs besides the model: the data `hyflash budget` sizes with.

    python benchmarks/budget_overhead.py --out hyflash/budget/data/runtime.json \
        [--work ~/.cache/hyflash/benchmarks/budget_overhead] [--skip-executorch]

Writes ``hyflash/budget/data/runtime.json`` (``hyflash.budget.runtime_costs`` reads it),
with this command, the library versions and the raw readings. Every reading is VmRSS /
VmHWM of a fresh child process (``/proc/self/status``), so nothing else counts:

- ``library_mib``: the runtime library plus a session of a trivial graph over a baseline
  process (Python + numpy; + torch and torchao for ExecuTorch, whose Python binding
  imports them anyway): what the library adds, the closest desktop proxy of the phone's;
- ``desktop_process_mib``: a process with exactly the imports `hyflash budget --measure`'s
  child makes (``hyflash.budget.measure.import_runtime``) plus a trivial session;
- ``session_mib``: each further trivial ONNX Runtime session (three sessions less one,
  halved); ExecuTorch runs one program;
- ``weights_factor`` per recipe: a calibration model (hidden 512, 8 layers, vocabulary
  32000, random weights: unlike the pocket model and SmolLM2, which `--measure` then checks
  out of sample) exported with our own exporters; its resident set after opening, less the
  process before, the trivial session and the further sessions (and on ExecuTorch the
  embedding and the KV cache the program allocates), over the weights the budget models
  at factor 1;
- ``load_transient_factor``: (VmHWM - VmRSS) after opening, over the target's weights;
- ``run_mib``: after a short speculative run (a 200-token prompt, 16 new tokens), what the
  resident set grew beyond the budget's terms for it: median over the calibration bundles;
  ``run_weights_factor``: a recipe whose run grew by more than a fifth of its weights
  beyond that median, as bytes per weight byte (ONNX Runtime's int8).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

MIB = 2 ** 20
WORK = Path.home() / ".cache/hyflash/benchmarks/budget_overhead"
SHAPE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
             tie_word_embeddings=True, bos_token_id=None, eos_token_id=1)
RECIPES = {"onnx": ("fp32", "int8", "int4"), "executorch": ("fp32", "8da4w")}
RUN_PROMPT, RUN_NEW = 200, 16


def status() -> dict[str, int]:
    from hyflash.budget.measure import status as read

    return read()


# --------------------------------------------------------------------- children

def trivial_onnx(work: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    path = work / "trivial.onnx"
    if not path.exists():
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
        one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "g", [x], [y],
                                  [one])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                  str(path))
    return path


def trivial_pte(work: Path) -> Path:
    path = work / "trivial.pte"
    if not path.exists():
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        class AddOne(torch.nn.Module):
            def forward(self, x):
                return x + 1

        ep = torch.export.export(AddOne(), (torch.zeros(1, 4),))
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        path.write_bytes(program.to_executorch().buffer)
    return path


def open_trivial(backend: str, work: Path) -> None:
    import numpy as np

    if backend == "onnx":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        s = ort.InferenceSession(str(trivial_onnx(work)), opts, providers=["CPUExecutionProvider"])
        s.run(None, {"x": np.zeros((1, 4), np.float32)})
        return
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(trivial_pte(work)).load_method("forward")
    method.execute([torch.zeros(1, 4)])


def child(kind: str, arg: str, work: Path) -> dict:
    if kind == "baseline":  # python + numpy (+ what the ExecuTorch binding imports anyway)
        import numpy  # noqa: F401

        if arg == "executorch":
            import torch  # noqa: F401
            import torchao  # noqa: F401
        return status()
    if kind in ("library", "library3"):
        child("baseline", arg, work)
        for _ in range(3 if kind == "library3" else 1):
            open_trivial(arg, work)
        return status()
    if kind == "desktop":
        from hyflash.budget.measure import import_runtime

        import_runtime(arg)
        open_trivial(arg, work)
        return status()
    # kind == "bundle": the process before and after opening it, and after a short run
    import numpy as np

    from hyflash.budget.measure import import_runtime
    from hyflash.bundle import read_bundle
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.open_bundle import open_bundle

    import_runtime(read_bundle(arg, verify_hashes=False).manifest.backend)
    before = status()
    _, target, drafter = open_bundle(arg, threads=1)
    opened = status()
    prompt = np.random.default_rng(0).integers(3, target.vocab_size - 1, RUN_PROMPT).tolist()
    out = SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=RUN_NEW, eos_ids=[])
    return {"before": before, "open": opened, "run": status(),
            "kv_positions": RUN_PROMPT + out.stats.new_tokens + drafter.block_size}


def spawn(kind: str, arg: str, work: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind, arg, "--work", str(work)],
                          capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"child {kind} {arg} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------- calibration model

def calibration_bundles(work: Path, backends: list[str]) -> dict[tuple[str, str], Path]:
    """The calibration pair exported with every recipe of each backend."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from hyflash.export.bundle import export_onnx_bundle, requantize_bundle
    from hyflash.export.executorch_bundle import export_executorch_bundle
    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    folder, drafter = work / "target", work / "drafter"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**SHAPE)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        words = ["[UNK]", "<eos>"] + [f"w{i}" for i in range(SHAPE["vocab_size"] - 2)]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                             eos_token="<eos>").save_pretrained(folder)
    if not (drafter / "config.json").exists():
        torch.manual_seed(0)
        Drafter.for_target(Target.from_pretrained(folder)).save(drafter)
    out = {}
    for backend in backends:
        for quant in RECIPES[backend]:
            b = work / f"bundle-{backend}-{quant}"
            if not (b / "manifest.json").exists():
                print(f"exporting {b.name}", flush=True)
                if backend == "executorch":
                    export_executorch_bundle(folder, drafter, b, quant, progress=False)
                elif quant == "fp32":
                    export_onnx_bundle(folder, drafter, b, "fp32", progress=False)
                else:
                    requantize_bundle(work / "bundle-onnx-fp32", quant, b)
            out[backend, quant] = b
    return out


def factors(bundle: Path, reading: dict, costs: dict) -> dict:
    """Weights factor, load transient and the run's unexplained bytes of one bundle."""
    from dataclasses import replace

    from hyflash.budget.measure_report import checkpoints
    from hyflash.budget.memory import budget
    from hyflash.budget.plan import for_bundle
    from hyflash.budget.runtime_costs import RuntimeCosts
    from hyflash.budget.sources import resolve

    src = resolve(str(bundle))
    p = for_bundle(src)
    unit = RuntimeCosts(backend=p.runtime.backend, library_bytes=0, desktop_process_bytes=0,
                        session_bytes=costs["session"], run_bytes=0,
                        weights_factor={p.recipe.name: 1.0, "fp32": 1.0},
                        load_transient_factor=0.0, embedding_mapped=p.runtime.embedding_mapped)
    plan = replace(p, runtime=unit, desktop=True, prefill=RUN_PROMPT,
                   kv_positions=None if src.backend == "executorch" else
                   min(p.context, reading["kv_positions"]))
    b = budget(plan)
    _, (_, _, at_open), (_, _, at_run) = checkpoints(b, src)
    scaled_keys = ("target.layers", "target.lm_head", "drafter.weights", "drafter.head")
    scaled = sum(b.term(k).resident for k in scaled_keys if k in at_open)
    fixed = sum(t.resident for t in b.terms if t.key in at_open and t.key not in scaled_keys)
    grown = reading["open"]["VmRSS"] - costs["desktop"] - fixed
    factor = grown / scaled
    target = (b.term("target.layers").resident + b.term("target.lm_head").resident) * factor
    transient = max(reading["open"]["VmHWM"] - reading["open"]["VmRSS"], 0) / target
    modelled_run = sum(t.resident for t in b.terms if t.key in at_run and t.key != "load")
    run = reading["run"]["VmHWM"] - reading["open"]["VmRSS"] - modelled_run
    return {"weights_factor": factor, "load_transient_factor": transient, "run_bytes": run,
            "weights_bytes": scaled}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("hyflash/budget/data/runtime.json"))
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--skip-executorch", action="store_true")
    p.add_argument("--repeats", type=int, default=3, help="readings per quantity (median)")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(child(*args.child, args.work)))
        return
    backends = ["onnx"] + ([] if args.skip_executorch else ["executorch"])
    bundles = calibration_bundles(args.work, backends)

    def median(kind, arg, key):
        values = sorted(spawn(kind, arg, args.work)[key] for _ in range(args.repeats))
        return values[len(values) // 2]

    result = {"format": 1, "about": __doc__.split("\n\n")[2].strip(),
              "command": "python " + " ".join(sys.argv),
              "machine": f"{platform.machine()} {platform.system()} {platform.release()}, "
                         f"Python {platform.python_version()}",
              "versions": versions(), "backends": {}, "readings": {}}
    for backend in backends:
        base = median("baseline", backend, "VmRSS")
        lib = median("library", backend, "VmRSS")
        session = (median("library3", backend, "VmRSS") - lib) // 2 if backend == "onnx" else 0
        desktop = median("desktop", backend, "VmRSS")
        costs = {"session": max(session, 0), "desktop": desktop}
        fits = {}
        for (be, quant), bundle in bundles.items():
            if be != backend:
                continue
            readings = sorted((spawn("bundle", str(bundle), args.work)
                               for _ in range(args.repeats)), key=lambda r: r["run"]["VmHWM"])
            reading = readings[len(readings) // 2]
            fits[quant] = factors(bundle, reading, costs)
            result["readings"][f"{backend}-{quant}"] = reading
            print(backend, quant, fits[quant], flush=True)
        runs = sorted(f["run_bytes"] for f in fits.values())
        run = max(runs[len(runs) // 2], 0)
        # a recipe whose first calls add far more than the others': proportional to weights
        unpack = {q: round((f["run_bytes"] - run) / f["weights_bytes"], 3)
                  for q, f in fits.items() if f["run_bytes"] - run > 0.2 * f["weights_bytes"]}
        entry = {"library_mib": round((lib - base) / MIB, 1),
                 "desktop_process_mib": round(desktop / MIB, 1),
                 "session_mib": round(costs["session"] / MIB, 1),
                 "run_mib": round(run / MIB, 1), "run_weights_factor": unpack,
                 "weights_factor": {q: round(f["weights_factor"], 3) for q, f in fits.items()},
                 "load_transient_factor": round(max(f["load_transient_factor"]
                                                    for f in fits.values()), 3)}
        result["backends"][backend] = entry
        result["readings"][backend] = {"baseline": base, "library": lib, "desktop": desktop,
                                       "session": costs["session"],
                                       "fits": {q: {k: round(v, 4) for k, v in f.items()}
                                                for q, f in fits.items()}}
        print(backend, entry, flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {args.out}")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("onnxruntime", "executorch", "torch", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
