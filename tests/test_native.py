"""The C++ runtime (runtime_native/, `hyflash-run`) against the Python engine on the SAME
ExecuTorch program: greedy tokens, tau, per-position acceptance, call counts and the stop
reason must be equal (short prompts, a prompt longer than the feature ring and the drafter's
step rows, which runs the chunked prefill and the commit-only method, up to a full
context, where the drafts per round shrink), plain decoding too. Bad input is one line on
stderr and exit status 2.

The binary is built with the Makefile's `native` target (as `make test` does; a no-op when
nothing changed) by the interpreter running the tests, so it links that interpreter's
executorch wheel; the pocket bundle is conftest's, shared with test_executorch.py.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hyflash.models.tokenizer import load_tokenizer
from hyflash.runtime import SpeculativeEngine

pytest.importorskip("executorch")
ROOT = Path(__file__).resolve().parents[1]
ANDROID = ROOT / "android_demo"
PROMPTS = ["def read_config(path):\n",
           "import os\nimport sys\n\nclass Parser:\n    def __init__(self",
           "for i in range(10):\n"]


@pytest.fixture(scope="session")
def hyflash_run() -> Path:
    if shutil.which("cmake") is None or shutil.which("make") is None:
        pytest.skip("cmake and make are needed to build runtime_native/")
    # STAMP= : build only; never reinstall packages from inside a test run
    done = subprocess.run(["make", "-s", "native", "STAMP=", f"PY={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return ROOT / "build" / "native" / "hyflash-run"


def run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYFLASH_ET_LOG"}
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def native(binary: Path, bundle: Path, ids: list[int], max_new: int, *flags: str) -> dict:
    done = run(binary, bundle, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
               max_new, "--threads", 1, "--json", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def same_run(out: dict, want) -> None:
    """The C++ run (JSON) equals the Python Generation token for token, stat for stat."""
    s, w = out["stats"], want.stats
    assert out["tokens"] == want.tokens
    assert s["stop_reason"] == w.stop_reason
    assert (s["rounds"], s["target_calls"], s["drafter_calls"], s["accepted_drafts"],
            s["dropped_draft_rows"]) == (w.rounds, w.target_calls, w.drafter_calls,
                                         w.accepted_drafts, w.dropped_draft_rows)
    assert (s["position_proposed"], s["position_accepted"]) == (w.position_proposed,
                                                                 w.position_accepted)
    assert s["tau"] == pytest.approx(w.tau, abs=1e-12)


@pytest.fixture(scope="module")
def python_pair(fp32_bundle):
    from hyflash.runtime.executorch_backend import load_executorch_pair

    bundle, target, drafter = load_executorch_pair(fp32_bundle, threads=1)
    return bundle, target, drafter, list(bundle.manifest.target.config.eos_token_ids)


def test_native_greedy_tokens_tau_and_acceptance_equal_the_python_engines(
        hyflash_run, fp32_bundle, python_pair):
    _, target, drafter, eos = python_pair
    tok = load_tokenizer(fp32_bundle)
    long_prompt = (tok(PROMPTS[1]).input_ids * 4)[:90]  # > 64 ring rows, up to the context
    cases = [(tok(p).input_ids, 40) for p in PROMPTS] + [(long_prompt, 64)]
    taus = []
    for ids, max_new in cases:
        want = SpeculativeEngine(target, drafter).generate(ids, max_new_tokens=max_new,
                                                           eos_ids=eos)
        out = native(hyflash_run, fp32_bundle, ids, max_new)
        same_run(out, want)
        taus.append(out["stats"]["tau"])
    assert out["stats"]["stop_reason"] == "context_full"  # the long prompt ran to the end
    assert max(taus) > 1.5  # drafts were accepted and rejected: rollbacks happened


def test_native_plain_decoding_equals_the_python_engines(hyflash_run, fp32_bundle, python_pair):
    _, target, _, eos = python_pair
    ids = load_tokenizer(fp32_bundle)(PROMPTS[0]).input_ids
    want = SpeculativeEngine(target).generate(ids, max_new_tokens=24, eos_ids=eos)
    out = native(hyflash_run, fp32_bundle, ids, 24, "--no-draft")
    same_run(out, want)
    assert out["stats"]["tau"] == 1.0 and out["stats"]["drafter_calls"] == 0


@pytest.mark.parametrize("with_drafter", [True, False], ids=["lookup+drafter", "lookup-only"])
def test_native_context_lookup_equals_the_python_engines(hyflash_run, fp32_bundle, python_pair,
                                                         with_drafter):
    """--lookup copies drafts from the context as runtime/lookup.py does: same tokens, same
    rounds drafted by lookup, same acceptance (the prompt repeats, so copies are found)."""
    from hyflash.runtime.lookup import ContextLookup

    _, target, drafter, eos = python_pair
    ids = (load_tokenizer(fp32_bundle)(PROMPTS[1]).input_ids * 3)[:60]
    lookup = ContextLookup(block_size=drafter.block_size)
    want = SpeculativeEngine(target, drafter if with_drafter else None, lookup).generate(
        ids, max_new_tokens=40, eos_ids=eos)
    out = native(hyflash_run, fp32_bundle, ids, 40, "--lookup",
                 *([] if with_drafter else ["--no-draft"]))
    same_run(out, want)
    assert out["stats"]["lookup_rounds"] == want.stats.lookup_rounds > 0
    assert out["stats"]["block_size"] == drafter.block_size


def test_native_adaptive_gate_is_lossless_and_accounts_for_every_round(hyflash_run,
                                                                      fp32_bundle):
    """--adaptive picks lookup, drafter or a plain decode per round by measured rate: the
    tokens stay plain decoding's, and every round is one of the three."""
    ids = load_tokenizer(fp32_bundle)(PROMPTS[1]).input_ids * 2
    plain = native(hyflash_run, fp32_bundle, ids, 48, "--no-draft", "--ignore-eos")
    out = native(hyflash_run, fp32_bundle, ids, 48, "--lookup", "--adaptive", "--ignore-eos",
                 "--repeat", "3")  # the CLI checks the three runs decode the same tokens
    assert out["tokens"] == plain["tokens"]
    for s in out["runs"]:
        assert s["lookup_rounds"] + s["plain_rounds"] + s["drafter_calls"] == s["rounds"]
    first = out["runs"][0]  # the gate's warm-up tries each proposer; later runs learned
    assert min(first["lookup_rounds"], first["plain_rounds"], first["drafter_calls"]) > 0


