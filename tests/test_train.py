"""Drafter training: the loss goes down, an interrupted run resumes exactly, and
`hyflash train` turns bad input into one line, never leaves a half-written drafter,
never replaces what it did not write, and gives the same drafter for the same command."""

import json

import pytest
import torch
from conftest import WORDS, save_tiny_llama

import hyflash.train.generation as generation
import hyflash.train.loop as loop
from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target
from hyflash.train.data import DataSpec, DistillSet, generate_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, model_folder):
    """Target-written continuations of random word streams, features cached."""
    target = Target.from_pretrained(model_folder)
    return target, distil_words(target, tmp_path_factory.mktemp("data"), 48)


def distil_words(target, out, sequences: int) -> DistillSet:
    """The target's continuations of random word streams in out, features cached."""
    stream = torch.randint(2, len(WORDS), (2000,),
                           generator=torch.Generator().manual_seed(0)).numpy()
    spec = DataSpec(sequences=sequences, gen_len=24, short_prompt=(4, 8),
                    long_prompt=(16, 36), batch=16, shard=16)
    generate_dataset(target, stream, spec, out, progress=False)
    target.drop_cache()
    return DistillSet(out)


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


@pytest.mark.parametrize("scores_bytes", [1 << 28, 4096])  # one prefill call; many chunks
def test_continue_batch_matches_a_plain_decode_with_the_whole_cache(model_folder, monkeypatch,
                                                                    scores_bytes):
    """The fast path (chunked prefill, cache sized to the batch, last-position logits,
    float16 features in place) writes what the straightforward loop writes."""
    target = Target.from_pretrained(model_folder)
    prompts = torch.randint(2, 48, (3, 20), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(generation, "PREFILL_SCORES_BYTES", scores_bytes)
    tokens, feats, greedy = generation.continue_batch(target, prompts, 9, False, 1.0,
                                                     torch.Generator())
    assert target.cache_len == 28 and feats.dtype == torch.float16
    target.setup_cache(3)  # the whole context, as generation did before
    with torch.inference_mode():
        logits, ref = target.prefill(prompts)
        assert torch.equal(greedy[:, :20], logits.argmax(-1))  # the prompt's labels
        ref_tokens, ref_feats = [prompts], [ref]
        for pos in range(20, 29):
            ref_tokens.append(logits[:, -1].argmax(-1, keepdim=True))
            if pos < 28:
                logits, f = target(ref_tokens[-1], pos)
                ref_feats.append(f)
    assert torch.equal(tokens, torch.cat(ref_tokens, 1))
    assert torch.equal(greedy[:, 19:], tokens[:, 20:])  # greedy decoding: its own labels
    torch.testing.assert_close(feats.float(), torch.cat(ref_feats, 1), atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_few_steps_reduce_the_loss(distilled, tmp_path, precision):
    target, data = distilled
    spec = loop.TrainSpec(steps=80, batch=4, anchors=8, lr=1e-2, warmup=5, precision=precision)
    _, val = loop.split(len(data), spec)
    d = small_drafter(target)
    before = loop.evaluate(d, data, val, spec)["val_loss"]
    report = loop.train(d, data, spec, tmp_path, progress=False)
    assert report["val_loss"] < 0.9 * before


def test_bf16_training_keeps_float32_weights_and_names_its_run(distilled, tmp_path):
    from hyflash.train.command import run_suffix

    target, data = distilled
    d = small_drafter(target)
    spec = loop.TrainSpec(steps=3, batch=4, anchors=8, warmup=1, precision="bfloat16")
    loop.train(d, data, spec, tmp_path, progress=False)
    assert {p.dtype for p in d.parameters()} == {torch.float32}
    assert run_suffix(spec).endswith("-bf16") and run_suffix(loop.TrainSpec()) == ""
    with pytest.raises(HyflashError, match="precision 'fp8'"):
        loop.TrainSpec(precision="fp8")


def test_a_checkpoint_from_before_a_setting_existed_resumes_with_its_default(tmp_path):
    now = {"drafter": {}, "train": {"steps": 10, "precision": "float32"}}
    loop.check_resumable(tmp_path / "ckpt", {"drafter": {}, "train": {"steps": 10}}, now)
    with pytest.raises(HyflashError, match="a run with precision 'float32', not 'bfloat16'"):
        loop.check_resumable(tmp_path / "ckpt", {"drafter": {}, "train": {"steps": 10}},
                             {**now, "train": {"steps": 10, "precision": "bfloat16"}})


def test_learning_rate_warms_up_then_decays_to_five_percent():
    got = [loop.lr_at(s, loop.TrainSpec()) for s in (0, 49, 50, 775, 1499)]
    assert got == [2e-05, 0.001, 0.001, 0.0005250000000000001, 5.000111487758779e-05]


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

    def crash_after_step_8(path, state):
        real_save(path, state)
        if state["step"] == 8:
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


def test_validation_during_a_run_logs_and_keeps_the_best_weights(distilled, tmp_path,
                                                                 monkeypatch):
    """Every eval_every steps a val.jsonl line; keep="best" ends with the weights of the
    best line, not the last ones; a run resumed from its checkpoint drops the lines
    written after it and ends with the same weights."""
    target, data = distilled
    spec = loop.TrainSpec(steps=12, batch=2, anchors=4, lr=3e-2, warmup=2, checkpoint_every=4,
                          eval_every=2, keep="best")
    real = loop.evaluate
    taus = []

    def scripted(*a, **k):  # validation's expected tau, as told: best at step 4
        return {**real(*a, **k), "val_expected_tau": taus.pop(0)}

    monkeypatch.setattr(loop, "evaluate", scripted)
    script = [1.2, 1.5, 1.4, 1.3, 1.1, 1.0, 0.0]  # steps 2..12, then the final evaluation
    taus[:] = script
    best = small_drafter(target)
    report = loop.train(best, data, spec, tmp_path / "best", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "best" / "val.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    assert [r["best"] for r in rows] == [True, True, False, False, False, False]
    assert report["best_step"] == 4 and report["kept"] == "best (step 4 of 12)"
    assert [p.name for p in (tmp_path / "best").glob("best-*")] == ["best-000004.safetensors"]

    taus[:] = script
    last = small_drafter(target)
    loop.train(last, data, loop.TrainSpec(**{**spec.__dict__, "keep": "last"}), tmp_path / "last",
               progress=False)
    assert any(not torch.equal(v, last.trainable_state()[k])
               for k, v in best.trainable_state().items())

    real_save = loop.save_checkpoint

    def crash_at_step_12(path, state):  # after step 12's validation, before its checkpoint
        if state["step"] == 12:
            raise KeyboardInterrupt
        real_save(path, state)

    taus[:] = script
    monkeypatch.setattr(loop, "save_checkpoint", crash_at_step_12)
    with pytest.raises(KeyboardInterrupt):
        loop.train(small_drafter(target), data, spec, tmp_path / "crash", progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    taus[:] = script[4:]  # the resumed run validates steps 10 and 12 again
    again = small_drafter(target)
    loop.train(again, data, spec, tmp_path / "crash", progress=False)
    lines = (tmp_path / "crash" / "val.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [2, 4, 6, 8, 10, 12]
    for k, v in best.trainable_state().items():
        torch.testing.assert_close(again.trainable_state()[k], v, msg=k)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    f = tmp_path_factory.mktemp("corpus") / "words.txt"
    g = torch.Generator().manual_seed(1)
    f.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, 46, (3000,), generator=g)))
    return f


RUN = "train-hyflash-L1-h4-B4-w8-s3-b2-a4"  # small_run's run: its non-default settings named


def small_run(model_folder, data, out, *extra) -> list[str]:
    return ["train", "--target", str(model_folder), "--data", str(data), "--out", str(out),
            "--layers", "1", "--heads", "4", "--block-size", "4", "--window", "8",
            "--sequences", "16", "--gen-len", "16", "--data-batch", "8", "--steps", "3",
            "--batch", "2", "--anchors", "4", "--threads", "1", "--quiet", *extra]


def test_train_command_writes_a_loadable_drafter_and_removes_its_work(model_folder, corpus,
                                                                      tmp_path, capsys):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out)) == 0
    meta = json.loads((out / "config.json").read_text())
    assert meta["training"]["train_spec"]["steps"] == 3 and meta["config"]["window"] == 8
    d = load_drafter(out, Target.from_pretrained(model_folder))
    assert d.cfg.block_size == 4 and d.cfg.memory == "prefix-slots"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]  # no work, no temp
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith(f"removed the work folder {out}.work (") and "KiB)" in said


