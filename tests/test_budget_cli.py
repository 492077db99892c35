"""`hyflash budget` on the command line: every source kind, the verdicts, --json, --explain,
--sweep-context, `simulate --device`, the tau simulate records, and bad input as one line."""

import json

import pytest
from cli_checks import exit_2
from test_gguf import bpe, save_hf, write_gguf  # noqa: F401 (bpe is a fixture)

from hyflash.cli import main


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path / "cache"))


def budget_json(capsys, *argv) -> dict:
    assert main(["budget", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_preset_gets_every_term_a_verdict_per_device_and_a_projection(capsys):
    out = budget_json(capsys, "llama-3.2-1b", "--quant", "int4", "--context", "4096",
                      "--device", "pixel-8", "--device", "iphone-15-pro", "--tau", "3")
    keys = [t["key"] for t in out["terms"]]
    assert keys == ["target.layers", "target.embedding", "target.lm_head", "target.kv",
                    "drafter.weights", "drafter.head", "drafter.state", "activations",
                    "runtime", "load"]
    by_key = {t["key"]: t["resident"] for t in out["terms"]}
    calls_or_load = max(by_key.pop("load"), by_key.pop("activations"))
    assert out["resident_bytes"] == sum(by_key.values()) + calls_or_load
    phones = {d["device"]: d for d in out["devices"]}
    assert phones["iphone-15-pro"]["fits"] == (out["resident_bytes"] <= 3 * 2 ** 30)
    assert phones["pixel-8"]["projection"] is None  # no published bandwidth: no speed
    proj = phones["iphone-15-pro"]["projection"]
    assert proj["spec_tok_s"] > proj["plain_tok_s"] > 0 and proj["tau"] == 3
    variants = out["variants_resident_bytes"]
    assert variants["no drafter"] < variants["HyFlash drafter"] < variants["full-context drafter"]


def test_the_text_report_has_the_table_the_verdicts_and_says_it_is_a_projection(capsys):
    assert main(["budget", "smollm2-135m", "--device", "raspberry-pi-5-8gb"]) == 0
    text = capsys.readouterr().out
    for needle in ("target KV cache", "drafter state", "total", "full-context drafter",
                   "Raspberry Pi 5 (8 GB)", "fits", "projection", "needs tau"):
        assert needle in text, needle


def test_explain_prints_the_formulas_and_the_calibration(capsys):
    assert main(["budget", "qwen3-0.6b", "--explain", "--device", "oneplus-12"]) == 0
    text = capsys.readouterr().out
    assert "2 x 28 layers x 8 kv heads x 128" in text  # the KV cache formula, with numbers
    assert "bandwidth x efficiency" in text and "OnePlus" in text and "50.2" in text


def test_a_model_hyflash_cannot_export_is_sized_with_its_approximations_said(capsys):
    assert main(["budget", "gemma-3-1b", "--device", "oneplus-12"]) == 0
    text = capsys.readouterr().out
    assert "approximated:" in text and "sliding window of 512" in text


def test_sweep_context_writes_a_png(capsys, tmp_path):
    assert main(["budget", "smollm2-360m", "--sweep-context", "--out", str(tmp_path),
                 "--device", "iphone-12-mini"]) == 0
    png = tmp_path / "budget_smollm2-360m_context.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in capsys.readouterr().out


def test_a_bundle_is_sized_from_its_manifest(capsys, onnx_bundles):
    out = budget_json(capsys, str(onnx_bundles[2]["int4"]), "--device", "oneplus-12")
    assert out["recipe"]["name"] == "int4" and out["context"] == 128
    assert out["source"]["kind"] == "bundle"
    # the manifest's own state bytes: the drafter state term is state in + out + buffer
    state = next(t for t in out["terms"] if t["key"] == "drafter.state")
    assert state["resident"] >= 2 * out["source"]["state_bytes"]


def test_a_model_folder_and_its_config_json_give_the_same_budget(capsys, model_folder):
    a = budget_json(capsys, str(model_folder), "--context", "64", "--drafter", "none")
    b = budget_json(capsys, str(model_folder / "config.json"), "--context", "64",
                    "--drafter", "none")
    assert a["resident_bytes"] == b["resident_bytes"] and a["drafter"] is None


def test_a_gguf_is_sized_from_its_metadata_without_converting_it(capsys, tmp_path, bpe):  # noqa: F811
    model = save_hf(tmp_path / "hf", bpe)
    gguf_file = write_gguf(tmp_path / "m.gguf", model, bpe)
    folder = tmp_path / "hf"
    flags = ("--context", "64", "--drafter", "none")
    from_gguf = budget_json(capsys, str(gguf_file), *flags)
    from_folder = budget_json(capsys, str(folder), *flags)
    assert from_gguf["target"] | {"name": "", "max_context": 0} == \
        from_folder["target"] | {"name": "", "max_context": 0}
    assert not (tmp_path / "cache" / "gguf").exists()  # nothing was dequantized


def test_simulate_shows_the_phone_next_to_the_desktop_and_budget_reuses_its_tau(
        capsys, onnx_bundles):
    bundle = str(onnx_bundles[2]["hyflash"])
    assert main(["simulate", bundle, "--max-new-tokens", "8", "--device", "oneplus-12",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "OnePlus 12 (12 GB) (projection): tokens/s plain | drafting" in text
    assert "OnePlus 12 (12 GB) (projection): memory" in text
    out = budget_json(capsys, bundle, "--device", "oneplus-12")
    assert out["projection"]["tau"] == out["source"]["tau_record"]["tau"] > 1
    assert out["devices"][0]["projection"]["spec_tok_s"] is not None


# --------------------------------------------------------------- bad input

def test_listing_without_a_source_names_presets_and_devices(capsys):
    assert main(["budget"]) == 0
    text = capsys.readouterr().out
    assert "llama-3.2-1b" in text and "iphone-15-pro" in text


def bad_config(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    return str(folder)


def bad_devices(tmp_path):
    f = tmp_path / "devices.json"
    f.write_text(json.dumps({"format": 1, "devices": {"mine": {"name": "Mine", "ram_gib": 4}}}))
    return str(f)


@pytest.mark.parametrize("argv,needles", [
    (["nosuch-model"], ["'nosuch-model' is no preset", "llama-3.2-1b"]),
    (["smollm2-135m", "--device", "nokia-3310"], ["unknown device 'nokia-3310'", "--devices"]),
    (["BROKEN"], ["lacks hidden_size", "restore it"]),
    (["smollm2-135m", "--context", "0"], ["--context: must be >= 1"]),
    (["smollm2-135m", "--context", "-5"], ["--context: must be >= 1"]),
    (["smollm2-135m", "--context", "100000"], ["above the 8192", "--context <= 8192"]),
    (["smollm2-135m", "--context", "40"], ["cannot hold the drafter's window", ">= 72"]),
    (["smollm2-135m", "--measure"], ["--measure runs an exported bundle"]),
    (["smollm2-135m", "--tau", "0.5"], ["--tau: must be >= 1"]),
    (["smollm2-135m", "--tau-full", "2"], ["--tau-full needs --tau"]),
    (["smollm2-135m", "--prompt-tokens", "9"], ["--prompt-tokens sizes the run of --measure"]),
    (["smollm2-135m", "--quant", "int4", "--group-size", "64"], ["--group-size applies to"]),
    (["smollm2-135m", "--quant", "8da4w", "--backend", "onnx", "--group-size", "64"],
     ["--group-size applies to --backend executorch", "blocks of 32"]),
    (["smollm2-135m", "--draft-vocab", "60000"], ["not below the vocabulary (49152)"]),
    (["smollm2-135m", "--devices", "DEVICES"], ["app_limit_gib must be a number > 0"]),
    (["smollm2-135m", "--drafter", "/no/such/drafter"], ["no drafter at /no/such/drafter"]),
])
def test_bad_input_is_one_line(capsys, tmp_path, argv, needles):
    argv = [bad_config(tmp_path) if a == "BROKEN" else bad_devices(tmp_path) if a == "DEVICES"
            else a for a in argv]
    exit_2(capsys, ["budget", *argv], *needles)


def test_a_bundle_refuses_flags_it_fixes(capsys, onnx_bundles):
    exit_2(capsys, ["budget", str(onnx_bundles[2]["hyflash"]), "--context", "64",
                    "--quant", "int4"], "drop --context and --quant")


def test_simulate_refuses_an_unknown_device_before_loading_anything(capsys, tmp_path):
    exit_2(capsys, ["simulate", str(tmp_path / "no-bundle"), "--device", "nokia-3310"],
           "unknown device 'nokia-3310'")


def test_budget_reads_bundles_without_importing_the_exporter(onnx_bundles):
    """A phone-side tool: sizing a preset or a bundle loads no hyflash.export module."""
    import subprocess
    import sys
    from pathlib import Path

    # hyflash.cli builds every command's parser (export's too), so this runs budget alone
    code = ("import argparse, sys, contextlib, io\n"
            "from hyflash.budget import command\n"
            "p = argparse.ArgumentParser()\n"
            "command.add_arguments(p)\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert command.run(p.parse_args([{str(onnx_bundles[2]['int4'])!r}])) == 0\n"
            "    assert command.run(p.parse_args(['gemma-3-1b', '--explain'])) == 0\n"
            "bad = [m for m in sys.modules if m.startswith('hyflash.export')]\n"
            "assert not bad, bad\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
