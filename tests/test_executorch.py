"""ExecuTorch bundles: one .pte with forward / features / draft / commit.

The fp32 program of the pocket pair must decode exactly what the torch reference decodes
(plain and with the shipped pocket drafter), its forward + features must compute
Target's logits and features over a prefill longer than the feature ring (chunked),
decode, verify and a verify after a rollback (the KV cache lives inside the program), the
drafter's state must keep the manifest's shapes through every call, the metadata methods
must say what the manifest says, and ExecuTorch's own LLM runner must load the program
and decode the target's greedy text.

The 8da4w program must stay lossless: a verify row is bit for bit what a decode of that
row gives, so speculative output is the program's own greedy decode. Lowering an 8da4w
pair costs ~2.5x an fp32 one (quantize / dequantize nodes in every linear), so these
tests use the tiny trained pair of the ONNX tests (a 3-layer Llama and a 1-layer drafter)
instead of the pocket pair. Each program is exported once per session.
"""

import pytest
import torch
from cli_checks import exit_2
from executorch_pairs import CONTEXT, on_a_fresh_stack

from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.target import Target
from hyflash.models.tokenizer import load_tokenizer
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.drafter_backend import load_torch_drafter

pytest.importorskip("executorch")
torch.set_num_threads(1)

PROMPTS = ["def read_config(path):\n",
           "import os\nimport sys\n\nclass Parser:\n    def __init__(self",
           "for i in range(10):\n"]


@pytest.fixture(scope="session")
def tiny_8da4w(tmp_path_factory):
    """The tiny trained pair (onnx_pairs.tiny_pair) and its 8da4w ExecuTorch bundle."""
    from onnx_pairs import CONTEXT as TINY_CONTEXT
    from onnx_pairs import tiny_pair

    from hyflash.export.executorch_bundle import export_executorch_bundle

    root = tmp_path_factory.mktemp("et-tiny")
    folder, drafters = tiny_pair(root, archs=("hyflash",))
    on_a_fresh_stack(export_executorch_bundle, folder, drafters["hyflash"], root / "8da4w",
                     quant="8da4w", max_seq_len=TINY_CONTEXT, progress=False)
    return folder, drafters["hyflash"], root / "8da4w"


@pytest.fixture(scope="module")
def reference():
    target = Target.from_pretrained("pocket", max_seq_len=CONTEXT)
    return target, SpeculativeEngine(TorchTarget(target), load_torch_drafter("pocket", target))


def open_pair(bundle):
    from hyflash.runtime.executorch_backend import load_executorch_pair

    return load_executorch_pair(bundle, threads=1)


def prompt_ids(bundle) -> list[list[int]]:
    tok = load_tokenizer(bundle)
    return [tok(p).input_ids for p in PROMPTS]


def test_fp32_program_decodes_what_torch_decodes_plain_and_with_the_pocket_drafter(
        fp32_bundle, reference):
    _, target, drafter = open_pair(fp32_bundle)
    taus = []
    for ids in prompt_ids(fp32_bundle):
        want = reference[1].generate(ids, max_new_tokens=40)
        spec = SpeculativeEngine(target, drafter).generate(ids, max_new_tokens=40)
        plain = SpeculativeEngine(target).generate(ids, max_new_tokens=40)
        assert spec.tokens == plain.tokens == want.tokens
        assert spec.stats.tau == pytest.approx(want.stats.tau)
        taus.append(spec.stats.tau)
    assert max(taus) > 1.5  # the drafter's proposals were accepted, rollbacks happened


def test_forward_and_features_compute_targets_logits_and_features_across_a_rollback(
        fp32_bundle, reference):
    """Rows of a prefill longer than the feature ring (two chunks), a decode, a verify
    block and a verify after a rollback that overwrites stale cache rows, against a fresh
    Target run over the whole sequence."""
    bundle, target, _ = open_pair(fp32_bundle)
    rows = bundle.contract("target").commit_rows
    assert rows == 64 and target.rows == rows
    g = torch.Generator().manual_seed(0)
    before = torch.randint(1, 4096, (110,), generator=g)
    after = torch.cat([before[:103], torch.randint(1, 4096, (4,), generator=g)])
    for seq, start, end in [(before, 0, 100), (before, 100, 101), (before, 101, 109),
                            (after, 103, 107)]:
        if seq is after:
            target.rollback(start)
        logits, features = target.forward(seq[start:end], start)
        with torch.no_grad():
            want_l, want_f = reference[0](seq[None, :end])  # no cache: one causal pass
        assert torch.allclose(logits, want_l[0, start:end], atol=2e-4)
        assert torch.allclose(features, want_f[0, start:end], atol=2e-4)
        assert torch.equal(logits.argmax(-1), want_l[0, start:end].argmax(-1))


