"""Weights that already are 4-bit blocks (what a GGUF's Q4_0 / Q4_1 tensors dequantize to)
go through the int4 recipes exactly: the int4 bundle of such a model computes what its fp32
bundle computes, where quantizing them again onto the recipe's grid would move them."""

import json
import shutil
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file, save_file
from test_gguf import bpe  # noqa: F401 (a fixture)
from test_onnx_lean import assert_decodes_losslessly

from hyflash.bundle import read_bundle
from hyflash.export.bundle import export_onnx_bundle, requantize_bundle
from hyflash.export.grid_blocks import (
    FOLD_DIGITS,
    grid8_codes,
    grid_codes,
    keep_grid_blocks,
    offset_digits,
)
from hyflash.export.quantize import matmul_nbits
from hyflash.models import pocket
from hyflash.runtime.onnx_backend import load_onnx_pair

torch.set_num_threads(1)
ort.set_default_logger_severity(3)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def on_grid(w: np.ndarray, kind=GGMLQuantizationType.Q4_1) -> np.ndarray:
    """w [N, K] quantized and dequantized by the gguf package (blocks of 32 along K)."""
    return dequantize(quantize(w.astype(np.float32), kind), kind).astype(np.float32)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_0])
def test_grid_codes_recover_a_gguf_4_bit_tensor_and_reject_others(kind):
    rng = np.random.default_rng(0)
    w = on_grid(rng.standard_normal((48, 96)), kind)  # [N, K]
    codes, step, low = grid_codes(np.ascontiguousarray(w.T))
    assert codes.shape == (48, 3, 32) and codes.max() <= 15
    rebuilt = (low[..., None] + step[..., None] * codes).reshape(48, 96)
    np.testing.assert_allclose(rebuilt, w, rtol=0, atol=1e-6 * np.abs(w).max())
    assert grid_codes(rng.standard_normal((96, 48)).astype(np.float32)) is None
    q8 = on_grid(rng.standard_normal((48, 96)), GGMLQuantizationType.Q8_0)
    assert grid_codes(np.ascontiguousarray(q8.T)) is None  # 255 levels: not a 4-bit grid
    off = w.copy()
    off[5, 40] += 0.37 * np.abs(w).max() / 15  # one value off its block's grid
    assert grid_codes(np.ascontiguousarray(off.T)) is None


def test_grid8_codes_recover_a_gguf_q8_0_tensor_and_reject_others():
    rng = np.random.default_rng(0)
    w = on_grid(rng.standard_normal((48, 96)), GGMLQuantizationType.Q8_0)
    codes, scale = grid8_codes(np.ascontiguousarray(w.T))
    rebuilt = ((codes.astype(np.float32) - 128) * scale[..., None]).reshape(48, 96)
    np.testing.assert_allclose(rebuilt, w, rtol=0, atol=1e-6 * np.abs(w).max())
    assert grid8_codes(rng.standard_normal((96, 48)).astype(np.float32)) is None


def linear_model(w: np.ndarray):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", w.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", w.shape[0]])],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bits_level", [(0, "int4"), (4, "8da4w")])
def test_the_4_bit_recipes_keep_grid_weights_and_requantizing_would_not(tmp_path, bits_level):
    level, name = bits_level
    rng = np.random.default_rng(1)
    w = on_grid(rng.standard_normal((64, 128)))
    onnx.save_model(linear_model(w), str(tmp_path / "fp32.onnx"))
    x = rng.standard_normal((2, 5, 128)).astype(np.float32)
    ref = x @ w.T
    errors = {}
    for keep in (True, False):
        out = tmp_path / f"{keep}.onnx"
        described = matmul_nbits(4, level, keep_source_grid=keep)(tmp_path / "fp32.onnx", out)
        assert described["recipe"] == name
        assert described.get("source_grid", {}) == ({"int4": 1} if keep else {})
        y = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        errors[keep] = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    assert errors[False] > 0.03  # a second quantization moves a Q4_1 layer by several %
    assert errors[True] < (1e-6 if level == 0 else 0.02)  # exact; 8da: int8 activations only


