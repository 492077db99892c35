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

from hyflash.errors import HyflashError

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
    p.add_argument("bundle", metavar="DIR", help="an ONNX bundle (`hyflash export --backend "
                                                 "onnx --out DIR`)")
    p.add_argument("--prompts", metavar="FILE",
                   help="prompts: .jsonl (one JSON string or {\"prompt\": ...} per line) or "
                        "text with prompts separated by lines holding only ---; default: "
                        "a few built-in Python code prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="ONNX Runtime intra-op threads (default 0 = all cores)")
    p.add_argument("--out", metavar="REPORT_DIR",
                   help="also write report.json, report.txt and report.png here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def read_prompts(path: str | None) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    f = Path(path)
    if not f.is_file():
        raise HyflashError(f"no prompts file at {f}: pass a .jsonl or text file")
    text = f.read_text(encoding="utf-8")
    if f.suffix == ".jsonl":
        prompts = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise HyflashError(f"{f} line {i} is not JSON ({e.msg}): write one JSON "
                                   "string or {\"prompt\": ...} per line") from e
            prompts.append(item["prompt"] if isinstance(item, dict) else str(item))
    else:
        prompts = [p.strip("\n") for p in text.split("\n---\n")]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise HyflashError(f"{f} holds no prompts")
    return prompts


def run(args: argparse.Namespace) -> int:
    from hyflash.export.command import require_onnx_extra

    require_onnx_extra("hyflash simulate")
    from tqdm import tqdm

    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.onnx_backend import load_onnx_pair
    from hyflash.runtime.simulate_report import Report

    if args.max_new_tokens < 1:
        raise HyflashError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = read_prompts(args.prompts)
    bundle, target, drafter = load_onnx_pair(args.bundle, threads=args.threads)
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
    plain, spec = SpeculativeEngine(target), SpeculativeEngine(target, drafter)
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
    print(report.table())
    if args.out:
        written = report.write(Path(args.out))
        print(f"\nreport written to {', '.join(str(w) for w in written)}")
    return 0


def check_prompt(ids: list[int], i: int, context: int, room: int) -> None:
    if not ids:
        raise HyflashError(f"prompt {i + 1} is empty after tokenization")
    if len(ids) > room:
        raise HyflashError(f"prompt {i + 1} has {len(ids)} tokens; the bundle's context of "
                           f"{context} holds at most {room} prompt tokens plus one block: "
                           "shorten it")
