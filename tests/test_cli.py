"""The one entry point: every subcommand has help, bad input is one line and exit 2."""

import subprocess
import sys

import pytest
from cli_checks import exit_2

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


# ------------------------------------------------------------ bad input: exit 2, one line

def damaged_copy(src, dst, how):
    import shutil

    shutil.copytree(src, dst)
    if how in ("config not JSON", "config a list", "config lacks sizes"):
        text = {"config not JSON": "{oops", "config a list": "[1, 2]",
                "config lacks sizes": '{"model_type": "llama"}'}[how]
        (dst / "config.json").write_text(text)
    else:
        weights = dst / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[:len(data) // 2] if how == "truncated weights"
                            else bytes(range(256)) * 8)
    return dst


@pytest.mark.parametrize("how,needle", [
    ("config not JSON", "config.json is not valid JSON"),
    ("config a list", "config.json holds a JSON list, not an object"),
    ("config lacks sizes", "config.json lacks vocab_size, hidden_size"),
    ("truncated weights", "model.safetensors is truncated or corrupt"),
    ("garbage weights", "model.safetensors is truncated or corrupt"),
])
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_damaged_model_folder_is_one_line_naming_the_file(model_folder, tmp_path, capsys,
                                                            how, needle, command):
    bad = damaged_copy(model_folder, tmp_path / "bad", how)
    argv = [str(bad)] if command == "inspect" else ["--target", str(bad), "--no-draft",
                                                    "--prompt", "w1"]
    exit_2(capsys, [command, *argv], needle, str(bad))


def test_inspect_describes_a_drafter_folder_and_says_what_it_is(capsys):
    from hyflash.models import pocket

    for name in ("pocket-full", str(pocket.drafter_path("hyflash"))):
        assert main(["inspect", name]) == 0
        out = capsys.readouterr().out
        assert "a hyflash drafter (not a model): inspect its target, or export the pair with " \
               f"`hyflash export --target pocket --drafter {name} --out BUNDLE`" in out
        assert "block size                  8 (drafts 7 tokens per call)" in out
        assert "trained for target          pocket (vocabulary 4096, context 2048)" in out
    assert "window                      64 context features" in out
    assert "322 KiB (--window-cache kv), 130 KiB (features); fixed, any context" in out
    exit_2(capsys, ["inspect", "pocket-full", "--max-seq-len", "64"],
           "--max-seq-len sizes a model folder's KV cache, and pocket-full is a drafter")


def test_inspect_sizes_only_contexts_the_model_supports(capsys):
    assert main(["inspect", "pocket", "--max-seq-len", "512"]) == 0
    assert "max context (static cache)   512" in capsys.readouterr().out
    exit_2(capsys, ["inspect", "pocket", "--max-seq-len", "0"], "--max-seq-len: must be >= 1")
    exit_2(capsys, ["inspect", "pocket", "--max-seq-len", "100000"],
           "100000 tokens is above the 2048 the model supports", "--max-seq-len <= 2048")


GEN = ["generate", "--target", "pocket", "--no-draft", "--prompt", "x"]
EXPORT = ["export", "--target", "pocket", "--drafter", "pocket", "--out", "b"]


@pytest.mark.parametrize("argv,needle", [
    (GEN + ["--max-new-tokens", "0"],
     "--max-new-tokens: must be >= 1, got 0"),
    (GEN + ["--temperature", "inf"],
     "--temperature: must be a finite number, got inf"),
    (GEN + ["--top-k", "-1"],
     "--top-k: must be >= 0"),
    (GEN + ["--top-p", "1.5"],
     "--top-p: must be in (0, 1]"),
    (GEN + ["--seed", "-1"],
     "--seed: must be >= 0"),
    (GEN + ["--threads", "0"],
     "--threads: must be >= 1"),
    (GEN + ["--max-seq-len", "0"],
     "--max-seq-len: must be >= 1"),
    (["simulate", "b", "--max-new-tokens", "-3"], "--max-new-tokens: must be >= 1"),
    (["simulate", "b", "--temperature", "nan"], "--temperature: must be a finite number"),
    (["simulate", "b", "--threads", "-2"], "--threads: must be >= 1"),
    (EXPORT + ["--max-seq-len", "0"],
     "--max-seq-len: must be >= 1"),
    (EXPORT + ["--threads", "x"],
     "--threads: 'x' is not a whole number"),
    (["inspect", "pocket", "--max-seq-len", "-1"], "--max-seq-len: must be >= 1"),
    (["demo", "--threads", "0"], "--threads: must be >= 1"),
    (["budget", "pocket", "--context", "0"], "--context: must be >= 1"),
    (["bench", "--runs", "0"], "--runs: must be >= 1"),
])
def test_a_bad_number_is_one_line_naming_the_flag(capsys, argv, needle):
    exit_2(capsys, argv, needle)


