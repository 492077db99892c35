"""`hyflash export`, `inspect` and `simulate` on ONNX bundles: the bundle is written
atomically, inspect prints it, simulate reports what the phone would see, and a damaged
or mismatched bundle gets one line and exit status 2."""

import json
import shutil

import pytest
from onnx_pairs import tiny_pair

import hyflash.export.bundle as bundle_mod
from hyflash.bundle import MANIFEST, read_bundle, seal
from hyflash.cli import main


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx-cli")
    folder, drafters = tiny_pair(root, archs=("hyflash",), steps=40)
    out = root / "bundle"
    assert main(["export", "--target", str(folder), "--drafter", str(drafters["hyflash"]),
                 "--backend", "onnx", "--quant", "int4", "--out", str(out),
                 "--no-progress"]) == 0
    return folder, drafters["hyflash"], out


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ------------------------------------------------------------------ export, inspect

def test_export_writes_a_complete_bundle_and_leaves_nothing_behind(exported, capsys):
    folder, _, out = exported
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["quantization"]["recipe"] == "int4"
    assert manifest["quantization"]["graphs"]["target"]["tool"].endswith("MatMulNBitsQuantizer")
    assert set(manifest["tokenizer"]["files"]) >= {"tokenizer.json"}
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_inspect_prints_a_bundle_and_still_describes_model_folders(exported, capsys):
    folder, _, out = exported
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in ("format 2", "int4", "window cache kv", "window_k [1, 16, 32] float32",
                   "past_key_values.*.key[1, 2, 'past_sequence_length', 8]",
                   "drafter_step (drafter.onnx", "tokenizer.json", "B/token"):
        assert needle in text, needle
    assert main(["inspect", str(folder)]) == 0
    assert "architecture" in capsys.readouterr().out


def test_export_replaces_an_old_bundle_only_when_the_new_one_is_complete(exported, capsys,
                                                                       monkeypatch):
    folder, drafter, out = exported
    before = (out / MANIFEST).read_text()

    def broken(*args, **kw):  # the last step: every model file is written by now
        raise bundle_mod.HyflashError("disk full")

    monkeypatch.setattr(bundle_mod, "build_manifest", broken)
    one_line_error(capsys, ["export", "--target", str(folder), "--drafter", str(drafter),
                            "--out", str(out), "--no-progress"], "disk full")
    assert (out / MANIFEST).read_text() == before
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_export_bad_input_is_one_line(exported, capsys, tmp_path):
    folder, drafter, _ = exported
    base = ["export", "--target", str(folder), "--drafter", str(drafter)]
    one_line_error(capsys, base + ["--backend", "executorch", "--quant", "int4", "--out",
                                   str(tmp_path / "b")], "unknown ExecuTorch quantization")
    one_line_error(capsys, base + ["--quant", "fp16", "--out", str(tmp_path / "b")],
                   "unknown ONNX quantization recipe 'fp16': choose one of fp32, int8, int4, "
                   "8da4w")
    one_line_error(capsys, base + ["--backend", "coreml", "--quant", "8da4w", "--out",
                                   str(tmp_path / "b")], "unknown Core ML quantization")
    one_line_error(capsys, base + ["--quant", "int8", "--source-blocks", "requantize", "--out",
                                   str(tmp_path / "b")],
                   "--source-blocks requantize applies to the 4-bit ONNX recipes")
    one_line_error(capsys, base + ["--backend", "executorch", "--quant", "8da4w",
                                   "--source-blocks", "keep", "--out", str(tmp_path / "b")],
                   "--source-blocks applies to --backend onnx")
    keep = tmp_path / "my-notes"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    one_line_error(capsys, base + ["--out", str(keep)], "is not a hyflash bundle")
    assert (keep / "notes.txt").read_text() == "precious"
    one_line_error(capsys, ["export", "--target", str(folder), "--drafter",
                            str(tmp_path / "nothing"), "--out", str(tmp_path / "b")],
                   "no drafter at")
    assert not (tmp_path / "b").exists()


# ------------------------------------------------------------------------ simulate

