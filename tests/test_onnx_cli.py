"""`hyflash export`, `inspect` and `simulate` on ONNX bundles: the bundle is written
atomically, inspect prints it, simulate reports what the phone would see, and a damaged
or mismatched bundle gets one line and exit status 2."""

import json
import shutil

import pytest
from onnx_pairs import tiny_pair

import hyflash.export.bundle as bundle_mod
from hyflash.cli import main
from hyflash.export.manifest import MANIFEST


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
    assert manifest["quantization"]["target"]["tool"].endswith("MatMulNBitsQuantizer")
    assert set(manifest["tokenizer"]["files"]) >= {"tokenizer.json"}
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_inspect_prints_a_bundle_and_still_describes_model_folders(exported, capsys):
    folder, _, out = exported
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in ("format 1", "int4", "window cache kv", "window_k [1, 16, 32] float32",
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
    one_line_error(capsys, base + ["--backend", "executorch", "--out", str(tmp_path / "b")],
                   "not implemented yet")
    one_line_error(capsys, base + ["--backend", "coreml", "--out", str(tmp_path / "b")],
                   "not implemented yet")
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
                "draft-side state", "3/3 prompts identical"):
        assert row in text, row
    data = json.loads((report / "report.json").read_text())
    s = data["summary"]
    assert len(data["prompts"]) == 3 and all(p["identical"] for p in data["prompts"])
    assert len(s["acceptance_by_position"]) == 3  # B - 1 positions
    assert s["tau"] >= 1 and s["speedup"] > 0 and s["ms_per_verify_call"] > 0
    assert s["draft_state_fixed_bytes"] == json.loads((out / MANIFEST).read_text())[
        "state_bytes"]
    assert (report / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (report / "report.txt").read_text().startswith("bundle")


def test_simulate_default_prompts_and_sampling(exported, capsys):
    _, _, out = exported
    assert main(["simulate", str(out), "--max-new-tokens", "8", "--temperature", "0.8",
                 "--threads", "1", "--no-progress"]) == 0
    assert "n/a (sampling" in capsys.readouterr().out


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
    elif how == "other-target":
        manifest["drafter"]["config"]["vocab_size"] = 50
    (bad / MANIFEST).write_text(json.dumps(manifest))
    return bad


@pytest.mark.parametrize("how,needles", [
    ("missing", ["missing drafter.onnx", "hyflash export"]),
    ("corrupted", ["model.onnx is corrupted", "sha256"]),
    ("newer", ["format version 99", "upgrade hyflash"]),
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
                            "--prompt", "w1"], "--bundle already holds")

