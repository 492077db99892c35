"""The target decoder matches transformers for every supported family, with and
without its static KV cache, before and after a rollback."""

import contextlib
import json

import pytest
import torch
import transformers

from hyflash.models.target import Target, TargetLoadError

BASE = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5)

FAMILIES = {
    "llama-untied": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3-rope": (transformers.LlamaConfig, dict(
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=32))),
    "mistral": (transformers.MistralConfig, dict(tie_word_embeddings=False, sliding_window=None)),
    "smollm-tied-mha": (transformers.LlamaConfig, dict(tie_word_embeddings=True,
                                                        num_key_value_heads=4)),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, dict(tie_word_embeddings=False, head_dim=24)),
}


def make_hf(name, tmp_path):
    cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    cfg = cls(**{**BASE, **extra})
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    # random init leaves biases and norms at 0/1; perturb so they matter in the comparison
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    folder = tmp_path / name
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder


@pytest.fixture(params=list(FAMILIES))
def pair(request, tmp_path):
    hf, folder = make_hf(request.param, tmp_path)
    ours = Target.from_pretrained(folder)
    return hf, ours


def prompt(n=11, vocab=BASE["vocab_size"], seed=1):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def hf_greedy(hf, ids, n):
    out = hf.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                      pad_token_id=0, eos_token_id=None)
    return out[0, ids.shape[1]:].tolist()


def our_greedy(model, ids, n):
    """Prefill then one-token decode steps through the static cache."""
    logits, _ = model(ids, 0)
    pos, out, all_logits = ids.shape[1], [], [logits[0, -1]]
    for _ in range(n):
        tok = int(all_logits[-1].argmax())
        out.append(tok)
        logits, _ = model(torch.tensor([[tok]]), pos)
        all_logits.append(logits[0, -1])
        pos += 1
    return out, torch.stack(all_logits)


@torch.no_grad()
def test_logits_match_transformers(pair):
    hf, ours = pair
    ids = prompt(40)
    ref = hf(ids).logits
    got, _ = ours(ids, 0)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@torch.no_grad()
def test_cached_greedy_generation_matches_transformers(pair):
    hf, ours = pair
    ids = prompt(9)
    ours.setup_cache()
    tokens, _ = our_greedy(ours, ids, 32)
    assert tokens == hf_greedy(hf, ids, 32)


@torch.no_grad()
def test_rollback_equals_fresh_run(pair):
    _, ours = pair
    ids = prompt(9)
    ours.setup_cache()
    fresh_tokens, fresh_logits = our_greedy(ours, ids, 20)
    # decode on a detour of 8 arbitrary tokens, then roll back by moving the position
    seq = torch.tensor([ids[0].tolist() + fresh_tokens[:10]])
    ours(seq, 0)
    ours(prompt(8, seed=7), seq.shape[1])
    pos = seq.shape[1]
    logits, _ = ours(torch.tensor([[fresh_tokens[10]]]), pos)
    torch.testing.assert_close(logits[0, -1], fresh_logits[11], atol=1e-5, rtol=0)
    tok, got = int(logits[0, -1].argmax()), [fresh_tokens[10]]
    for _ in range(9):
        got.append(tok)
        pos += 1
        logits, _ = ours(torch.tensor([[tok]]), pos)
        tok = int(logits[0, -1].argmax())
    assert got == fresh_tokens[10:20]


@torch.no_grad()
def test_features_are_tap_layer_hidden_states(pair):
    hf, ours = pair
    ids = prompt(17)
    hidden = hf(ids, output_hidden_states=True).hidden_states
    _, feats = ours(ids, 0)
    taps = ours.cfg.tap_layers
    assert taps == (1, 2, 3)  # default: spread over depth, not the first or last layer
    assert feats.shape == (1, 17, len(taps) * BASE["hidden_size"]) == (1, 17, ours.cfg.feature_size)
    ref = torch.cat([hidden[i + 1] for i in taps], dim=-1)
    torch.testing.assert_close(feats, ref, atol=1e-4, rtol=0)


