"""The peers a user would pick instead, found or built once, or the reason they cannot run.

Everything lands in ``ROOT/peers/`` (ROOT: the suite's folder in the hyflash cache); a
step whose output exists is skipped. Built from the same Hugging Face folder our exports
read (for a GGUF target: the folder hyflash dequantized it into):

- transformers ``generate``, plain and with prompt-lookup decoding (in process, nothing
  to build);
- optimum: ``optimum-cli export onnx --task text-generation-with-past`` (fp32), and its
  model.onnx through our int4 recipe (so the int4 rows compare runtimes, not quantizers),
  run by ``ORTModelForCausalLM.generate``;
- onnxruntime-genai: its model builder (fp32, int4 with the builder's CPU defaults) in its
  own venv (``GENAI_PINS``; it needs transformers 5, the project pins < 4.58), plain and
  its n-gram speculative mode; its draft-model mode is *tried* with our drafter and the
  outcome reported (``genai_draft_attempt``);
- llama.cpp: ``hyflash.bench.llamacpp``.

``benchmarks/setup_baselines.py`` builds the SmolLM2 models of ``benchmarks/baselines.py``
the same way (same pins, same builder flags).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hyflash.bench.systems import Skipped, System

GENAI_PINS = ("onnxruntime-genai==0.18.0", "onnxruntime==1.32.0", "torch==2.13.0",
              "transformers==5.23.0", "onnx==1.23.2", "onnx-ir==1.1.0")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
PROMPT_LOOKUP = 10  # transformers' documented prompt_lookup_num_tokens example
GENAI_NGRAM = 3


def run_logged(cmd: list, log: Path, env: dict | None = None) -> str | None:
    """Run cmd with its output in log; None on success, else the reason (last line)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})})
    if done.returncode == 0:
        return None
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()] or ["?"]
    return f"{Path(str(cmd[2] if cmd[1] == '-m' else cmd[0])).name} failed: {lines[-1][:240]}"


def transformers_systems(hf_folder: Path) -> list[System]:
    return [System("transformers generate", "transformers", "peer", "fp32",
                   {"folder": str(hf_folder), "prompt_lookup": PROMPT_LOOKUP},
                   note=f"eager torch fp32; lookup = prompt_lookup_num_tokens={PROMPT_LOOKUP}")]


def optimum_systems(hf_folder: Path, root: Path, quants: list[str],
                    say=print) -> list[System | Skipped]:
    out: list[System | Skipped] = []
    fp32 = root / "peers" / "optimum-fp32"
    if not (fp32 / "model.onnx").is_file():
        say(f"exporting {hf_folder.name} with optimum-cli -> {fp32}")
        cli = Path(sys.executable).parent / "optimum-cli"
        why = run_logged([cli, "export", "onnx", "--model", hf_folder, "--task",
                          "text-generation-with-past", fp32], root / "peers" / "optimum.log",
                         OFFLINE)
        if why:
            return [Skipped(f"optimum ORTModelForCausalLM {q}", "peer", why) for q in quants]
    for q in quants:
        folder = fp32 if q == "fp32" else root / "peers" / f"optimum-{q}"
        if not (folder / "model.onnx").is_file():
            from hyflash.export.quantize import quantize

            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(fp32, tmp, ignore=shutil.ignore_patterns("model.onnx*"))
            quantize(q, fp32 / "model.onnx", tmp / "model.onnx")
            tmp.rename(folder)
        out.append(System(f"optimum ORTModelForCausalLM {q}", "optimum", "peer", q,
                          {"folder": str(folder)},
                          note="optimum-cli export" + ("" if q == "fp32" else
                                                       f", model.onnx through our {q} recipe")))
    return out


def genai_python(cache: Path, setup: bool, say=print) -> Path | str:
    py = cache / "venvs" / "genai" / "bin" / "python"
    stamp = py.parents[1] / "pins.txt"
    if py.is_file() and stamp.is_file() and stamp.read_text().split() == list(GENAI_PINS):
        return py
    if not setup:
        return (f"its venv ({py.parents[1]}) is missing: pass --setup-peers to create it "
                f"(pip install {' '.join(GENAI_PINS)})")
    say(f"creating the onnxruntime-genai venv at {py.parents[1]} (pip)")
    log = cache / "benchmarks" / "genai-venv.log"
    if not py.is_file():
        why = run_logged([sys.executable, "-m", "venv", py.parents[1]], log)
        if why:
            return why
    why = run_logged([py, "-m", "pip", "install", "--quiet", *GENAI_PINS], log)
    if why:
        return why
    stamp.write_text("\n".join(GENAI_PINS) + "\n")
    return py


def genai_systems(hf_folder: Path, root: Path, cache: Path, setup: bool,
                  say=print) -> list[System | Skipped]:
    py = genai_python(cache, setup, say)
    labels = {"fp32": "onnxruntime-genai fp32", "int4": "onnxruntime-genai int4"}
    if isinstance(py, str):
        return [Skipped(label, "peer", py) for label in labels.values()]
    out: list[System | Skipped] = []
    for q, label in labels.items():
        folder = root / "peers" / f"genai-{q}"
        if not (folder / "genai_config.json").is_file():
            say(f"building {label} with its model builder -> {folder}")
            why = run_logged([py, "-m", "onnxruntime_genai.models.builder", "-i", hf_folder,
                              "-o", folder, "-p", q, "-e", "cpu", "-c",
                              root / "peers" / "genai-cache"],
                             root / "peers" / f"genai-{q}.log", OFFLINE)
            if why:
                out.append(Skipped(label, "peer", why))
                continue
        out.append(System(label, "genai", "peer", q, {"folder": str(folder), "ngram": GENAI_NGRAM},
                          python=str(py),
                          note="its model builder's defaults (int4: accuracy_level 4, int8 "
                               "activations); lookup = its n-gram speculative mode, "
                               f"ngram_size {GENAI_NGRAM}, 7 drafts"))
    shutil.rmtree(root / "peers" / "genai-cache", ignore_errors=True)
    return out


def genai_draft_attempt(hf_folder: Path, drafter: Path, root: Path, cache: Path,
                        setup: bool) -> Skipped:
    """Ask genai's model builder to take our drafter as its speculative draft model (its
    block-drafter option, ``dflash2_path``) and report what it said."""
    label = "onnxruntime-genai speculative, our drafter as its draft model"
    py = genai_python(cache, setup)
    if isinstance(py, str):
        return Skipped(label, "peer", py)
    out = root / "peers" / "genai-draft-attempt"
    log = root / "peers" / "genai-draft-attempt.log"
    if out.exists() and (out / "genai_config.json").is_file():
        cfg = (out / "genai_config.json").read_text()
        return Skipped(label, "peer", "its builder wrote a model" + (
            " with a draft section, not run by this bench" if "dflash2" in cfg else
            f" but ignored the drafter (no draft section in genai_config.json; log {log})"))
    why = run_logged([py, "-m", "onnxruntime_genai.models.builder", "-i", hf_folder, "-o", out,
                      "-p", "fp32", "-e", "cpu", "-c", root / "peers" / "genai-cache",
                      "--extra_options", f"dflash2_path={drafter}", "use_paged_attention=true"],
                     log, OFFLINE)
    shutil.rmtree(root / "peers" / "genai-cache", ignore_errors=True)
    if why:
        return Skipped(label, "peer", f"tried (builder --extra_options dflash2_path=<our "
                                      f"drafter>): {why}")
    return genai_draft_attempt(hf_folder, drafter, root, cache, setup)
