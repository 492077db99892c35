"""The lean target graph (static KV buffers updated in place by GroupQueryAttention,
fused rotary and norms) computes what the torch Target computes, at fp32 and int4, for
prefill, decode, verify and after a rollback; a bundle records the form it holds and
opens with the backend for it; and the engine's output through it, plain or drafting
with the shipped pocket drafter, is the target's own greedy decode."""

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from hyflash.bundle import read_bundle
from hyflash.export.bundle import export_onnx_bundle, requantize_bundle
from hyflash.export.onnx_lean import KV_CACHE, LEAN_FILE, export_lean_target, lean_io_names
from hyflash.models.target import Target, TargetConfig
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.onnx_backend import load_onnx_pair
from hyflash.runtime.onnx_lean import OnnxLeanTarget

torch.set_num_threads(1)
ort.set_default_logger_severity(3)

PROMPTS = ["import os\n\n\ndef read_config(path):\n    ",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push("]


def session(model) -> ort.InferenceSession:
    """A 1-thread session of a graph file (or serialized graph bytes)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def pocket():
    return Target.from_pretrained("pocket")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The pocket pair exported with the default target graph (auto: lean for the
    pocket model), and requantized to int4."""
    root = tmp_path_factory.mktemp("lean")
    export_onnx_bundle("pocket", "pocket", root / "fp32", "fp32", progress=False)
    requantize_bundle(root / "fp32", "int4", root / "int4")
    return {"fp32": root / "fp32", "int4": root / "int4"}


@pytest.fixture(scope="module")
def graphs(pocket, bundles):
    """{recipe: (lean graph file, torch reference with the same weights)}."""
    int4 = bundles["int4"] / LEAN_FILE
    return {"fp32": (bundles["fp32"] / LEAN_FILE, pocket),
            "int4": (int4, dequantized_reference(pocket, int4))}


def dequantized_reference(target: Target, path) -> Target:
    """target with every weight the int4 graph quantized replaced by what the graph
    really multiplies by: each MatMulNBits node run by ONNX Runtime on an identity matrix
    gives its dequantized weight [in, out]."""
    from onnx import helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    ref = copy.deepcopy(target)
    ref.lm_head.weight = torch.nn.Parameter(ref.lm_head.weight.detach().clone())  # untie
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        k = next(a.i for a in node.attribute if a.name == "K")
        used = [inits[n] for n in node.input[1:] if n]
        graph = helper.make_graph(
            [helper.make_node("MatMulNBits", ["a", *node.input[1:]], ["w"], domain=node.domain,
                              **{a.name: helper.get_attribute_value(a) for a in node.attribute})],
            "dequant", [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [k, k])],
            [helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, None)], used)
        one = helper.make_model(graph, opset_imports=list(model.opset_import))
        w = session(one.SerializeToString()).run(None, {"a": np.eye(k, dtype=np.float32)})[0]
        assign(ref, node.name, torch.from_numpy(w.T.copy()))
    return ref


def assign(ref: Target, node: str, weight: torch.Tensor) -> None:
    """Put a dequantized [out, in] weight where the lean graph's MatMul node took it."""
    if node.startswith("lm_head"):
        ref.lm_head.weight.data = weight
        return
    layer, proj = node.split("/")[:2]
    block = ref.layers[int(layer.split(".")[1])]
    proj = proj.removesuffix("_Q4")
    if proj == "qkv_proj":
        a = block.self_attn
        sizes = [m.weight.shape[0] for m in (a.q_proj, a.k_proj, a.v_proj)]
        for m, w in zip((a.q_proj, a.k_proj, a.v_proj), weight.split(sizes), strict=True):
            m.weight.data = w.contiguous()
    else:
        owner = block.self_attn if proj == "o_proj" else block.mlp
        getattr(owner, proj).weight.data = weight


