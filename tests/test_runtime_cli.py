"""`hyflash generate`: streams the target's text, prints the stats table, and turns bad
input into one line."""

import cli_checks
import pytest
import torch
import transformers

from hyflash.cli import main
from hyflash.models.target import Target


def exit_2(capsys, argv, *needles):
    """generate's errors come before anything is echoed."""
    return cli_checks.exit_2(capsys, argv, *needles, quiet_stdout=True)


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
                "drafting", "decoding", "overhead", "tokens/s", "peak RSS"):
        assert row in out
    assert f"4 / {len(want)}" in out
    # plain decoding verifies nothing: its target calls after the prefill are decodes
    assert f"{len(want)} (1 prefill + {len(want) - 1} decode)" in out and "verifying" not in out


def test_generate_with_lookup_only_writes_the_same_text_and_says_how_it_drafted(
        model_folder, capsys):
    prompt = "w3 w14 w3 w14 w3 w14 w3"  # repeats: the lookup finds matches
    argv = ["generate", "--target", str(model_folder), "--prompt", prompt, "--no-draft",
            "--max-new-tokens", "12"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--lookup"]) == 0
    looked = capsys.readouterr().out
    assert looked.split("\n")[0] == plain.split("\n")[0]  # the same streamed text
    assert "rounds drafted by lookup" in looked and "block size" in looked


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
    exit_2(capsys, ["generate", "--target", str(model_folder), "--no-draft", *argv], message)


def test_generate_without_tokenizer_is_one_line(tmp_path, model_folder, capsys):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((model_folder / name).read_bytes())
    assert main(["generate", "--target", str(tmp_path), "--prompt", "w1", "--no-draft"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer" in err


@pytest.fixture(scope="module")
def drafter_folder(model_folder, tmp_path_factory):
    """An untrained drafter for the tiny model (window 16, block 4): enough to load."""
    from hyflash.models.drafter import Drafter

    folder = tmp_path_factory.mktemp("drafter")
    torch.manual_seed(0)
    Drafter.for_target(Target.from_pretrained(model_folder), num_layers=1, num_heads=4,
                       block_size=4, window=16).save(folder)
    return folder


def test_generate_with_fewer_draft_rows_writes_the_plain_text_and_counts_the_cut_rows(
        model_folder, drafter_folder, capsys):
    argv = ["generate", "--target", str(model_folder), "--prompt", "w3 w14 w15 w9",
            "--max-new-tokens", "12"]
    assert main([*argv, "--no-draft"]) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--drafter", str(drafter_folder), "--draft-rows", "0.99"]) == 0
    cut = capsys.readouterr().out
    assert cut.split("\n")[0] == plain.split("\n")[0]  # the same streamed text
    assert "drafted rows not proposed" in cut  # an untrained drafter is never that sure
    exit_2(capsys, [*argv, "--no-draft", "--draft-rows", "auto"],
           "--draft-rows auto chooses among the drafter's rows")


def test_generate_checks_the_prompt_against_the_context_before_echoing_it(model_folder,
                                                                          capsys):
    prompt = " ".join(f"w{i % 40 + 2}" for i in range(300))
    exit_2(capsys, ["generate", "--target", str(model_folder), "--no-draft", "--prompt", prompt,
                    "--max-seq-len", "32"], "prompt of 300 tokens leaves no room", "32 tokens")


@pytest.mark.parametrize("argv,needle", [
    (["--bundle", "B", "--max-seq-len", "64"],
     "--bundle already fixes the target, drafter and context: drop --max-seq-len"),
    (["--bundle", "B", "--target", "T"], "drop --target"),
    (["--target", "T", "--no-draft", "--drafter", "D"], "exactly one of --drafter DIR or"),
    (["--target", "T", "--no-draft", "--top-k", "5"],
     "--top-k applies to sampling, and --temperature 0 decodes greedily"),
    (["--target", "T", "--no-draft", "--top-p", "0.9", "--seed", "3"],
     "--top-p and --seed apply to sampling"),
])
def test_generate_refuses_flags_that_do_not_apply_to_its_mode(capsys, argv, needle):
    exit_2(capsys, ["generate", "--prompt", "w1", *argv], needle)


def test_generate_refuses_a_context_too_small_for_the_drafters_window(model_folder,
                                                                     drafter_folder, capsys):
    base = ["generate", "--target", str(model_folder), "--drafter", str(drafter_folder),
            "--prompt", "w1 w2", "--max-new-tokens", "4"]
    exit_2(capsys, base + ["--max-seq-len", "19"], "window (16) and one block (4) need 20")
    assert main(base + ["--max-seq-len", "20"]) == 0


def test_generate_sets_the_threads_it_is_given(model_folder, capsys):
    from hyflash.argtypes import machine_cores

    try:
        assert main(["generate", "--target", str(model_folder), "--no-draft", "--prompt", "w1",
                     "--max-new-tokens", "2", "--threads", "2"]) == 0
        assert torch.get_num_threads() == min(2, machine_cores())
    finally:
        torch.set_num_threads(1)


def test_tokenizer_leaves_length_checks_to_us_without_a_warning(capfd):
    from hyflash.models import pocket
    from hyflash.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(pocket.path())
    assert len(tokenizer("x = 1\n" * 1000).input_ids) > 2048  # the model's context
    assert "Token indices sequence length" not in capfd.readouterr().err


def test_the_pocket_model_runs_the_transformers_generate_idiom():
    """tokenizer(text) returns only what the model takes (no token_type_ids)."""
    from hyflash.models import pocket

    tokenizer = transformers.AutoTokenizer.from_pretrained(pocket.path())
    model = transformers.AutoModelForCausalLM.from_pretrained(pocket.path())
    inputs = tokenizer("def read(path):", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4
