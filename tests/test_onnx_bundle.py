"""ONNX bundles: the exported graphs compute what the torch models compute, the ONNX
runtime reproduces the torch reference engine token for token, quantized bundles stay
lossless, and optimum's ORTModelForCausalLM runs the target graph as it is."""

import hashlib
import json

import numpy as np
import onnx
import pytest
import torch
from onnx_pairs import BUNDLES, CONTEXT, prompts

from hyflash.bundle import read_bundle
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.drafter_backend import TorchDrafter
from hyflash.runtime.onnx_backend import load_onnx_pair


@pytest.fixture(scope="module")
def pair(onnx_bundles):
    """conftest's tiny pair (target folder, drafters, bundles), exported once per session."""
    return onnx_bundles


def torch_pair(folder, drafter_dir):
    target = Target.from_pretrained(folder)
    return target, load_drafter(drafter_dir, target)


def onnx_pair(bundle):
    _, target, drafter = load_onnx_pair(bundle, threads=1)
    return target, drafter


# ------------------------------------------------------------------- the bundle

def test_every_file_is_hashed_and_every_graph_passes_the_checker(pair):
    _, _, bundles = pair
    for bundle in bundles.values():
        m = read_bundle(bundle).manifest
        assert {"model.onnx", "drafter.onnx", "drafter_commit.onnx", "config.json",
                "generation_config.json", "tokenizer.json"} <= set(m.files)
        for name, entry in m.files.items():
            data = (bundle / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry.sha256
            if name.endswith(".onnx"):
                onnx.checker.check_model(str(bundle / name), full_check=True)


def test_manifest_records_the_io_contract_state_and_kv_layout(pair):
    folder, _, bundles = pair
    m = read_bundle(bundles["hyflash"]).manifest
    hf = json.loads((folder / "config.json").read_text())
    layers = hf["num_hidden_layers"]
    assert m.format_version == 2 and m.backend == "onnx"
    assert m.drafter.window_cache == "kv" and m.block_size == 4
    assert read_bundle(bundles["hyflash-features"]).manifest.drafter.window_cache == "features"
    assert m.target.config.hidden_size == hf["hidden_size"]
    assert m.drafter.config.window == m.window == 16
    assert m.max_context == CONTEXT and m.quantization.recipe == "fp32"
    raw = json.loads((bundles["hyflash"] / "manifest.json").read_text())
    for copy in ("block_size", "window", "tap_layers", "max_context", "state_bytes"):
        assert copy not in raw  # stored once, in the configs and specs

    target = m.models["target"]
    kv = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    assert [i.name for i in target.inputs] == ["input_ids", "attention_mask", "position_ids",
                                               *kv]
    assert m.kv_names()[0] == kv
    outs = {o.name: o for o in target.outputs}
    assert list(outs)[:3] == ["logits", "features", "argmax"]
    assert outs["logits"].shape == (1, "sequence_length", hf["vocab_size"])
    assert outs["argmax"].dtype == "int64"
    assert outs["present.0.key"].shape == (1, hf["num_key_value_heads"],
                                           "past_sequence_length + sequence_length",
                                           hf["hidden_size"] // hf["num_attention_heads"])

    step = m.models["drafter_step"]
    names = [s.name for s in m.drafter.state]
    assert names == ["window_k", "window_v", "count", "memory_S", "memory_z"]
    assert [i.name for i in step.inputs] == ["anchor", "features", "n_valid",
                                             *(f"state.{n}" for n in names)]
    assert [o.name for o in step.outputs] == ["logits", *(f"new_state.{n}" for n in names)]
    for spec in step.inputs + step.outputs:  # every drafter shape is fixed
        assert all(isinstance(d, int) for d in spec.shape), spec
    by_name = {i.name: i for i in step.inputs}
    for s in m.drafter.state:
        assert by_name[s.input].shape == s.shape
    _, drafter = torch_pair(folder, pair[1]["hyflash"])  # its window caches K/V too
    assert m.state_bytes == sum(v.numel() * v.element_size() for v in drafter.init_state().values())
    assert m.kv_bytes_per_token == 2 * layers * 2 * 8 * 4


def test_the_tied_embedding_is_stored_once_and_loaded_once(pair):
    """Target and drafter step graph reference one file, which ONNX Runtime maps (the
    drafter's step and commit graphs also share its projections the same way)."""
    folder, _, bundles = pair
    embed = Target.from_pretrained(folder).embed_tokens.weight.detach().numpy()
    for bundle in bundles.values():
        m = read_bundle(bundle).manifest
        (name, w), = [(n, w) for n, w in m.shared_weights.items() if w.shape == embed.shape]
        assert w.roles == ("drafter_step", "target")
        assert name == "shared.target.embed_tokens.weight"
        assert m.quantization.recipe != "fp32" or any(  # (int4 ones are below MIN_BYTES)
            w.roles == ("drafter_commit", "drafter_step") for w in m.shared_weights.values())
        np.testing.assert_array_equal(np.fromfile(bundle / w.file, np.float32).reshape(w.shape),
                                      embed)
        for role in w.roles:
            inits = onnx.load(str(bundle / m.models[role].file),
                              load_external_data=False).graph.initializer
            held = [i for i in inits if i.name == name]
            assert len(held) == 1 and held[0].data_location == onnx.TensorProto.EXTERNAL
            assert not any(i.raw_data == embed.tobytes() for i in inits)  # no second copy


# ------------------------------------------------------------ graphs vs torch

@torch.no_grad()
def test_target_graph_matches_torch_on_prefill_decode_verify_and_rollback(pair):
    folder, drafters, bundles = pair
    ref = TorchTarget(Target.from_pretrained(folder))
    ort_target, _ = onnx_pair(bundles["hyflash"])
    prompt = torch.tensor(prompts(1, seed=3, lo=30, hi=31)[0])
    steps = [(prompt, 0), (torch.tensor([7]), 30), (torch.tensor([7, 8, 9, 10]), 31),
             (torch.tensor([11, 12]), 32)]  # the last one after a rollback to 32
    for tokens, pos in steps:
        if pos < ort_target.length:
            ref.rollback(pos)
            ort_target.rollback(pos)
        want = ref.forward(tokens, pos)
        out = ort_target.run(tokens.numpy(), pos)
        torch.testing.assert_close(torch.from_numpy(out["logits"][0]), want[0], atol=1e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(torch.from_numpy(out["features"][0]), want[1], atol=1e-4,
                                   rtol=1e-4)
        assert np.array_equal(out["argmax"][0], out["logits"][0].argmax(-1))
    assert ort_target.length == 34


@pytest.mark.parametrize("name", BUNDLES)
@torch.no_grad()
def test_drafter_graphs_match_the_torch_drafter(pair, name):
    """Same commits (a 40-row prefill split over commit-only calls, then rounds of 1..B
    rows), same drafts: logits within fp32 tolerance (the torch reference keeps K/V)."""
    folder, drafters, bundles = pair
    target, drafter = torch_pair(folder, drafters[BUNDLES[name][0]])
    ref = TorchDrafter(drafter)
    _, ort_drafter = onnx_pair(bundles[name])
    seq = torch.tensor([prompts(1, seed=5, lo=80, hi=81)[0]])
    feats = target(seq, 0)[1][0]
    pos, gen = 40, torch.Generator().manual_seed(0)
    ref.commit(feats[:pos])
    ort_drafter.commit(feats[:pos])
    while pos < 76:
        anchor = int(seq[0, pos])
        torch.testing.assert_close(ort_drafter.draft(anchor, pos), ref.draft(anchor, pos),
                                   atol=1e-4, rtol=1e-4)
        n = int(torch.randint(1, 5, (1,), generator=gen))
        ref.commit(feats[pos:pos + n])
        ort_drafter.commit(feats[pos:pos + n])
        pos += n
    assert ort_drafter.calls["commit"] >= 1  # the prefill went through the commit graph


# ------------------------------------------------------------- the whole loop

@pytest.mark.parametrize("name", BUNDLES)
def test_fp32_bundle_generates_the_torch_reference_tokens(pair, name):
    folder, drafters, bundles = pair
    target, drafter = torch_pair(folder, drafters[BUNDLES[name][0]])
    reference = SpeculativeEngine(TorchTarget(target), TorchDrafter(drafter))
    ort_target, ort_drafter = onnx_pair(bundles[name])
    exported = SpeculativeEngine(ort_target, ort_drafter)
    taus = []
    for prompt in prompts(4, seed=1):
        want = reference.generate(prompt, max_new_tokens=40, eos_ids=[1])
        got = exported.generate(prompt, max_new_tokens=40, eos_ids=[1])
        assert got.tokens == want.tokens
        # the same drafts were proposed and accepted, position by position
        assert got.stats.position_accepted == want.stats.position_accepted
        assert got.stats.rounds == want.stats.rounds
        taus.append(got.stats.tau)
    assert max(taus) > 1.2  # drafts were accepted (and, with tau < B, also rejected)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_bundles_stay_lossless(pair, quant):
    """Quantization changes the target; verification keeps the output exactly what the
    (quantized) ONNX target produces alone."""
    _, _, bundles = pair
    bundle = read_bundle(bundles[quant])
    fp32 = read_bundle(bundles["hyflash"])
    assert bundle.manifest.quantization.recipe == quant
    bits = {a.i for n in onnx.load(str(bundle.path("target"))).graph.node
            if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert bits == {int(quant[3:])}
    size = bundle.manifest.files["model.onnx"].bytes
    assert size < 0.75 * fp32.manifest.files["model.onnx"].bytes
    for role in bundle.manifest.models:  # every weight matrix, in every graph
        graph = onnx.load(str(bundle.path(role))).graph
        weights = {i.name for i in graph.initializer}
        float_weights = [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm")
                         and n.input[1] in weights]
        assert not float_weights, (role, float_weights)

    ort_target, ort_drafter = onnx_pair(bundles[quant])
    plain, spec = SpeculativeEngine(ort_target), SpeculativeEngine(ort_target, ort_drafter)
    reference = SpeculativeEngine(*onnx_pair(bundles["hyflash"]))  # the fp32 bundle
    tokens = {"quant": 0, "fp32": 0}
    rounds = {"quant": 0, "fp32": 0}
    for prompt in prompts(6, seed=2):
        want = plain.generate(prompt, max_new_tokens=40)
        got = spec.generate(prompt, max_new_tokens=40)
        assert got.tokens == want.tokens
        assert got.stats.target_calls < want.stats.target_calls
        for key, run in (("quant", got), ("fp32", reference.generate(prompt, max_new_tokens=40))):
            tokens[key] += run.stats.rounds + run.stats.accepted_drafts
            rounds[key] += run.stats.rounds
    tau = {k: tokens[k] / rounds[k] for k in tokens}
    assert abs(tau["quant"] - tau["fp32"]) <= 0.1 * tau["fp32"], tau


def test_optimum_ort_model_runs_the_target_graph(pair):
    """ORTModelForCausalLM finds model.onnx, config.json and generation_config.json in the
    bundle, feeds past_key_values / reads present itself, and decodes our tokens."""
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForCausalLM

    _, _, bundles = pair
    for name in ("hyflash", "int4"):
        opts = SessionOptions()
        opts.intra_op_num_threads = 1
        model = ORTModelForCausalLM.from_pretrained(bundles[name], session_options=opts)
        assert model.can_use_cache
        ort_target, _ = onnx_pair(bundles[name])
        plain = SpeculativeEngine(ort_target)
        for prompt in prompts(2, seed=4):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                                 do_sample=False, pad_token_id=0)  # stops at eos (id 1)
            want = plain.generate(prompt, max_new_tokens=20, eos_ids=[1]).tokens
            assert out[0, len(prompt):].tolist() == want


def test_onnx_target_refuses_gaps_and_overflow(pair):
    _, _, bundles = pair
    ort_target, _ = onnx_pair(bundles["hyflash"])
    ort_target.forward(torch.tensor([3, 4, 5]), 0)
    with pytest.raises(ValueError, match="gap"):
        ort_target.forward(torch.tensor([6]), 5)
    with pytest.raises(Exception, match="do not fit the target's context"):
        ort_target.forward(torch.zeros(CONTEXT, dtype=torch.long), 3)


def test_onnx_sessions_never_spin(pair):
    """Idle intra-op threads that spin after a run take the cores from the next session's
    run (drafter, then target, then drafter ...): every session of a bundle turns it off."""
    bundles = pair[2]
    _, target, drafter = load_onnx_pair(bundles["hyflash"], threads=1)
    for session in (target.session, drafter.step, drafter.commit_only):
        options = session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_onnx_runtime_fuses_every_rms_norm(pair, tmp_path):
    """Each RMSNorm reaches ONNX Runtime as one fused node, not six small ones: at this
    model size per-node overhead is most of a call (benchmarks/onnx_profile.py)."""
    import onnxruntime as ort

    folder, _, bundles = pair
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    bundle = read_bundle(bundles["hyflash"])
    expected = {"target": 2 * layers + 1,  # two per layer + the final norm
                "drafter_step": 2 * 1 + 2}  # two per layer + fc_norm + the final norm
    for role, n in expected.items():
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = str(tmp_path / f"{role}.onnx")
        ort.InferenceSession(str(bundle.path(role)), opts, providers=["CPUExecutionProvider"])
        optimized = onnx.load(opts.optimized_model_filepath, load_external_data=False)
        ops = [node.op_type for node in optimized.graph.node]
        assert ops.count("SimplifiedLayerNormalization") == n, role
        assert "Reciprocal" not in ops


def test_export_api_refuses_a_drafter_trained_for_another_target(pair, tmp_path):
    """The Python API, like the CLI, never re-taps a target to suit a foreign drafter: the
    pocket drafter (4096 tokens, taps [1, 2, 4]) does not fit the tiny target."""
    from hyflash.errors import HyflashError
    from hyflash.export.bundle import export_onnx_bundle

    with pytest.raises(HyflashError, match="trained for another target"):
        export_onnx_bundle(pair[0], "pocket", tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()