def lean(path, target: Target) -> OnnxLeanTarget:
    n = target.cfg.num_hidden_layers
    return OnnxLeanTarget(session(path), target.cfg, (KV_CACHE.names(KV_CACHE.past_inputs, n),
                                                      KV_CACHE.names(KV_CACHE.present_outputs, n)))


def calls(vocab: int) -> list[tuple[list[int], int]]:
    """(tokens, start_pos) of one sequence: a prefill, decodes, a verify of 8, a verify
    after rolling back 6 positions, then a shorter prefill over the stale cache."""
    g = torch.Generator().manual_seed(0)

    def toks(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    return [(toks(40), 0), (toks(1), 40), (toks(1), 41), (toks(1), 42), (toks(8), 43),
            (toks(8), 45), (toks(12), 0), (toks(1), 12)]


def assert_same_calls(onnx_target: OnnxLeanTarget, ref: Target, atol: float) -> None:
    ref.setup_cache(1)
    for tokens, start in calls(ref.cfg.vocab_size):
        if start < onnx_target.length:
            onnx_target.rollback(start)
        logits, features = onnx_target.forward(torch.tensor(tokens), start)
        with torch.inference_mode():
            want_logits, want_features = ref(torch.tensor([tokens]), start)
        assert torch.equal(logits.argmax(-1), want_logits[0].argmax(-1)), (start, len(tokens))
        torch.testing.assert_close(logits, want_logits[0], atol=atol, rtol=0)
        torch.testing.assert_close(features, want_features[0], atol=atol, rtol=0)
        assert np.array_equal(onnx_target.run(np.array(tokens), start)[0]["argmax"],
                              logits.argmax(-1).numpy())  # the graph's own argmax agrees
        for rows in {1, 2, len(tokens)}:  # the LM head over the last rows only (a prefill: 1)
            if rows <= len(tokens):
                onnx_target.rollback(start)
                last, again = onnx_target.forward(torch.tensor(tokens), start, logits_rows=rows)
                assert last.shape == (rows, ref.cfg.vocab_size)
                torch.testing.assert_close(last, logits[-rows:], atol=1e-5, rtol=0)
                assert torch.equal(again, features)
        onnx_target.rollback(start + len(tokens))


@pytest.mark.parametrize("recipe", ["fp32", "int4"])
def test_lean_graph_matches_torch_for_prefill_decode_verify_and_rollback(graphs, recipe):
    path, ref = graphs[recipe]
    assert_same_calls(lean(path, ref), ref, atol=2e-4)


def test_the_kv_buffers_are_the_graphs_presents_written_in_place(graphs, pocket):
    path, _ = graphs["fp32"]
    target = lean(path, pocket)
    tokens = torch.arange(5, 25)
    target.forward(tokens, 0)
    pocket.setup_cache(1)
    with torch.inference_mode():
        pocket.prefill(tokens[None])
    for i, layer in enumerate(pocket.layers):
        cache = layer.self_attn.kv_cache
        np.testing.assert_allclose(target.kv[2 * i][:, :, :20], cache.k[:, :, :20], atol=1e-5)
        np.testing.assert_allclose(target.kv[2 * i + 1][:, :, :20], cache.v[:, :, :20],
                                   atol=1e-5)
        assert not target.kv[2 * i][:, :, 20:].any()  # nothing past the written rows
    assert target.kv_bytes() == 20 * target.bytes_per_token


def test_quantized_recipes_quantize_every_weight_matmul_of_the_lean_graph(graphs, pocket):
    model = onnx.load(str(graphs["int4"][0]))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 5 * pocket.cfg.num_hidden_layers + 1  # + LM head
    assert "MatMul" not in ops
    assert ops.count("GroupQueryAttention") == pocket.cfg.num_hidden_layers


def test_a_bundle_records_the_lean_form_and_opens_with_its_backend(bundles, pocket):
    m = read_bundle(bundles["int4"]).manifest
    assert m.kv_cache.form == "in_place" and m.model("target").file == LEAN_FILE
    ins, outs = lean_io_names(pocket.cfg.num_hidden_layers)
    target = m.model("target")
    assert [s.name for s in target.inputs] == ins and [s.name for s in target.outputs] == outs
    assert target.inputs[3].name == "logits_rows"
    assert target.inputs[4].shape == (1, 4, pocket.cfg.max_seq_len, 32)  # static buffer
    assert m.quantization.graphs["target"]["quantized_nodes"] == 31
    _, backend, _ = load_onnx_pair(bundles["int4"], threads=1)
    assert isinstance(backend, OnnxLeanTarget)


def test_a_lean_graph_exported_before_logits_rows_still_runs(graphs, pocket, tmp_path):
    """Bundles exported before the graph took logits_rows compute every row's logits;
    the backend returns the rows asked for all the same, and the manifest check takes
    the older role's I/O."""
    from hyflash.bundle import Manifest

    path, _ = graphs["fp32"]
    model = onnx.load(str(path))
    g = model.graph
    head = next(n for n in g.node if "logits" in n.output)
    head.input[0] = next(n for n in g.node if n.name == "logits_rows/slice").input[0]
    keep = [n for n in g.node if not n.name.startswith("logits_rows/")]
    del g.node[:]
    g.node.extend(keep)
    old_inputs = [i for i in g.input if i.name != "logits_rows"]
    del g.input[:]
    g.input.extend(old_inputs)
    old = tmp_path / "old.onnx"
    onnx.save_model(model, str(old))
    target = lean(old, pocket)
    assert not target.takes_rows
    tokens = torch.arange(5, 25)
    logits, _ = target.forward(tokens, 0)
    target.rollback(0)
    last, _ = target.forward(tokens, 0, logits_rows=1)
    assert logits.shape[0] == 20 and torch.equal(last, logits[-1:])
    with pytest.raises(ValueError, match="logits_rows 21 is not within 1..20"):
        target.forward(tokens, 0, logits_rows=21)

    d = read_bundle(graphs["fp32"][0].parent).manifest.to_dict()
    d["models"]["target"]["inputs"] = [s for s in d["models"]["target"]["inputs"]
                                       if s["name"] != "logits_rows"]
    Manifest.from_dict(d).check("the bundle")  # the older I/O passes the check


@pytest.mark.parametrize("recipe", ["fp32", "int4"])
def test_the_engine_on_a_lean_bundle_is_the_targets_greedy_decode_with_and_without_drafts(
        bundles, graphs, recipe):
    """Plain decoding through the lean graph equals the torch reference with the same
    weights token for token; speculative decoding with the bundle's drafter equals it."""
    _, target, drafter = load_onnx_pair(bundles[recipe], threads=1)
    assert_decodes_losslessly(target, drafter, TorchTarget(graphs[recipe][1]))


def assert_decodes_losslessly(target, drafter, reference=None) -> None:
    """On PROMPTS (pocket tokenizer), 48 new tokens: plain decoding through target equals
    the reference backend's (if given) token for token, speculative decoding with drafter
    equals it, and both the accept and the rollback paths ran."""
    from hyflash.models.pocket import path
    from hyflash.models.tokenizer import load_tokenizer

    tok = load_tokenizer(path())
    plain, spec = SpeculativeEngine(target), SpeculativeEngine(target, drafter)
    accepted = rejected = 0
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        want = plain.generate(ids, max_new_tokens=48).tokens
        if reference is not None:
            assert SpeculativeEngine(reference).generate(ids, max_new_tokens=48).tokens == want
        out = spec.generate(ids, max_new_tokens=48)
        assert out.tokens == want
        accepted += out.stats.accepted_drafts
        rejected += sum(out.stats.position_proposed) - out.stats.accepted_drafts
    assert accepted > 0 and rejected > 0


def test_qwen3_style_target_with_qk_norm_bias_and_untied_head_matches_torch(tmp_path):
    cfg = TargetConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_seq_len=64, qkv_bias=True, qk_norm=True, model_type="qwen3",
                       rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16})
    torch.manual_seed(0)
    target = Target(cfg).eval()
    with torch.no_grad():
        for name, p in target.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # not all ones: a norm weight applied wrongly shows
    export_lean_target(target, tmp_path / "qwen3.onnx")
    assert_same_calls(lean(tmp_path / "qwen3.onnx", target), target, atol=1e-4)