def test_keep_work_keeps_the_work_folder_and_says_how_big(model_folder, corpus, tmp_path,
                                                          capsys):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--keep-work")) == 0
    work = tmp_path / "drafter.work"
    size = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith(f"kept the work folder {work} ({size / 1024:.1f} KiB)")
    assert [p.name for p in work.glob(f"data-*/{RUN}/checkpoint.pt")]
    # rerun: the finished checkpoint is resumed (no step left to run), same drafter
    weights = (out / "model.safetensors").read_bytes()
    loss = json.loads((out / "config.json").read_text())["training"]["final_train_loss"]
    assert main(small_run(model_folder, corpus, out, "--keep-work")) == 0
    assert (out / "model.safetensors").read_bytes() == weights
    assert json.loads((out / "config.json").read_text())["training"]["final_train_loss"] == loss


def test_target_init_trains_from_the_targets_last_layers_in_a_run_of_its_own(
        model_folder, corpus, tmp_path, capsys):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--keep-work", "--init", "target",
                          "--steps", "1", "--lr", "1e-9")) == 0
    assert "init: drafter layers start as target layers [2]" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["training"]["init"] == "target"
    assert [p.name for p in (tmp_path / "drafter.work").glob("data-*/train-*")] == \
        ["train-hyflash-L1-h4-B4-w8-s1-b2-a4-lr1e-09-inittarget"]
    target = Target.from_pretrained(model_folder)
    mlp = load_drafter(out, target).layers[0].mlp.down_proj.weight  # one step at lr 1e-9
    torch.testing.assert_close(mlp, target.layers[2].mlp.down_proj.weight)


