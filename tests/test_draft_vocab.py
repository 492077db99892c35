"""A reduced draft vocabulary: the drafter scores a subset of the target's tokens with
those rows of its LM head, the step form returns -inf elsewhere, training skips labels
it cannot score, and speculative decoding stays lossless (greedy and sampled)."""

import json

import numpy as np
import pytest
import torch
from conftest import WORDS
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_drafters import plain_greedy, tiny_target, uncached
from test_runtime_sampling import ALPHA, engine_counts, exact_joint, pvalues

from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.draft_vocab import most_frequent
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target
from hyflash.runtime import SpeculativeEngine, TorchTarget
from hyflash.runtime.drafter_backend import TorchDrafter
from hyflash.train.loop import block_loss

V, L = 61, 32
TARGET = tiny_target(vocab=V, max_seq_len=L)
REFERENCE = uncached(TARGET)
IDS = torch.tensor([0, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59])


def drafter_pair(target=TARGET, ids=IDS, seed=0):
    """The same random weights twice: full vocabulary, and restricted to ids."""
    kw = dict(num_layers=1, num_heads=4, block_size=4, window=8)
    torch.manual_seed(seed)
    full = Drafter.for_target(target, **kw).to(target.embed_tokens.weight.dtype).eval()
    sub = Drafter.for_target(target, draft_vocab=len(ids), **kw)
    sub.load_state_dict(full.state_dict(), strict=False)
    sub.draft_head.set_ids(ids)
    return full, sub.to(target.embed_tokens.weight.dtype).eval()


@torch.no_grad()
def test_step_logits_are_the_full_drafters_on_the_subset_and_minus_inf_elsewhere():
    full, sub = drafter_pair()
    feats = torch.randn(6, TARGET.cfg.feature_size, dtype=torch.float64)
    outs = []
    for d in (full, sub):
        state = d.commit(d.init_state(torch.float64), feats, 6)
        outs.append(d.draft(state, torch.tensor([5])))
    want, got = outs
    assert got.shape == want.shape == (3, V)
    torch.testing.assert_close(got[:, IDS], want[:, IDS])
    outside = torch.ones(V, dtype=torch.bool)
    outside[IDS] = False
    assert torch.isneginf(got[:, outside]).all()


def test_loading_ids_loads_their_lm_head_rows():
    """Any load_state_dict (a drafter folder, a training checkpoint) re-derives the rows."""
    _, sub = drafter_pair()
    _, fresh = drafter_pair(ids=torch.arange(len(IDS)))
    fresh.load_state_dict(sub.trainable_state(), strict=False)  # what a folder saves
    assert fresh.draft_head.ids.tolist() == IDS.tolist()
    torch.testing.assert_close(fresh.draft_head.proj.weight, TARGET.lm_head.weight[IDS])


def test_labels_map_into_the_subset_and_outside_is_minus_one():
    _, sub = drafter_pair()
    assert sub.label_space(torch.tensor([[0, 5, 59, 2]])).tolist() == [[0, 2, 16, -1]]


def test_a_label_outside_the_subset_adds_no_loss_and_counts_as_a_miss():
    logits = torch.zeros(1, 1, 2, 4)
    logits[..., 0, 1] = 5.0  # position 1 predicts index 1
    w = torch.ones(2)
    loss_in, acc_in = block_loss(logits, torch.tensor([[[1, 1]]]), w)
    loss_out, acc_out = block_loss(logits, torch.tensor([[[1, -1]]]), w)
    assert acc_in.tolist() == [1.0, 0.0] and acc_out.tolist() == [1.0, 0.0]
    assert loss_out < loss_in  # the -1 label's cross-entropy is left out


class Recording(TorchDrafter):
    """Keeps every greedy proposal."""

    def reset(self):
        super().reset()
        self.proposed = []

    def draft(self, anchor, pos):
        logits = super().draft(anchor, pos)
        self.proposed += logits.argmax(-1).tolist()
        return logits


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=10),
       max_new=st.integers(1, 20), seed=st.integers(0, 50))
