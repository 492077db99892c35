"""Lower the target and the drafter to ONNX with torch.onnx's dynamo exporter.

Three graphs, all from the one torch model definition (``hyflash.models``):

- **target** (``model.onnx``): ``Target.forward_past`` with the KV cache as explicit I/O,
  named as optimum names it, so that standard ONNX Runtime clients (optimum's
  ``ORTModelForCausalLM``, onnxruntime-genai style loops) can run it unchanged::

      input_ids [1, T] int64, attention_mask [1, P+T] int64, position_ids [1, T] int64,
      past_key_values.N.key / .value [1, kv_heads, P, head_dim]
      -> logits [1, T, V], features [1, T, F], argmax [1, T] int64,
         present.N.key / .value [1, kv_heads, P+T, head_dim]

  T and P are dynamic, so one graph serves prefill (P = 0), decode (T = 1) and verify
  (T = B). ``argmax`` lets a greedy client fetch T ids instead of T x V logits.
- **drafter step** (``drafter.onnx``): ``DrafterStep``, commit + draft in one call, every
  window and memory tensor an explicit input (``state.X``) and output (``new_state.X``),
  all shapes fixed.
- **drafter commit** (``drafter_commit.onnx``): commit only, for a larger chunk of rows.
  After a prefill the drafter must absorb the whole prompt; one step call per
  ``commit_size`` rows would draft a block it throws away each time.

The dynamo exporter handles all three (no TorchScript fallback is needed).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from hyflash.bundle import ROLES as BUNDLE_ROLES
from hyflash.bundle.records import KVCacheSpec, ModelContract, TensorSpec
from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter, DrafterStep
from hyflash.models.target import Target

TARGET_FILE = "model.onnx"  # optimum's standard name: ORTModelForCausalLM finds it by itself
DRAFTER_FILE = "drafter.onnx"
COMMIT_FILE = "drafter_commit.onnx"
FILES = {"target": TARGET_FILE, "drafter_step": DRAFTER_FILE, "drafter_commit": COMMIT_FILE}
OPSET = 18
COMMIT_CHUNK = 64  # rows per commit-only call (capped by the window)

ONNX_DTYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 16: "bfloat16"}


# ------------------------------------------------------------------------- names
# The graph I/O names are the bundle format's (hyflash.bundle.ROLES), KV named as optimum
# names it; the manifest records these patterns and the runtime reads them from there.

ROLES = BUNDLE_ROLES["onnx"]
KV_CACHE = KVCacheSpec(form="past_present", dtype="float32",
                       past_inputs="past_key_values.{layer}.{kind}",
                       present_outputs="present.{layer}.{kind}")


def target_io_names(n_layers: int) -> tuple[list[str], list[str]]:
    role = ROLES["target"]
    return ([*role.inputs, *KV_CACHE.names(KV_CACHE.past_inputs, n_layers)],
            [*role.outputs, *KV_CACHE.names(KV_CACHE.present_outputs, n_layers)])


def state_input(name: str) -> str:
    return f"state.{name}"


def state_output(name: str) -> str:
    return f"new_state.{name}"


def commit_rows(drafter: Drafter) -> int:
    """Rows of the commit-only graph: a prompt commits in chunks of this many."""
    return max(drafter.cfg.commit_size, min(drafter.cfg.window, COMMIT_CHUNK))


# ---------------------------------------------------------------------- wrappers

class TargetGraph(nn.Module):
    """``Target.forward_past`` with the past as a flat list (one tensor per ONNX input)
    and the greedy token of every row as an extra output."""

    def __init__(self, target: Target):
        super().__init__()
        self.target = target

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        past = [(past_key_values[2 * i], past_key_values[2 * i + 1])
                for i in range(len(past_key_values) // 2)]
        logits, features, presents = self.target.forward_past(input_ids, position_ids, past,
                                                              attention_mask)
        flat = [t for kv in presents for t in kv]
        return (logits, features, logits.argmax(-1), *flat)


class DrafterCommit(nn.Module):
    """``Drafter.commit`` alone, state tensors in and out in ``state_names`` order."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter
        self.state_names = list(drafter.init_state())

    def forward(self, features, n_valid, *state):
        st = self.drafter.commit(dict(zip(self.state_names, state, strict=True)), features,
                                 n_valid)
        return tuple(st[k] for k in self.state_names)


