"""`hyflash budget BUNDLE --measure`: run the bundle and read the process's own memory.

The bundle runs in a child process (``python -m hyflash.budget.measure``) so that nothing
the parent loaded counts: it imports the runtime, opens the bundle with its backend
(``hyflash.runtime.open_bundle``), prefills a prompt and decodes speculatively,
and reports its resident set after each stage and its peak (Linux ``/proc/self/status``
VmRSS / VmHWM, as ``hyflash.runtime.stats.peak_rss_mib`` reads it). The parent compares
those stages with the estimate's terms (``measure_report``).
"""

from __future__ import annotations

import json
import subprocess
import sys

from hyflash.errors import HyflashError

STAGES = ("imports", "open", "run")


def status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, bytes."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def import_runtime(backend: str) -> None:
    """What a process running a bundle of this backend imports before opening it (the
    ``desktop_process_mib`` of ``data/runtime.json`` is measured after the same imports)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import hyflash.runtime.backends  # noqa: F401
    import hyflash.runtime.engine  # noqa: F401

    if backend == "executorch":
        import executorch.runtime  # noqa: F401

        import hyflash.runtime.executorch_backend  # noqa: F401
    else:
        import onnxruntime  # noqa: F401

        import hyflash.runtime.onnx_backend  # noqa: F401
        import hyflash.runtime.onnx_lean  # noqa: F401


def child(bundle: str, prompt_tokens: int, new_tokens: int, threads: int) -> None:
    """Runs in the child: print one JSON line per stage."""
    from hyflash.bundle import read_bundle

    import_runtime(read_bundle(bundle, verify_hashes=False).manifest.backend)
    import numpy as np
    import torch

    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.open_bundle import open_bundle

    torch.set_num_threads(threads)

    def report(stage: str, **extra) -> None:
        print(json.dumps({"stage": stage, **status(), **extra}), flush=True)

    report("imports")
    _, target, drafter = open_bundle(bundle, threads=threads)
    report("open")
    prompt = np.random.default_rng(0).integers(3, target.vocab_size - 1, prompt_tokens).tolist()
    out = SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=new_tokens,
                                                      eos_ids=[])
    report("run", new_tokens=out.stats.new_tokens, tau=out.stats.tau,
           kv_positions=prompt_tokens + out.stats.new_tokens + drafter.block_size)


def run(bundle: str, prompt_tokens: int, new_tokens: int, threads: int = 1,
        progress: bool = True) -> dict[str, dict]:
    """The child's stage reports, streamed with a progress bar."""
    from tqdm import tqdm

    if not sys.platform.startswith("linux"):
        raise HyflashError("--measure reads /proc/self/status, which only Linux has: run it on "
                           "Linux")
    cmd = [sys.executable, "-m", "hyflash.budget.measure", bundle, str(prompt_tokens),
           str(new_tokens), str(threads)]
    stages: dict[str, dict] = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc, \
            tqdm(total=len(STAGES), desc="measure", unit="stage", disable=not progress) as bar:
        for line in proc.stdout:
            if line.startswith("{"):
                item = json.loads(line)
                stages[item["stage"]] = item
                bar.set_postfix_str(f"{item['stage']}: {item.get('VmRSS', 0) / 2**20:.0f} MiB")
                bar.update()
        err = proc.stderr.read()
    if proc.returncode or set(stages) != set(STAGES):
        last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        raise HyflashError(f"running the bundle failed ({last[0][:200]}): check it with "
                           f"`hyflash simulate {bundle}`")
    return stages


if __name__ == "__main__":
    path, prompt, new, threads = sys.argv[1:5]
    child(path, int(prompt), int(new), int(threads))