def test_drafter_init_trains_a_trained_drafter_further_in_a_run_of_its_own(
        model_folder, corpus, tmp_path, capsys):
    """--init DIR starts from DIR's weights and draft vocabulary (the data of this run would
    rank another vocabulary), names its run after DIR's weights, and refuses a shape that
    differs from DIR's with the flag to change."""
    first = tmp_path / "first"
    assert main(small_run(model_folder, corpus, first, "--draft-vocab", "20")) == 0
    ids = load_drafter(first, Target.from_pretrained(model_folder)).draft_head.ids.clone()
    out = tmp_path / "again"
    other = tmp_path / "other.txt"  # other text: a vocabulary ranked on it would differ
    other.write_text(" ".join(f"w{(i * 7) % 46}" for i in range(3000)))
    capsys.readouterr()
    assert main(small_run(model_folder, other, out, "--draft-vocab", "20", "--keep-work",
                          "--init", str(first), "--steps", "1", "--lr", "1e-9")) == 0
    assert f"init: weights and draft vocabulary of the drafter at {first}" in \
        capsys.readouterr().out
    (run,) = (tmp_path / "again.work").glob("data-*/train-*")
    assert run.name.startswith("train-hyflash-dv20-L1-h4-B4-w8-s1-b2-a4-lr1e-09-initdrafter")
    target = Target.from_pretrained(model_folder)
    a, b = load_drafter(first, target), load_drafter(out, target)
    assert torch.equal(b.draft_head.ids, ids)
    assert main(small_run(model_folder, other, tmp_path / "fresh", "--draft-vocab", "20")) == 0
    assert not torch.equal(load_drafter(tmp_path / "fresh", target).draft_head.ids, ids)
    for k, v in a.trainable_state().items():  # one step at lr 1e-9
        torch.testing.assert_close(b.trainable_state()[k], v, msg=k)
    assert main(small_run(model_folder, corpus, tmp_path / "wide", "--draft-vocab", "20",
                          "--init", str(first), "--heads", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert f"--init {first}: that drafter's shape differs" in err and \
        "--heads 2 here, 4 there" in err and "\n" not in err
    deep = tmp_path / "deep"  # more layers grow it: DIR's below, an identity layer on top
    assert main(small_run(model_folder, corpus, deep, "--draft-vocab", "20", "--init",
                          str(first), "--layers", "2", "--steps", "1", "--lr", "1e-9")) == 0
    c = load_drafter(deep, target)
    assert c.cfg.num_layers == 2 and torch.equal(c.draft_head.ids, ids)
    for k, v in a.layers[0].state_dict().items():
        torch.testing.assert_close(c.layers[0].state_dict()[k], v, msg=k)
    assert c.layers[1].o_proj.weight.abs().max() < 1e-6
    assert main(small_run(model_folder, corpus, tmp_path / "shallow", "--draft-vocab", "20",
                          "--init", str(deep))) == 2
    err = capsys.readouterr().err.strip()
    assert "--layers 1 here, 2 there (more layers than that grow it; fewer cannot)" in err


def test_data_only_generates_the_data_and_stops(model_folder, corpus, tmp_path, capsys):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--data-only")) == 0
    assert not out.exists()
    (data,) = (tmp_path / "drafter.work").glob("data-*")
    assert (data / "done").exists() and not list(data.glob("train-*"))
    assert f"data ready in {data}" in capsys.readouterr().out


def test_train_command_takes_tokens_from_a_tokens_only_folder(model_folder, corpus, tmp_path,
                                                              capsys):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--data-only", "--features",
                          "recompute")) == 0
    assert main(small_run(model_folder, corpus, out, "--data-only", "--features",
                          "cache")) == 0
    said = capsys.readouterr().out
    assert "tokens: taken from" in said
    cached, tokens_only = sorted((tmp_path / "drafter.work").glob("data-*"),
                                 key=lambda p: DistillSet(p).has_features, reverse=True)
    assert DistillSet(cached).has_features and not DistillSet(tokens_only).has_features
    a, b = DistillSet(cached), DistillSet(tokens_only)
    for i in range(len(a)):
        assert torch.equal(a.get(i, features=False)[0], b.get(i, features=False)[0])