def test_offset_digits_add_up_to_the_offsets():
    rng = np.random.default_rng(4)
    offsets = (rng.standard_normal((18, 40)) * rng.uniform(0.01, 1, 40)).astype(np.float32)
    codes, scales = offset_digits(offsets, 32)
    assert codes.shape == (40, FOLD_DIGITS, 16) and scales.shape == (40, FOLD_DIGITS)
    q = np.stack([codes & 15, codes >> 4], -1).reshape(40, FOLD_DIGITS, 32).astype(np.float32) - 8
    rebuilt = (q * scales[..., None]).sum(1).T  # [32, N]: the digits over the same sums
    assert np.all(rebuilt[18:] == 0)  # the padding rows stay zero
    err = np.abs(rebuilt[:18] - offsets).max(0) / np.abs(offsets).max(0)
    assert err.max() < 1e-3, err.max()
    one = offset_digits(offsets, 32, digits=1)
    q1 = np.stack([one[0] & 15, one[0] >> 4], -1).reshape(40, 32).astype(np.float32) - 8
    assert (np.abs((q1 * one[1]).T[:18] - offsets).max(0) / np.abs(offsets).max(0)).max() > 0.01


@pytest.mark.parametrize("k", [128, 1536])  # sums of 4 blocks / of 48, padded to 32 / 64
def test_with_int8_activations_the_offsets_fold_into_one_matmul_nbits(tmp_path, k):
    rng = np.random.default_rng(5)
    w = on_grid(rng.standard_normal((64, k)) + 0.5)  # offsets far from 0: they matter
    x = rng.standard_normal((2, 5, k)).astype(np.float32)
    ref = x @ w.T
    errors, ops = {}, {}
    for fold in (True, False):
        model = linear_model(w)
        assert keep_grid_blocks(model, 4, fold=fold)[0] == {"int4": 1}
        ops[fold] = sorted(n.op_type for n in model.graph.node)
        y = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        errors[fold] = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    assert ops[True] == ["Concat", "MatMul", "MatMulNBits"]  # block sums, [x, s, s, s], one call
    assert ops[False] == ["Add", "MatMul", "MatMul", "MatMulNBits"]
    assert errors[True] < 0.01 and errors[True] < 1.5 * errors[False], errors
    onnx.save_model(linear_model(w), str(tmp_path / "fp32.onnx"))  # quantized once more:
    matmul_nbits(4, 4, keep_source_grid=False)(tmp_path / "fp32.onnx", tmp_path / "rq.onnx")
    y = ort.InferenceSession(str(tmp_path / "rq.onnx"),
                             providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    requantized = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    assert requantized > 3 * errors[True], (requantized, errors)


def test_with_int8_activations_a_q8_0_weight_is_kept_at_8_bits(tmp_path):
    rng = np.random.default_rng(3)
    w = on_grid(rng.standard_normal((64, 128)), GGMLQuantizationType.Q8_0)
    onnx.save_model(linear_model(w), str(tmp_path / "fp32.onnx"))
    x = rng.standard_normal((1, 3, 128)).astype(np.float32)
    kept = {}
    for level in (0, 4):
        out = tmp_path / f"{level}.onnx"
        kept[level] = matmul_nbits(4, level)(tmp_path / "fp32.onnx", out).get(
            "source_grid", {}).get("int8", 0)
        bits = [a.i for n in onnx.load(str(out)).graph.node for a in n.attribute
                if a.name == "bits"]
        assert bits == ([8] if kept[level] else [4])
        sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        y = sess.run(None, {"x": x})[0]
        err = float(np.linalg.norm(y - x @ w.T) / np.linalg.norm(x @ w.T))
        assert err < (0.02 if kept[level] else 0.2)
    assert kept == {0: 0, 4: 1}


@pytest.fixture(scope="module")
def grid_bundles(tmp_path_factory):
    """The pocket model with every linear weight put on a Q4_1 grid (as if loaded from a
    Q4_1 GGUF), exported fp32 with the pocket drafter and requantized to int4."""
    root = tmp_path_factory.mktemp("grid")
    folder = root / "pocket-q4_1"
    shutil.copytree(pocket.path(), folder)
    stored = load_file(str(folder / "model.safetensors"))
    weights = {k: v.astype(np.float32) for k, v in stored.items()}
    for name in weights:
        if name.split(".")[-2] in LINEAR:
            weights[name] = on_grid(weights[name])
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "model.safetensors"))
    export_onnx_bundle(str(folder), "pocket", root / "fp32", "fp32", progress=False,
                       target_graph="lean")
    requantize_bundle(root / "fp32", "int4", root / "int4")
    requantize_bundle(root / "fp32", "8da4w", root / "8da4w")
    return root


