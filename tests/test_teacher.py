"""The KL term (`hyflash train --kl`): the teacher's logits are the target's own at each
block position, the KL is zero when the drafter matches them, and training with it moves
the drafter toward the target's distribution."""

import json

import numpy as np
import pytest
import torch

import hyflash.train.loop as loop
from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.models.target import Target
from hyflash.train.features import target_features
from hyflash.train.teacher import Teacher, kl_to_teacher

torch.set_num_threads(1)


def drafter_for(target, **kw):
    torch.manual_seed(0)
    return Drafter.for_target(target, "hyflash", num_layers=1, num_heads=4, block_size=4,
                              window=8, **kw)


@pytest.mark.parametrize("taps", [(0, 1), (0, 1, 2)])  # a layer above the last tap, or none
@pytest.mark.parametrize("draft_vocab", [0, 12])
def test_teacher_logits_are_the_targets_at_each_block_position(model_folder, taps, draft_vocab):
    target = Target.from_pretrained(model_folder, tap_layers=taps)
    drafter = drafter_for(target, draft_vocab=draft_vocab)
    if draft_vocab:
        drafter.draft_head.set_ids(torch.randperm(target.cfg.vocab_size)[:draft_vocab])
    tokens = torch.randint(2, target.cfg.vocab_size, (2, 30),
                           generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[0, 9, 20], [3, 4, 26]])
    soft = Teacher(target, drafter).logits(target_features(target, tokens), anchors, 4)
    with torch.no_grad():
        full, _ = target(tokens)
    if draft_vocab:
        full = full[..., drafter.draft_head.ids]
    assert soft.shape == (2, 3, 3, full.shape[-1])
    for n in range(2):
        for a in range(3):
            for k in range(1, 4):  # block row k-1 predicts the token at anchor + k
                torch.testing.assert_close(soft[n, a, k - 1], full[n, anchors[n, a] + k - 1],
                                           atol=1e-5, rtol=1e-5)


def test_a_block_past_the_features_is_refused(model_folder):
    target = Target.from_pretrained(model_folder, tap_layers=(0, 1))
    feats = target_features(target, torch.ones(1, 10, dtype=torch.long))
    with pytest.raises(HyflashError, match="reaches position 10, past the 10 positions"):
        Teacher(target, drafter_for(target)).logits(feats, torch.tensor([[8]]), 4)


def test_the_kl_term_is_zero_for_the_teachers_own_logits_and_counts_only_labelled_rows():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, 10)
    labels = torch.randint(0, 10, (2, 3, 4))
    labels[0, 0, 2:] = loop.NO_LABEL
    w = loop.position_weights(5, 4.0)
    ce, _ = loop.block_loss(logits, labels, w)
    same, _ = loop.block_loss(logits, labels, w, logits.clone(), 1.0)
    torch.testing.assert_close(same, ce)
    other = torch.randn(2, 3, 4, 10)
    with_kl, _ = loop.block_loss(logits, labels, w, other, 0.5)
    kl = kl_to_teacher(logits, other) * (labels != loop.NO_LABEL)
    want = ce + 0.5 * (kl * w).sum() / (w * (labels != loop.NO_LABEL)).sum()
    torch.testing.assert_close(with_kl, want)
    assert with_kl > ce


def test_training_with_kl_moves_the_drafter_toward_the_targets_distribution(distilled_kl,
                                                                             tmp_path):
    target, data = distilled_kl
    spec = loop.TrainSpec(steps=60, batch=4, anchors=8, lr=1e-2, warmup=5)
    _, val = loop.split(len(data), spec)
    picks = [(i, np.random.default_rng(i)) for i in val]
    tokens, feats, anchors, labels = loop.make_batch(data, picks, 8, 4)

    def mean_kl(drafter):
        with torch.no_grad():
            kl = kl_to_teacher(drafter(tokens, feats, anchors),
                               Teacher(target, drafter).logits(feats, anchors, 4))
        return float(kl[labels != loop.NO_LABEL].mean())

    before = mean_kl(drafter_for(target))
    after = {}
    for kl in (0.0, 1.0):
        drafter = drafter_for(target)
        run = loop.TrainSpec(**{**spec.__dict__, "kl": kl})
        report = loop.train(drafter, data, run, tmp_path / f"kl{kl}", progress=False,
                            teacher=Teacher(target, drafter))
        assert report["train_spec"]["kl"] == kl
        after[kl] = mean_kl(drafter)
    assert after[1.0] < 0.5 * before and after[1.0] < 0.8 * after[0.0], (before, after)


def test_kl_needs_a_teacher_and_a_weight_of_zero_or_more(distilled_kl, tmp_path):
    from hyflash.train.command import run_suffix

    target, data = distilled_kl
    with pytest.raises(HyflashError, match="kl 1.0 needs the target's distributions"):
        loop.train(drafter_for(target), data, loop.TrainSpec(steps=1, kl=1.0), tmp_path,
                   progress=False)
    with pytest.raises(HyflashError, match="kl weight -1 < 0"):
        loop.TrainSpec(kl=-1)
    assert run_suffix(loop.TrainSpec(kl=0.5)) == "-kl0.5"


@pytest.fixture(scope="module")
def distilled_kl(tmp_path_factory, model_folder):
    """Target-written continuations, features cached, of a target with a layer above its
    last tap (so the teacher runs it)."""
    from test_train import distil_words

    target = Target.from_pretrained(model_folder, tap_layers=(0, 1))
    with torch.no_grad():  # a random target is near uniform: make its choices peaked
        target.lm_head.weight.mul_(20.0)
    return target, distil_words(target, tmp_path_factory.mktemp("data"), 32)


def test_train_command_kl_trains_in_a_run_of_its_own(model_folder, tmp_path):
    from test_train import small_run

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(["alpha beta gamma delta"] * 200))
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--kl", "0.5", "--keep-work")) == 0
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["train_spec"]["kl"] == 0.5
    runs = [p.name for p in (tmp_path / "drafter.work").glob("*/train-*")]
    assert len(runs) == 1 and runs[0].endswith("-kl0.5"), runs
