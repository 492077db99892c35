"""`hyflash demo` and `hyflash bench --quick` on the pocket pair, end to end (one ONNX int4
export, ~12 s, shared by every test here through one work folder)."""

import json
import shutil

import pytest
from cli_checks import exit_2

from hyflash.cli import main

pytest.importorskip("onnxruntime")

DEMO = ["demo", "--backends", "onnx", "--prompts", "1", "--max-new-tokens", "8",
        "--no-progress"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-work")


@pytest.fixture(scope="module")
def demo_runs(work, tmp_path_factory):
    """Two demo runs on the same work folder: the first exports, the second reuses."""
    import contextlib
    import io

    outs = []
    for i in range(2):
        report = tmp_path_factory.mktemp(f"demo-{i}")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*DEMO, "--work", str(work), "--out", str(report)]) == 0
        outs.append((buf.getvalue(), report))
    return outs


def test_demo_exports_simulates_budgets_and_writes_its_report(demo_runs):
    text, report = demo_runs[0]
    for needle in ("[1/3] export", "exported (no bundle yet)", "[2/3] simulate",
                   "identical to plain: yes", "[3/3] memory budget", "runtime library",
                   "Samsung Galaxy S25 (12 GB) (projection)", f"report: {report}/"):
        assert needle in text, needle
    data = json.loads((report / "demo.json").read_text())
    r = data["results"]["onnx"]
    assert r["lossless"] == "1/1 prompts identical to plain decoding"
    assert r["tau"] >= 1 and r["desktop_plain"] > 0 and r["phone_plain"] > 0 and r["fits"]
    assert data["bundles"]["onnx"]["reused"] is False
    for name in ("summary.md", "demo.png", "onnx/report.json", "onnx/report.png",
                 "onnx/budget.txt"):
        assert (report / name).stat().st_size > 0, name
    assert "| onnx int4 |" in (report / "summary.md").read_text()


def test_a_second_demo_run_reuses_the_still_valid_export(demo_runs):
    text, report = demo_runs[1]
    assert "reused (files and inputs unchanged)" in text and "exporting" not in text
    assert json.loads((report / "demo.json").read_text())["bundles"]["onnx"]["reused"] is True


def test_an_export_is_not_reused_once_its_inputs_or_files_change(demo_runs, work, tmp_path):
    from dataclasses import replace

    from hyflash.bench import demo, exports

    spec = exports.ExportSpec("pocket", "pocket", *demo.BACKENDS["onnx"], demo.CONTEXT)
    want = exports.identity(spec)
    folder = work / spec.name
    assert exports.why_not_reusable(folder, want) is None
    assert exports.why_not_reusable(folder, exports.identity(replace(
        spec, drafter="pocket-full"))) == "its drafter files changed"
    assert exports.why_not_reusable(folder, exports.identity(replace(
        spec, max_seq_len=512))) == "its options changed"
    assert exports.why_not_reusable(folder, {**want, "exporter_code": "0" * 64}) \
        == "its exporter code changed"
    copy = tmp_path / spec.name
    shutil.copytree(folder, copy)
    shutil.copy(exports.stamp_path(folder), exports.stamp_path(copy))
    graph = copy / "drafter.onnx"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    assert "no longer checks out" in exports.why_not_reusable(copy, want)
    exports.stamp_path(copy).unlink()
    assert exports.why_not_reusable(copy, want) == "no record of its inputs"


