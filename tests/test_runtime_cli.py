"""`hyflash generate`: streams the target's text, prints the stats table, and turns bad
input into one line."""

import pytest
import torch
import transformers

from hyflash.cli import main
from hyflash.models.target import Target

torch.set_num_threads(1)  # tiny model; threads only add overhead on a busy machine

def greedy_reference(folder, prompt_ids, n):
    model = Target.from_pretrained(folder)
    seq = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]), 0)[0][0, -1].argmax()))
            if seq[-1] == 1:
                break
    return seq[len(prompt_ids):]


def test_generate_no_draft_streams_the_targets_greedy_text_and_prints_stats(model_folder,
                                                                             capsys):
    prompt = "w3 w14 w15 w9"
    assert main(["generate", "--target", str(model_folder), "--prompt", prompt, "--no-draft",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_folder)
    want = greedy_reference(model_folder, tokenizer(prompt).input_ids, 12)
    text = tokenizer.decode(want, skip_special_tokens=True)
    assert out.startswith(prompt + " " + text)
    for row in ("stop reason", "tau (tokens per verify)", "1.00", "target calls",
                "drafting", "verifying", "overhead", "tokens/s", "peak RSS"):
        assert row in out
    assert f"4 / {len(want)}" in out


def test_generate_samples_reproducibly(model_folder, capsys):
    argv = ["generate", "--target", str(model_folder), "--prompt", "w1 w2", "--no-draft",
            "--temperature", "1.0", "--top-k", "10", "--top-p", "0.9", "--seed", "3"]
    assert main(argv) == 0
    first = capsys.readouterr().out.split("\n")[0]
    assert main(argv) == 0
    assert capsys.readouterr().out.split("\n")[0] == first


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "w1"], "exactly one of --drafter DIR or --no-draft"),
    (["--prompt", "w1", "--no-draft", "--drafter", "x"], "exactly one of --drafter"),
])
def test_generate_needs_a_drafter_or_no_draft(model_folder, capsys, argv, message):
    assert main(["generate", "--target", str(model_folder), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_generate_needs_something_to_run(capsys):
    assert main(["generate", "--prompt", "w1"]) == 2
    assert "pass --target (with --drafter or --no-draft) or --bundle" in capsys.readouterr().err


def test_generate_with_a_folder_that_is_no_drafter_is_one_line(model_folder, capsys, tmp_path):
    assert main(["generate", "--target", str(model_folder), "--prompt", "w1",
                 "--drafter", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no drafter at" in err


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "w1 w2 w3 w4 w5", "--max-seq-len", "4"], "leaves no room"),
    (["--prompt", ""], "empty prompt"),
    (["--prompt", "w1", "--top-p", "0"], "top-p"),
])
def test_generate_bad_input_is_one_line(model_folder, capsys, argv, message):
    assert main(["generate", "--target", str(model_folder), "--no-draft", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_generate_without_tokenizer_is_one_line(tmp_path, model_folder, capsys):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((model_folder / name).read_bytes())
    assert main(["generate", "--target", str(tmp_path), "--prompt", "w1", "--no-draft"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer" in err
