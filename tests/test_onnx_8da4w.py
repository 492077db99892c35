"""The ONNX ``8da4w`` recipe (int4 weights, int8 activations per block and row at run
time: MatMulNBits accuracy level 4) stays lossless. The lean target graph's attention
computes a call of one row slightly differently from the same row inside a longer call,
and so does MatMulNBits on an AVX2 CPU in either form; int8 activations amplify that, so
the backends of both forms pad a one-token call to two rows: a decode then computes bit
for bit what a verify computes. Both forms, on the pocket pair."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_onnx_lean import assert_decodes_losslessly

from hyflash.bundle import read_bundle
from hyflash.errors import HyflashError
from hyflash.export.bundle import export_onnx_bundle, requantize_bundle
from hyflash.runtime.onnx_backend import load_onnx_pair

torch.set_num_threads(1)
ort.set_default_logger_severity(3)

FORMS = ("lean", "optimum")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """{form: the pocket pair exported in that target graph form, requantized to 8da4w;
    lean-8da8w: the lean one requantized to 8da8w}."""
    root = tmp_path_factory.mktemp("8da4w")
    out = {}
    for form in FORMS:
        export_onnx_bundle("pocket", "pocket", root / f"{form}-fp32", "fp32", progress=False,
                           target_graph=form)
        out[form] = root / form
        requantize_bundle(root / f"{form}-fp32", "8da4w", out[form])
    out["lean-8da8w"] = root / "lean-8da8w"
    requantize_bundle(root / "lean-fp32", "8da8w", out["lean-8da8w"])
    return out


def decode_vs_verify(target, trials: int = 4) -> float:
    """Largest logit difference between 8 one-token calls and one 8-token call over the
    same tokens after the same random prompt."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(trials):
        prompt = torch.tensor(rng.integers(3, 200, 20 + 10 * trial))
        block = torch.tensor(rng.integers(3, 200, 8))
        target.rollback(0)
        target.forward(prompt, 0)
        verify, _ = target.forward(block, len(prompt))
        target.rollback(len(prompt))
        decoded = torch.stack([target.forward(block[i:i + 1], len(prompt) + i)[0][0]
                               for i in range(8)])
        worst = max(worst, float((decoded - verify).abs().max()))
    return worst


def test_the_recipe_quantizes_activations_and_both_target_forms_record_two_rows(bundles):
    m = read_bundle(bundles["lean"]).manifest
    assert m.quantization.recipe == "8da4w"
    for name in bundles:
        graphs = read_bundle(bundles[name]).manifest.quantization.graphs
        assert graphs["target"]["min_rows"] == 2, name
        assert "min_rows" not in graphs["drafter_step"], name
    from hyflash.bundle.describe import describe

    shown = describe(read_bundle(bundles["lean"]))  # what `hyflash inspect` prints
    assert "activations int8 per block of 32" in shown and "run as 2 rows" in shown
    for role, graph in m.quantization.graphs.items():
        assert graph["accuracy_level"] == 4, role
        nodes = onnx.load(str(bundles["lean"] / m.model(role).file)).graph.node
        levels = {a.i for n in nodes if n.op_type == "MatMulNBits"
                  for a in n.attribute if a.name == "accuracy_level"}
        assert levels == {4}, role


@pytest.mark.parametrize("name", [*FORMS, "lean-8da8w"])
def test_a_padded_decode_computes_exactly_the_rows_of_a_verify(bundles, name):
    _, target, _ = load_onnx_pair(bundles[name], threads=1)
    assert target.min_rows == 2
    assert decode_vs_verify(target) == 0.0
    if name != "optimum":  # the optimum form's one row differs on some CPUs only (AVX2)
        target.min_rows = 1  # what a one-row call computes instead: why the backend pads
        assert decode_vs_verify(target) > 1e-3


def test_an_optimum_8da_bundle_without_the_record_is_padded_too(bundles, tmp_path):
    """Optimum-form 8da bundles exported before the record covered that form say nothing
    of min_rows; their int8 activations still get the pad, and stay lossless."""
    import json
    import shutil

    from hyflash.bundle import seal
    from hyflash.bundle.records import Quantization

    old = tmp_path / "optimum-unrecorded"
    shutil.copytree(bundles["optimum"], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["quantization"]["graphs"]["target"]["min_rows"]
    (old / "manifest.json").write_text(json.dumps(seal(manifest)))  # as an export wrote it
    _, target, drafter = load_onnx_pair(old, threads=1)
    assert target.min_rows == 2
    assert decode_vs_verify(target) == 0.0
    assert_decodes_losslessly(target, drafter)
    assert Quantization("int4", {"target": {"weights": "int4"}}).min_rows() == 1
    assert Quantization("fp32", {}).min_rows() == 1
    assert Quantization("8da4w", {"target": {"accuracy_level": 4, "min_rows": 3}}).min_rows() == 3


@pytest.mark.parametrize("name", [*FORMS, "lean-8da8w"])
def test_speculative_decoding_is_the_padded_plain_decode(bundles, name):
    _, target, drafter = load_onnx_pair(bundles[name], threads=1)
    assert_decodes_losslessly(target, drafter)


@pytest.mark.parametrize("name", FORMS)
def test_the_pad_row_costs_the_last_cache_position(bundles, name):
    """The usable context is the graph's minus one: a decode at the last usable position
    still has room for its pad, one more is refused in one line."""
    _, target, _ = load_onnx_pair(bundles[name], threads=1)
    cfg = read_bundle(bundles[name]).manifest.target.config
    assert target.max_seq_len == cfg.max_seq_len - 1
    n = target.max_seq_len - 1
    target.forward(torch.arange(n) % 200 + 3, 0)
    logits, _ = target.forward(torch.tensor([5]), n)
    assert logits.shape == (1, cfg.vocab_size) and target.length == target.max_seq_len
    with pytest.raises(HyflashError, match="do not fit the target's context"):
        target.forward(torch.tensor([5]), target.max_seq_len)


@pytest.mark.parametrize("name", ["lean", "lean-8da8w"])
def test_the_budget_sizes_what_the_recipe_stored(bundles, name):
    from test_budget_memory import initializer_bytes

    from hyflash.budget import memory
    from hyflash.budget.plan import for_bundle
    from hyflash.budget.sources import resolve

    src = resolve(str(bundles[name]))
    plan = for_bundle(src)
    assert plan.recipe.name == read_bundle(bundles[name]).manifest.quantization.recipe
    assert plan.recipe.offered
    estimate, real = memory.budget(plan).stored, initializer_bytes(src.bundle)
    assert abs(estimate / real - 1) < 0.03, (estimate, real)
