"""The speculative runtime: one engine, a minimal backend interface, lossless verification.

The torch engine here is the reference every exported backend (ONNX Runtime, ExecuTorch)
is tested against: a backend only has to implement the two small protocols in
``backends`` to plug into the same loop.
"""

from hyflash.runtime.backends import DrafterBackend, TargetBackend, TorchTarget
from hyflash.runtime.engine import Generation, SpeculativeEngine
from hyflash.runtime.sampling import Sampling
from hyflash.runtime.stats import GenerationStats, format_stats

__all__ = ["DrafterBackend", "Generation", "GenerationStats", "Sampling", "SpeculativeEngine",
           "TargetBackend", "TorchTarget", "format_stats"]