def test_native_draft_rows_cutoff_equals_the_python_engines(hyflash_run, fp32_bundle,
                                                           python_pair):
    """--draft-rows P keeps the rows runtime/draft_rows.py's Cutoff keeps: same tokens, same
    rows proposed and left out, same acceptance (a cutoff depends on nothing measured)."""
    from hyflash.runtime.draft_rows import Cutoff

    _, target, drafter, eos = python_pair
    ids = load_tokenizer(fp32_bundle)(PROMPTS[0]).input_ids
    want = SpeculativeEngine(target, drafter, draft_rows=Cutoff(0.35)).generate(
        ids, max_new_tokens=40, eos_ids=eos)
    out = native(hyflash_run, fp32_bundle, ids, 40, "--draft-rows", "0.35")
    same_run(out, want)
    assert out["stats"]["cut_draft_rows"] == want.stats.cut_draft_rows > 0


def test_native_draft_rows_auto_is_lossless(hyflash_run, fp32_bundle):
    ids = load_tokenizer(fp32_bundle)(PROMPTS[1]).input_ids * 2
    plain = native(hyflash_run, fp32_bundle, ids, 48, "--no-draft", "--ignore-eos")
    auto = native(hyflash_run, fp32_bundle, ids, 48, "--ignore-eos", "--repeat", "3",
                  "--draft-rows", "auto")  # the CLI checks the three runs decode the same
    assert auto["tokens"] == plain["tokens"]
    assert auto["runs"][0]["cut_draft_rows"] > 0  # its exploration proposes half, then none
    gated = native(hyflash_run, fp32_bundle, ids, 48, "--ignore-eos", "--draft-rows", "auto",
                   "--lookup", "--adaptive")
    assert gated["tokens"] == plain["tokens"]


def test_plain_text_output_names_tau_and_speed(hyflash_run, fp32_bundle):
    done = run(hyflash_run, fp32_bundle, "--prompt-ids", "534,1087,63", "--max-new-tokens", 8)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tokens: ")
    assert "tau (tokens per verify)" in done.stdout and "tokens/s" in done.stdout


