"""The drafter's two execution forms agree, and its state is fixed-shape and bounded."""

import pytest
import torch

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.drafter_folder import (
    check_drafter_context,
    check_drafter_fits,
    load_drafter,
    read_drafter_config,
)
from hyflash.models.target import Target, TargetConfig


def tiny_target(max_seq_len=64, seed=0):
    torch.manual_seed(seed)
    cfg = TargetConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, max_seq_len=max_seq_len, tie_word_embeddings=True)
    return Target(cfg).eval()


def make_drafter(target, arch="hyflash", **kw):
    torch.manual_seed(1)
    d = Drafter.for_target(target, arch, num_heads=4, **kw).eval()
    with torch.no_grad():  # make gates, norms and decays matter
        for name, p in d.named_parameters():
            if p.requires_grad and any(w in name for w in ("norm", "gate", "decay", "slot")):
                p.add_(torch.randn_like(p) * 0.3)
    return d


def sequence(target, t=48, seed=3):
    tokens = torch.randint(0, target.cfg.vocab_size, (1, t),
                           generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        _, feats = target(tokens, 0)
    return tokens, feats


@pytest.mark.parametrize("arch,kw", [("hyflash", dict(window=8, block_size=4,
                                                      memory="decayed-linear")),
                                     ("hyflash", dict(window=8, block_size=4,
                                                      memory="prefix-slots")),
                                     ("hyflash", dict(window=5, block_size=5, num_layers=1)),
                                     # a window longer than the text: the whole-context path
                                     ("hyflash", dict(window=56, block_size=4)),
                                     ("full", dict(block_size=4))])
@pytest.mark.parametrize("chunks,window_cache", [("random", "kv"), ("single", "kv"),
                                                 ("random", "features")])
@torch.no_grad()
def test_parallel_form_equals_step_form(arch, kw, chunks, window_cache):
    target = tiny_target()
    d = make_drafter(target, arch, **kw)
    d.window_cache = window_cache
    tokens, feats = sequence(target)
    t, bsz = tokens.shape[1], d.cfg.block_size
    anchors = torch.arange(0, t - bsz + 1)[None]
    par = d(tokens, feats, anchors)[0]  # [A, B-1, V]
    state = d.init_state()
    gen = torch.Generator().manual_seed(5)
    checked = 0
    while int(state["count"]) <= t - bsz:
        p = int(state["count"])
        step = d.draft(state, tokens[0, p])
        torch.testing.assert_close(step, par[p], atol=1e-4, rtol=0)
        checked += 1
        n = int(torch.randint(1, bsz + 1, (1,), generator=gen)) if chunks == "random" else 1
        chunk = torch.zeros(bsz, feats.shape[-1])  # fixed-size commit, padded
        real = feats[0, p:p + n]
        chunk[: len(real)] = real
        state = d.commit(state, chunk, len(real))
    assert checked > 10


@pytest.mark.parametrize("arch,kw", [("hyflash", dict(window=8, block_size=4,
                                                      memory="decayed-linear")),
                                     ("hyflash", dict(window=8, block_size=4)),
                                     ("full", dict(block_size=4))])
@torch.no_grad()
def test_a_batch_of_sequences_drafts_as_each_sequence_alone(arch, kw):
    """The parallel form batches sequences and anchors (the windowed form reshapes them
    into N*A blocks): each row must see only its own sequence and anchor."""
    target = tiny_target()
    d = make_drafter(target, arch, **kw)
    (t1, f1), (t2, f2) = sequence(target), sequence(target, seed=4)
    anchors = torch.tensor([[3, 40, 17, 9], [44, 0, 25, 12]])
    both = d(torch.cat([t1, t2]), torch.cat([f1, f2]), anchors)
    for i, (tok, f) in enumerate([(t1, f1), (t2, f2)]):
        alone = d(tok, f, torch.arange(0, 45)[None])[0]
        torch.testing.assert_close(both[i], alone[anchors[i]], atol=1e-4, rtol=0)


@pytest.mark.parametrize("memory", ["decayed-linear", "prefix-slots"])
@torch.no_grad()
def test_memory_changes_the_draft_at_long_context(memory):
    target = tiny_target()
    d = make_drafter(target, window=8, block_size=4, memory=memory)
    tokens, feats = sequence(target)
    anchors = torch.tensor([[40]])
    on = d(tokens, feats, anchors)
    d.memory_off = True
    off = d(tokens, feats, anchors)
    assert (on - off).abs().max() > 1e-3


@pytest.mark.parametrize("window_cache", ["kv", "features"])
@torch.no_grad()
def test_state_shapes_fixed_and_hyflash_state_independent_of_context(window_cache):
    target = tiny_target(max_seq_len=256)
    d = make_drafter(target, window=16, block_size=4)
    d.window_cache = window_cache
    tokens = torch.randint(0, 97, (1, 200), generator=torch.Generator().manual_seed(0))
    _, feats = target(tokens, 0)
    state = d.init_state()
    shapes = {k: (v.shape, v.dtype) for k, v in state.items()}
    for p in range(0, 196, 4):
        state = d.commit(state, feats[0, p:p + 4], 4)
        d.draft(state, tokens[0, p + 4])
        assert {k: (v.shape, v.dtype) for k, v in state.items()} == shapes
    full = make_drafter(target, "full", block_size=4)
    full.window_cache = window_cache
    assert d.state_bytes() < full.state_bytes() / 4
    window = "window" if window_cache == "features" else "window_k"
    assert full.init_state()[window].shape[-2] == 256  # grows with max context
    assert d.init_state()[window].shape[-2] == 16  # does not


def test_window_caches_trade_bytes_for_compute():
    """kv keeps each layer's K and V (2 x layers x the fused window), same drafts."""
    d = make_drafter(tiny_target(), window=8, block_size=4)
    d.window_cache = "features"
    small = d.state_bytes()
    d.window_cache = "kv"
    fused = 8 * d.cfg.hidden_size * 4
    assert d.state_bytes() - small == (2 * d.cfg.num_layers - 1) * fused
    d.window_cache = "ring"
    with pytest.raises(HyflashError, match="unknown window cache 'ring'"):
        d.init_state()


def test_save_load_roundtrip_and_target_mismatch(tmp_path):
    target = tiny_target()
    d = make_drafter(target, window=8, block_size=4)
    d.save(tmp_path / "d")
    saved = set(__import__("safetensors.torch").torch.load_file(tmp_path / "d/model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in saved)
    loaded = load_drafter(tmp_path / "d", target)
    tokens, feats = sequence(target)
    a = torch.tensor([[20]])
    torch.testing.assert_close(loaded(tokens, feats, a), d(tokens, feats, a))
    other = Target(TargetConfig(vocab_size=50, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, max_seq_len=64))
    with pytest.raises(HyflashError, match="trained for another target: its vocab size is 97"):
        load_drafter(tmp_path / "d", other)
    with pytest.raises(HyflashError, match="no drafter at"):
        load_drafter(tmp_path / "nothing", target)


def damage_drafter(folder, how):
    import json

    from safetensors.torch import load_file, save_file

    cfg, weights = folder / "config.json", folder / "model.safetensors"
    meta = json.loads(cfg.read_text())
    if how == "config not JSON":
        cfg.write_text("{oops")
    elif how == "config a list":
        cfg.write_text("[1]")
    elif how == "a model's config":
        cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    elif how == "config lacks vocab_size":
        del meta["config"]["vocab_size"]
        cfg.write_text(json.dumps(meta))
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif how == "garbage weights":
        weights.write_bytes(b"\x00garbage" * 100)
    elif how == "missing tensor":
        save_file({k: v for k, v in load_file(weights).items() if k != "fc.weight"}, weights)
    elif how == "wrong shape":
        save_file({**load_file(weights), "fc.weight": torch.zeros(3, 3)}, weights)


@pytest.mark.parametrize("how,message", [
    ("config not JSON", r"config.json is not valid JSON \(.*\): pass a drafter folder written"),
    ("config a list", "config.json holds a JSON list, not an object: pass a drafter folder"),
    ("a model's config", "is not a hyflash drafter config .a model's config: pass that folder "
                         "as --target"),
    ("config lacks vocab_size", "holds no usable drafter config .*'vocab_size'"),
    ("truncated weights", "model.safetensors is truncated or corrupt .*incomplete metadata"),
    ("garbage weights", "model.safetensors is truncated or corrupt"),
    ("missing tensor", r"missing \['fc.weight'\]"),
    ("wrong shape", r"weight fc.weight in .* has shape \[3, 3\], but the config says \[32, 64\]"),
])
def test_a_damaged_drafter_folder_is_one_error_naming_the_file(tmp_path, how, message):
    target = tiny_target()
    make_drafter(target, window=8, block_size=4).save(tmp_path / "d")
    damage_drafter(tmp_path / "d", how)
    with pytest.raises(HyflashError, match=message):
        load_drafter(tmp_path / "d", target)


def test_a_drafter_for_a_target_of_another_depth_is_refused(tmp_path):
    """Same vocabulary, hidden size and feature size, but other tap layers: its features
    would come from other layers than the drafter learned on."""
    five = tiny_target().cfg.to_dict() | {"num_hidden_layers": 5, "tap_layers": ()}
    target = Target(TargetConfig(**five))  # taps (1, 2, 3)
    make_drafter(target, window=8, block_size=4).save(tmp_path / "d")
    deeper = TargetConfig(**five | {"num_hidden_layers": 6})  # taps (1, 2, 4)
    assert deeper.feature_size == target.cfg.feature_size
    folder, cfg, _ = read_drafter_config(tmp_path / "d")
    with pytest.raises(HyflashError, match=r"its tap layers are \[1, 2, 3\], this 6-layer "
                                           r"target's are \[1, 2, 4\]"):
        check_drafter_fits(cfg, deeper, folder)


def test_the_context_must_hold_the_window_and_a_block(tmp_path):
    target = tiny_target(max_seq_len=64)
    cfg = make_drafter(target, window=8, block_size=4).cfg
    check_drafter_context(cfg, 12, tmp_path)
    with pytest.raises(HyflashError, match=r"window \(8\) and one block \(4\) need 12; pass "
                                           "--max-seq-len >= 12"):
        check_drafter_context(cfg, 11, tmp_path)
    full = make_drafter(target, "full", block_size=4).cfg  # window = the whole 64
    check_drafter_context(full, 5, tmp_path)
    with pytest.raises(HyflashError, match="sees 64 tokens; a context of 65 would drop older"):
        check_drafter_context(full, 65, tmp_path)


def test_bad_config_is_rejected():
    target = tiny_target()
    with pytest.raises(HyflashError, match="block size 40 must be in"):
        DrafterConfig.for_target(target.cfg, block_size=40)
    with pytest.raises(HyflashError, match="unknown memory kind"):
        DrafterConfig.for_target(target.cfg, memory="lstm")


@pytest.mark.parametrize("arch", ["hyflash", "full"])
def test_engine_with_random_drafter_is_lossless(arch):
    """A randomly initialised drafter of either kind changes speed, never the output."""
    from hyflash.runtime import SpeculativeEngine, TorchTarget
    from hyflash.runtime.drafter_backend import TorchDrafter

    target = tiny_target(max_seq_len=96).cast(torch.float64)  # no argmax near-ties by rounding
    d = make_drafter(target, arch, **({"window": 8} if arch == "hyflash" else {}),
                     block_size=4).to(torch.float64)
    prompt = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(9)).tolist()
    plain = SpeculativeEngine(TorchTarget(target)).generate(prompt, max_new_tokens=50)
    spec = SpeculativeEngine(TorchTarget(target), TorchDrafter(d)).generate(prompt,
                                                                          max_new_tokens=50)
    assert spec.tokens == plain.tokens
    assert spec.stats.target_calls <= plain.stats.target_calls


@torch.no_grad()
def test_step_module_is_commit_then_draft_and_exports():
    from hyflash.models.drafter import DrafterStep

    target = tiny_target()
    d = make_drafter(target, window=8, block_size=4)
    tokens, feats = sequence(target)
    step = DrafterStep(d)
    state = d.init_state()
    ref = d.init_state()
    ep = torch.export.export(step, (torch.tensor([0]), feats[0, :4], torch.tensor([4]),
                                    *state.values()), strict=False).module()
    for p in range(0, 20, 3):
        chunk = torch.zeros(4, feats.shape[-1])
        chunk[:3] = feats[0, p:p + 3]
        args = (tokens[0, p + 3:p + 4], chunk, torch.tensor([3]))
        out = step(*args, *state.values())
        exported = ep(*args, *state.values())
        ref = d.commit(ref, chunk, 3)
        torch.testing.assert_close(out[0], d.draft(ref, tokens[0, p + 3]))
        for a, b in zip(out, exported, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        state = dict(zip(step.state_names, out[1:], strict=True))
        assert [tuple(v.shape) for v in state.values()] == \
            [tuple(v.shape) for v in d.init_state().values()]
