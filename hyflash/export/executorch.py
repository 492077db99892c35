"""Lower the target and the drafter to ONE ExecuTorch program (.pte), XNNPACK-delegated.
(Imports torch lazily: `hyflash export --help` reads RECIPES.)

Methods (all exported from the one model definition, ``hyflash.models``):

- ``forward(tokens [1, T], input_pos [1]) -> logits [1, T, V]``: exactly what ExecuTorch's
  LLM runner (``TextLLMRunner``) calls (it aborts on a second output), and the prefill and
  verify of the speculative loop: it also writes the positions' tap features into a ring
  of ``get_feature_rows`` rows inside the program;
- ``features(tokens [1, T], input_pos [1]) -> features [1, T, F]``: reads back what the
  last ``forward`` with the same arguments wrote. The target graph is lowered once
  (``executorch_modules``).
- ``draft`` (``DrafterStep``: commit + draft) and ``commit`` (commit only), every window
  and memory tensor an explicit input and output of fixed shape: the app owns the state.

The KV cache is ``Target``'s static ``KVCache`` (mutable buffers, written at
``input_pos``); ``forward`` and ``features`` are exported from the same ``ProgramTarget``
so the buffers have the same names, and ``share_mutable_buffers`` makes the memory planner
place each name once for all methods (ExecuTorch 1.5.1, ``MemoryPlanningPass``). T is
dynamic, 1..the ring's rows: the memory planner sizes every activation (logits [T, V],
attention scores) for the largest T, so allowing T up to the whole context would plan
hundreds of MiB that a phone must hold and never uses. ``get_max_seq_len`` says so to the
stock runner, which then prefills a longer prompt in chunks of that many tokens, as for
ExecuTorch's own LLM exports (its max_seq_len is a prefill chunk, ``get_max_context_len``
the cache). Rolling back is free: the next call at an earlier position
overwrites the stale rows before any query sees them.

Constant methods: the runner's (``get_max_seq_len`` ...) and ours (``get_block_size`` ...,
``get_hyflash_format``, which a reader checks to refuse a program from another hyflash).

Recipes (torchao, as ExecuTorch's LLM export applies them, to every ``nn.Linear`` of both
models before ``torch.export``): ``fp32``; ``8da4w`` (``Int8DynamicActivationIntxWeight
Config``: int4 weights in groups of ``group_size``, int8 activations with one scale PER
TOKEN, so a verify row is computed as a decode of that row: tested bit for bit). int8
weight-only is not offered: XNNPACK's linear takes a dequantized weight only with a
quantized activation, so such linears decompose to ``mm``; XNNPACK folds most of those
dequantizes back into float32 weights (no saving) and refuses the drafter's 2-D context
projections, leaving a ``torchao::dequantize_affine`` that has no portable kernel.

Lowering is most of an export's time (torch's symbolic-shape work in every graph pass),
so the target's graph is lowered once (``forward``; ``features`` only reads a buffer).
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.bundle.records import KVCacheSpec, ModelContract, TensorSpec
from hyflash.errors import HyflashError

PTE_FILE = "model.pte"
FORMAT = 2  # get_hyflash_format: bump when methods or their I/O change
RECIPES = ("fp32", "8da4w")
NOT_OFFERED = {"int8": "int8 weight-only: XNNPACK in ExecuTorch 1.5.1 has no linear with int8 "
                       "weights and float activations"}
DEFAULT_GROUP_SIZE = 32
GROUP_MULTIPLE = 32  # XNNPACK refuses other int4 group sizes (ExecuTorch 1.5.1)
COMMIT_ROWS = 64  # rows of the commit-only method (capped by the window)
FEATURE_ROWS = 64  # rows of the feature ring: the longest call whose features are all read
SEQ = "sequence_length"
# role -> method of the program (hyflash.bundle.ROLES["executorch"])
METHODS = {"forward": "forward", "target": "features", "drafter_step": "draft",
           "drafter_commit": "commit"}
KV_CACHE = KVCacheSpec(form="mutable_buffers", dtype="float32",
                       past_inputs="layers.{layer}.self_attn.kv_cache.{kind}",
                       present_outputs="layers.{layer}.self_attn.kv_cache.{kind}")


def check_recipe(recipe: str, group_size: int | None = None) -> None:
    if recipe not in RECIPES:
        why = f" ({NOT_OFFERED[recipe]})" if recipe in NOT_OFFERED else ""
        raise HyflashError(f"unknown ExecuTorch quantization recipe {recipe!r}{why}: choose one "
                           f"of {', '.join(RECIPES)}")
    if group_size is not None and recipe != "8da4w":
        raise HyflashError(f"--group-size applies to the 8da4w recipe only, not {recipe}: drop "
                           "it or pass --quant 8da4w")
    if group_size is not None and group_size % GROUP_MULTIPLE:
        raise HyflashError(f"--group-size {group_size} is not a multiple of {GROUP_MULTIPLE}, "
                           "which XNNPACK's int4 kernels need: pass 32, 64, 128, ...")


def commit_rows(drafter) -> int:
    return max(drafter.cfg.commit_size, min(drafter.cfg.window, COMMIT_ROWS))


def feature_rows(target, drafter) -> int:
    """Rows of the feature ring: a verify block always fits, a prefill goes in chunks."""
    return min(max(FEATURE_ROWS, drafter.cfg.block_size), target.cfg.max_seq_len)


# ------------------------------------------------------------------ quantization

def linears(*models) -> dict:
    """Every distinct nn.Linear of the models (the drafter shares the target's LM head)."""
    from torch import nn

    seen, out = set(), {}
    for prefix, model in zip(("target", "drafter"), models, strict=False):
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and id(m) not in seen:
                seen.add(id(m))
                out[f"{prefix}.{name}"] = m
    return out


def quantize_pair(target, drafter, recipe: str, group_size: int | None) -> dict:
    """Quantize every Linear of the pair in place with torchao -> manifest description."""
    if recipe == "fp32":
        return {"weights": "float32", "activations": "float32"}
    import torch
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    # 8da4w only; int8 weight-only cannot lower (NOT_OFFERED, README "ExecuTorch")
    layers = linears(target, drafter)
    gs = group_size or DEFAULT_GROUP_SIZE
    bad = next(((n, m.in_features) for n, m in layers.items() if m.in_features % gs), None)
    if bad:
        raise HyflashError(f"--group-size {gs} does not divide the input size {bad[1]} of "
                           f"{bad[0]}: pass a group size that divides every layer's input "
                           f"size (e.g. {DEFAULT_GROUP_SIZE})")
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                   weight_granularity=PerGroup(gs))
    desc = {"weights": f"int4 symmetric, groups of {gs}", "group_size": gs,
            "activations": "int8 dynamic, asymmetric, one scale per token"}
    todo = set(map(id, layers.values()))

    def once(m, _fqn):  # the shared LM head is reached from both models: quantize it once
        if id(m) not in todo:
            return False
        todo.discard(id(m))
        return True

    for model in (target, drafter):
        quantize_(model, config, filter_fn=once)
    return {"tool": f"torchao.quantization.{type(config).__name__}", **desc,
            "linears": len(layers), "embedding": "float32"}


