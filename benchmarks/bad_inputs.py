"""Feed the CLI bad input the way a new user would and tabulate what happens.

    python benchmarks/bad_inputs.py --out benchmarks/results/bad_inputs [--only PATTERN]

Every case runs ``python -m hyflash ...`` in a fresh process (timeout 120 s) and is
classified by what the user sees:

- ``clean``: exit status 2, no traceback, exactly one ``error:`` line on stderr;
- ``ok``: exit 0 where running is the right answer (e.g. ``--threads 1000`` is capped
  with a note); for a case that expected an error this is ``ACCEPTED`` (silently wrong);
- ``TRACEBACK``, ``HANG`` (timeout), ``CRASH`` (another exit status);
- ``LOST``: a file the user owned before the command is gone or changed afterwards.

Fixtures (a tiny model, an exported pocket bundle, damaged copies of both, bad prompt
and corpus files) are built once in a scratch folder. Results go to ``bad_inputs.md``
and ``bad_inputs.json`` in --out. This is a benchmark, not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

POCKET_DRAFTER = ROOT / "hyflash/models/pocket/drafters/hyflash"
POCKET_MODEL = ROOT / "hyflash/models/pocket/model"


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: str = "error"          # error | ok | either
    owned: list[str] = field(default_factory=list)  # user files that must survive
    quiet_stdout: bool = False     # the error must come before anything is echoed


# ------------------------------------------------------------------- fixtures

def build_fixtures(d: Path) -> dict[str, str]:
    """Everything the cases point at; returns name -> path."""
    from conftest import save_tiny_llama

    from hyflash.export.command import run as export_run  # noqa: F401  (import check)

    f: dict[str, str] = {}
    tiny = save_tiny_llama(d / "tiny")
    f["tiny"] = str(tiny)
    for name, text in (("cfg_not_json", "{not json"), ("cfg_list", "[1, 2, 3]"),
                       ("cfg_no_hidden", None)):
        folder = d / name
        shutil.copytree(tiny, folder)
        if text is None:
            cfg = json.loads((tiny / "config.json").read_text())
            del cfg["hidden_size"]
            text = json.dumps(cfg)
        (folder / "config.json").write_text(text)
        f[name] = str(folder)
    for name, mangle in (("st_truncated", lambda b: b[: len(b) // 2]),
                         ("st_garbage", lambda b: b"\x00garbage" * 100)):
        folder = d / name
        shutil.copytree(tiny, folder)
        w = folder / "model.safetensors"
        w.write_bytes(mangle(w.read_bytes()))
        f[name] = str(folder)
    (d / "plain.txt").write_text("hello\n")
    f["plain_file"] = str(d / "plain.txt")
    (d / "fake.gguf").write_bytes(b"not a gguf file at all" * 10)
    f["fake_gguf"] = str(d / "fake.gguf")

    # prompt files (simulate) and corpus files (train)
    words = " ".join(f"w{i % 40 + 2}" for i in range(3000))
    (d / "corpus.txt").write_text(words)
    f["corpus"] = str(d / "corpus.txt")
    (d / "latin1.txt").write_bytes("caf\xe9 d\xe9j\xe0 vu\n".encode("latin-1") * 50)
    (d / "binary.bin").write_bytes(bytes(range(256)) * 20)
    (d / "null.jsonl").write_text('{"prompt": "def f():"}\nnull\n')
    (d / "nofield.jsonl").write_text('{"prompt": "def f():"}\n{"other": 1}\n')
    (d / "textnull.jsonl").write_text('{"text": "w1 w2"}\nnull\n')
    (d / "textnofield.jsonl").write_text('{"text": "w1 w2"}\n{"body": "w3"}\n')
    (d / "empty.txt").write_text("")
    (d / "empty.jsonl").write_text("")
    (d / "long.jsonl").write_text(json.dumps({"prompt": "x = 1\n" * 3000}) + "\n")
    for n in ("latin1.txt", "binary.bin", "null.jsonl", "nofield.jsonl", "textnull.jsonl",
              "textnofield.jsonl", "empty.txt", "empty.jsonl", "long.jsonl"):
        f[n] = str(d / n)
    f["long_prompt"] = "x = 1\n" * 3000

    # an exported bundle and damaged copies
    bundle = d / "bundle"
    run(["export", "--target", "pocket", "--drafter", "pocket", "--out", str(bundle),
         "--max-seq-len", "256", "--no-progress"], timeout=600, check=True)
    f["bundle"] = str(bundle)

    def damaged(name: str, edit) -> None:
        copy = d / name
        shutil.copytree(bundle, copy)
        edit(copy)
        f[name] = str(copy)

    def edit_manifest(fn):
        def edit(folder: Path):
            m = json.loads((folder / "manifest.json").read_text())
            fn(m)
            (folder / "manifest.json").write_text(json.dumps(m, indent=1))
        return edit

    def set_deep(m: dict, keys: list[str], value, delete: bool = False) -> None:
        """Set (or delete) m[k0][k1]...; a key path that does not exist is skipped."""
        for k in keys[:-1]:
            if not isinstance(m, dict) or k not in m:
                return
            m = m[k]
        if delete:
            m.pop(keys[-1], None)
        else:
            m[keys[-1]] = value

    def bump_block(m):  # v1 stored it at the top, later formats inside the drafter config
        set_deep(m, ["block_size"], 4)
        set_deep(m, ["drafter", "config", "block_size"], 4)

    damaged("b_block_edited", edit_manifest(bump_block))
    damaged("b_seq_edited", edit_manifest(lambda m: (set_deep(m, ["max_context"], 99999),
                                                     set_deep(m, ["target", "config",
                                                                  "max_seq_len"], 99999))))
    damaged("b_future", edit_manifest(lambda m: m.update(format_version=99)))
    damaged("b_nested", edit_manifest(lambda m: set_deep(m, ["models", "target", "inputs"],
                                                         None, delete=True)))
    def damage_state(m):  # v1 kept the state specs at the top, later formats in the drafter
        for spec in (m.get("state") or m["drafter"].get("state") or [])[:1]:
            spec["shape"] = "big"

    damaged("b_state_shape", edit_manifest(damage_state))
    damaged("b_not_json", lambda p: (p / "manifest.json").write_text("{oops"))
    damaged("b_missing", lambda p: (p / "drafter.onnx").unlink())
    def corrupt_target(folder: Path) -> None:  # the biggest graph: the target, either form
        graph = max(folder.glob("*.onnx"), key=lambda p: p.stat().st_size)
        graph.write_bytes(graph.read_bytes()[:-1000] + b"\x00" * 1000)

    damaged("b_corrupt", corrupt_target)
    return f


# ---------------------------------------------------------------------- cases

def cases(f: dict[str, str], d: Path) -> list[Case]:
    g = ["generate", "--prompt", "def f():", "--max-new-tokens", "4"]
    tp = ["--target", "pocket", "--no-draft"]
    s = ["simulate", f["bundle"], "--max-new-tokens", "4", "--no-progress"]
    t = ["train", "--target", f["tiny"], "--data", f["corpus"], "--sequences", "8",
         "--batch", "8", "--steps", "2", "--gen-len", "8", "--quiet"]
    e = ["export", "--target", "pocket", "--drafter", "pocket", "--no-progress"]

    def out(name: str) -> str:
        return str(d / "outs" / name)

    user_dir = d / "user_dir"
    user_file = d / "user_file.txt"
    c = [
        # generate: sources and modes
        Case("generate: target does not exist", g + ["--target", str(d / "nope"), "--no-draft"]),
        Case("generate: no --prompt", ["generate", *tp]),
        Case("generate: neither target nor bundle", g),
        Case("generate: target without --drafter/--no-draft", g + ["--target", "pocket"]),
        Case("generate: --drafter with --no-draft",
             g + tp + ["--drafter", "pocket"]),
        Case("generate: --bundle with --target", g + ["--bundle", f["bundle"], *tp]),
        Case("generate: --bundle with --max-seq-len", g + ["--bundle", f["bundle"],
                                                          "--max-seq-len", "128"]),
        Case("generate: --drafter does not exist",
             g + ["--target", "pocket", "--drafter", str(d / "nope")]),
        Case("generate: --drafter is a model folder",
             g + ["--target", "pocket", "--drafter", str(POCKET_MODEL)]),
        Case("generate: drafter for another target",
             g + ["--target", f["tiny"], "--drafter", "pocket"]),
        Case("generate: --target is a drafter folder", g + ["--target", str(POCKET_DRAFTER),
                                                           "--no-draft"]),
        Case("generate: --target is a plain file", g + ["--target", f["plain_file"],
                                                       "--no-draft"]),
        Case("generate: --target is a fake .gguf", g + ["--target", f["fake_gguf"],
                                                       "--no-draft"]),
        Case("generate: config.json not JSON", g + ["--target", f["cfg_not_json"], "--no-draft"]),
        Case("generate: config.json a list", g + ["--target", f["cfg_list"], "--no-draft"]),
        Case("generate: config.json lacks hidden_size",
             g + ["--target", f["cfg_no_hidden"], "--no-draft"]),
        Case("generate: truncated safetensors", g + ["--target", f["st_truncated"],
                                                    "--no-draft"]),
        Case("generate: garbage safetensors", g + ["--target", f["st_garbage"], "--no-draft"]),
        # generate: numbers
        Case("generate: --max-new-tokens 0", g + tp + ["--max-new-tokens", "0"]),
        Case("generate: --max-new-tokens -5", g + tp + ["--max-new-tokens", "-5"]),
        Case("generate: --max-new-tokens abc", g + tp + ["--max-new-tokens", "abc"]),
        Case("generate: --temperature inf", g + tp + ["--temperature", "inf"]),
        Case("generate: --temperature nan", g + tp + ["--temperature", "nan"]),
        Case("generate: --temperature -1", g + tp + ["--temperature", "-1"]),
        Case("generate: --top-p 0", g + tp + ["--top-p", "0"]),
        Case("generate: --top-p 1.5", g + tp + ["--top-p", "1.5"]),
        Case("generate: --top-k -1", g + tp + ["--top-k", "-1"]),
        Case("generate: --seed -1", g + tp + ["--seed", "-1"]),
        Case("generate: --threads 0", g + tp + ["--threads", "0"]),
        Case("generate: --threads 1000 (capped)", g + tp + ["--threads", "1000"], expect="ok"),
        Case("generate: --max-seq-len 0", g + tp + ["--max-seq-len", "0"]),
        Case("generate: --max-seq-len -1", g + tp + ["--max-seq-len", "-1"]),
        Case("generate: --max-seq-len 100000", g + tp + ["--max-seq-len", "100000"]),
        Case("generate: 18k-char prompt over the context",
             ["generate", *tp, "--prompt", f["long_prompt"], "--max-seq-len", "256"],
             quiet_stdout=True),
        # inspect
        Case("inspect: path does not exist", ["inspect", str(d / "nope")]),
        Case("inspect: a drafter folder", ["inspect", str(POCKET_DRAFTER)], expect="either"),
        Case("inspect: config.json not JSON", ["inspect", f["cfg_not_json"]]),
        Case("inspect: config.json a list", ["inspect", f["cfg_list"]]),
        Case("inspect: --max-seq-len 0", ["inspect", "pocket", "--max-seq-len", "0"]),
        Case("inspect: a plain file", ["inspect", f["plain_file"]]),
        Case("inspect: manifest not JSON", ["inspect", f["b_not_json"]]),
        Case("inspect: manifest block_size edited", ["inspect", f["b_block_edited"]]),
        Case("inspect: manifest max_seq_len edited", ["inspect", f["b_seq_edited"]]),
        Case("inspect: manifest from a newer hyflash", ["inspect", f["b_future"]]),
        Case("inspect: manifest nested entry removed", ["inspect", f["b_nested"]]),
        Case("inspect: manifest state shape damaged", ["inspect", f["b_state_shape"]]),
        Case("inspect: bundle file missing", ["inspect", f["b_missing"]]),
        Case("inspect: bundle file corrupted", ["inspect", f["b_corrupt"]]),
        # simulate
        Case("simulate: bundle does not exist", ["simulate", str(d / "nope")]),
        Case("simulate: a model folder, not a bundle", ["simulate", str(POCKET_MODEL)]),
        Case("simulate: --threads 0", s + ["--threads", "0"]),
        Case("simulate: --threads 1000 (capped)", s + ["--threads", "1000"], expect="ok"),
        Case("simulate: --max-new-tokens 0", s + ["--max-new-tokens", "0"]),
        Case("simulate: --temperature inf", s + ["--temperature", "inf"]),
        Case("simulate: --prompts not UTF-8", s + ["--prompts", f["latin1.txt"]]),
        Case("simulate: --prompts binary", s + ["--prompts", f["binary.bin"]]),
        Case("simulate: --prompts .jsonl line null", s + ["--prompts", f["null.jsonl"]]),
        Case("simulate: --prompts .jsonl lacks prompt", s + ["--prompts", f["nofield.jsonl"]]),
        Case("simulate: --prompts empty .txt", s + ["--prompts", f["empty.txt"]]),
        Case("simulate: --prompts empty .jsonl", s + ["--prompts", f["empty.jsonl"]]),
        Case("simulate: --prompts does not exist", s + ["--prompts", str(d / "nope.jsonl")]),
        Case("simulate: prompt longer than the context", s + ["--prompts", f["long.jsonl"]]),
        Case("simulate: --out is an existing file", s + ["--out", str(user_file)],
             owned=[str(user_file)]),
        Case("simulate: manifest block_size edited", s[:2] + [f["b_block_edited"]] + s[3:]),
        Case("simulate: bundle file corrupted", s[:1] + [f["b_corrupt"]] + s[2:]),
        # export
        Case("export: --out is a folder with user files", e + ["--out", str(user_dir)],
             owned=[str(user_dir / "notes.txt")]),
        Case("export: --out is a regular file", e + ["--out", str(user_file)],
             owned=[str(user_file)]),
        Case("export: --max-seq-len below window + block", e + ["--out", out("e1"),
                                                               "--max-seq-len", "16"]),
        Case("export: --max-seq-len 0", e + ["--out", out("e2"), "--max-seq-len", "0"]),
        Case("export: --drafter does not exist", ["export", "--target", "pocket", "--drafter",
                                                  str(d / "nope"), "--out", out("e3")]),
        Case("export: drafter for another target", ["export", "--target", f["tiny"],
                                                    "--drafter", "pocket", "--out", out("e4")]),
        Case("export: --backend coreml (not built)", e + ["--out", out("e5"),
                                                          "--backend", "coreml"]),
        Case("export: --quant int3", e + ["--out", out("e6"), "--quant", "int3"]),
        Case("export: target config.json not JSON", ["export", "--target", f["cfg_not_json"],
                                                     "--drafter", "pocket", "--out", out("e7")]),
        # train
        Case("train: --out is a folder with user files", t + ["--out", str(user_dir)],
             owned=[str(user_dir / "notes.txt")]),
        Case("train: --out is a regular file", t + ["--out", str(user_file)],
             owned=[str(user_file)]),
        Case("train: --steps 0", t + ["--out", out("t1"), "--steps", "0"]),
        Case("train: --sequences 0", t + ["--out", out("t2"), "--sequences", "0"]),
        Case("train: --batch -1", t + ["--out", out("t3"), "--batch", "-1"]),
        Case("train: --lr inf", t + ["--out", out("t4"), "--lr", "inf"]),
        Case("train: --sampled-fraction 2", t + ["--out", out("t5"), "--sampled-fraction", "2"]),
        Case("train: --threads 0", t + ["--out", out("t6"), "--threads", "0"]),
        Case("train: --max-seq-len 0", t + ["--out", out("t7"), "--max-seq-len", "0"]),
        Case("train: --data does not exist", swap(t, "--data", str(d / "nope")) + ["--out",
                                                                                  out("t8")]),
        Case("train: --data not UTF-8", swap(t, "--data", f["latin1.txt"]) + ["--out",
                                                                             out("t9")]),
        Case("train: --data binary", swap(t, "--data", f["binary.bin"]) + ["--out", out("t10")]),
        Case("train: --data .jsonl line null", swap(t, "--data", f["textnull.jsonl"])
             + ["--out", out("t11")]),
        Case("train: --data .jsonl lacks text", swap(t, "--data", f["textnofield.jsonl"])
             + ["--out", out("t12")]),
        Case("train: --data empty file", swap(t, "--data", f["empty.txt"]) + ["--out",
                                                                             out("t13")]),
        Case("train: --target garbage safetensors", swap(t, "--target", f["st_garbage"])
             + ["--out", out("t14")]),
        # commands not built yet, and the entry point
        Case("budget: future arguments", ["budget", "pocket", "--device", "pixel-8",
                                          "--context", "4096"]),
        Case("bench: future arguments", ["bench", "--suite", "standard", "--out", out("b")]),
        Case("unknown command", ["frobnicate"]),
    ]
    return c


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


# -------------------------------------------------------------------- running

def run(argv: list[str], timeout: float = 120, check: bool = False):
    proc = subprocess.run([sys.executable, "-m", "hyflash", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise SystemExit(f"fixture command failed: hyflash {' '.join(argv)}\n{proc.stderr}")
    return proc


def snapshot(paths: list[str]) -> dict[str, bytes | None]:
    return {p: Path(p).read_bytes() if Path(p).is_file() else None for p in paths}


def classify(case: Case, d: Path) -> dict:
    user_dir, user_file = d / "user_dir", d / "user_file.txt"
    for p in (user_dir, user_file):  # a previous case may have replaced one by the other
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("the user's notes\n")
    user_file.write_text("the user's file\n")
    before = snapshot(case.owned)
    t0 = time.time()
    try:
        proc = run(case.argv)
    except subprocess.TimeoutExpired:
        return {"outcome": "HANG", "seconds": round(time.time() - t0, 1), "said": ""}
    seconds = round(time.time() - t0, 1)
    err = proc.stderr.strip().splitlines()
    errors = [line for line in err if "error:" in line]
    said = (errors or err or [""])[-1][:160]
    if any(before[p] != snap for p, snap in snapshot(case.owned).items()):
        outcome = "LOST"
    elif "Traceback (most recent call last)" in proc.stderr + proc.stdout:
        outcome = "TRACEBACK"
        said = err[-1][:160] if err else ""
    elif proc.returncode == 0:
        outcome = "ok" if case.expect in ("ok", "either") else "ACCEPTED"
        said = (err[-1] if err else proc.stdout.strip().splitlines()[0])[:160]
    elif proc.returncode == 2 and len(errors) == 1:
        outcome = "clean" if case.expect in ("error", "either") else "REFUSED"
        if case.quiet_stdout and len(proc.stdout) > 200:
            outcome = "ECHOED"
    else:
        outcome = f"CRASH rc={proc.returncode}"
    return {"outcome": outcome, "seconds": seconds, "said": said}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bad_inputs")
    ap.add_argument("--only", help="run only cases whose name matches this glob")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temp folder)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="hyflash-bad-inputs-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"building fixtures in {work}", flush=True)
    fixtures = build_fixtures(work)
    results = []
    for case in cases(fixtures, work):
        if args.only and not fnmatch.fnmatch(case.name, args.only):
            continue
        r = {"case": case.name, "expect": case.expect, **classify(case, work)}
        results.append(r)
        print(f"{r['outcome']:>10}  {r['seconds']:6.1f}s  {case.name}  | {r['said']}",
              flush=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bad_inputs.json").write_text(json.dumps({"counts": counts,
                                                          "cases": results}, indent=1))
    lines = ["# Bad inputs", "", "`python benchmarks/bad_inputs.py` (one fresh process per case)",
             "", "counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             "| # | case | outcome | what the user saw |", "|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        said = r["said"].replace("|", "\\|")
        lines.append(f"| {i} | {r['case']} | {r['outcome']} | {said} |")
    (args.out / "bad_inputs.md").write_text("\n".join(lines) + "\n")
    print("counts:", counts)
    shutil.rmtree(work / "outs", ignore_errors=True)
    bad = sum(v for k, v in counts.items() if k not in ("clean", "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