def test_same_command_twice_gives_the_same_drafter(model_folder, corpus, tmp_path):
    def weights(name, *extra):
        assert main(small_run(model_folder, corpus, tmp_path / name, *extra)) == 0
        return (tmp_path / name / "model.safetensors").read_bytes()

    first = weights("a")
    assert weights("b") == first
    assert weights("c", "--seed", "1") != first  # the seed matters, so the test can fail


def test_another_corpus_regenerates_the_data_and_trains_afresh(model_folder, corpus, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(" ".join(f"w{(i * 7) % 46}" for i in range(3000)))
    out, work = tmp_path / "drafter", tmp_path / "drafter.work"
    assert main(small_run(model_folder, corpus, out, "--keep-work")) == 0
    (first,) = work.glob("data-*")
    old_ckpt = (first / RUN / "checkpoint.pt").read_bytes()
    assert main(small_run(model_folder, other, out, "--keep-work")) == 0
    (second,) = set(work.glob("data-*")) - {first}
    assert (second / RUN / "checkpoint.pt").exists()  # trained, not resumed
    assert (first / RUN / "checkpoint.pt").read_bytes() == old_ckpt
    meta = json.loads((out / "config.json").read_text())["training"]
    assert meta["data"] == str(other)
    # the same drafter as a run that never saw the first corpus
    assert main(small_run(model_folder, other, tmp_path / "fresh")) == 0
    assert (out / "model.safetensors").read_bytes() == \
        (tmp_path / "fresh" / "model.safetensors").read_bytes()


def snapshot(root):
    """Every path under root with its bytes (None for a folder)."""
    if root.is_file():
        return {".": root.read_bytes()}
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None
            for p in root.rglob("*")}


def user_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    return f


def user_folder(tmp_path):
    d = tmp_path / "results"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"mine": true}')
    (d / "sub" / "plot.png").write_bytes(b"png")
    return d


def drafter_with_notes(tmp_path):
    """A drafter folder `hyflash train` wrote, to which the user added a file."""
    d = tmp_path / "old-drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"format_version": 1, "config": {},
                                               "training": {}}))
    (d / "model.safetensors").write_bytes(b"w")
    (d / "NOTES.md").write_text("mine")
    return d


