"""`hyflash simulate`: run an ONNX bundle's graphs exactly as the phone would, on the desktop.

For every prompt the *same* ONNX target decodes twice in one process, side by side:
plain autoregressive decoding (one target call per token) and speculative decoding with
the bundle's drafter (draft a block, verify it in one target call, keep what the target
would have produced). Both go through the one engine (``hyflash.runtime.engine``) with
the ONNX Runtime backends, so the numbers are the loop's, not a model of it. In greedy
mode the two outputs must be identical (lossless verification); the report says so.

The report: tau and per-position acceptance, tokens/s of both and the speedup, time per
drafter call and per verify call, peak RSS, draft-side state bytes vs the target's KV
cache. Printed as a table; with ``--out`` also written as JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hyflash.argtypes import DEFAULT_THREADS, nonneg_float, nonneg_int, positive_int, threads
from hyflash.errors import HyflashError
from hyflash.runtime import round_options

# Built-in prompts: Python code, what the embedded pocket model was trained on; one long
# prompt so that the drafter's window and memory both matter.
DEFAULT_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n",
    "def read_lines(path, encoding='utf-8'):\n    with open(path, encoding=encoding) as f:\n",
    '"""Utilities for parsing configuration files."""\n\nimport re\nfrom collections import '
    'OrderedDict\n\n_SECTION = re.compile(r"\\[(?P<name>[^]]+)\\]")\n_OPTION = re.compile('
    'r"(?P<key>[^=:\\s]+)\\s*[=:]\\s*(?P<value>.*)")\n\n\nclass ParseError(Exception):\n'
    '    """Raised when a line cannot be parsed."""\n\n    def __init__(self, lineno, line):'
    '\n        super().__init__(f"line {lineno}: {line!r}")\n        self.lineno = lineno\n'
    '        self.line = line\n\n\ndef parse(text):\n    """Return {section: {key: value}}'
    ' for an INI-style text."""\n    sections = OrderedDict()\n    current = None\n'
    '    for lineno, raw in enumerate(text.splitlines(), 1):\n        line = raw.strip()\n'
    '        if not line or line.startswith(("#", ";")):\n            continue\n'
    '        m = _SECTION.match(line)\n        if m:\n',
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="DIR", help="an ONNX, ExecuTorch or Core ML (macOS) bundle "
                                                 "(`hyflash export --backend "
                                                 "onnx|executorch|coreml --out DIR`)")
    p.add_argument("--prompts", metavar="FILE",
                   help="prompts: .jsonl (one JSON string or {\"prompt\": ...} per line) or "
                        "text with prompts separated by lines holding only ---; default: "
                        "a few built-in Python code prompts")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=nonneg_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=nonneg_int, default=None, help="sampling only (default 0)")
    p.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"ONNX Runtime intra-op threads (default {DEFAULT_THREADS}; more than the "
                        "cores are capped)")
    p.add_argument("--out", metavar="REPORT_DIR",
                   help="also write report.json, report.txt and report.png here")
    round_options.add_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", metavar="NAME",
                   help="also project phone decode speed and memory on this device profile "
                        "(`hyflash budget`'s), with the tau this run measures")


PROMPTS_FORMAT = "write one JSON string or {\"prompt\": \"...\"} per line"


