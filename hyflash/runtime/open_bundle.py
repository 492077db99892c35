"""Opening an exported bundle: its manifest names the runtime, and this picks the backend
(each backend module implements the protocols of ``backends``; this module is the one
place that knows all of them)."""

from __future__ import annotations


def open_bundle(folder, threads: int = 0):
    """-> (bundle, target, drafter) of an exported bundle, with the backends of the runtime
    its manifest names (``onnx``: ONNX Runtime; ``executorch``: executorch.runtime;
    ``coreml``: Core ML, macOS only)."""
    from hyflash.bundle import read_bundle

    backend = read_bundle(folder, verify_hashes=False).manifest.backend
    if backend == "coreml":  # Core ML predicts on macOS only: elsewhere one line says so
        from hyflash.runtime.coreml_backend import load_coreml_pair

        return load_coreml_pair(folder, threads=threads)
    if backend == "executorch":
        from hyflash.runtime.executorch_backend import load_executorch_pair

        return load_executorch_pair(folder, threads=threads)
    from hyflash.extras import require_onnx_extra
    from hyflash.runtime.onnx_backend import load_onnx_pair

    require_onnx_extra("running an ONNX bundle")
    return load_onnx_pair(folder, threads=threads)
