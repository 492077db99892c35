"""Bundles that `demo` and `bench` export once and reuse while they are still valid.

A cached bundle is reused only if both hold:

- its files are what its manifest says (``read_bundle`` with every sha256 checked), and
- it was exported from the same inputs: a stamp beside the bundle (``NAME.inputs.json``,
  outside the bundle, which stays byte for byte what export wrote) records the sha256 of
  the target's and the drafter's files, the export options, the hyflash version and a
  digest of the code that writes bundles (``EXPORTER_CODE``: a changed recipe or graph
  exports again, where the version number alone would serve the old bundle).

Anything else (no bundle, a corrupted file, new drafter weights, another context) exports
again, and the caller is told why. Exports run as ``python -m hyflash export`` in a fresh
process, as a user would run them, so an export's memory never counts in a later
measurement of this process; ONNX int8 / int4 / 8da4w variants of a bench can be requantized from
the fp32 bundle instead (``requantize_bundle``: the same recipe without a second export).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hyflash import __version__
from hyflash.bundle import sha256
from hyflash.errors import HyflashError

STAMP_SUFFIX = ".inputs.json"
PACKAGE = Path(__file__).resolve().parents[1]
EXPORTER_CODE = ("export", "models", "bundle")  # the subpackages whose code a bundle holds


@dataclass(frozen=True)
class ExportSpec:
    """What `hyflash export` is asked for; ``requantize`` makes an ONNX int8 / int4 / 8da4w
    bundle from the fp32 bundle of the same spec."""

    target: str
    drafter: str
    backend: str = "onnx"
    quant: str = "fp32"
    max_seq_len: int | None = None
    target_graph: str = "auto"
    requantize: bool = False

    @property
    def name(self) -> str:
        graph = f"-{self.target_graph}" if self.backend == "onnx" else ""
        return f"{self.backend}{graph}-{self.quant}"

    def argv(self, out: Path, threads: int, progress: bool) -> list[str]:
        argv = ["export", "--target", self.target, "--drafter", self.drafter,
                "--backend", self.backend, "--quant", self.quant, "--out", str(out),
                "--threads", str(threads)]
        if self.max_seq_len:
            argv += ["--max-seq-len", str(self.max_seq_len)]
        if self.backend == "onnx":
            argv += ["--target-graph", self.target_graph]
        return argv + ([] if progress else ["--no-progress"])


@dataclass
class Exported:
    folder: Path
    spec: ExportSpec
    reused: bool
    seconds: float  # export (or requantize) time; 0 when reused
    note: str  # why it was (re-)exported, or that it was reused


def folder_digest(folder: Path, names: list[str]) -> dict[str, str]:
    return {n: sha256(folder / n) for n in sorted(names) if (folder / n).is_file()}


def exporter_digest() -> str:
    """sha256 over the sources of the subpackages that decide what a bundle holds."""
    import hashlib

    h = hashlib.sha256()
    for sub in EXPORTER_CODE:
        for f in sorted((PACKAGE / sub).rglob("*.py")):
            h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def identity(spec: ExportSpec) -> dict:
    """What a bundle is made from: the content of the pair's files, the options, the
    exporter's version. Paths are not part of it: a moved model is the same model."""
    from hyflash.export.bundle import TOKENIZER_FILES
    from hyflash.models.drafter_folder import resolve_drafter_folder
    from hyflash.models.target import resolve_model_folder

    target = resolve_model_folder(spec.target)
    drafter = resolve_drafter_folder(spec.drafter)
    weights = [p.name for p in target.glob("*.safetensors*")]
    return {"hyflash_version": __version__, "exporter_code": exporter_digest(),
            "options": {k: v for k, v in asdict(spec).items() if k not in ("target", "drafter")},
            "target_files": folder_digest(target, ["config.json", "generation_config.json",
                                                   *TOKENIZER_FILES, *weights]),
            "drafter_files": folder_digest(drafter, ["config.json", "model.safetensors"])}


def stamp_path(folder: Path) -> Path:
    return folder.with_name(folder.name + STAMP_SUFFIX)


def why_not_reusable(folder: Path, want: dict) -> str | None:
    """None if the bundle at folder is valid and made from these inputs, else the reason."""
    from hyflash.bundle import read_bundle

    if not (folder / "manifest.json").is_file():
        return "no bundle yet"
    try:
        have = json.loads(stamp_path(folder).read_text())
    except (OSError, ValueError):
        return "no record of its inputs"
    for part in ("options", "target_files", "drafter_files", "hyflash_version", "exporter_code"):
        if have.get(part) != want[part]:
            return f"its {part.replace('_', ' ')} changed"
    try:
        read_bundle(folder)  # every file's size and sha256 against the manifest
    except HyflashError as e:
        return f"it no longer checks out ({e})"
    return None


def hyflash_process(argv: list[str], quiet: bool) -> None:
    """`python -m hyflash ARGV` in a fresh process running this very hyflash. Its stdout
    (export's description of the bundle) is not the caller's; of its stderr only the
    progress bar is shown (unless quiet), the rest (library warnings) is kept for an error."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hyflash", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for part in iter_progress(proc.stderr):
        if part.startswith(f"{argv[0]}:") and "%|" in part:
            if not quiet:
                print("\r      " + part, end="", file=sys.stderr, flush=True)
        elif part.strip():
            lines.append(part.strip())
    code = proc.wait()
    if not quiet:
        print(file=sys.stderr)
    if code:
        tail = f": {lines[-1]}" if lines else ""
        raise HyflashError(f"`hyflash {argv[0]}` failed (exit {code}){tail}; run it by hand "
                           f"to see why: hyflash {' '.join(argv)}")


def iter_progress(stream):
    """Lines and carriage-return updates (a tqdm bar) of a text stream, as they come."""
    buf = ""
    for ch in iter(lambda: stream.read(1), ""):
        if ch in "\r\n":
            yield buf
            buf = ""
        else:
            buf += ch
    if buf:
        yield buf


def ensure(spec: ExportSpec, root: Path, threads: int = 1, progress: bool = True,
           say=print) -> Exported:
    """The bundle for spec under root: reused if still valid, else (re-)exported."""
    folder = root / spec.name
    want = identity(spec)
    reason = why_not_reusable(folder, want)
    if reason is None:
        return Exported(folder, spec, True, 0.0, "reused (files and inputs unchanged)")
    start = time.perf_counter()
    if spec.requantize:
        from dataclasses import replace

        from hyflash.export.bundle import requantize_bundle

        base = ensure(replace(spec, quant="fp32", requantize=False), root, threads, progress,
                      say)
        say(f"requantizing {base.folder.name} to {spec.quant} -> {folder} ({reason})")
        requantize_bundle(base.folder, spec.quant, folder)
    else:
        say(f"exporting {spec.backend} {spec.quant} -> {folder} ({reason})")
        hyflash_process(spec.argv(folder, threads, progress), quiet=not progress)
    stamp_path(folder).write_text(json.dumps(want, indent=1) + "\n")
    return Exported(folder, spec, False, time.perf_counter() - start, f"exported ({reason})")
