"""The lean target graph: static KV buffers updated in place, fused attention and norms.

The optimum-style graph (``onnx.py``) takes the past keys/values in and returns
past + new as the present, so every call copies the whole cache, and a rollback slices
it again. This second form is written the way onnxruntime-genai's model builder writes
decoders, for ONNX Runtime's CPU kernels:

- **attention** is one ``com.microsoft.GroupQueryAttention`` node per layer, with rotary
  embedding fused in (``do_rotary``, cos/sin tables as initializers) and the query, key
  and value projections packed into one MatMul. Its ``past_key`` and ``present_key`` are
  meant to be bound to the SAME buffer ``[1, kv_heads, max_seq_len, head_dim]``: the
  kernel then writes only the T new rows, at ``seqlens_k + 1 - T``, and attends to the
  first ``seqlens_k + 1`` rows. Rows beyond are never read, so a rollback is free: the
  runtime just passes a smaller ``seqlens_k`` next time and the new rows overwrite the
  stale ones.
- **norms**: ``SkipSimplifiedLayerNormalization`` (residual add + RMSNorm in one node,
  which also returns the residual sum) after every attention and MLP block;
  ``RMSNormalization`` (ONNX opset 23) for the first norm and Qwen3's per-head q/k norms.
- **outputs**: ``logits`` [1,R,V] (sampling), ``argmax`` [1,R] (greedy) for the last R =
  ``logits_rows`` rows of the call, ``features`` [1,T,F] (the drafter) for all T, and the
  presents (the bound buffers themselves). A verify asks for all its rows; a prefill only
  needs its last, and skipping the LM head over the other rows (49152 x 576 on SmolLM2)
  took a 1018-token fp32 prefill of SmolLM2-135M from 1907 to 1460 ms
  (``benchmarks/prefill_rows.py``).

Inputs::

    input_ids [1, T] int64
    seqlens_k [1] int32              start_pos + T - 1  (total length - 1, as GQA wants)
    total_sequence_length [] int32   start_pos + T
    logits_rows [1] int64            R, 1 <= R <= T
    past_key_values.N.key / .value [1, kv_heads, max_seq_len, head_dim]
    -> logits, argmax, features, present.N.key / .value (same shape as past)

The graph is built from the ``Target`` module's own weights and config (the one model
definition), walking its layers; every MatMul weight is an initializer [in, out], so
the int4/int8 recipes of ``quantize.py`` quantize it like the optimum graph. The tied
LM head is ``MatMul(x, Transpose(embedding))``: one copy of the matrix in the file,
and the quantized recipes fold the Transpose into the LM head's own weight first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hyflash.bundle import TARGET_ROLES
from hyflash.bundle.records import KVCacheSpec
from hyflash.errors import HyflashError

if TYPE_CHECKING:  # importing torch is what `hyflash export --help` should not wait for
    import torch

    from hyflash.models.target import Target, TargetConfig

# not model.onnx: optimum's ORTModelForCausalLM picks that name up and cannot run this form
LEAN_FILE = "model_lean.onnx"
KV_CACHE = KVCacheSpec(form="in_place", dtype="float32",
                       past_inputs="past_key_values.{layer}.{kind}",
                       present_outputs="present.{layer}.{kind}")
OPSET = 23  # RMSNormalization
MS = "com.microsoft"
SEQ = "sequence_length"
ROWS = "logits_rows"


def lean_io_names(n_layers: int) -> tuple[list[str], list[str]]:
    """The graph's inputs and outputs in order: the bundle format's in-place target role
    (``hyflash.bundle.TARGET_ROLES``), then the KV cache, layer by layer."""
    role = TARGET_ROLES[KV_CACHE.form]
    return ([*role.inputs, *role.optional_inputs, *KV_CACHE.names(KV_CACHE.past_inputs, n_layers)],
            [*role.outputs, *KV_CACHE.names(KV_CACHE.present_outputs, n_layers)])


def check_lean_supported(c: TargetConfig) -> None:
    """GroupQueryAttention's CPU kernel with fused rotary takes a head size that is a
    multiple of 16."""
    if c.head_dim % 16:
        raise HyflashError(f"the lean target graph needs a head_dim that is a multiple of 16 "
                           f"(ONNX Runtime's fused rotary attention); this model has "
                           f"{c.head_dim}: export with --target-graph optimum")
    if c.num_attention_heads % c.num_key_value_heads:
        raise HyflashError("num_attention_heads must be a multiple of num_key_value_heads")


class _Graph:
    """Nodes and initializers being collected; names are unique by construction."""

    def __init__(self):
        self.nodes, self.inits = [], []

    def init(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1,
             domain: str = "", outputs: list[str] | None = None, **attrs) -> list[str]:
        from onnx import helper

        outs = outputs or [f"{name}/out{i}" if i else f"{name}/out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def build_lean_target(target: Target):
    """-> onnx.ModelProto of the lean graph for target (weights as fp32 initializers)."""
    import torch
    from onnx import TensorProto, helper

    c = target.cfg
    check_lean_supported(c)
    n, h, kvh, d = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps = float(c.rms_norm_eps)
    g = _Graph()
    in_names, out_names = lean_io_names(n)
    ids, seqlens, total, logits_rows = in_names[:4]
    past_names = in_names[4:]

    embed = g.init("embed_tokens.weight", _np(target.embed_tokens.weight))
    cos = g.init("rope.cos", _np(target.rope_cos[:, : d // 2]))
    sin = g.init("rope.sin", _np(target.rope_sin[:, : d // 2]))
    x = g.node("Gather", [embed, ids], "embed")[0]
    normed = g.node("RMSNormalization", [x, g.init("layers.0.input_layernorm.weight",
                                                  _np(target.layers[0].input_layernorm.weight))],
                    "layers.0/input_norm", axis=-1, epsilon=eps)[0]
    taps = []
    for i, layer in enumerate(target.layers):
        p, a = f"layers.{i}", layer.self_attn
        qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).T
        qkv = g.node("MatMul", [normed, g.init(f"{p}.qkv_proj.weight", _np(qkv_w))],
                     f"{p}/qkv_proj")[0]
        if c.qkv_bias:
            bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            qkv = g.node("Add", [qkv, g.init(f"{p}.qkv_proj.bias", _np(bias))],
                         f"{p}/qkv_bias")[0]
        qkv_in = [qkv, "", ""]
        if c.qk_norm:
            qkv_in = _qk_norm(g, p, a, qkv, h, kvh, d, eps)
        past_k, past_v = past_names[2 * i: 2 * i + 2]
        attn = g.node("GroupQueryAttention",
                      [*qkv_in, past_k, past_v, seqlens, total, cos, sin], f"{p}/attn",
                      domain=MS, outputs=[f"{p}/attn/out", *out_names[3 + 2 * i: 5 + 2 * i]],
                      num_heads=h, kv_num_heads=kvh, do_rotary=1, rotary_interleaved=0)[0]
        o = g.node("MatMul", [attn, g.init(f"{p}.o_proj.weight", _np(a.o_proj.weight.T))],
                   f"{p}/o_proj")[0]
        normed, x = _skip_norm(g, f"{p}/post_attn_norm", o, x,
                               _np(layer.post_attention_layernorm.weight), eps)
        mlp = layer.mlp
        gate = g.node("MatMul", [normed, g.init(f"{p}.gate_proj.weight",
                                                _np(mlp.gate_proj.weight.T))], f"{p}/gate_proj")[0]
        up = g.node("MatMul", [normed, g.init(f"{p}.up_proj.weight", _np(mlp.up_proj.weight.T))],
                    f"{p}/up_proj")[0]
        sig = g.node("Sigmoid", [gate], f"{p}/sigmoid")[0]
        silu = g.node("Mul", [gate, sig], f"{p}/silu")[0]
        act = g.node("Mul", [silu, up], f"{p}/act")[0]
        down = g.node("MatMul", [act, g.init(f"{p}.down_proj.weight",
                                             _np(mlp.down_proj.weight.T))], f"{p}/down_proj")[0]
        last = i == n - 1
        next_w = target.norm.weight if last else target.layers[i + 1].input_layernorm.weight
        normed, x = _skip_norm(g, "final_norm" if last else f"layers.{i + 1}/input_norm", down,
                               x, _np(next_w), eps)
        if i in c.tap_layers:
            taps.append(x)

    if c.tie_word_embeddings:
        head = g.node("Transpose", [embed], "lm_head/transpose", perm=[1, 0])[0]
    else:
        head = g.init("lm_head.weight", _np(target.lm_head.weight.T))
    # the LM head over the last logits_rows rows only: Slice(normed, -R, end) on axis 1
    start = g.node("Neg", [logits_rows], "logits_rows/neg")[0]
    last = g.node("Slice", [normed, start, g.init("logits_rows.end", np.array([2**62], np.int64)),
                            g.init("logits_rows.axis", np.array([1], np.int64))],
                  "logits_rows/slice")[0]
    g.node("MatMul", [last, head], "lm_head", outputs=["logits"])
    g.node("ArgMax", ["logits"], "argmax", outputs=["argmax"], axis=-1, keepdims=0)
    g.node("Concat", taps, "features", outputs=["features"], axis=-1)

    f32, cache = TensorProto.FLOAT, [1, kvh, c.max_seq_len, d]
    inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, [1, SEQ]),
              helper.make_tensor_value_info(seqlens, TensorProto.INT32, [1]),
              helper.make_tensor_value_info(total, TensorProto.INT32, []),
              helper.make_tensor_value_info(logits_rows, TensorProto.INT64, [1]),
              *(helper.make_tensor_value_info(nm, f32, cache) for nm in past_names)]
    outputs = [helper.make_tensor_value_info("logits", f32, [1, ROWS, c.vocab_size]),
               helper.make_tensor_value_info("argmax", TensorProto.INT64, [1, ROWS]),
               helper.make_tensor_value_info("features", f32, [1, SEQ, c.feature_size]),
               *(helper.make_tensor_value_info(nm, f32, cache) for nm in out_names[3:])]
    graph = helper.make_graph(g.nodes, "hyflash_lean_target", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS, 1)],
                              producer_name="hyflash")
    model.ir_version = 10
    return model


def _skip_norm(g: _Graph, name: str, x: str, residual: str, weight: np.ndarray,
               eps: float) -> tuple[str, str]:
    """residual + x and its RMSNorm in one node -> (normed, new residual)."""
    out = g.node("SkipSimplifiedLayerNormalization",
                 [x, residual, g.init(f"{name}.weight", weight)], name, domain=MS,
                 outputs=[f"{name}/out", "", "", f"{name}/sum"], epsilon=eps)
    return out[0], out[3]


def _qk_norm(g: _Graph, p: str, a, qkv: str, h: int, kvh: int, d: int,
             eps: float) -> list[str]:
    """Qwen3: split the packed projection, RMSNorm q and k per head -> [q, k, v]."""
    sizes = g.init(f"{p}.qkv_sizes", np.array([h * d, kvh * d, kvh * d], np.int64))
    q, k, v = g.node("Split", [qkv, sizes], f"{p}/qkv_split", n_out=3, axis=-1)
    out = []
    for nm, z, heads, norm in (("q", q, h, a.q_norm), ("k", k, kvh, a.k_norm)):
        shape = g.init(f"{p}.{nm}_heads", np.array([0, 0, heads, d], np.int64))
        flat = g.init(f"{p}.{nm}_flat", np.array([0, 0, heads * d], np.int64))
        z = g.node("Reshape", [z, shape], f"{p}/{nm}_heads")[0]
        z = g.node("RMSNormalization", [z, g.init(f"{p}.{nm}_norm.weight", _np(norm.weight))],
                   f"{p}/{nm}_norm", axis=-1, epsilon=eps)[0]
        out.append(g.node("Reshape", [z, flat], f"{p}/{nm}_flat")[0])
    return [*out, v]


def export_lean_target(target: Target, path: Path) -> None:
    """Write the lean graph of target to path (fp32 weights inside the file), checked."""
    import onnx

    model = build_lean_target(target)
    onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)


# ----------------------------------------------------------------- the two forms

TARGET_GRAPHS = ("auto", "lean", "optimum")


def target_graph_form(form: str, target: Target):
    """-> (file name, KV cache spec, export function) of a target graph form: ``lean``
    (this module), ``optimum`` (``onnx.py``, what ORTModelForCausalLM loads), or ``auto``:
    lean where ONNX Runtime's fused attention takes the model's heads, else optimum."""
    from hyflash.export import onnx as ox

    if form == "auto":
        try:
            check_lean_supported(target.cfg)
            form = "lean"
        except HyflashError:
            form = "optimum"
    if form == "lean":
        check_lean_supported(target.cfg)
        return LEAN_FILE, KV_CACHE, export_lean_target
    if form == "optimum":
        return ox.TARGET_FILE, ox.KV_CACHE, ox.export_target
    raise HyflashError(f"unknown target graph form {form!r}: choose one of "
                       f"{', '.join(TARGET_GRAPHS)}")