def test_export_refuses_the_lean_form_for_a_head_dim_it_cannot_take(tmp_path, capsys):
    """head_dim 8: one line naming the optimum form, before any graph is written."""
    from conftest import save_tiny_llama

    from hyflash.cli import main
    from hyflash.models.drafter import Drafter

    folder = save_tiny_llama(tmp_path / "target")
    Drafter.for_target(Target.from_pretrained(folder), "hyflash", num_layers=1, num_heads=4,
                       block_size=4, window=16).save(tmp_path / "drafter")
    code = main(["export", "--target", str(folder), "--drafter", str(tmp_path / "drafter"),
                 "--target-graph", "lean", "--out", str(tmp_path / "bundle"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "multiple of 16" in err and "--target-graph optimum" in err
    assert not (tmp_path / "bundle").exists()


def test_requantizing_only_the_drafter_leaves_the_target_fp32_and_names_the_mix(
        bundles, tmp_path, capsys):
    """``requantize_bundle(roles=...)`` (benchmarks/quant_roles.py): only the named graphs
    are quantized, the manifest's recipe says which, the mix still decodes losslessly."""
    from hyflash.errors import HyflashError

    out = requantize_bundle(bundles["fp32"], "int4", tmp_path / "mix",
                            ("drafter_commit", "drafter_step"))
    assert out.quantization.recipe == "int4:drafter_commit+drafter_step"
    m = read_bundle(tmp_path / "mix").manifest
    target_ops = [n.op_type for n in onnx.load(str(tmp_path / "mix" / LEAN_FILE)).graph.node]
    step_ops = [n.op_type for n in onnx.load(
        str(tmp_path / "mix" / m.model("drafter_step").file)).graph.node]
    assert "MatMulNBits" not in target_ops and "MatMulNBits" in step_ops
    assert m.quantization.graphs["target"]["weights"] == "float32"
    _, target, drafter = load_onnx_pair(tmp_path / "mix", threads=1)
    ids = list(range(5, 40))
    want = SpeculativeEngine(target).generate(ids, max_new_tokens=24).tokens
    assert SpeculativeEngine(target, drafter).generate(ids, max_new_tokens=24).tokens == want
    with pytest.raises(HyflashError, match="no graph drafter: its roles are target"):
        requantize_bundle(bundles["fp32"], "int4", tmp_path / "bad", ("drafter",))
    # hyflash budget sizes the mix: the target as fp32, the drafter as int4
    from hyflash.budget.plan import split_recipe
    from hyflash.budget.sources import resolve
    from hyflash.cli import main

    def terms(folder):
        capsys.readouterr()
        assert main(["budget", str(folder), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        return out, {t["key"]: t["stored"] for t in out["terms"]}

    mix, mixed = terms(tmp_path / "mix")
    _, fp32 = terms(bundles["fp32"])
    _, int4 = terms(bundles["int4"])
    assert mix["recipe"]["name"] == "fp32" and mix["drafter_recipe"]["name"] == "int4"
    assert mixed["target.layers"] == fp32["target.layers"]
    assert mixed["drafter.weights"] == int4["drafter.weights"] < fp32["drafter.weights"]
    assert resolve(str(tmp_path / "mix")).recipe == "int4:drafter_commit+drafter_step"
    with pytest.raises(HyflashError, match="one recipe each: requantize the bundle with"):
        split_recipe("int4:drafter_step", "bundle x")
