"""Core ML package sizes per recipe and conversion time, pocket pair and SmolLM2-135M.

    python benchmarks/setup_models.py          # the SmolLM2 GGUF, once
    python benchmarks/coreml_sizes.py --out benchmarks/results [--pairs pocket,smollm2] \
        [--work ~/.cache/hyflash/benchmarks/coreml_sizes]

For each pair, at context 2048 (the KV cache is not stored in a package: its size does not
depend on the context):

- ``export_coreml_bundle`` fp16 with the KV cache as Core ML state (iOS 18): the whole
  export (load, torch.export + ct.convert of the three packages, save), wall and CPU
  time of this process (torch 1 thread; coremltools' passes are single-threaded Python);
- int8 and int4 with ``requantize_coreml_bundle`` from that bundle (quantize + save);
- for the pocket pair also fp16 and int8 with explicit KV I/O (iOS 17);
- bytes on disk of each package (and of its weight.bin), and of the bundle;
- float16 headroom of the target, from a float32 torch forward over 256 tokens of this
  repository's source: the largest |value| of the residual stream, of the MLP's
  gate * up product, of the logits and features. Core ML computes in float16 (max 65504):
  the one numeric risk of the conversion that can be sized without a Mac. Then the
  converted program run in float16 in torch against float32 (argmax agreement, largest
  logit difference), with the float16-safe RMSNorm the export uses and with the plain one.

SmolLM2's drafter: the lean-drafter benchmark's freshly initialised full-vocabulary
drafter (seed 0; sizes and conversion time do not depend on training), made here if
missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

GGUF = Path.home() / ".cache/hyflash/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LEAN_DRAFTER = Path.home() / ".cache/hyflash/benchmarks/lean_drafter/drafter-full"
CONTEXT = 2048
ROLES = ("target", "drafter_step", "drafter_commit")


def smollm2_drafter(work: Path) -> tuple[Path, str]:
    if (LEAN_DRAFTER / "config.json").exists():
        return LEAN_DRAFTER, "lean_drafter benchmark's random drafter (seed 0)"
    import torch

    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    folder = work / "drafter-smollm2"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        Drafter.for_target(Target.from_pretrained(str(GGUF), max_seq_len=CONTEXT)).save(folder)
    return folder, "random drafter made here (seed 0)"


def timed(fn, *args, **kwargs) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() \
        else path.stat().st_size


def sizes(bundle: Path) -> dict:
    from hyflash.bundle import read_bundle

    b = read_bundle(bundle, verify_hashes=False)
    out = {role: {"package_bytes": du(b.path(role)),
                  "weights_bytes": du(b.path(role) / "Data/com.apple.CoreML/weights")}
           for role in ROLES}
    out["bundle_bytes"] = du(bundle)
    return out


def headroom(target_path: str) -> dict:
    """Largest |values| of a float32 forward that Core ML will compute in float16, and the
    converted program itself run in float16 in torch (what Core ML's float16 arithmetic
    approximates: same ops, float16 storage) against float32: argmax agreement and the
    largest logit difference, with the float16-safe RMSNorm and with the plain glue's."""
    import torch

    from hyflash.export.coreml_modules import TargetForCoreML
    from hyflash.export.executorch_modules import ProgramTarget
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.models.tokenizer import load_tokenizer

    class PlainNorm(TargetForCoreML):
        norm = ProgramTarget.norm

    folder = resolve_model_folder(target_path)
    target = Target.from_pretrained(folder, max_seq_len=CONTEXT)
    text = (Path(__file__).resolve().parents[1] / "hyflash/models/target.py").read_text()
    ids = torch.tensor([load_tokenizer(folder)(text).input_ids[:256]])
    peak = {"residual": 0.0, "mlp_product": 0.0}

    def watch(key):
        def hook(_module, inputs, output):
            value = inputs[0] if key == "mlp_product" else output[0]
            peak[key] = max(peak[key], value.abs().max().item())
        return hook

    for layer in target.layers:
        layer.register_forward_hook(watch("residual"))
        layer.mlp.down_proj.register_forward_hook(watch("mlp_product"))
    with torch.no_grad():
        logits, features = target(ids)
    out = {**peak, "logits": logits.abs().max().item(),
           "features": features.abs().max().item(), "tokens": ids.shape[1]}
    for name, cls in (("fp16_safe_norm", TargetForCoreML), ("fp16_plain_norm", PlainNorm)):
        model = cls(Target.from_pretrained(folder, max_seq_len=CONTEXT), "state").half()
        torch.set_default_dtype(torch.float16)  # the glue's own constants (mask, ...)
        try:
            with torch.no_grad():
                got = model(ids, torch.tensor([0]))[0].float()
        finally:
            torch.set_default_dtype(torch.float32)
        out[name] = {"argmax_agreement": (got.argmax(-1) == logits.argmax(-1)).float()
                     .mean().item(),
                     "max_logit_diff": (got - logits).nan_to_num(1e9).abs().max().item()}
    return out


