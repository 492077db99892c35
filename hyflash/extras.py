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
