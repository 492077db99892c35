"""Core ML bundles: target, drafter and drafter-commit .mlpackage, checked as far as Linux
allows, plus the numeric tests a Mac runs as they are.

Core ML predicts on macOS only, so here the tests read the saved packages back: their
inputs, outputs and states against the manifest (names, shapes, dtypes, enumerated token
counts), the quantized weight ops and the bytes each recipe saves, the metadata and
descriptions an app sees. The program a package is converted from is run in torch and
held to ``Target`` (prefill, decode, verify, a verify after a rollback), and the same
torch program converted through the ONNX path must have the same I/O contract and the same
matrix products, weights and softmaxes as the Core ML package. On macOS the packages
predict: greedy tokens follow the torch reference, speculative output is the package's own
greedy decode.

The tiny trained pair of the ONNX tests (conftest's ``onnx_bundles``) is converted once
per session (fp16 with the KV cache as state, int8 / int4 requantized from it, int8 with
explicit KV I/O for iOS 17).
"""

import json
import math
import sys
from collections import Counter
from dataclasses import replace

import pytest
import torch
from cli_checks import exit_2
from coreml_structure import coreml_structure, onnx_structure
from executorch_pairs import on_a_fresh_stack

from hyflash.bundle import read_bundle
from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.target import Target

pytest.importorskip("coremltools")
torch.set_num_threads(1)

MAC = pytest.mark.skipif(sys.platform != "darwin",
                         reason="Core ML predicts on macOS only: on a Mac these run as they are")
FP16_TOL = 0.05  # logits: float16 compute vs the float32 torch reference


@pytest.fixture(scope="session")
def coreml(onnx_bundles, tmp_path_factory):
    """-> (target folder, drafter folder, the ONNX fp32 bundle, {name: Core ML bundle})."""
    from hyflash.export.coreml_bundle import export_coreml_bundle, requantize_coreml_bundle

    folder, drafters, onnx = onnx_bundles
    root = tmp_path_factory.mktemp("coreml")
    b = {name: root / name for name in ("fp16", "int8", "int4", "io-int8")}
    assert on_a_fresh_stack(main, ["export", "--target", str(folder), "--drafter",
                                   str(drafters["hyflash"]), "--backend", "coreml", "--out",
                                   str(b["fp16"]), "--no-progress"]) == 0
    for quant in ("int8", "int4"):
        requantize_coreml_bundle(b["fp16"], quant, b[quant])
    on_a_fresh_stack(export_coreml_bundle, folder, drafters["hyflash"], b["io-int8"],
                     quant="int8", kv="io", progress=False)
    return folder, drafters["hyflash"], onnx["hyflash"], b


def package(bundle, role):
    from hyflash.runtime.coreml_spec import read_package

    return read_package(bundle.path(role))


# ------------------------------------------------------------------ packages vs manifest