def measure(name: str, target: str, drafter: str, work: Path, io_too: bool) -> dict:
    import torch

    from hyflash.export.coreml_bundle import export_coreml_bundle, requantize_coreml_bundle

    torch.set_num_threads(1)
    rows, base = {}, work / f"{name}-fp16"
    for folder in work.glob(f"{name}-*"):
        shutil.rmtree(folder)
    wall, cpu = timed(export_coreml_bundle, target, drafter, base, "fp16", "state",
                      max_seq_len=CONTEXT, progress=False)
    rows["fp16 state (iOS 18)"] = {"step": "export", "wall_s": wall, "cpu_s": cpu,
                                   **sizes(base)}
    for quant in ("int8", "int4"):
        out = work / f"{name}-{quant}"
        wall, cpu = timed(requantize_coreml_bundle, base, quant, out)
        rows[f"{quant} state (iOS 18)"] = {"step": "requantize", "wall_s": wall, "cpu_s": cpu,
                                           **sizes(out)}
    if io_too:
        for quant in ("fp16", "int8"):
            out = work / f"{name}-io-{quant}"
            wall, cpu = timed(export_coreml_bundle, target, drafter, out, quant, "io",
                              max_seq_len=CONTEXT, progress=False)
            rows[f"{quant} io (iOS 17)"] = {"step": "export", "wall_s": wall, "cpu_s": cpu,
                                            **sizes(out)}
    return rows


def table(results: dict) -> str:
    mb = 1e6
    lines = ["| pair | recipe, KV | target MB | drafter MB | drafter commit MB | bundle MB | "
             "vs fp16 | time s (wall / CPU) |", "|---|---|---|---|---|---|---|---|"]
    for pair, r in results["pairs"].items():
        fp16 = r["recipes"]["fp16 state (iOS 18)"]["bundle_bytes"]
        for recipe, row in r["recipes"].items():
            lines.append(
                f"| {pair} | {recipe} | {row['target']['package_bytes'] / mb:.1f} | "
                f"{row['drafter_step']['package_bytes'] / mb:.1f} | "
                f"{row['drafter_commit']['package_bytes'] / mb:.2f} | "
                f"{row['bundle_bytes'] / mb:.1f} | {row['bundle_bytes'] / fp16:.2f} | "
                f"{row['step']} {row['wall_s']:.0f} / {row['cpu_s']:.0f} |")
    lines += ["", "| pair | drafter | max abs residual | max abs MLP gate*up | max abs logit | "
                  "max abs feature | float16 run: argmax agreement, max logit diff | same, "
                  "plain RMSNorm |", "|---|---|---|---|---|---|---|---|"]
    for pair, r in results["pairs"].items():
        h = r["float16_headroom"]
        safe, plain = h["fp16_safe_norm"], h["fp16_plain_norm"]
        lines.append(f"| {pair} | {r['drafter_note']} | {h['residual']:.0f} | "
                     f"{h['mlp_product']:.0f} | {h['logits']:.1f} | {h['features']:.0f} | "
                     f"{safe['argmax_agreement']:.3f}, {safe['max_logit_diff']:.3f} | "
                     f"{plain['argmax_agreement']:.3f}, {plain['max_logit_diff']:.3g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", default="pocket,smollm2")
    ap.add_argument("--work", type=Path,
                    default=Path.home() / ".cache/hyflash/benchmarks/coreml_sizes")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = {"context": CONTEXT, "pairs": {}}
    for pair in args.pairs.split(","):
        if pair == "pocket":
            target, drafter, note = "pocket", "pocket", "shipped pocket drafter (trained)"
        else:
            target = str(GGUF)
            drafter, note = smollm2_drafter(args.work)
            drafter = str(drafter)
        results["pairs"][pair] = {
            "drafter_note": note, "float16_headroom": headroom(target),
            "recipes": measure(pair, target, drafter, args.work, io_too=pair == "pocket")}
        print(json.dumps(results["pairs"][pair], indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coreml_sizes.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "coreml_sizes.md").write_text(
        f"# Core ML package sizes (context {CONTEXT})\n\n"
        "`python benchmarks/coreml_sizes.py --out benchmarks/results` (sizes in MB = 1e6 "
        "bytes; times on a shared 2-core machine with other jobs running, torch 1 thread: "
        "the process's CPU time is the comparable number, wall time depends on the load)"
        "\n\n" + table(results))
    print(table(results))


if __name__ == "__main__":
    main()