@pytest.mark.parametrize("make,flag,message", [
    (user_file, "--out", "is a file, not a drafter folder: choose a new --out, or remove it"),
    (user_folder, "--out", "is a folder that `hyflash train` did not write (it holds "
                           "config.json, sub...): choose a new --out, or remove it yourself"),
    (drafter_with_notes, "--out", "did not write"),
    (user_file, "--work", "is a file, not a work folder: choose another --work"),
    (user_folder, "--work", "is a folder that `hyflash train` did not make"),
])
def test_train_refuses_to_replace_what_it_did_not_write(model_folder, corpus, tmp_path, capsys,
                                                        monkeypatch, make, flag, message):
    mine = make(tmp_path)
    before = snapshot(mine)
    called = []
    monkeypatch.setattr("hyflash.models.target.Target.from_pretrained",
                        lambda *a, **k: called.append(1))
    argv = small_run(model_folder, corpus, tmp_path / "d")
    argv[argv.index("--out") + 1] = str(mine) if flag == "--out" else str(tmp_path / "d")
    if flag == "--work":
        argv += ["--work", str(mine)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert snapshot(mine) == before and not called  # refused before any work


def test_train_refuses_overlapping_out_and_work(model_folder, corpus, tmp_path, capsys):
    out = tmp_path / "d"
    assert main(small_run(model_folder, corpus, out, "--work", str(out / "w"))) == 2
    assert "overlap" in capsys.readouterr().err and not out.exists()


def test_train_replaces_a_drafter_it_wrote(model_folder, corpus, tmp_path):
    out = tmp_path / "drafter"
    assert main(small_run(model_folder, corpus, out, "--seed", "1")) == 0
    first = (out / "model.safetensors").read_bytes()
    assert main(small_run(model_folder, corpus, out)) == 0
    assert (out / "model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]


def write_bytes(name: str, data: bytes):
    def make(tmp_path):
        f = tmp_path / name
        f.write_bytes(data)
        return f
    return make


def empty_folder(tmp_path):
    d = tmp_path / "texts"
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "a.txt").write_text("  \n")
    return d


@pytest.mark.parametrize("make,message", [
    (write_bytes("latin1.txt", "caf\xe9 w1 w2".encode("latin-1")),
     "latin1.txt is not UTF-8 text (byte 0xe9 at offset 3): convert it to UTF-8"),
    (write_bytes("blob.txt", b"w1 w2\x00\x01\x02"), "blob.txt is binary (it holds NUL bytes)"),
    (write_bytes("p.jsonl", b'{"text": "w1 w2"}\nnull\n'),
     "p.jsonl:2: a JSONL record needs a 'text' or 'prompt' string field, got null"),
    (write_bytes("p.jsonl", b'{"text": "w1"}\n{"body": "w2"}\n'),
     "p.jsonl:2: a JSONL record needs a 'text' or 'prompt' string field, got keys ['body']"),
    (write_bytes("p.jsonl", b'{"prompt": 3}\n'), "got 'prompt' of type int"),
    (write_bytes("p.jsonl", b'{"text": "w1"\n'), "p.jsonl:1: not a JSON line"),
    (write_bytes("empty.txt", b""), "empty.txt: the file is empty"),
    (write_bytes("empty.jsonl", b"\n\n"), "empty.jsonl: the file is empty"),
    (empty_folder, "found no non-empty .py, .txt"),
    (lambda tmp_path: tmp_path / "missing.txt", "no data at"),
])
def test_train_corpus_bad_input_is_one_line(model_folder, tmp_path, capsys, make, message):
    data = make(tmp_path)
    out = tmp_path / "d"
    assert main(small_run(model_folder, data, out)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "d.work").exists()


@pytest.mark.parametrize("flag,value,message", [
    ("--steps", "0", "must be >= 1, got 0"),
    ("--sequences", "-3", "must be >= 1, got -3"),
    ("--sequences", "0", "must be >= 1, got 0"),
    ("--batch", "0", "must be >= 1"),
    ("--anchors", "-1", "must be >= 1"),
    ("--gen-len", "0", "must be >= 1"),
    ("--data-batch", "0", "must be >= 1"),
    ("--lr", "0", "must be > 0, got 0"),
    ("--lr", "-0.001", "must be > 0"),
    ("--lr", "inf", "must be a finite number, got inf"),
    ("--lr", "nan", "must be a finite number"),
    ("--memory-lr-scale", "0", "must be > 0"),
    ("--kl", "-1", "must be >= 0"),
    ("--sampled-fraction", "1.5", "must be in [0, 1], got 1.5"),
    ("--sampled-fraction", "-0.1", "must be in [0, 1]"),
    ("--threads", "0", "must be >= 1, got 0"),
    ("--max-seq-len", "0", "must be >= 1, got 0"),
    ("--seed", "-1", "must be >= 0"),
    ("--steps", "ten", "'ten' is not a whole number"),
])
def test_train_number_flags_out_of_range_are_one_line(model_folder, corpus, tmp_path, capsys,
                                                      flag, value, message):
    with pytest.raises(SystemExit) as e:
        main(small_run(model_folder, corpus, tmp_path / "d", flag, value))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err and err.count("\n") == 1, err


def test_train_max_seq_len_above_the_targets_is_one_line(model_folder, corpus, tmp_path, capsys):
    assert main(small_run(model_folder, corpus, tmp_path / "d", "--max-seq-len", "100000")) == 2
    err = capsys.readouterr().err
    assert "100000 tokens is above the 64 the model supports" in err
    assert err.count("\n") == 1


def test_train_threads_are_capped_at_the_cores(capsys):
    from hyflash.argtypes import machine_cores
    from hyflash.cli import build_parser

    args = build_parser().parse_args(["train", "--target", "t", "--data", "d", "--out", "o",
                                      "--threads", "100000"])
    assert args.threads == machine_cores()
    assert "capped" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--block-size", "40"], "block size 40 must be in 2..32"),
    (["--sequences", "1"], "too few examples"),
    (["--gen-len", "60"], "leaves no room for prompts"),
    (["--keep", "best"], "--keep best needs validations during the run"),
    (["--init", "target"], "--init target: --heads 8 differs from the target's 4 attention"),
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