@pytest.mark.parametrize("name", ["fp16", "io-int8"])
def test_packages_declare_what_the_manifest_records(coreml, name):
    bundle = read_bundle(coreml[3][name])
    m = bundle.manifest
    t, d = m.target.config, m.drafter.config
    io = {role: package(bundle, role) for role in m.models}
    for role, c in m.models.items():
        assert (io[role].inputs, io[role].outputs) == (c.inputs, c.outputs)
    tgt = io["target"]
    kv_shape = (1, t.num_key_value_heads, t.max_seq_len, t.head_dim)
    past, present = m.kv_names()
    assert tgt.token_counts == (1, d.block_size, 64)  # decode, verify, prefill chunk
    assert [(s.name, s.shape, s.dtype) for s in tgt.inputs[:2]] == \
        [("tokens", (1, "sequence_length"), "int32"), ("input_pos", (1,), "int32")]
    assert [(s.name, s.shape, s.dtype) for s in tgt.outputs[:2]] == \
        [("logits", (1, "sequence_length", t.vocab_size), "float16"),
         ("features", (1, "sequence_length", t.feature_size), "float16")]
    if name == "fp16":  # the KV cache as Core ML state, iOS 18
        assert m.kv_cache.form == "state" and tgt.spec_version == 9
        assert [(s.name, s.shape, s.dtype) for s in tgt.states] == \
            [(n, kv_shape, "float16") for n in past]
        assert len(tgt.inputs) == 2 and len(tgt.outputs) == 2
    else:  # explicit KV inputs and outputs, iOS 17, no states
        assert m.kv_cache.form == "static_io" and tgt.spec_version == 8 and not tgt.states
        assert [(s.name, s.shape, s.dtype) for s in tgt.inputs[2:]] == \
            [(n, kv_shape, "float16") for n in past]
        assert [(s.name, s.shape, s.dtype) for s in tgt.outputs[2:]] == \
            [(n, kv_shape, "float16") for n in present]
    state = {s.name: s for s in m.drafter.state}
    assert {k: (s.shape, s.dtype) for k, s in state.items()} == \
        {"window_k": ((1, 16, 32), "float16"), "window_v": ((1, 16, 32), "float16"),
         "count": ((1,), "int32"), "memory_S": ((1, 4, 8, 8), "float16"),
         "memory_z": ((1, 4, 8), "float16")}
    for role, rows in (("drafter_step", d.block_size), ("drafter_commit", d.window)):
        pkg = io[role]
        assert pkg.spec_version == tgt.spec_version and not pkg.states
        assert pkg.inputs[len(pkg.inputs) - len(state) - 2] == \
            replace(pkg.inputs[0], name="features", shape=(rows, t.feature_size),
                    dtype="float16")
        assert [(s.name, s.shape, s.dtype) for s in pkg.inputs[-len(state):]] == \
            [(s.input, s.shape, s.dtype) for s in state.values()]
        assert [(s.name, s.shape, s.dtype) for s in pkg.outputs[-len(state):]] == \
            [(s.output, s.shape, s.dtype) for s in state.values()]
    assert io["drafter_step"].outputs[0].shape == (d.block_size - 1, t.vocab_size)


def test_packages_carry_hyflash_metadata_and_descriptions(coreml):
    bundle = read_bundle(coreml[3]["fp16"])
    m = bundle.manifest
    for role in m.models:
        pkg = package(bundle, role)
        assert pkg.author == f"hyflash {m.hyflash_version}" and pkg.version == m.hyflash_version
        meta = pkg.metadata
        assert (meta["role"], meta["format"], meta["quantization"]) == (role, "1", "fp16")
        assert int(meta["block_size"]) == m.block_size and int(meta["window"]) == m.window
        assert json.loads(meta["tap_layers"]) == list(m.tap_layers)
        assert json.loads(meta["state"]) == [s.to_dict() for s in m.drafter.state]
        assert json.loads(meta["token_counts"]) == [1, m.block_size, 64]
        assert all(pkg.descriptions.values()), pkg.descriptions  # every input/output/state


# ------------------------------------------------------------------------- quantization

