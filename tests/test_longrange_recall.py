"""The ``recall`` memory (issue 14's lever for the long-range set): its two execution
forms agree, and its state maps an evicted feature to the one that followed it."""

from __future__ import annotations

import pytest
import torch
from test_drafter import make_drafter, sequence, tiny_target

from hyflash.models.memory import RecallReadout


@pytest.mark.parametrize("window_cache", ["kv", "features"])
@torch.no_grad()
def test_recall_parallel_form_equals_step_form(window_cache):
    target = tiny_target()
    d = make_drafter(target, window=8, block_size=4, memory="recall")
    d.window_cache = window_cache
    tokens, feats = sequence(target)
    t, bsz = tokens.shape[1], d.cfg.block_size
    par = d(tokens, feats, torch.arange(0, t - bsz + 1)[None])[0]
    state = d.init_state()
    gen = torch.Generator().manual_seed(5)
    while int(state["count"]) <= t - bsz:
        p = int(state["count"])
        torch.testing.assert_close(d.draft(state, tokens[0, p]), par[p], atol=1e-4, rtol=0)
        n = int(torch.randint(1, bsz + 1, (1,), generator=gen))
        chunk = torch.zeros(bsz, feats.shape[-1])
        real = feats[0, p:p + n]
        chunk[: len(real)] = real
        state = d.commit(state, chunk, len(real))


@torch.no_grad()
def test_recall_memory_changes_the_draft_at_long_context():
    target = tiny_target()
    d = make_drafter(target, window=8, block_size=4, memory="recall")
    tokens, feats = sequence(target)
    on = d(tokens, feats, torch.tensor([[40]]))
    d.memory_off = True
    assert (on - d(tokens, feats, torch.tensor([[40]]))).abs().max() > 1e-3


@torch.no_grad()
def test_recall_reads_the_successor_of_the_matching_key():
    """Keys 0 and 1 in memory (ages 1 and 0), values from positions 1 and 2: a query
    that matches only key 0 reads position 1's value, not its own."""
    m = RecallReadout(heads=1, head_dim=2, hidden=4)
    m.decay_logit.fill_(20.0)  # no decay
    k = torch.tensor([[[[30.0, -30.0], [-30.0, 30.0], [0.0, 0.0]]]])  # [1, H, K, hd]
    v = torch.tensor([[[[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]]])
    q = torch.tensor([[[[30.0, -30.0]]]])
    age = torch.tensor([[[1, 0, -1]]])  # key 2 has not entered memory
    out = m.read_parallel(q, k, v, age)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([2.0, 0.0]), atol=1e-3, rtol=0)