@pytest.fixture(scope="module")
def quick(demo_runs, work, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    assert main(["bench", "--quick", "--runs", "1", "--work", str(work), "--out", str(out),
                 "--no-progress"]) == 0
    return out, json.loads((out / "bench-quick.json").read_text())


def test_bench_quick_writes_the_report_schema(quick):
    out, r = quick
    assert r["suite"] == "quick" and r["dry_run"] is False and r["runs"] == 1
    assert {g["goal"] for g in r["goals"]} == {
        "our fastest configuration >= 2x the best peer's tokens/s",
        "identical greedy output to plain decoding in every speculative configuration",
        "speculative decoding >= 2x plain decoding of the same export (decode phase)",
        "HyFlash tau >= full-context tau at every context >= 1024"}
    assert all(isinstance(g["text"], str) and g["text"] for g in r["goals"])
    speed = r["speed"]
    assert speed["exports"]["onnx-auto-int4"]["reused"] is True  # the demo's export
    modes = {(row["system"], row["mode"]) for row in speed["rows"]}
    ours = ("plain", "speculative", "speculative+auto-rows", "lookup", "speculative+lookup",
            "adaptive")
    assert modes == {*(("ours ORT lean int4", m) for m in ours),
                     ("transformers generate", "plain"), ("transformers generate", "lookup")}
    for row in speed["rows"]:
        assert row["tokens_per_s"] > 0 and row["peak_rss_mib"] > 0 and row["runs"] == 1
        if row["group"] == "ours":  # the decode phase alone is faster than with the prefill
            assert row["decode_tokens_per_s"] > row["tokens_per_s"]
        else:
            assert row["decode_tokens_per_s"] is None
        assert [len(t) for t in row["tokens"]] == [r["new_tokens"]] * 2
    assert speed["skipped"] and all(s["reason"] for s in speed["skipped"])
    acc = r["acceptance"]["rows"]
    assert {(a["drafter"], a["temperature"]) for a in acc} == {
        ("hyflash", 0.0), ("hyflash", 1.0), ("full-context", 0.0), ("full-context", 1.0)}
    assert all(1 <= a["tau"] <= 8 and len(a["acceptance"]) == 7 for a in acc)
    mem = {(m["drafter"], m["layout"]): m["bytes"] for m in r["memory"]["rows"]}
    assert len(set(mem["hyflash", "kv"].values())) == 1  # fixed, whatever the context
    assert mem["full-context", "kv"]["2048"] > 4 * mem["full-context", "kv"]["256"]
    md = (out / "bench-quick.md").read_text()
    assert "## Goals" in md and "## Speed" in md and "Not run here" in md
    assert (out / "bench-quick.png").stat().st_size > 0


def test_every_row_claimed_identical_really_is(quick):
    from hyflash.runtime import SpeculativeEngine
    from hyflash.runtime.onnx_backend import load_onnx_pair

    _, r = quick
    rows = {f"{row['system']} / {row['mode']}": row for row in r["speed"]["rows"]}
    claims = [row for row in rows.values() if row.get("identical")]
    assert len(claims) == 6  # ours: 5 besides plain; transformers lookup
    for row in claims:
        assert row["tokens"] == rows[row["identical_to"]]["tokens"]
    # and against plain decoding run here, independently of the bench's own workers
    _, target, _ = load_onnx_pair(r["speed"]["exports"]["onnx-auto-int4"]["folder"], threads=1)
    plain = SpeculativeEngine(target)
    for mode in ("speculative", "speculative+auto-rows", "lookup", "speculative+lookup",
                 "adaptive"):
        spec = rows[f"ours ORT lean int4 / {mode}"]["tokens"]
        for ids, tokens in zip(r["speed"]["prompt_ids"], spec, strict=True):
            assert plain.generate(ids, max_new_tokens=r["new_tokens"]).tokens == tokens


@pytest.mark.parametrize("argv,needle", [
    (["demo", "--backends", "coreml"], "--backends takes onnx and executorch, not 'coreml'"),
    (["demo", "--device", "nokia-3310"], "unknown device 'nokia-3310'"),
    (["bench", "--parts", "speed,colour"], "--parts takes speed, acceptance, memory"),
    (["bench", "--suite", "smollm2"], "--suite smollm2 needs --drafter DIR"),
    (["bench", "--quick", "--suite", "smollm2"], "--quick is its own suite"),
    (["bench", "--quick", "--configs", "onnx-lean-fp32"],
     "--configs: onnx-lean-fp32 is not one of this suite's: onnx-auto-int4"),
    (["bench", "--script", "no_such_benchmark"], "no benchmark script 'no_such_benchmark'"),
    (["bench", "--", "--repeats", "3"], "arguments after -- (--repeats 3) go to a --script"),
])
def test_bad_demo_and_bench_input_is_one_line(capsys, argv, needle):
    exit_2(capsys, argv, needle)


def test_bench_lists_its_suites_and_every_benchmark_script(capsys):
    from pathlib import Path

    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2" in out
    for script in (Path(__file__).parents[1] / "benchmarks").glob("*.py"):
        if "__main__" in script.read_text():
            assert f"  {script.stem} " in out, script.stem


def test_the_pocket_model_written_as_gguf_reads_back_to_its_own_logits(tmp_path, model_folder):
    """llama.cpp's converter refuses the pocket tokenizer, so the bench writes the GGUF
    llama.cpp runs; the writer itself checks the logits read back (1e-4)."""
    from hyflash.bench.gguf_writer import write_llama_gguf
    from hyflash.errors import HyflashError
    from hyflash.models import pocket

    out = write_llama_gguf(pocket.path(), tmp_path / "pocket.gguf")
    assert out.stat().st_size > 20e6 and not (tmp_path / "pocket.tmp").exists()
    with pytest.raises(HyflashError, match="only a byte-level BPE tokenizer is written"):
        write_llama_gguf(model_folder, tmp_path / "tiny.gguf")


def test_the_peer_goal_is_not_met_when_peers_did_not_run():
    from hyflash.bench.report import goals

    rows = [{"group": "ours", "system": "ours", "mode": "lookup", "tokens_per_s": 80.0},
            {"group": "peer", "system": "optimum", "mode": "plain", "tokens_per_s": 30.0}]
    result = {"suite": "smollm2", "dry_run": False, "speed": {"rows": rows, "skipped": []}}
    assert goals(result)[0]["met"] is True
    result["speed"]["skipped"] = [{"label": "onnxruntime-genai int4", "group": "peer",
                                   "reason": "no venv"}]
    goal = goals(result)[0]
    assert goal["met"] is None and "onnxruntime-genai int4" in goal["text"]
    assert goal["text"].startswith("Met against the peers that ran only")


def test_the_decode_rate_counts_the_tokens_after_the_prefill_over_the_time_after_it():
    from hyflash.bench.runs import decode_rate

    mode = {"tokens": [[1] * 10, [2] * 12], "seconds": [2.0, 3.0], "prefill_seconds": [1.0, 0.5]}
    assert decode_rate(mode, 10) == 18 / 3.5  # 9 + 9 tokens (12 cut to 10) after 1 + 2.5 s
    assert decode_rate({"tokens": [[1] * 4], "seconds": [1.0]}, 4) is None  # a peer's mode
