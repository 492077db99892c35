"""The one entry point: every subcommand has help, bad input is one line and exit 2."""

import subprocess
import sys

import pytest

from hyflash.cli import COMMANDS, main


def run(*args):
    return subprocess.run([sys.executable, "-m", "hyflash", *args], capture_output=True,
                          text=True, timeout=120)


def test_help_lists_every_subcommand():
    out = run("--help")
    assert out.returncode == 0
    for name in ("train", "export", "simulate", "generate", "bench", "budget", "inspect",
                 "demo"):
        assert name in out.stdout
        assert name in COMMANDS


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_subcommand_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert COMMANDS[name].description.split(":")[0][:40] in " ".join(out.split())


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("hyflash ")


@pytest.mark.parametrize("argv", [["frobnicate"], ["inspect"], ["inspect", "a", "--bogus"]])
def test_bad_usage_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "--help" in err


def test_user_error_is_one_line_without_traceback(tmp_path):
    out = run("inspect", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "no model folder" in out.stderr


def test_inspect_describes_a_model_folder(tmp_path, capsys):
    import torch
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=512)
    transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32) \
        .save_pretrained(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen3" in out and "[1, 2] -> 64" in out
    # 2 (k, v) * 4 layers * 2 kv heads * 16 dims * 2 bytes
    assert "512 B/token" in out


def test_demo_runs_offline_on_the_pocket_pair(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "tau (tokens per verify)" in out and "drafter calls" in out