def test_greedy_output_with_a_draft_vocabulary_is_the_targets_own(prompt, max_new, seed):
    _, sub = drafter_pair(seed=seed)
    drafter = Recording(sub)
    out = SpeculativeEngine(TorchTarget(TARGET), drafter).generate(
        prompt, max_new_tokens=max_new)
    assert out.tokens == plain_greedy(REFERENCE, prompt, min(max_new, L - len(prompt)))
    assert set(drafter.proposed) <= set(IDS.tolist())


def test_sampled_tokens_follow_the_target_distribution_with_q_zero_outside():
    """Vocabulary 8, drafter scoring 3 tokens: the target's likely tokens outside the
    subset can only come from the residual, which must make up their whole mass."""
    target = tiny_target(vocab=8, hidden=16, layers=2, max_seq_len=16, seed=4,
                         dtype=torch.float32)
    _, sub = drafter_pair(target, torch.tensor([1, 4, 6]), seed=2)
    sampling = dict(temperature=1.0, top_k=0, top_p=1.0)
    engine = SpeculativeEngine(TorchTarget(target), TorchDrafter(sub))
    counts = engine_counts(engine, [1, 2, 3], 1000, sampling)
    assert min(pvalues(counts, exact_joint(uncached(target), [1, 2, 3], sampling))) > ALPHA


def test_most_frequent_ranks_generated_then_prompt_counts_then_id():
    generated = [np.array([5, 5, 5, 2, 2, 9])]
    prompts = [np.array([7, 7, 1, 1, 1, 0])]
    assert most_frequent(generated, prompts, 3, 10).tolist() == [2, 5, 9]
    assert most_frequent(generated, prompts, 5, 10).tolist() == [1, 2, 5, 7, 9]
    assert most_frequent(generated, prompts, 6, 10).tolist() == [0, 1, 2, 5, 7, 9]


@pytest.mark.parametrize("size", [1, V, V + 5])
def test_draft_vocabulary_out_of_range_is_refused(size):
    with pytest.raises(HyflashError, match="draft vocabulary"):
        DrafterConfig.for_target(TARGET.cfg, draft_vocab=size)


@pytest.mark.parametrize("ids", [[0, 0, 1], [0, 1, V]])
def test_duplicate_or_out_of_range_ids_are_refused(ids):
    _, sub = drafter_pair(ids=torch.tensor([0, 1, 2]))
    with pytest.raises(HyflashError, match="distinct token ids"):
        sub.draft_head.set_ids(torch.tensor(ids))


def test_train_with_a_draft_vocabulary_saves_ids_and_loads_the_target_rows(model_folder,
                                                                            tmp_path):
    corpus = tmp_path / "words.txt"
    g = torch.Generator().manual_seed(1)
    corpus.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, 46, (3000,), generator=g)))
    out = tmp_path / "drafter"
    assert main(["train", "--target", str(model_folder), "--data", str(corpus), "--out",
                 str(out), "--layers", "1", "--heads", "4", "--block-size", "4", "--window",
                 "8", "--sequences", "16", "--gen-len", "16", "--data-batch", "8", "--steps",
                 "3", "--batch", "2", "--anchors", "4", "--threads", "1", "--quiet",
                 "--draft-vocab", "12"]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["draft_vocab"] == 12
    target = Target.from_pretrained(model_folder)
    d = load_drafter(out, target)
    ids = d.draft_head.ids
    assert ids.numel() == 12 and ids.unique().numel() == 12 and ids.max() < len(WORDS)
    torch.testing.assert_close(d.draft_head.proj.weight, target.lm_head.weight[ids])


def test_damaged_saved_ids_are_one_line(model_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    target = Target.from_pretrained(model_folder)
    d = Drafter.for_target(target, num_layers=1, num_heads=4, block_size=4, window=8,
                           draft_vocab=4)
    d.save(tmp_path / "d")
    state = load_file(tmp_path / "d" / "model.safetensors")
    state["draft_head.ids"] = torch.tensor([1, 1, 2, 3])
    save_file(state, tmp_path / "d" / "model.safetensors")
    with pytest.raises(HyflashError, match="distinct token ids.*train"):
        load_drafter(tmp_path / "d", target)
