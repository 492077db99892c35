"""Drafter training: the loss goes down, an interrupted run resumes exactly, and
`hyflash train` turns bad input into one line and never leaves a half-written drafter."""

import json

import pytest
import torch
from conftest import WORDS, save_tiny_llama

import hyflash.train.loop as loop
from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter, load_drafter
from hyflash.models.target import Target
from hyflash.train.data import DataSpec, DistillSet, generate_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, model_folder):
    """Target-written continuations of random word streams, features cached."""
    target = Target.from_pretrained(model_folder)
    stream = torch.randint(2, len(WORDS), (2000,),
                           generator=torch.Generator().manual_seed(0)).numpy()
    spec = DataSpec(sequences=48, gen_len=24, short_prompt=(4, 8), long_prompt=(16, 36),
                    batch=16, shard=16)
    out = tmp_path_factory.mktemp("data")
    generate_dataset(target, stream, spec, out, progress=False)
    target.drop_cache()
    return target, DistillSet(out)


def small_drafter(target):
    torch.manual_seed(0)
    return Drafter.for_target(target, "hyflash", num_layers=1, num_heads=4, block_size=4,
                              window=8)


def test_distilled_sequences_are_the_targets_greedy_continuations(distilled):
    target, data = distilled
    tokens, feats, plen = data.get(5)
    assert feats.shape == (len(tokens) - 1, target.cfg.feature_size)
    with torch.no_grad():
        logits, ref_feats = target(tokens[None, :-1], 0)
    assert torch.equal(logits[0, plen - 1:].argmax(-1), tokens[plen:])
    torch.testing.assert_close(feats, ref_feats[0], atol=2e-3, rtol=1e-2)  # stored as fp16


def test_a_few_steps_reduce_the_loss(distilled, tmp_path):
    target, data = distilled
    spec = loop.TrainSpec(steps=80, batch=4, anchors=8, lr=1e-2, warmup=5)
    _, val = loop.split(len(data), spec)
    d = small_drafter(target)
    before = loop.evaluate(d, data, val, spec)["val_loss"]
    report = loop.train(d, data, spec, tmp_path, progress=False)
    assert report["val_loss"] < 0.9 * before


def test_memory_scalars_train_faster_and_vectors_skip_weight_decay(distilled):
    target, _ = distilled
    torch.manual_seed(0)
    d = Drafter.for_target(target, "hyflash", num_layers=1, num_heads=4, block_size=4,
                           window=8, memory="decayed-linear")
    spec = loop.TrainSpec(lr=1e-3, weight_decay=0.1, memory_lr_scale=10.0)
    groups = loop.param_groups(d, spec)
    names = {id(p): n for n, p in d.named_parameters()}
    by = {(g["lr_scale"], g["weight_decay"]): sorted(names[id(p)] for p in g["params"])
          for g in groups}
    trainable = sorted(n for n, p in d.named_parameters() if p.requires_grad)
    assert sorted(sum(by.values(), [])) == trainable  # every parameter exactly once
    assert by[(10.0, 0.0)] == ["layers.0.memory.decay_logit", "layers.0.memory.gate.bias"]
    assert "layers.0.memory.gate.weight" in by[(1.0, 0.1)]
    assert "fc_norm.weight" in by[(1.0, 0.0)] and "mask_embed" in by[(1.0, 0.0)]


def test_interrupted_training_resumes_exactly(distilled, tmp_path, monkeypatch):
    target, data = distilled
    spec = loop.TrainSpec(steps=12, batch=2, anchors=4, checkpoint_every=4)
    straight = small_drafter(target)
    loop.train(straight, data, spec, tmp_path / "a", progress=False)

    real_save = loop.save_checkpoint

    def crash_after_step_8(path, drafter, opt, step, run):
        real_save(path, drafter, opt, step, run)
        if step == 8:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop, "save_checkpoint", crash_after_step_8)
    with pytest.raises(KeyboardInterrupt):
        loop.train(small_drafter(target), data, spec, tmp_path / "b", progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    resumed = small_drafter(target)
    loop.train(resumed, data, spec, tmp_path / "b", progress=False)
    for (name, a), (_, b) in zip(straight.trainable_state().items(),
                                 resumed.trainable_state().items(), strict=True):
        torch.testing.assert_close(a, b, msg=name)

    # a checkpoint resumes only into the run that made it
    other_lr = loop.TrainSpec(steps=12, batch=2, anchors=4, checkpoint_every=4, lr=5e-3)
    with pytest.raises(HyflashError, match="is a run with lr 0.001, not 0.005"):
        loop.train(small_drafter(target), data, other_lr, tmp_path / "b", progress=False)
    torch.manual_seed(0)
    wider = Drafter.for_target(target, "hyflash", num_layers=1, num_heads=4, block_size=4,
                               window=16)
    with pytest.raises(HyflashError, match="is a run with window 8, not 16"):
        loop.train(wider, data, spec, tmp_path / "b", progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    f = tmp_path_factory.mktemp("corpus") / "words.txt"
    g = torch.Generator().manual_seed(1)
    f.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, 46, (3000,), generator=g)))
    return f


def test_train_command_writes_a_loadable_drafter(model_folder, corpus, tmp_path, capsys):
    out = tmp_path / "drafter"
    argv = ["train", "--target", str(model_folder), "--data", str(corpus), "--out", str(out),
            "--layers", "1", "--heads", "4", "--block-size", "4", "--window", "8",
            "--sequences", "16", "--gen-len", "16", "--data-batch", "8", "--steps", "3",
            "--batch", "2", "--anchors", "4", "--quiet"]
    assert main(argv) == 0
    meta = json.loads((out / "config.json").read_text())
    assert meta["training"]["train_spec"]["steps"] == 3 and meta["config"]["window"] == 8
    d = load_drafter(out, Target.from_pretrained(model_folder))
    assert d.cfg.block_size == 4 and d.cfg.memory == "prefix-slots"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("extra,message", [
    (["--block-size", "40"], "block size 40 must be in 2..32"),
    (["--sequences", "1"], "too few examples"),
    (["--gen-len", "60"], "leaves no room for prompts"),
])
def test_train_command_bad_input_is_one_line(model_folder, corpus, tmp_path, capsys, extra,
                                             message):
    out = tmp_path / "drafter"
    argv = ["train", "--target", str(model_folder), "--data", str(corpus), "--out", str(out),
            "--quiet", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_train_command_memory_choices_are_the_models():
    from hyflash.models import memory
    from hyflash.train import command

    assert command.MEMORY_KINDS == memory.MEMORY_KINDS
    assert command.MEMORY_KINDS[0] == memory.DEFAULT_MEMORY


def test_train_command_rejects_a_mismatched_tokenizer(tmp_path, corpus, capsys):
    folder = save_tiny_llama(tmp_path / "m")
    small = Target.from_pretrained(folder).cfg
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = 20  # fewer ids than the tokenizer produces
    (folder / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    w = load_file(folder / "model.safetensors")
    w = {k: (v[:20] if v.shape[0] == small.vocab_size else v) for k, v in w.items()}
    save_file(w, folder / "model.safetensors")
    assert main(["train", "--target", str(folder), "--data", str(corpus), "--out",
                 str(tmp_path / "d"), "--quiet"]) == 2
    assert "tokenizer does not match the target" in capsys.readouterr().err
