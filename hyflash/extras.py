"""Optional extras: say which `pip install` a command needs before it fails on an import."""

from __future__ import annotations

from importlib.util import find_spec

from hyflash.errors import HyflashError


def require_onnx_extra(what: str) -> None:
    """onnx, onnxruntime and onnxscript are the optional `onnx` extra."""
    missing = [m for m in ("onnx", "onnxruntime", "onnxscript") if find_spec(m) is None]
    if missing:
        raise HyflashError(f"{what} needs the onnx extra ({', '.join(missing)} missing): "
                           "pip install 'hyflash[onnx]'")


def require_coreml_extra(what: str) -> None:
    """coremltools is the optional `coreml` extra (it converts and reads .mlpackage files on
    any OS; only macOS can predict with them)."""
    if find_spec("coremltools") is None:
        raise HyflashError(f"{what} needs the coreml extra (coremltools missing): "
                           "pip install 'hyflash[coreml]'")