@torch.no_grad()
def test_cached_and_uncached_forward_agree(pair):
    _, ours = pair
    ids = prompt(30)
    ref_logits, ref_feats = ours(ids, 0)
    ours.setup_cache()
    a, fa = ours(ids[:, :12], 0)
    b, fb = ours(ids[:, 12:], 12)
    torch.testing.assert_close(torch.cat([a, b], 1), ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([fa, fb], 1), ref_feats, atol=1e-5, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    hf, _ = make_hf("qwen2", tmp_path)
    folder = tmp_path / "sharded"
    hf.save_pretrained(folder, safe_serialization=True, max_shard_size="50KB")
    assert (folder / "model.safetensors.index.json").exists()
    ours = Target.from_pretrained(folder)
    ids = prompt(10)
    torch.testing.assert_close(ours(ids, 0)[0], hf(ids).logits, atol=1e-4, rtol=0)


def test_custom_tap_layers_and_dtype(tmp_path):
    _, folder = make_hf("llama-untied", tmp_path)
    m = Target.from_pretrained(folder, tap_layers=(0, 4), dtype="bfloat16")
    _, feats = m(prompt(5), 0)
    assert feats.dtype == torch.bfloat16 and feats.shape[-1] == 2 * BASE["hidden_size"]
    assert m.rope_cos.dtype == torch.float32


def test_unsupported_architecture_fails_clearly(tmp_path):
    _, folder = make_hf("llama-untied", tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TargetLoadError, match="unsupported model_type 'gpt2'.*llama.*qwen3"):
        Target.from_pretrained(folder)


def test_folder_without_weights_fails_clearly(tmp_path):
    _, folder = make_hf("llama-untied", tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(TargetLoadError, match="no weights in"):
        Target.from_pretrained(folder)


def test_bad_dtype_and_bad_tap_layers_fail_clearly(tmp_path):
    _, folder = make_hf("llama-untied", tmp_path)
    with pytest.raises(TargetLoadError, match="unsupported dtype 'int3'.*float32"):
        Target.from_pretrained(folder, dtype="int3")
    with pytest.raises(TargetLoadError, match=r"tap layers \[9\] out of range"):
        Target.from_pretrained(folder, tap_layers=(1, 9))


def test_missing_folder_fails_clearly(tmp_path):
    with pytest.raises(TargetLoadError, match="no model folder"):
        Target.from_pretrained(tmp_path / "nope")


def test_forward_is_exportable(tmp_path):
    _, folder = make_hf("qwen3", tmp_path)
    m = Target.from_pretrained(folder)
    m.setup_cache()
    t = torch.export.Dim("t", min=1, max=64)
    ep = torch.export.export(m, (prompt(4), torch.tensor(0)),
                             dynamic_shapes=({1: t}, None), strict=False)
    ids = prompt(6)
    ref = Target.from_pretrained(folder)
    torch.testing.assert_close(ep.module()(ids, torch.tensor(0))[0], ref(ids, 0)[0],
                               atol=1e-5, rtol=0)


@torch.no_grad()
def test_explicit_kv_form_matches_the_static_cache(pair):
    """forward_past (optimum-style past/present I/O) == forward with the static cache."""
    _, ours = pair
    ids = prompt(20)
    ref_logits, ref_feats = ours(ids, 0)
    c = ours.cfg
    past = [(torch.zeros(1, c.num_key_value_heads, 0, c.head_dim),) * 2
            for _ in range(c.num_hidden_layers)]
    got_l, got_f = [], []
    for a, b in ((0, 7), (7, 8), (8, 20)):
        logits, feats, past = ours.forward_past(ids[:, a:b], torch.arange(a, b)[None], past)
        got_l.append(logits)
        got_f.append(feats)
    assert past[0][0].shape[2] == 20
    torch.testing.assert_close(torch.cat(got_l, 1), ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(got_f, 1), ref_feats, atol=1e-5, rtol=0)


@torch.no_grad()
def test_prefill_equals_cached_forward_and_fills_the_cache(pair):
    _, ours = pair
    ids = prompt(25)
    ours.setup_cache()
    ref_logits, ref_feats = ours(ids, 0)
    ref_next = ours(prompt(3, seed=4), 25)[0]
    ours.setup_cache()
    logits, feats = ours.prefill(ids)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(feats, ref_feats, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours(prompt(3, seed=4), 25)[0], ref_next, atol=1e-5, rtol=0)


@torch.no_grad()
def test_fused_attention_computes_what_the_explicit_form_does_and_is_scoped(pair):
    """The data passes' fused kernel: same logits and features (1e-5) for a prefill, a
    multi-token call against the static cache and a causal pass; outside the context the
    explicit form is back (the flag the exported graphs never see)."""
    _, ours = pair
    ids, more = prompt(25), prompt(6, seed=4)
    ref = []
    for fused in (False, True):
        ours.setup_cache()
        with ours.fused_attention() if fused else contextlib.nullcontext():
            got = [*ours.prefill(ids), *ours(more, 25)]
            ours.drop_cache()
            got += [*ours(torch.cat([ids, more], 1), 0)]
        ref.append(got)
    for a, b in zip(*ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert not any(layer.self_attn.fused for layer in ours.layers)


# ------------------------------------------------------------ damaged model folders

def damage_config(folder, how):
    f = folder / "config.json"
    cfg = json.loads(f.read_text())
    if how == "not JSON":
        f.write_text("{not json")
    elif how == "a list":
        f.write_text("[1, 2]")
    elif how == "no hidden_size":
        del cfg["hidden_size"]
        f.write_text(json.dumps(cfg))
    elif how == "zero layers":
        f.write_text(json.dumps({**cfg, "num_hidden_layers": 0}))
    elif how == "a drafter's":
        f.write_text(json.dumps({"format_version": 1, "config": {"block_size": 8}}))


@pytest.mark.parametrize("how,message", [
    ("not JSON", r"config.json is not valid JSON \(.*line 1 column 2\): restore it"),
    ("a list", "config.json holds a JSON list, not an object: restore it"),
    ("no hidden_size", "config.json lacks hidden_size: not a complete model config"),
    ("zero layers", "config.json has num_hidden_layers = 0, not a whole number >= 1"),
    ("a drafter's", "is a hyflash drafter, not a model: pass it as --drafter"),
])
def test_a_damaged_config_json_is_one_error_naming_the_file(tmp_path, how, message):
    _, folder = make_hf("llama-untied", tmp_path)
    damage_config(folder, how)
    with pytest.raises(TargetLoadError, match=message):
        Target.from_pretrained(folder)


@pytest.mark.parametrize("how,problem", [
    ("truncated", "incomplete metadata, file not fully covered"),
    ("garbage", "Error while deserializing header"),
])
def test_a_truncated_or_garbage_safetensors_file_is_one_error(tmp_path, how, problem):
    _, folder = make_hf("llama-untied", tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else b"<html>404</html>" * 64)
    with pytest.raises(TargetLoadError, match=f"model.safetensors is truncated or corrupt "
                                              f"\\(.*{problem}.*\\): re-download"):
        Target.from_pretrained(folder)


def test_a_missing_or_misshapen_weight_is_one_error(tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = make_hf("llama-untied", tmp_path)
    weights = folder / "model.safetensors"
    state = load_file(weights)
    save_file({k: v for k, v in state.items() if "layers.2.mlp.up_proj" not in k}, weights)
    with pytest.raises(TargetLoadError, match=r"missing \['layers.2.mlp.up_proj.weight'\]"):
        Target.from_pretrained(folder)
    state["model.norm.weight"] = torch.ones(3)
    save_file(state, weights)
    with pytest.raises(TargetLoadError, match=r"weight norm.weight .* has shape \[3\], but the "
                                              r"config says \[64\]"):
        Target.from_pretrained(folder)


def test_max_seq_len_is_at_least_one_and_at_most_what_the_model_supports(tmp_path):
    _, folder = make_hf("llama-untied", tmp_path)  # max_position_embeddings 256
    assert Target.from_pretrained(folder).cfg.max_seq_len == 256
    assert Target.from_pretrained(folder, max_seq_len=100).cfg.max_seq_len == 100
    with pytest.raises(TargetLoadError, match="max_seq_len must be >= 1, got 0"):
        Target.from_pretrained(folder, max_seq_len=0)
    with pytest.raises(TargetLoadError, match="100000 tokens is above the 256 the model supports "
                                              r"\(its max_position_embeddings\)"):
        Target.from_pretrained(folder, max_seq_len=100000)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "sliding_window": 64}))
    assert Target.from_pretrained(folder).cfg.max_seq_len == 64  # the default fits the window
    with pytest.raises(TargetLoadError, match=r"above the 64 the model supports \(its sliding"):
        Target.from_pretrained(folder, max_seq_len=128)