# ------------------------------------------------------------------------ export

def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str],
            outputs: list[str], dynamic_shapes=None) -> None:
    """torch.onnx.export (dynamo), weights inside the file, checked by onnx.checker."""
    import onnx

    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # exporter chatter (axis renames, pytree notices)
        try:
            torch.onnx.export(module, args, str(path), dynamo=True, input_names=inputs,
                              output_names=outputs, dynamic_shapes=dynamic_shapes,
                              opset_version=OPSET, external_data=False, verbose=False)
        except Exception as e:  # the exporter's own errors are long; keep the first line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise HyflashError(f"ONNX export of {path.name} failed: {first}") from e
    onnx.checker.check_model(str(path), full_check=True)


def export_target(target: Target, path: Path) -> None:
    """The target graph; T and P dynamic, batch 1."""
    cfg = target.cfg
    n, kvh, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    dtype = target.embed_tokens.weight.dtype
    p, t = 3, 2  # example sizes; 0 and 1 would be specialised away by torch.export
    past = [torch.zeros(1, kvh, p, hd, dtype=dtype) for _ in range(2 * n)]
    args = (torch.zeros(1, t, dtype=torch.long), torch.ones(1, p + t, dtype=torch.long),
            torch.arange(p, p + t)[None], past)
    limit = cfg.max_seq_len
    seq = torch.export.Dim("sequence_length", min=1, max=limit)
    past_len = torch.export.Dim("past_sequence_length", min=0, max=limit - 1)
    total = torch.export.Dim("total_sequence_length", min=1, max=limit)
    shapes = {"input_ids": {1: seq}, "attention_mask": {1: total}, "position_ids": {1: seq},
              "past_key_values": [{2: past_len}] * (2 * n)}
    inputs, outputs = target_io_names(n)
    _export(TargetGraph(target), args, path, inputs, outputs, shapes)


def export_drafter(drafter: Drafter, step_path: Path, commit_path: Path) -> None:
    """The drafter's step graph (commit + draft) and its commit-only graph."""
    cfg = drafter.cfg
    state = drafter.init_state(drafter.fc.weight.dtype)
    names = list(state)
    step, commit = ROLES["drafter_step"], ROLES["drafter_commit"]
    step_in = [*step.inputs, *map(state_input, names)]
    step_out = [*step.outputs, *map(state_output, names)]
    feats = torch.zeros(cfg.commit_size, cfg.feature_size, dtype=drafter.fc.weight.dtype)
    _export(DrafterStep(drafter), (torch.tensor([0]), feats, torch.tensor([1]),
                                   *state.values()), step_path, step_in, step_out)
    rows = torch.zeros(commit_rows(drafter), cfg.feature_size, dtype=drafter.fc.weight.dtype)
    _export(DrafterCommit(drafter), (rows, torch.tensor([1]), *state.values()), commit_path,
            [*commit.inputs, *map(state_input, names)],
            [*commit.outputs, *map(state_output, names)])


# ------------------------------------------------------------------- I/O contract

def io_contract(path: Path, role: str, commit_rows: int | None = None) -> ModelContract:
    """The manifest's record of an ONNX file as written: every input and output with its
    name, shape (ints, or symbolic dim names where dynamic) and dtype."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def spec(v) -> TensorSpec:
        tt = v.type.tensor_type
        shape = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tt.shape.dim]
        return TensorSpec(v.name, tuple(shape), ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type)))

    return ModelContract(role, path.name, tuple(map(spec, graph.input)),
                         tuple(map(spec, graph.output)), commit_rows)