def test_an_int4_bundle_of_grid_weights_computes_what_its_fp32_bundle_does(grid_bundles):
    manifest = read_bundle(grid_bundles / "int4").manifest
    assert manifest.quantization.graphs["target"]["source_grid"] == {"int4": 6 * 5}  # qkv fused
    pairs = {q: load_onnx_pair(grid_bundles / q, threads=1)[1:] for q in ("fp32", "int4")}
    tokens = torch.tensor(np.random.default_rng(2).integers(3, 4000, 40))
    features = {}
    for q, (target, _) in pairs.items():
        target.rollback(0)
        prefill = target.forward(tokens[:32], 0)[1]
        verify = target.forward(tokens[32:], 32)[1]
        features[q] = torch.cat([prefill, verify])
    print({q: f.shape for q, f in features.items()})
    torch.testing.assert_close(features["int4"], features["fp32"], atol=2e-4, rtol=0)
    target, drafter = pairs["int4"]
    assert_decodes_losslessly(target, drafter)


def test_an_8da4w_bundle_of_grid_weights_folds_the_offsets_and_decodes_losslessly(grid_bundles):
    bundle = read_bundle(grid_bundles / "8da4w")
    assert bundle.manifest.quantization.graphs["target"]["source_grid"] == {"int4": 30}
    ops = [n.op_type for n in onnx.load(str(bundle.path("target")),
                                        load_external_data=False).graph.node]
    assert ops.count("MatMulNBits") == 30 + 1 and ops.count("Add") == 0  # + the LM head
    pairs = {q: load_onnx_pair(grid_bundles / q, threads=1)[1:] for q in ("fp32", "8da4w")}
    tokens = torch.tensor(np.random.default_rng(2).integers(3, 4000, 40))
    logits = {}
    for q, (target, _) in pairs.items():
        target.rollback(0)
        logits[q] = torch.cat([target.forward(tokens[:32], 0)[0],
                               target.forward(tokens[32:], 32)[0]])
    rel = float((logits["8da4w"] - logits["fp32"]).norm() / logits["fp32"].norm())
    assert rel < 0.05, rel  # int8 activations; a second 4-bit quantization moves it more
    target, drafter = pairs["8da4w"]
    assert_decodes_losslessly(target, drafter)


def test_source_blocks_requantize_gives_the_recipe_its_own_grid(grid_bundles, tmp_path):
    requantize_bundle(grid_bundles / "fp32", "8da4w", tmp_path / "r", source_blocks="requantize")
    graphs = read_bundle(tmp_path / "r").manifest.quantization.graphs["target"]
    assert "source_grid" not in graphs and graphs["source_blocks"] == "requantized"
    assert graphs["min_rows"] == 2


@pytest.mark.parametrize("recipe", ["int4", "8da4w"])
def test_the_budget_sizes_what_the_kept_grid_stores(grid_bundles, recipe):
    from test_budget_memory import initializer_bytes

    from hyflash.budget import memory
    from hyflash.budget.plan import for_bundle
    from hyflash.budget.recipes import FOLD_DIGITS as BUDGETED_DIGITS
    from hyflash.budget.sources import resolve

    assert BUDGETED_DIGITS == FOLD_DIGITS
    src = resolve(str(grid_bundles / recipe))
    assert src.facts["source_grid"] == {"int4": 30}
    real = initializer_bytes(src.bundle)
    estimate = memory.budget(for_bundle(src)).stored
    assert abs(estimate / real - 1) < 0.02, (estimate, real)
    plain = memory.budget(for_bundle(replace(src, facts={**src.facts, "source_grid": None})))
    assert abs(plain.stored / real - 1) > 0.04  # the offsets are worth sizing


def test_a_q4_1_gguf_is_budgeted_with_its_blocks_kept(tmp_path, bpe):  # noqa: F811
    from test_gguf import save_hf, write_gguf

    from hyflash.budget.sources import resolve

    model = save_hf(tmp_path / "hf", bpe, tied=True)  # the LM head is token_embd
    floats = resolve(str(write_gguf(tmp_path / "f32.gguf", model, bpe)))
    q4 = resolve(str(write_gguf(tmp_path / "q4.gguf", model, bpe,
                                quant={"blk": GGMLQuantizationType.Q4_1,
                                       "token_embd": GGMLQuantizationType.Q8_0})))
    assert floats.facts["source_grid"] == {"int4": False, "int8": False}
    assert q4.facts["source_grid"] == {"int4": True, "int8": True}
    assert replace(q4.target, name="") == replace(floats.target, name="")