class Checked:
    """A drafter method whose every state input and output is held to the manifest."""

    def __init__(self, method, specs, state_at, calls):
        self.method, self.specs, self.state_at, self.calls = method, specs, state_at, calls

    def execute(self, inputs):
        out = self.method.execute(inputs)
        for values in (inputs[self.state_at:], out[len(out) - len(self.specs):]):
            assert [(tuple(v.shape), str(v.dtype)) for v in values] == \
                [(s.shape, f"torch.{s.dtype}") for s in self.specs]
        self.calls.append(len(inputs))
        return out


def test_drafter_state_keeps_the_manifests_shapes_at_every_call(fp32_bundle):
    bundle, target, drafter = open_pair(fp32_bundle)
    specs, calls = bundle.manifest.drafter.state, []
    drafter.step = Checked(drafter.step, specs, 3, calls)
    drafter.commit_only = Checked(drafter.commit_only, specs, 2, calls)
    long_prompt = prompt_ids(fp32_bundle)[1] * 4  # > one step's rows: commit-only runs too
    SpeculativeEngine(target, drafter).generate(long_prompt[:90], max_new_tokens=20)
    assert drafter.calls["commit"] >= 1 and drafter.calls["step"] >= 3
    assert len(calls) == drafter.calls["commit"] + drafter.calls["step"]