# ------------------------------------------------------------------------ export

def constant_methods(target, drafter, state: dict) -> dict:
    """The runner's metadata methods plus ours (block size, features, state layout)."""
    t = target.cfg
    d = drafter.cfg
    bos = t.bos_token_id
    out = {"get_max_seq_len": feature_rows(target, drafter),  # tokens per call (see top)
           "get_max_context_len": t.max_seq_len,
           "get_vocab_size": t.vocab_size, "get_eos_ids": list(t.eos_token_ids),
           "use_kv_cache": True, "use_sdpa_with_kv_cache": False, "enable_dynamic_shape": True,
           "get_hyflash_format": FORMAT, "get_block_size": d.block_size,
           "get_feature_size": t.feature_size, "get_tap_layers": list(t.tap_layers),
           "get_window": d.window, "get_window_cache": drafter.window_cache,
           "get_commit_rows": commit_rows(drafter),
           "get_feature_rows": feature_rows(target, drafter),
           "get_state": json.dumps([{"name": k, "shape": list(v.shape),
                                     "dtype": str(v.dtype).removeprefix("torch.")}
                                    for k, v in state.items()])}
    if bos is not None:
        out["get_bos_id"] = bos
    return out


def export_program(target, drafter, path: Path, attention: str = "operand") -> None:
    """Write the .pte of the (possibly quantized) pair to path. attention: the target's
    attention form (``executorch_modules.ATTENTION_FORMS``): ``operand`` (the cache is the
    left operand of both attention matmuls, read in place) or ``bmm`` (the earlier form, the
    cache on the right: XNNPACK copies and packs it at every call; for comparison)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import (
        EdgeCompileConfig,
        ExecutorchBackendConfig,
        to_edge_transform_and_lower,
    )
    from executorch.exir.passes import MemoryPlanningPass

    from hyflash.export.executorch_modules import ATTENTION_FORMS as FORMS
    from hyflash.export.executorch_modules import FeaturesMethod, ForwardMethod
    from hyflash.export.onnx import DrafterCommit
    from hyflash.models.drafter import DrafterStep

    dcfg = drafter.cfg
    target.requires_grad_(False)
    drafter.requires_grad_(False)
    core = FORMS[attention](target, feature_rows(target, drafter))
    state = drafter.init_state(torch.float32)
    seq = torch.export.Dim(SEQ, min=1, max=feature_rows(target, drafter))
    ex = (torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]))
    feats = torch.zeros(dcfg.commit_size, dcfg.feature_size)
    rows = torch.zeros(commit_rows(drafter), dcfg.feature_size)
    one = torch.tensor([1])
    with torch.no_grad():
        try:
            programs = {
                "forward": torch.export.export(ForwardMethod(core), ex,
                                               dynamic_shapes=({1: seq}, None), strict=False),
                "features": torch.export.export(FeaturesMethod(core), ex,
                                                dynamic_shapes=({1: seq}, None),
                                                strict=False),
                "draft": torch.export.export(DrafterStep(drafter), (torch.tensor([0]), feats, one,
                                                                   *state.values()),
                                             strict=False),
                "commit": torch.export.export(DrafterCommit(drafter), (rows, one,
                                                                       *state.values()),
                                              strict=False)}
            edge = to_edge_transform_and_lower(
                programs, partitioner=[XnnpackPartitioner()],
                constant_methods=constant_methods(target, drafter, state),
                # as ExecuTorch's own LLM export: the IR check re-runs every op (~10%)
                compile_config=EdgeCompileConfig(_check_ir_validity=False))
            program = edge.to_executorch(ExecutorchBackendConfig(
                memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
                                                        share_mutable_buffers=True),
                run_reinplace_pass=True, emit_mutable_buffer_names=True))
        except HyflashError:
            raise
        except Exception as e:  # torch.export / ExecuTorch errors are pages long
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise HyflashError(f"ExecuTorch export failed ({type(e).__name__}: {first[:200]}): "
                               "this target has an op torch.export or XNNPACK cannot take; "
                               "export it with --backend onnx") from e
        finally:
            if attention != "bmm":  # the form replaced Target's caches with its own layout
                target.setup_cache(1, dtype=torch.float32)
    path.write_bytes(program.buffer)


# ------------------------------------------------------------------- I/O contract

def contracts(target, drafter, file: str = PTE_FILE) -> dict[str, ModelContract]:
    """Each method's I/O as exported (names are ours: ExecuTorch I/O is positional)."""
    import torch

    from hyflash.export.onnx import state_input, state_output

    t, d = target.cfg, drafter.cfg
    state = drafter.init_state(torch.float32)

    def spec(name, shape, dtype="float32"):
        return TensorSpec(name, tuple(shape), dtype)

    def dt(v):
        return str(v.dtype).removeprefix("torch.")

    ins = (spec("tokens", (1, SEQ), "int64"), spec("input_pos", (1,), "int64"))
    logits = spec("logits", (1, SEQ, t.vocab_size))
    s_in = tuple(spec(state_input(k), v.shape, dt(v)) for k, v in state.items())
    s_out = tuple(spec(state_output(k), v.shape, dt(v)) for k, v in state.items())
    n_valid = spec("n_valid", (1,), "int64")
    io = {
        "forward": (ins, (logits,), None),
        "target": (ins, (spec("features", (1, SEQ, t.feature_size)),),
                   feature_rows(target, drafter)),
        "drafter_step": ((spec("anchor", (1,), "int64"),
                          spec("features", (d.commit_size, d.feature_size)), n_valid, *s_in),
                         (spec("logits", (d.block_size - 1, d.vocab_size)), *s_out),
                         d.commit_size),
        "drafter_commit": ((spec("features", (commit_rows(drafter), d.feature_size)), n_valid,
                            *s_in), s_out, commit_rows(drafter)),
    }
    return {role: ModelContract(role, file, i, o, rows, METHODS[role])
            for role, (i, o, rows) in io.items()}
