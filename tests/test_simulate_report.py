"""The simulate report: each prompt's stop reason is shown, prompts that stop after one
token stay out of the speedup (and the report says so), and the draft-side memory says
what it counts, in the same numbers `hyflash inspect` prints."""

import json
from pathlib import Path
from types import SimpleNamespace

from hyflash.bundle import Bundle, parse_manifest
from hyflash.bundle.describe import describe
from hyflash.runtime.stats import GenerationStats
from hyflash.simulate.report import Report

DATA = Path(__file__).parent / "data"
MANIFEST = parse_manifest(json.loads((DATA / "manifest_v1_kv.json").read_text()))
ARGS = SimpleNamespace(max_new_tokens=24, temperature=0.0, seed=0, threads=1)


def run(new: int, seconds: float, stop: str, rounds: int = 0) -> SimpleNamespace:
    stats = GenerationStats(block_size=4, prompt_tokens=10, new_tokens=new, rounds=rounds,
                            accepted_drafts=rounds, total_s=seconds, stop_reason=stop,
                            position_proposed=[rounds] * 3, position_accepted=[rounds, 0, 0])
    return SimpleNamespace(tokens=list(range(new)), stats=stats)


def report(tmp_path=None) -> Report:
    r = Report(Bundle(Path("bundles/tiny"), MANIFEST), ARGS, 3)
    buffer = 4 * 96 * 4  # step rows x feature size x fp32, as OnnxDrafter counts it
    r.add(0, run(24, 1.0, "max_new_tokens"), run(24, 0.5, "max_new_tokens", 12), {},
          MANIFEST.state_bytes + buffer, 1000)
    r.add(1, run(1, 0.01, "eos"), run(1, 0.001, "eos"), {}, MANIFEST.state_bytes + buffer, 10)
    r.add(2, run(10, 0.5, "eos"), run(10, 0.5, "eos", 5), {}, MANIFEST.state_bytes + buffer, 10)
    r.finish()
    return r


def test_a_prompt_that_stops_after_one_token_is_shown_but_left_out_of_the_speedup(tmp_path):
    r = report()
    s = r.summary
    assert s["speedup"] == (34 / 1.0) / (34 / 1.5)  # prompts 1 and 3 only
    assert s["speedup_prompts"] == 2 and s["left_out_of_speedup"] == [2]
    assert [row["stop_reason"] for row in r.rows] == ["max_new_tokens", "eos", "eos"]
    assert [row["in_speedup"] for row in r.rows] == [True, False, True]
    assert r.rows[1]["speedup"] is None
    text = r.table()
    assert "over 2 of 3 prompts; prompt 2 stopped after < 2 new tokens, left out" in text
    lines = {line.split()[0]: line for line in text.splitlines()[-4:]}
    assert "eos* -" in lines["2"] and "eos*" in lines["3"] and "max_new_tokens" in lines["1"]
    assert "stopped on EOS before --max-new-tokens" in text
    files = r.write(tmp_path / "report")
    data = json.loads(files[0].read_text())
    assert [p["stop_reason"] for p in data["prompts"]] == ["max_new_tokens", "eos", "eos"]
    assert data["summary"]["left_out_of_speedup"] == [2]
    assert files[2].read_bytes()[:4] == b"\x89PNG"


def test_simulate_and_inspect_say_what_their_state_size_counts():
    r = report()
    fixed = MANIFEST.state_bytes / 1024
    buffer = 4 * 96 * 4 / 1024
    assert (f"{fixed + buffer:.1f} KiB = {fixed:.1f} KiB fixed state (as `hyflash inspect` "
            f"shows) + {buffer:.1f} KiB commit buffer") in r.table()
    shown = describe(Bundle(Path("bundles/tiny"), MANIFEST))
    assert f"{fixed:.1f} KiB ({MANIFEST.state_bytes} B) fixed state" in shown
    assert f"{buffer:.1f} KiB more while running" in shown