def test_simulate_reports_acceptance_speed_and_memory(exported, capsys, tmp_path):
    _, _, out = exported
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w3 w14 w15 w9 w26 w5\n---\nw7 w7 w8\n---\n"
                       + " ".join(f"w{i % 40 + 2}" for i in range(30)) + "\n")
    report = tmp_path / "report"
    assert main(["simulate", str(out), "--prompts", str(prompts), "--max-new-tokens", "24",
                 "--threads", "1", "--out", str(report), "--no-progress"]) == 0
    text = capsys.readouterr().out
    for row in ("tau (tokens per verify)", "acceptance by position", "tokens/s plain",
                "speedup", "ms per drafter call", "ms per verify call", "peak RSS",
                "draft-side memory", "fixed state", "commit buffer", "3/3 prompts identical"):
        assert row in text, row
    data = json.loads((report / "report.json").read_text())
    s = data["summary"]
    assert len(data["prompts"]) == 3 and all(p["identical"] for p in data["prompts"])
    assert len(s["acceptance_by_position"]) == 3  # B - 1 positions
    assert s["tau"] >= 1 and s["speedup"] > 0 and s["ms_per_verify_call"] > 0
    assert s["draft_state_fixed_bytes"] == read_bundle(out).manifest.state_bytes
    assert (report / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (report / "report.txt").read_text().startswith("bundle")


def test_simulate_default_prompts_and_sampling(exported, capsys):
    _, _, out = exported
    assert main(["simulate", str(out), "--max-new-tokens", "8", "--temperature", "0.8",
                 "--threads", "1", "--no-progress"]) == 0
    assert "n/a (sampling" in capsys.readouterr().out


@pytest.mark.parametrize("rows", ["auto", "0.9"])
def test_simulate_with_fewer_draft_rows_stays_identical_and_records_the_policy(
        exported, capsys, tmp_path, rows):
    _, _, out = exported
    report = tmp_path / "report"
    assert main(["simulate", str(out), "--max-new-tokens", "24", "--threads", "1",
                 "--draft-rows", rows, "--out", str(report), "--no-progress"]) == 0
    data = json.loads((report / "report.json").read_text())
    assert data["settings"]["draft_rows"] == rows
    assert all(p["identical"] for p in data["prompts"])


# ------------------------------------------------------------------- bad bundles

def damaged(out, tmp_path, how):
    bad = tmp_path / f"bad-{how}"
    shutil.copytree(out, bad)
    manifest = json.loads((bad / MANIFEST).read_text())
    if how == "missing":
        (bad / "drafter.onnx").unlink()
    elif how == "corrupted":
        with open(bad / "model.onnx", "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif how == "newer":
        manifest["format_version"] = 99
    elif how == "edited":
        manifest["drafter"]["config"]["block_size"] = 8
    elif how == "other-target":  # as if assembled from two exports: the hash is right
        manifest["drafter"]["config"]["vocab_size"] = 50
        manifest = seal(manifest)
    (bad / MANIFEST).write_text(json.dumps(manifest))
    return bad


@pytest.mark.parametrize("how,needles", [
    ("missing", ["missing drafter.onnx", "hyflash export"]),
    ("corrupted", ["model.onnx is corrupted", "sha256"]),
    ("newer", ["format version 99", "upgrade hyflash"]),
    ("edited", ["manifest.json was edited after export", "re-export"]),
    ("other-target", ["trained for another target", "vocab size is 50"]),
])
@pytest.mark.parametrize("command", ["inspect", "simulate"])
def test_a_damaged_or_mismatched_bundle_is_one_line_and_exit_2(exported, capsys, tmp_path,
                                                               how, needles, command):
    _, _, out = exported
    bad = damaged(out, tmp_path, how)
    argv = [command, str(bad)] + (["--no-progress"] if command == "simulate" else [])
    one_line_error(capsys, argv, *needles)


def test_simulate_bad_input_is_one_line(exported, capsys, tmp_path):
    _, _, out = exported
    one_line_error(capsys, ["simulate", str(tmp_path)], "no manifest.json")
    one_line_error(capsys, ["simulate", str(out), "--prompts", str(tmp_path / "none.txt")],
                   "no prompts file")
    long = tmp_path / "long.txt"
    long.write_text(" ".join(["w5"] * 200))
    one_line_error(capsys, ["simulate", str(out), "--prompts", str(long), "--threads", "1"],
                   "prompt 1 has 200 tokens")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"ok"\n{broken\n')
    one_line_error(capsys, ["simulate", str(out), "--prompts", str(bad)], "line 2 is not JSON")


# ------------------------------------------------------------------------ generate

def generated_text(capsys, argv) -> str:
    assert main(["generate", "--prompt", "w3 w14 w15 w9 w2", "--max-new-tokens", "24",
                 *argv]) == 0
    out = capsys.readouterr().out
    return out.split("\n\n")[0], out


def test_generate_runs_a_drafter_or_a_bundle_and_stays_lossless(exported, capsys):
    folder, drafter, bundle = exported
    plain, _ = generated_text(capsys, ["--target", str(folder), "--no-draft"])
    drafted, out = generated_text(capsys, ["--target", str(folder), "--drafter", str(drafter)])
    assert drafted == plain and "acceptance by position" in out
    onnx_plain, _ = generated_text(capsys, ["--bundle", str(bundle), "--no-draft"])
    onnx_drafted, out = generated_text(capsys, ["--bundle", str(bundle)])
    assert onnx_drafted == onnx_plain and "tau" in out


def test_generate_bundle_excludes_target_and_drafter(exported, capsys):
    folder, _, bundle = exported
    one_line_error(capsys, ["generate", "--bundle", str(bundle), "--target", str(folder),
                            "--prompt", "w1"], "--bundle already fixes the target")



# ------------------------------------------------- bad input, refused before the work

def refuse_to_export(monkeypatch):
    def export(*args, **kw):
        raise AssertionError("export ran: the pair should have been refused first")

    monkeypatch.setattr(bundle_mod, "export_onnx_bundle", export)


def test_export_refuses_a_context_below_the_drafters_window_before_exporting(
        exported, capsys, tmp_path, monkeypatch):
    folder, drafter, _ = exported  # window 16, block 4
    refuse_to_export(monkeypatch)
    out = tmp_path / "b"
    one_line_error(capsys, ["export", "--target", str(folder), "--drafter", str(drafter),
                            "--out", str(out), "--max-seq-len", "19"],
                   "window (16) and one block (4) need 20; pass --max-seq-len >= 20")
    one_line_error(capsys, ["export", "--target", str(folder), "--drafter", str(drafter),
                            "--out", str(out), "--max-seq-len", "100000"],
                   "100000 tokens is above the 128 the model supports")
    assert not out.exists()


def test_export_refuses_a_drafter_trained_for_a_target_of_another_depth(exported, capsys,
                                                                        tmp_path, monkeypatch):
    """Same vocabulary and hidden size, so the drafter's features would fit in size, but
    they would come from other layers: export must not re-tap the target to suit it."""
    import transformers

    folder, drafter, _ = exported  # a 3-layer target: taps [0, 1, 2]
    deeper = tmp_path / "deeper"
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.num_hidden_layers = 5  # taps [1, 2, 3]
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(deeper)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(folder / name, deeper / name)
    refuse_to_export(monkeypatch)
    one_line_error(capsys, ["export", "--target", str(deeper), "--drafter", str(drafter),
                            "--out", str(tmp_path / "b")],
                   "trained for another target: its tap layers are [0, 1, 2], this 5-layer "
                   "target's are [1, 2, 3]")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("name,content,needle", [
    ("latin1.txt", "café déjà vu\n".encode("latin-1"), "is not UTF-8 text"),
    ("binary.bin", bytes(range(256)) * 4, "is a binary file, not prompts"),
    ("null.jsonl", b'{"prompt": "w1 w2"}\nnull\n', "line 2 holds null, not a prompt"),
    ("nofield.jsonl", b'{"prompt": "w1"}\n{"text": "w2"}\n', 'line 2 has no "prompt" field'),
    ("number.jsonl", b'"w1"\n5\n', "line 2 holds 5, not a prompt"),
    ("blank.jsonl", b'{"prompt": "  "}\n', "line 1 holds an empty prompt"),
    ("empty.txt", b"", "holds no prompts (it is empty)"),
    ("empty.jsonl", b"\n\n", "holds no prompts (it is empty)"),
    ("dashes.txt", b"\n---\n\n---\n", "holds no prompts: write at least one"),
])
def test_simulate_a_bad_prompts_file_is_one_line(exported, capsys, tmp_path, name, content,
                                                 needle):
    _, _, out = exported
    prompts = tmp_path / name
    prompts.write_bytes(content)
    one_line_error(capsys, ["simulate", str(out), "--prompts", str(prompts), "--no-progress"],
                   str(prompts), needle)


def test_simulate_refuses_flags_that_do_not_apply_and_an_out_that_is_a_file(exported, capsys,
                                                                           tmp_path):
    _, _, out = exported
    one_line_error(capsys, ["simulate", str(out), "--seed", "3"],
                   "--seed applies to sampling, and --temperature 0 decodes greedily")
    mine = tmp_path / "notes.txt"
    mine.write_text("precious")
    one_line_error(capsys, ["simulate", str(out), "--out", str(mine)],
                   f"--out {mine} is a file: pass a folder for the report")
    assert mine.read_text() == "precious"


def test_simulate_caps_absurd_threads_at_the_cores_and_runs(exported, capsys, tmp_path):
    from hyflash.argtypes import machine_cores

    _, _, out = exported
    prompts = tmp_path / "p.txt"
    prompts.write_text("w3 w14 w15 w9\n")
    assert main(["simulate", str(out), "--prompts", str(prompts), "--max-new-tokens", "4",
                 "--threads", "1000", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"note: --threads 1000 capped at {machine_cores()}" in captured.err
    assert "1/1 prompts identical" in captured.out


def test_the_bundle_runs_the_optimum_generate_idiom(exported):
    """The source tokenizer returns token_type_ids (a bare PreTrainedTokenizerFast does);
    the bundle's copy returns only what its target graph takes."""
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    folder, _, out = exported
    assert "token_type_ids" in AutoTokenizer.from_pretrained(folder)("w1 w2")
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("w3 w14 w15", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    ids = ORTModelForCausalLM.from_pretrained(out).generate(**inputs, max_new_tokens=4,
                                                             do_sample=False)
    assert ids.shape[1] == 3 + 4
