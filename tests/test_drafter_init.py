"""--init target: drafter layers start as the target's last layers, grouped K/V widened."""

import pytest
import torch

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter, rope_at
from hyflash.models.drafter_init import INITS, init_from_target, widen_kv
from hyflash.models.target import Target, TargetConfig


def tiny_target(**kw):
    torch.manual_seed(0)
    cfg = TargetConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, max_seq_len=64, tie_word_embeddings=True, **kw)
    target = Target(cfg).eval()
    with torch.no_grad():  # norms that are not all ones, so copying them is visible
        for name, p in target.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return target


def test_widen_kv_repeats_each_kv_head_for_the_query_heads_that_read_it():
    w = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2 * 3, 5)  # 2 kv heads, hd 3
    wide = widen_kv(w, kv_heads=2, heads=4).view(4, 3, 5)
    assert torch.equal(wide[0], w[:3]) and torch.equal(wide[1], w[:3])
    assert torch.equal(wide[2], w[3:]) and torch.equal(wide[3], w[3:])


def test_a_target_initialised_layer_computes_the_target_layer():
    """Over the block alone (no context, no memory, every position visible) drafter layer
    i computes what target layer N-L+i computes with the same non-causal mask: the copied
    weights, the widened keys/values and the head order all agree."""
    target = tiny_target()
    torch.manual_seed(1)
    drafter = Drafter.for_target(target, num_layers=2, num_heads=4).eval()
    assert init_from_target(drafter, target) == [2, 3]
    assert torch.equal(drafter.norm.weight, target.norm.weight)
    t, d = 6, target.cfg.hidden_size
    x = torch.randn(1, t, d)
    pos = torch.arange(t)
    see_all = torch.ones(t, t, dtype=torch.bool)
    empty = torch.zeros(1, 4, 0, 8)
    for layer, i in zip(drafter.layers, (2, 3), strict=True):
        with torch.no_grad():
            want, _ = target.layers[i](x, target.rope_cos[:t], target.rope_sin[:t], pos, see_all)
            got = layer(x, rope_at(pos[None], 8, target.cfg.rope_theta), empty, empty,
                        rope_at(pos[None, :0], 8, target.cfg.rope_theta), see_all[None], None)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw, heads, message", [
    ({}, 8, "--heads 8 differs from the target's 4 attention heads (use --heads 4)"),
    ({"qk_norm": True}, 4, "q/k/v biases or q/k norms"),
])
def test_target_init_refuses_what_it_cannot_copy(kw, heads, message):
    target = tiny_target(**kw)
    drafter = Drafter.for_target(target, num_layers=2, num_heads=heads)
    before = drafter.layers[0].mlp.up_proj.weight.clone()
    with pytest.raises(HyflashError, match="--init target: .*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        init_from_target(drafter, target)
    assert torch.equal(drafter.layers[0].mlp.up_proj.weight, before)  # nothing half-copied


def test_the_train_command_offers_the_same_inits():
    from hyflash.train import command

    assert command.INITS == INITS and INITS[0] == "random"  # the default stays random


@torch.no_grad()
def test_a_grown_drafter_drafts_exactly_what_the_one_it_grew_from_drafts(tmp_path):
    """--init DIR --layers L+1: DIR's layers below and an identity layer on top, so the
    parallel form and the step form give DIR's logits exactly until training moves it."""
    from hyflash.models.drafter_init import init_from_drafter

    target = tiny_target()
    torch.manual_seed(2)
    small = Drafter.for_target(target, num_layers=1, num_heads=4, window=8, block_size=4,
                               draft_vocab=30)
    small.draft_head.set_ids(torch.randperm(97)[:30])
    for p in small.parameters():  # trained-looking weights, slots included
        if p.requires_grad:
            p.add_(torch.randn_like(p) * 0.05)
    small.save(tmp_path / "small")
    grown = init_from_drafter(Drafter.for_target(target, num_layers=2, num_heads=4, window=8,
                                                 block_size=4, draft_vocab=30),
                              tmp_path / "small", target).eval()
    small = small.eval()
    assert grown.cfg.num_layers == 2 and torch.equal(grown.draft_head.ids, small.draft_head.ids)
    tokens = torch.randint(0, 97, (1, 24))
    feats = torch.randn(1, 24, target.cfg.feature_size)
    anchors = torch.tensor([[0, 5, 11, 19]])
    assert torch.equal(grown(tokens, feats, anchors), small(tokens, feats, anchors))
    a, b = small.init_state(), grown.init_state()
    for p in range(0, 16, 4):
        a, b = small.commit(a, feats[0, p:p + 4], 4), grown.commit(b, feats[0, p:p + 4], 4)
        assert torch.equal(grown.draft(b, tokens[0, p + 4]), small.draft(a, tokens[0, p + 4]))
    assert b["window_k"].shape[0] == 2  # the grown state holds the new layer's window too
