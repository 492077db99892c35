"""The focused measurements in ``benchmarks/*.py``, run through `hyflash bench` too.

`hyflash bench --list` names the suites and every script with the first line of its
docstring; `hyflash bench --script NAME -- ARGS` runs ``benchmarks/NAME.py ARGS`` with this
hyflash on its path, from the checkout's root, so every benchmark has one entry point and
writes where its docstring says (``benchmarks/results/``). The scripts live in the source
checkout, not in an installed package: elsewhere ``--list`` says so.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from hyflash.errors import HyflashError

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "benchmarks"


def scripts() -> dict[str, str]:
    """name -> the first sentence(s) of each runnable benchmark script's docstring."""
    out = {}
    for f in sorted(FOLDER.glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        first = " ".join((ast.get_docstring(tree) or "").strip().split("\n\n")[0].split())
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            out[f.stem] = first if len(first) <= 100 else first[:99] + "…"
    return out


def listing(suites: tuple[str, ...]) -> str:
    lines = ["suites (hyflash bench --suite NAME; --quick: seconds on the pocket pair):",
             *[f"  {s}" for s in suites]]
    if not FOLDER.is_dir():
        return "\n".join(lines + [f"(no {FOLDER}: the focused scripts come with the source "
                                  "checkout)"])
    lines.append("scripts (hyflash bench --script NAME -- ARGS; results in "
                 "benchmarks/results/):")
    table = scripts()
    width = max(map(len, table), default=0)
    return "\n".join(lines + [f"  {k:<{width}}  {v}" for k, v in table.items()])


def run_script(name: str, argv: list[str]) -> int:
    table = scripts() if FOLDER.is_dir() else {}
    if name not in table:
        raise HyflashError(f"no benchmark script {name!r}: choose one of "
                           f"{', '.join(table) or '(none: use a source checkout)'}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(FOLDER / f"{name}.py"), *argv], cwd=ROOT,
                          env=env).returncode
