"""What each `hyflash bench` suite measures.

- ``quick``: the pocket pair in seconds (what the test suite runs): one ONNX int4 bundle
  (the demo's export spec: a shared ``--work`` folder reuses it) plain vs speculative,
  transformers plain vs prompt lookup, acceptance at context 64, memory rows. Every other
  configuration is listed as left out of --quick.
- ``pocket`` (``standard``, ``make bench``): the pocket pair, every configuration: ONNX
  Runtime fp32 / int8 / int4 in both target graph forms and 8da4w in the lean one,
  ExecuTorch fp32 / 8da4w, the C++ runtime, each plain and speculative; the peers;
  acceptance at 64 / 256 / 1024 / 2048.
- ``smollm2``: the same on SmolLM2-135M-Instruct (its Q4_1 GGUF) with ``--drafter DIR``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hyflash.bench.exports import ExportSpec

SMOLLM2_GGUF = "models/SmolLM2-135M-Instruct.Q4_1.gguf"  # under the hyflash cache
ONNX = [("lean", "fp32"), ("lean", "int8"), ("lean", "int4"), ("lean", "8da4w"),
        ("lean", "8da8w"),
        ("optimum", "fp32"), ("optimum", "int8"), ("optimum", "int4")]
EXECUTORCH = ["fp32", "8da4w"]


@dataclass
class Suite:
    name: str
    target: str
    drafter: str
    baseline: str | None  # the full-context drafter, for acceptance and memory
    max_seq_len: int
    exports: list[ExportSpec]
    prompts: tuple[int, int]  # (short, long) held-out code prompts for the speed rows
    new_tokens: int
    contexts: list[int]
    acceptance_prompts: int
    acceptance_new_tokens: int
    peers: bool
    native: bool
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (label, why)


def onnx_spec(target, drafter, ctx, form, quant) -> ExportSpec:
    return ExportSpec(target, drafter, "onnx", quant, ctx, form, requantize=quant != "fp32")


def full_suite(name, target, drafter, baseline, ctx, new_tokens, contexts,
               acceptance_prompts) -> Suite:
    exports = [onnx_spec(target, drafter, ctx, f, q) for f, q in ONNX]
    exports += [ExportSpec(target, drafter, "executorch", q, ctx) for q in EXECUTORCH]
    return Suite(name, target, drafter, baseline, ctx, exports, (2, 2), new_tokens, contexts,
                 acceptance_prompts, 128, peers=True, native=True)


def build(args, cache: Path) -> Suite:
    name = "quick" if args.quick else args.suite
    if name == "quick":
        target, drafter = args.target or "pocket", args.drafter or "pocket"
        return Suite("quick", target, drafter, args.baseline or "pocket-full", 1024,
                     [ExportSpec(target, drafter, "onnx", "int4", 1024)], (2, 0), 16,
                     [64], 2, 16, peers=False, native=False,
                     left_out=[("ONNX fp32 / int8, optimum graph form, ExecuTorch, C++ runtime",
                                "left out of --quick (run `hyflash bench`)"),
                               ("optimum, onnxruntime-genai, llama.cpp",
                                "left out of --quick (run `hyflash bench`)")])
    if name in ("standard", "pocket"):
        return full_suite("pocket", args.target or "pocket", args.drafter or "pocket",
                          args.baseline or "pocket-full", 2048, args.new_tokens or 128,
                          [64, 256, 1024, 2048], 8)
    target = args.target or str(cache / SMOLLM2_GGUF)
    return full_suite("smollm2", target, args.drafter, args.baseline, 2048,
                      args.new_tokens or 128, [64, 256, 1024, 2048], 4)