def read_prompts(path: str | None) -> list[str]:
    """Prompts from a .jsonl file or from text separated by lines holding only ---; the
    built-in ones without a file. A file that holds no usable prompt is an error."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    f = Path(path)
    if not f.is_file():
        raise HyflashError(f"no prompts file at {f}: pass a .jsonl or text file")
    data = f.read_bytes()
    if b"\0" in data:
        raise HyflashError(f"{f} is a binary file, not prompts: pass a .jsonl or UTF-8 text "
                           "file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise HyflashError(f"{f} is not UTF-8 text (byte {e.start}): convert it to UTF-8, e.g. "
                           f"iconv -t utf-8") from None
    if f.suffix == ".jsonl":
        prompts = jsonl_prompts(f, text)
    else:
        prompts = [p.strip("\n") for p in text.split("\n---\n")]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise HyflashError(f"{f} holds no prompts" + (" (it is empty)" if not text.strip()
                                                       else "") + ": write at least one")
    return prompts


def jsonl_prompts(f: Path, text: str) -> list[str]:
    prompts = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise HyflashError(f"{f} line {i} is not JSON ({e.msg}): {PROMPTS_FORMAT}") from None
        if isinstance(item, dict):
            if "prompt" not in item:
                raise HyflashError(f"{f} line {i} has no \"prompt\" field: {PROMPTS_FORMAT}")
            item = item["prompt"]
        if not isinstance(item, str) or not item.strip():
            what = "an empty prompt" if isinstance(item, str) else f"{json.dumps(item)[:20]}"
            raise HyflashError(f"{f} line {i} holds {what}, not a prompt: {PROMPTS_FORMAT}")
        prompts.append(item)
    return prompts


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.open_bundle import open_bundle
    from hyflash.simulate.report import Report

    check_args(args)
    if args.device:
        from hyflash.budget.phone import check_device

        check_device(args.device)
    prompts = read_prompts(args.prompts)
    torch.set_num_threads(args.threads)  # the engine's own tensor work
    bundle, target, drafter = open_bundle(args.bundle, threads=args.threads)
    tokenizer = load_tokenizer(bundle.folder)
    eos = set(target.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    ids = [tokenizer(p).input_ids for p in prompts]
    room = target.max_seq_len - drafter.block_size - 1
    if args.prompts is None:  # built-in prompts: keep those the bundle's context can hold
        ids = [p for p in ids if 0 < len(p) <= room]
        if not ids:
            raise HyflashError(f"the bundle's context of {target.max_seq_len} tokens is too "
                               "small for the built-in prompts: pass --prompts FILE")
    for i, p in enumerate(ids):
        check_prompt(p, i, target.max_seq_len, room)
    plain = SpeculativeEngine(target)
    spec = round_options.engine(args, target, drafter)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              seed=args.seed, eos_ids=sorted(eos))
    # warm-up: the first ONNX Runtime calls allocate and plan; keep them out of the numbers
    for engine in (plain, spec):
        engine.generate(ids[0][:8], **{**kw, "max_new_tokens": min(8, args.max_new_tokens)})
    report = Report(bundle, args, len(prompts))
    for i, p in enumerate(tqdm(ids, desc="simulate", unit="prompt",
                               disable=args.no_progress)):
        a = plain.generate(p, **kw)
        drafter.calls = {"step": 0, "commit": 0}
        b = spec.generate(p, **kw)
        report.add(i, a, b, dict(drafter.calls), drafter.state_bytes(), target.kv_bytes())
    report.finish()
    from hyflash.budget.tau import record

    record(bundle.folder, report.summary, report.meta)  # `hyflash budget` projects with it
    if args.device:
        from hyflash.budget.phone import projection

        report.phone = projection(bundle.folder, args.device, report.summary)
    print(report.table())
    if args.out:
        written = report.write(Path(args.out))
        print(f"\nreport written to {', '.join(str(w) for w in written)}")
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Before the bundle loads: flags that do not apply, an --out that cannot be written."""
    if args.seed is not None and args.temperature == 0:
        raise HyflashError("--seed applies to sampling, and --temperature 0 decodes greedily: "
                           "pass --temperature > 0 or drop --seed")
    args.seed = args.seed or 0  # the report records the seed the engine used
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise HyflashError(f"--out {args.out} is a file: pass a folder for the report")


def check_prompt(ids: list[int], i: int, context: int, room: int) -> None:
    if not ids:
        raise HyflashError(f"prompt {i + 1} is empty after tokenization")
    if len(ids) > room:
        raise HyflashError(f"prompt {i + 1} has {len(ids)} tokens; the bundle's context of "
                           f"{context} holds at most {room} prompt tokens plus one block: "
                           "shorten it")
