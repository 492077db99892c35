"""The shipped pocket model: a plain Hugging Face folder, small, deterministic; and its
build command refuses bad environments and resumes after an interruption."""

import hashlib
import shutil
import sysconfig
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import transformers

from hyflash.models import pocket
from hyflash.models.target import Target
from hyflash.train import pocket_target as build

torch.set_num_threads(1)

# sha256 of the 32 greedy token ids after PROMPT; changes only if the weights change
PROMPT = "def __init__(self"
GREEDY_SHA256 = "9ddc3b3438c4f6328f28473233d924707644cf3c5201d5f10230e0635209a163"


def greedy_ids(model: Target, ids: list[int], n: int) -> list[int]:
    model.setup_cache()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), 0)
        out, pos = [], len(ids)
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits, _ = model(torch.tensor([[out[-1]]]), pos)
            pos += 1
    return out


def test_shipped_folder_is_small_and_complete():
    folder = pocket.path()
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size <= 15 * 2**20
    for name in ("config.json", "model.safetensors", "tokenizer.json",
                 "generation_config.json", "README.md"):
        assert (folder / name).exists(), name
    card = (folder / "README.md").read_text()
    assert "Held-out quality" in card and "perplexity" in card and "License" in card


def test_loads_with_transformers_and_hyflash_alike():
    folder = pocket.path()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    ours = Target.from_pretrained(folder)
    assert ours.cfg.max_seq_len >= 2048 and ours.cfg.vocab_size == len(tok)
    ids = tok("import os\nimport sys\n\n\ndef main(argv):\n").input_ids
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits
    torch.testing.assert_close(ours(torch.tensor([ids]), 0)[0], ref, atol=1e-4, rtol=0)


def test_greedy_continuation_is_pinned():
    folder = pocket.path()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = greedy_ids(Target.from_pretrained(folder), tok(PROMPT).input_ids, 32)
    digest = hashlib.sha256(str(out).encode()).hexdigest()
    assert digest == GREEDY_SHA256, (digest, tok.decode(out))


def test_build_refuses_without_stdlib_sources(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = build.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                     "--stdlib", str(tmp_path / "empty")])
    assert rc == 2
    assert "no stdlib sources" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_build_refuses_without_disk_space(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(build.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 10**6))
    rc = build.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")])
    assert rc == 2
    assert "no disk space" in capsys.readouterr().err


def test_build_learning_rate_schedule_is_the_one_the_shipped_model_used():
    # values of the schedule the model was built with (before it moved to train/scaffold.py)
    got = [build.lr_at(s, 1200, 2e-3, 100) for s in (0, 99, 100, 600, 1199)]
    assert got == [2e-05, 0.002, 0.002, 0.0012280833544459568, 0.00020000367051153852]


def test_build_reads_the_same_stdlib_split_as_train():
    from hyflash.train import corpus

    assert build.split_files is corpus.split_files and build.read_text is corpus.read_text
    train, held, root = corpus.split_files()
    assert len(held) > 10 and not set(train) & set(held)
    assert all(corpus.is_heldout(f.relative_to(root).as_posix()) for f in held)


def test_interrupted_build_resumes_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    src = tmp_path / "lib"
    src.mkdir()
    for f in sorted(stdlib.glob("*.py"))[:60]:
        shutil.copy(f, src / f.name)
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                vocab_size=300)
    for k, v in tiny.items():
        monkeypatch.setitem(build.MODEL_CONFIG, k, v)
    argv = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), "--stdlib",
            str(src), "--steps", "4", "--checkpoint-every", "2", "--tokens-per-step", "256",
            "--short-seq", "32", "--warmup", "1", "--threads", "1"]
    real_save = build.save_checkpoint

    def crash_after_step_2(*args, **kw):
        real_save(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "save_checkpoint", crash_after_step_2)
    with pytest.raises(KeyboardInterrupt):
        build.main(argv)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(build, "save_checkpoint", real_save)
    capsys.readouterr()
    assert build.main(argv) == 0
    assert "at step 2/4" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert hf.config.num_hidden_layers == 1


@pytest.mark.parametrize("name", ["pocket", "pocket-full"])
def test_shipped_drafters_load_and_stay_lossless(name):
    from hyflash.models.drafter_folder import load_drafter
    from hyflash.runtime import SpeculativeEngine, TorchTarget
    from hyflash.runtime.drafter_backend import TorchDrafter

    folder = pocket.path()
    target = Target.from_pretrained(folder)
    drafter = load_drafter(name, target)
    assert drafter.cfg.block_size == 8 and drafter.cfg.arch == ("full" if "full" in name
                                                                  else "hyflash")
    ids = transformers.AutoTokenizer.from_pretrained(folder)(PROMPT).input_ids
    out = SpeculativeEngine(TorchTarget(target), TorchDrafter(drafter)).generate(
        ids, max_new_tokens=32)
    assert hashlib.sha256(str(out.tokens).encode()).hexdigest() == GREEDY_SHA256
    assert out.stats.target_calls < 33  # the drafter saved some target calls


def test_pocket_drafter_keywords_resolve_to_the_shipped_folders():
    from hyflash.models.drafter_folder import resolve_drafter_folder

    assert resolve_drafter_folder("pocket") == pocket.drafter_path("hyflash")
    assert resolve_drafter_folder("pocket-full") == pocket.drafter_path("full")
    assert resolve_drafter_folder("runs/x") == Path("runs/x")
