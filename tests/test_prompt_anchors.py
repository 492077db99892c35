"""Prompt anchors: every prefix of a prompt is a prompt, labelled by the target's greedy
tokens for as long as the text agrees with them (``loop.block_labels``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import WORDS

from hyflash.cli import main
from hyflash.models.target import Target
from hyflash.train import loop
from hyflash.train.data import DataSpec, features_for, generate_dataset
from hyflash.train.shards import DistillSet, write_shard

SPEC = DataSpec(sequences=24, gen_len=12, short_prompt=(6, 10), long_prompt=(16, 30), batch=8,
                shard=8)


@pytest.fixture(scope="module")
def target(model_folder):
    return Target.from_pretrained(model_folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory, target):
    stream = torch.randint(2, len(WORDS), (1500,),
                           generator=torch.Generator().manual_seed(3)).numpy()
    out = tmp_path_factory.mktemp("data")
    generate_dataset(target, stream, SPEC, out, progress=False)
    target.drop_cache()
    return DistillSet(out)


def test_greedy_labels_are_the_targets_argmax_after_every_token(target, data):
    """Written while generating: the prompt's from the prefill logits, the continuation's
    are its own next tokens; a causal pass over the same tokens gives the same labels."""
    for i in (0, 9, 23):
        tokens, _, plen = data.get(i)
        greedy = data.greedy(i)
        with torch.inference_mode():
            logits, _ = target.prefill(tokens[None, :-1])
        target.drop_cache()
        assert torch.equal(greedy, logits[0].argmax(-1))
        assert torch.equal(greedy[plen - 1:], tokens[plen:])
        _, again = features_for(target, [tokens.numpy()], 8)
        assert np.array_equal(again[0], greedy.numpy())


def test_block_labels_stop_where_the_text_leaves_the_greedy_path():
    tokens = torch.tensor([[5, 1, 2, 3, 4, 9, 9]])
    greedy = torch.tensor([[1, 2, 7, 4, 8, 9, 0]])  # the text disagrees after token 2
    lab = loop.block_labels(tokens, greedy, torch.tensor([[0, 3]]), bsz=4)
    no = loop.NO_LABEL
    assert lab.tolist() == [[[1, 2, 7], [4, 8, no]]]


def test_prompt_anchors_sit_in_the_prompt_and_continuation_labels_are_the_text(data):
    picks = [(i, np.random.default_rng(i)) for i in range(8)]
    tokens, _, anchors, labels = loop.make_batch(data, picks, 8, 4, prompt_share=0.5)
    _, _, _, text_labels = loop.make_batch(data, [(i, np.random.default_rng(i))
                                                  for i in range(8)], 8, 4, prompt_share=0.5)
    assert torch.equal(labels, text_labels)  # reproducible per sequence
    for r, (i, _) in enumerate(picks):
        plen = data.get(i)[2]
        in_prompt = anchors[r] < plen - 1
        assert int(in_prompt.sum()) == 4 and bool((anchors[r][in_prompt] >= 1).all())
        cont = ~in_prompt
        expect = torch.stack([tokens[r, anchors[r][cont] + k] for k in range(1, 4)], -1)
        assert torch.equal(labels[r][cont], expect)
    # the first label of every block is always there; later ones go where the text strays
    assert bool((labels[..., 0] != loop.NO_LABEL).all())
    assert bool((labels == loop.NO_LABEL).any())


def test_unlabelled_positions_count_neither_in_the_loss_nor_the_accuracy():
    logits = torch.zeros(1, 2, 2, 5)
    logits[0, 0, :, 1] = logits[0, 1, 0, 3] = 9.0
    w = torch.ones(2)
    both = torch.tensor([[[1, 1], [3, 3]]])
    cut = torch.tensor([[[1, 1], [3, loop.NO_LABEL]]])
    loss_both, acc_both = loop.block_loss(logits, both, w)
    loss_cut, acc_cut = loop.block_loss(logits, cut, w)
    assert acc_both.tolist() == [1.0, 0.5] and acc_cut.tolist() == [1.0, 1.0]
    assert float(loss_cut) < float(loss_both)  # the one wrong row is not in it any more


def test_unlabelled_positions_stay_unlabelled_through_a_draft_vocabulary(target):
    from hyflash.models.drafter import Drafter

    drafter = Drafter.for_target(target, block_size=4, window=8, num_layers=1, num_heads=4,
                                 draft_vocab=8)
    drafter.draft_head.set_ids(torch.arange(10, 18))
    labels = torch.tensor([[[12, loop.NO_LABEL, 3]]])
    assert loop.head_labels(drafter, labels).tolist() == [[[2, loop.NO_LABEL, -1]]]


def test_data_without_greedy_labels_is_refused_in_one_line(tmp_path, data, target):
    old = tmp_path / "old"
    old.mkdir()
    toks = [data.get(i)[0].numpy() for i in range(8)]
    feats = [data.get(i)[1].numpy() for i in range(8)]
    write_shard(old, 0, toks, feats, [{"prompt_len": data.get(i)[2]} for i in range(8)])
    drafter_spec = loop.TrainSpec(steps=1, batch=2, anchors=4, prompt_anchors=0.5)
    from hyflash.errors import HyflashError
    from hyflash.models.drafter import Drafter

    drafter = Drafter.for_target(target, block_size=4, window=8, num_layers=1, num_heads=4)
    with pytest.raises(HyflashError, match="--prompt-anchors needs the target's greedy labels"):
        loop.train(drafter, DistillSet(old), drafter_spec, tmp_path / "run", progress=False)


def test_runs_of_other_settings_train_beside_each_other_on_the_same_data(model_folder,
                                                                        tmp_path):
    corpus = tmp_path / "words.txt"
    g = torch.Generator().manual_seed(1)
    corpus.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, 46, (3000,), generator=g)))
    base = ["train", "--target", str(model_folder), "--data", str(corpus), "--layers", "1",
            "--heads", "4", "--block-size", "4", "--window", "8", "--sequences", "16",
            "--gen-len", "16", "--data-batch", "8", "--steps", "3", "--batch", "2",
            "--anchors", "4", "--threads", "1", "--quiet", "--work", str(tmp_path / "w"),
            "--keep-work"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--prompt-anchors", "0.5"]) == 0
    # another shape must not resume (or fail on) the first run's checkpoint
    assert main([*base, "--out", str(tmp_path / "c"), "--layers", "2"]) == 0
    (data_dir,) = (tmp_path / "w").glob("data-*")
    runs = sorted(p.name for p in data_dir.glob("train-*"))
    assert runs == ["train-hyflash-L1-h4-B4-w8-s3-b2-a4",
                    "train-hyflash-L1-h4-B4-w8-s3-b2-a4-pa0.5",
                    "train-hyflash-h4-B4-w8-s3-b2-a4"]  # 2 layers: the default, not named