def weight_matrices(pkg) -> int:
    """Elements of the model's weight matrices (from an fp16 package's spec)."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(pkg))
    fn = spec.mlProgram.functions["main"]
    return sum(math.prod(d.constant.size for d in o.type.tensorType.dimensions)
               for op in fn.block_specializations[fn.opset].operations if op.type == "const"
               for o in op.outputs
               if o.name.startswith("p_") and len(o.type.tensorType.dimensions) == 2)


def weights_bytes(bundle, role) -> int:
    return (bundle.path(role) / "Data/com.apple.CoreML/weights/weight.bin").stat().st_size


@pytest.mark.parametrize("quant,bits,op", [("int8", 8, "constexpr_blockwise_shift_scale"),
                                           ("int4", 4, "constexpr_blockwise_shift_scale"),
                                           ("io-int8", 8, "constexpr_affine_dequantize")])
def test_quantized_packages_hold_quantized_weights_and_shrink_as_the_recipe_says(
        coreml, quant, bits, op):
    """Every weight matrix (7 per target layer + embedding + LM head; the drafter's
    projections and the shared embedding / LM head) and nothing else (rope tables, the
    glue's constant matrices) is stored in int8 / int4; the weight file shrinks by what
    the matrices save, less one float16 scale per row (int8) or per 32 weights (int4)."""
    fp16, q = read_bundle(coreml[3]["fp16"]), read_bundle(coreml[3][quant])
    t = q.manifest.target.config
    assert q.manifest.quantization.recipe == quant.removeprefix("io-")
    for role in q.manifest.models:
        pkg = package(q, role)
        n = q.manifest.quantization.graphs[role]["weight_matrices"]
        assert pkg.weight_dtypes == Counter({f"int{bits}": n}) and pkg.ops[op] == n
        assert package(fp16, role).weight_dtypes == Counter()
        elements = weight_matrices(fp16.path(role))
        saved = weights_bytes(fp16, role) - weights_bytes(q, role)
        scales = elements / (32 if bits == 4 else t.hidden_size) * 2
        assert saved > 0.85 * (elements * (2 - bits / 8) - scales), (role, saved, elements)
    assert q.manifest.quantization.graphs["target"]["weight_matrices"] == \
        7 * t.num_hidden_layers + (1 if t.tie_word_embeddings else 2)


# ------------------------------------------------------- the converted program, in torch

@pytest.mark.parametrize("kv", ["state", "io"])
def test_the_converted_torch_program_computes_targets_logits_and_features(coreml, kv):
    """The exact torch.export program coremltools converts (slice-written KV cache, start
    read with .item()), run in torch: a prefill, a decode, a verify and a verify after a
    rollback that overwrites stale cache rows, against Target run without a cache."""
    from hyflash.export.coreml import target_program

    folder = coreml[0]
    reference = Target.from_pretrained(folder)
    module, args, dynamic = target_program(Target.from_pretrained(folder), kv, (1, 4, 64))
    program = torch.export.export(module, args, dynamic_shapes=dynamic).run_decompositions()
    run, caches = program.module(), list(args[2:])
    g = torch.Generator().manual_seed(0)
    before = torch.randint(2, 48, (40,), generator=g)
    after = torch.cat([before[:33], torch.randint(2, 48, (4,), generator=g)])
    for seq, start, end in [(before, 0, 30), (before, 30, 31), (before, 31, 35),
                            (after, 33, 37)]:
        out = run(seq[None, start:end], torch.tensor([start]), *caches)
        logits, features, caches = out[0], out[1], list(out[2:])
        with torch.no_grad():
            want_l, want_f = reference(seq[None, :end])
        assert torch.allclose(logits, want_l[:, start:end], atol=1e-4)
        assert torch.allclose(features, want_f[:, start:end], atol=1e-4)


def test_float16_rmsnorm_survives_activations_whose_square_float16_cannot_hold():
    """SmolLM2's residual stream reaches ~24000, whose square is no float16 (max 65504):
    the plain mean of squares turns such a row into zeros, rms_norm_fp16 does not (and is
    RMSNorm exactly in float32)."""
    from hyflash.export.coreml_modules import rms_norm_fp16
    from hyflash.models.target import RMSNorm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g)
    x[0, 3], x[1], x[2], x[3] = 24000.0, x[1] * 300, x[2] * 1e-2, 0.0
    norm = RMSNorm(64, 1e-5)
    norm.weight.data = torch.rand(64, generator=g) + 0.5
    want = norm(x).detach()
    assert torch.allclose(rms_norm_fp16(x, norm.weight, norm.eps), want, atol=1e-6)
    h, w = x.half(), norm.weight.detach().half()
    assert torch.allclose(rms_norm_fp16(h, w, norm.eps).float(), want, rtol=1e-2, atol=1e-3)
    plain = w * (h / torch.sqrt((h * h).mean(-1, keepdim=True) + norm.eps))
    assert not torch.allclose(plain.float(), want, rtol=1e-2, atol=1e-3)


# --------------------------------------------------- structure: ONNX path vs Core ML path

def test_the_same_torch_program_through_onnx_has_the_same_contract_and_products(
        coreml, tmp_path):
    """Target (KV as I/O: ONNX has no states): the very program Core ML converts, exported
    to ONNX. Drafter: the ONNX bundle's graphs of the same DrafterStep / DrafterCommit.
    Same I/O (names, shapes, float / int), same count of matrix products over the same
    weight matrices, same softmaxes, the same KV writes (ScatterND / scatter)."""
    import warnings

    from hyflash.export.coreml import target_program

    folder, _, onnx_bundle, b = coreml
    bundle = read_bundle(b["io-int8"])
    module, args, dynamic = target_program(Target.from_pretrained(folder), "io", (1, 4, 64))
    program = torch.export.export(module, args, dynamic_shapes=dynamic)
    c = bundle.contract("target")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(program, args, str(tmp_path / "target.onnx"), dynamo=True,
                          input_names=[s.name for s in c.inputs],
                          output_names=[s.name for s in c.outputs], external_data=False,
                          verbose=False)
    onnx_t, coreml_t = onnx_structure(tmp_path / "target.onnx"), \
        coreml_structure(bundle.path("target"))
    layers = bundle.manifest.target.config.num_hidden_layers
    assert onnx_t[:5] == coreml_t[:5] and onnx_t[5] == coreml_t[5] == 2 * layers
    assert onnx_t[4] == layers
    onnx = read_bundle(onnx_bundle)
    for role in ("drafter_step", "drafter_commit"):
        assert onnx_structure(onnx.path(role)) == coreml_structure(bundle.path(role)), role


# ----------------------------------------------------------------------------- runtime

def test_call_plan_uses_enumerated_token_counts_only():
    from hyflash.runtime.coreml_backend import call_plan

    counts = (1, 4, 64)
    assert call_plan(counts, 0, 150, 512) == [(64, 64), (64, 64), (64, 22)]  # padded 22 -> 64
    assert call_plan(counts, 10, 3, 512) == [(4, 3)]  # a short verify pads to B
    assert call_plan(counts, 10, 1, 512) == [(1, 1)]
    assert call_plan(counts, 126, 2, 128) == [(1, 1), (1, 1)]  # padding would pass the end
    assert call_plan(counts, 100, 27, 128) == [(4, 4)] * 6 + [(4, 3)]  # 64 would pass it
    assert call_plan(counts, 125, 3, 128) == [(1, 1)] * 3
    for start, n in [(0, 127), (5, 64), (60, 68), (0, 1)]:
        plan = call_plan(counts, start, n, 128)
        assert sum(r for _, r in plan) == n and all(s in counts for s, _ in plan)
        assert start + sum(r for _, r in plan[:-1]) + plan[-1][0] <= 128


def test_a_package_that_differs_from_the_manifest_is_refused_in_one_line(coreml):
    from hyflash.runtime.coreml_backend import check_packages

    bundle = read_bundle(coreml[3]["fp16"])
    check_packages(bundle)  # as exported: fine, on any OS
    m = bundle.manifest
    target = m.models["target"]
    renamed = replace(target, inputs=(replace(target.inputs[0], name="input_ids"),
                                      *target.inputs[1:]))
    for models in ({**m.models, "target": renamed},
                   {**m.models, "drafter_step": replace(m.models["drafter_step"],
                                                        file="drafter_commit.mlpackage")}):
        with pytest.raises(HyflashError, match="does not match manifest.json") as e:
            check_packages(replace(bundle, manifest=replace(m, models=models)))
        assert "\n" not in str(e.value)


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only")
def test_running_a_coreml_bundle_off_macos_says_where_it_runs(coreml, capsys):
    b = coreml[3]["fp16"]
    for argv in (["simulate", str(b), "--max-new-tokens", "4"],
                 ["generate", "--bundle", str(b), "--prompt", "w3 w4"]):
        exit_2(capsys, argv, "Core ML predicts on macOS only", "--backend onnx or executorch")
    main(["inspect", str(b)])
    assert "backend coreml" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad input

def test_coreml_export_bad_input_is_one_line(coreml, capsys, tmp_path, monkeypatch):
    folder, drafter = coreml[0], coreml[1]
    base = ["export", "--target", str(folder), "--drafter", str(drafter), "--out",
            str(tmp_path / "b"), "--no-progress", "--backend", "coreml"]
    exit_2(capsys, base + ["--coreml-target", "ios17"], "Core ML state", "needs iOS 18",
           "--coreml-kv io")
    exit_2(capsys, base + ["--coreml-target", "ios17", "--coreml-kv", "io", "--quant", "int4"],
           "int4 weights", "needs iOS 18")
    exit_2(capsys, base + ["--quant", "fp32"], "unknown Core ML quantization recipe 'fp32'",
           "fp16, int8, int4")
    exit_2(capsys, base + ["--group-size", "32"], "--group-size applies to --backend executorch")
    exit_2(capsys, base[:-2] + ["--coreml-kv", "io"], "--coreml-kv applies to --backend coreml")
    with monkeypatch.context() as patch:
        patch.setattr("hyflash.extras.find_spec", lambda name: None)
        exit_2(capsys, base, "needs the coreml extra", "pip install 'hyflash[coreml]'")
    with monkeypatch.context() as patch:  # an op coremltools 9 has no conversion for
        from hyflash.models.target import MLP

        patch.setattr(MLP, "forward", lambda self, x: self.down_proj(torch.special.i0(
            self.gate_proj(x))))
        exit_2(capsys, base, "Core ML cannot convert the drafter", "no conversion for the op "
               "'i0'", "--backend onnx or executorch")
    assert not (tmp_path / "b").exists()


def test_int4_refuses_a_layer_whose_inputs_are_not_blocks_of_32():
    from torch import nn

    from hyflash.export.coreml import check_int4_blocks

    check_int4_blocks(nn.Linear(64, 8), nn.Linear(32, 3))
    with pytest.raises(HyflashError, match=r"drafter\.0 has 48: export this model with "
                                           r"--quant int8"):
        check_int4_blocks(nn.Linear(64, 8), nn.Sequential(nn.Linear(48, 8)))


# ------------------------------------------------------------------ macOS: Core ML predicts

def open_pair(bundle):
    from hyflash.runtime.coreml_backend import load_coreml_pair

    return load_coreml_pair(bundle, compute_units="cpu_only")


def prompts(n=4):
    from onnx_pairs import prompts as tiny_prompts

    return tiny_prompts(n, seed=3)


@MAC
@pytest.mark.parametrize("name", ["fp16", "io-int8"])
def test_greedy_tokens_follow_the_torch_reference(coreml, name):
    """Each token Core ML picks greedily is the reference's argmax at that position, up to
    float16: where the reference's top two are closer than FP16_TOL either may win."""
    from hyflash.runtime import SpeculativeEngine

    folder = coreml[0]
    _, target, _ = open_pair(coreml[3][name])
    reference = Target.from_pretrained(folder)
    for prompt in prompts():
        out = SpeculativeEngine(target).generate(prompt, max_new_tokens=24, eos_ids=[])
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + out.tokens]))[0][0]
        rows = logits[len(prompt) - 1:len(prompt) - 1 + len(out.tokens)]
        picked = rows.gather(1, torch.tensor(out.tokens)[:, None])[:, 0]
        tol = FP16_TOL if name == "fp16" else 0.5  # int8 weights move logits further
        assert (rows.max(-1).values - picked <= tol).all(), (prompt, out.tokens)


@MAC
@pytest.mark.parametrize("name", ["fp16", "int4", "io-int8"])
def test_speculative_output_is_the_packages_own_greedy_decode(coreml, name):
    """Lossless with the drafter: the speculative loop on the packages writes exactly the
    target package's plain greedy decode, and the drafter's proposals are accepted."""
    from hyflash.runtime import SpeculativeEngine

    _, target, drafter = open_pair(coreml[3][name])
    taus = []
    for prompt in prompts():
        plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=32, eos_ids=[])
        spec = SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=32,
                                                            eos_ids=[])
        assert spec.tokens == plain.tokens, prompt
        taus.append(spec.stats.tau)
    assert max(taus) > 1.2