def test_metadata_methods_return_what_the_manifest_records(fp32_bundle):
    import json

    from executorch.runtime import Runtime

    bundle, _, _ = open_pair(fp32_bundle)
    m = bundle.manifest
    program = Runtime.get().load_program(fp32_bundle / "model.pte")

    def get(name):
        return program.load_method(name).execute([])

    t = m.target.config
    assert get("get_max_context_len") == [CONTEXT]
    # tokens per call: the stock runner prefills in chunks of it (activations sized for it)
    assert get("get_max_seq_len") == [m.model("target").commit_rows]
    assert get("get_vocab_size") == [t.vocab_size] and get("get_bos_id") == [t.bos_token_id]
    assert get("get_eos_ids") == list(t.eos_token_ids)
    assert get("use_kv_cache") == [True] and get("enable_dynamic_shape") == [True]
    assert get("use_sdpa_with_kv_cache") == [False]
    assert get("get_block_size") == [m.block_size] and get("get_window") == [m.window]
    assert get("get_feature_size") == [t.feature_size]
    assert get("get_tap_layers") == list(m.tap_layers)
    assert get("get_window_cache") == [m.drafter.window_cache]
    assert get("get_commit_rows") == [m.model("drafter_commit").commit_rows]
    assert get("get_feature_rows") == [m.model("target").commit_rows]
    assert json.loads(get("get_state")[0]) == [
        {"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in m.drafter.state]
    assert {"forward", "features", "draft", "commit"} <= program.method_names


def test_the_stock_llm_runner_decodes_the_targets_greedy_text(fp32_bundle, reference):
    """A prompt longer than get_max_seq_len: the runner prefills it in chunks."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    prompt = PROMPTS[1] * 4
    tok = load_tokenizer(fp32_bundle)
    assert len(tok(prompt).input_ids) > 64
    runner = TextLLMRunner(str(fp32_bundle / "model.pte"), str(fp32_bundle / "tokenizer.json"))
    pieces = []
    runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=24, temperature=0.0),
                    token_callback=pieces.append)
    want = SpeculativeEngine(TorchTarget(reference[0])).generate(
        tok(prompt).input_ids, max_new_tokens=24)
    assert "".join(pieces) == tok.decode(want.tokens)


def test_generate_and_simulate_run_an_executorch_bundle(fp32_bundle, capsys, tmp_path):
    assert main(["generate", "--bundle", str(fp32_bundle), "--prompt", PROMPTS[0],
                 "--max-new-tokens", "16"]) == 0
    assert "tau" in capsys.readouterr().out
    prompts = tmp_path / "p.txt"
    prompts.write_text(PROMPTS[2] + "\n")
    assert main(["simulate", str(fp32_bundle), "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--no-progress"]) == 0
    assert "speedup" in capsys.readouterr().out


def test_8da4w_verify_rows_equal_decodes_of_those_rows(tiny_8da4w):
    """Per-token activation scales: row i of a verify of 8 tokens is bit for bit what a
    decode of token i alone computes, so verification of a quantized target is lossless."""
    _, target, _ = open_pair(tiny_8da4w[2])
    seq = torch.randint(2, 48, (18,), generator=torch.Generator().manual_seed(1))
    target.forward(seq[:10], 0)
    block, block_features = target.forward(seq[10:18], 10)
    rows, row_features = [], []
    for i in range(10, 18):
        target.rollback(i)
        logits, features = target.forward(seq[i:i + 1], i)
        rows.append(logits[0])
        row_features.append(features[0])
    assert torch.equal(block, torch.stack(rows))
    assert torch.equal(block_features, torch.stack(row_features))


def test_8da4w_speculative_output_is_its_own_greedy_decode_with_fp32s_tau(tiny_8da4w):
    """tau against the fp32 pair's (the torch reference, which the fp32 program matches
    token for token and tau for tau: the pocket test above)."""
    from onnx_pairs import CONTEXT as TINY_CONTEXT
    from onnx_pairs import prompts

    folder, drafter_dir, bundle_dir = tiny_8da4w
    bundle, target, drafter = open_pair(bundle_dir)
    assert bundle.manifest.quantization.recipe == "8da4w"
    fp32 = Target.from_pretrained(folder, max_seq_len=TINY_CONTEXT)
    reference = SpeculativeEngine(TorchTarget(fp32), load_torch_drafter(drafter_dir, fp32))
    tau, f_tau = [], []
    for ids in prompts(16):  # fewer give a noisy mean: 6 prompts differed by 12%
        spec = SpeculativeEngine(target, drafter).generate(ids, max_new_tokens=40)
        assert spec.tokens == SpeculativeEngine(target).generate(ids, max_new_tokens=40).tokens
        tau.append(spec.stats.tau)
        f_tau.append(reference.generate(ids, max_new_tokens=40).stats.tau)
    assert sum(tau) / len(tau) == pytest.approx(sum(f_tau) / len(f_tau), rel=0.1)
    assert max(tau) > 1.5


@pytest.mark.parametrize("argv, needle", [
    (["--quant", "int4"], "unknown ExecuTorch quantization recipe 'int4'"),
    (["--quant", "int8"], "unknown ExecuTorch quantization recipe 'int8'"),
    (["--group-size", "32"], "--group-size applies to the 8da4w recipe only, not fp32"),
    (["--quant", "8da4w", "--group-size", "48"], "--group-size 48 is not a multiple of 32"),
    (["--quant", "8da4w", "--group-size", "0"], "--group-size"),
    (["--target-graph", "lean"], "--target-graph applies to --backend onnx"),
])
def test_export_bad_input_is_one_line(capsys, tmp_path, argv, needle):
    exit_2(capsys, ["export", "--target", "pocket", "--drafter", "pocket", "--backend",
                    "executorch", "--out", str(tmp_path / "b"), *argv], needle)
    assert not (tmp_path / "b").exists()


def test_a_group_size_that_does_not_divide_a_layer_is_refused(tmp_path):
    from hyflash.export.executorch_bundle import export_executorch_bundle

    with pytest.raises(HyflashError, match="--group-size 128 does not divide the input size "
                                           "704 of target.layers.0.mlp.down_proj"):
        export_executorch_bundle("pocket", "pocket", tmp_path / "b", quant="8da4w",
                                 group_size=128, max_seq_len=CONTEXT, progress=False)
    assert not (tmp_path / "b").exists()


def test_a_program_from_another_hyflash_or_runtime_is_refused(fp32_bundle, monkeypatch):
    import hyflash.runtime.executorch_backend as eb
    from hyflash.export.executorch import FORMAT
    from hyflash.runtime.onnx_backend import load_onnx_pair

    assert eb.PROGRAM_FORMAT == FORMAT
    monkeypatch.setattr(eb, "PROGRAM_FORMAT", FORMAT + 1)
    with pytest.raises(HyflashError, match=f"has program format {FORMAT}, this hyflash "
                                           f"reads {FORMAT + 1}"):
        open_pair(fp32_bundle)
    with pytest.raises(HyflashError, match="is for executorch, not onnx"):
        load_onnx_pair(fp32_bundle)