@pytest.fixture(scope="module")
def bad_bundles(fp32_bundle, tmp_path_factory):
    """A bundle whose manifest names another backend, and one whose program is truncated."""
    root = tmp_path_factory.mktemp("bad-native")
    onnx = root / "onnx"
    onnx.mkdir()
    manifest = json.loads((fp32_bundle / "manifest.json").read_text())
    (onnx / "manifest.json").write_text(json.dumps({**manifest, "backend": "onnx"}))
    cut = root / "cut"
    shutil.copytree(fp32_bundle, cut)
    with open(cut / "model.pte", "r+b") as f:
        f.truncate(1000)
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("argv, needle", [
    (["{root}/nowhere", "--prompt-ids", "1"], "no bundle folder at"),
    (["{root}/empty", "--prompt-ids", "1"], "no manifest.json in"),
    (["{root}/onnx", "--prompt-ids", "1"], "is for onnx, not executorch"),
    (["{root}/cut", "--prompt-ids", "1"], "model.pte is corrupted"),
    (["{bundle}", "--prompt-ids", "1,x"], "'x' is not a token id"),
    (["{bundle}", "--prompt-ids", ""], "--prompt-ids is empty"),
    (["{bundle}", "--prompt-ids", "5,-1"], "prompt token id -1 is outside the target's "
                                           "vocabulary 0..4095"),
    (["{bundle}", "--prompt-ids", "99999"], "prompt token id 99999 is outside"),
    (["{bundle}", "--prompt-ids", ",".join(["5"] * 125)], "block size 8 exceeds the "
                                                          "remaining context"),
    (["{bundle}", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be "
                                                                 "a positive integer"),
    (["{bundle}"], "--prompt-ids is required"),
    (["{bundle}", "--prompt-ids", "1", "--temperature", "1"], "unknown option --temperature"),
    (["{bundle}", "--prompt-ids", "1", "--draft-rows", "most"], "--draft-rows most: pass all, "
                                                                "auto or a probability"),
    (["{bundle}", "--prompt-ids", "1", "--draft-rows", "1.5"], "need 0 <= p < 1"),
    (["{bundle}", "--prompt-ids", "1", "--no-draft", "--draft-rows", "auto"],
     "--no-draft runs no drafter"),
])
def test_bad_input_is_one_line_and_exit_2(hyflash_run, fp32_bundle, bad_bundles, argv, needle):
    done = run(hyflash_run, *[a.format(root=bad_bundles, bundle=fp32_bundle) for a in argv])
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hyflash-run: error: ")
    assert needle in lines[0]


def test_android_jni_layer_runs_on_the_host_jvm_as_the_cli_does(hyflash_run, fp32_bundle):
    """The demo's JNI layer (android_demo/app/src/main/cpp/hyflash_jni.cpp) built for this
    machine and called from a JVM through a Java class with the Kotlin NativeEngine's
    name and methods: the same tokens and stats as hyflash-run, errors as the one line."""
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.skip("no JDK (javac, java, jni.h): the JNI host check needs one")
    kotlin = (ANDROID / "app/src/main/java/org/hyflash/demo/NativeEngine.kt").read_text()
    mirror = (ANDROID / "host_check/org/hyflash/demo/NativeEngine.java").read_text()
    kotlin, mirror = (re.findall(r"external fun (\w+)\(", kotlin),
                      re.findall(r"native \w+ (\w+)\(", mirror))
    assert kotlin == mirror == ["open", "generate", "close"]
    build = ROOT / "build" / "android-host"
    prefix = importlib.util.find_spec("executorch").submodule_search_locations[0]
    sources = sorted((ANDROID / "host_check").rglob("*.java"))
    for cmd in (["cmake", "-S", ANDROID / "app/src/main/cpp", "-B", build, "--log-level=WARNING",
                 "-DHYFLASH_HOST_CHECK=ON", f"-DJAVA_HOME={Path(javac).resolve().parents[1]}",
                 f"-DCMAKE_PREFIX_PATH={prefix}"],
                ["cmake", "--build", build, "-j", "2"],
                [javac, "-d", build / "classes", *sources]):
        done = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

    def jvm(*args):
        return subprocess.run([java, f"-Djava.library.path={build}", "-cp", str(build / "classes"),
                               "org.hyflash.demo.HostCheck", *map(str, args)],
                              capture_output=True, text=True, timeout=120)

    ids = load_tokenizer(fp32_bundle)(PROMPTS[2]).input_ids
    done = jvm(fp32_bundle, ",".join(map(str, ids)), 24)
    assert done.returncode == 0, done.stderr
    got, want = json.loads(done.stdout), native(hyflash_run, fp32_bundle, ids, 24)
    assert got["tokens"] == want["tokens"]
    assert got["stats"]["tau"] == want["stats"]["tau"]
    assert got["stats"]["position_accepted"] == want["stats"]["position_accepted"]
    missing = jvm(fp32_bundle.parent / "nowhere", "1", 4)
    assert missing.returncode == 2
    assert missing.stdout.startswith("error: no bundle folder at")
