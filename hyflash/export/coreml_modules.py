"""The torch modules a Core ML export converts, built on the one model definition.

``TargetForCoreML`` is ExecuTorch's ``ProgramTarget`` (``Target``'s own projections, norms,
MLPs and rope tables, with the glue written once for export: an additive causal mask,
3-D ``bmm`` attention, rotate-half as a matmul), returning the logits AND the tap
features of the call: a Core ML model may have several outputs, so no feature ring is
needed. Only the KV cache differs, in two forms of the same computation:

- ``state`` (iOS 18): each layer's keys and values are buffers that coremltools turns into
  Core ML states (``ct.StateType``, float16), read and updated inside the model;
- ``io`` (iOS 17, no states): the same buffers are inputs ``past_key_values_N_key/value``
  and come back as outputs ``present_N_key/value``, full length, the call's rows written.

Both write the cache with a slice assignment at the call's start position
(``SliceKVCache``). ``Target``'s ``KVCache`` writes with ``index_copy_``, which coremltools
9 does not convert (nor the ``index_put`` it decomposes to with several positions along
one axis); a slice whose start is a runtime value becomes ``slice_update``, the op Core ML
updates a state with in place (Apple's stateful-model recipe). The start is read with
``.item()`` and bounded with ``torch._check`` so ``torch.export`` can trace it.

Core ML computes in float16 (max 65504), and RMSNorm's mean of squares overflows it as
soon as an activation passes 256: SmolLM2-135M's residual stream reaches ~24000 (its first
tokens' "massive activations"), and a float16 run of the plain glue in torch agreed with
the float32 argmax on 1 of 64 positions (benchmarks/coreml_sizes.py measures the peaks).
So every RMSNorm of both packages is computed on x / max|x| (``rms_norm_fp16``): the same
value in exact arithmetic, squares <= 1 in float16.

The drafter is exported as for ONNX (``DrafterStep``, ``DrafterCommit``): every window and
memory tensor already is an explicit input and output of fixed shape. Its RMSNorm modules
are swapped for the float16-safe form (``safe_norms``).
"""

from __future__ import annotations

import torch
from torch import nn

from hyflash.export.executorch_modules import ProgramTarget
from hyflash.models.target import RMSNorm, Target

TINY = 2.0 ** -14  # float16's smallest normal: floor of the per-row scale


def rms_norm_fp16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps), computed on y = x / s with s = max|x| per row:
    y / sqrt(mean(y^2) + eps / s^2) is the same value, and y^2 <= 1 cannot overflow in
    float16 (eps / s^2 may become 0 or inf: then the row is large, or all zero)."""
    s = x.abs().amax(-1, keepdim=True).clamp(min=TINY)
    y = x / s
    return weight * (y / torch.sqrt((y * y).mean(-1, keepdim=True) + eps / (s * s)))


class SafeRMSNorm(nn.Module):
    """An RMSNorm of the model computed by ``rms_norm_fp16`` (same weight, same eps)."""

    def __init__(self, norm: RMSNorm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_fp16(x, self.weight, self.eps)


def safe_norms(model: nn.Module) -> nn.Module:
    """model with every RMSNorm computed in the float16-safe form (in place)."""
    for name, child in list(model.named_children()):
        if isinstance(child, RMSNorm):
            setattr(model, name, SafeRMSNorm(child))
        else:
            safe_norms(child)
    return model


class SliceKVCache(nn.Module):
    """One layer's static cache [1, kv_heads, max_seq_len, head_dim], written by slice.
    As buffers (``state``) the write is in place; bound to graph inputs (``io``) it is a
    functional ``slice_scatter`` whose result is the layer's present output."""

    def __init__(self, shape: tuple[int, ...], as_state: bool):
        super().__init__()
        self.as_state = as_state
        if as_state:
            self.register_buffer("key", torch.zeros(shape), persistent=False)
            self.register_buffer("value", torch.zeros(shape), persistent=False)

    def bind(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """io form: the cache of this call is the graph's past inputs."""
        self.key, self.value = key, value

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        t = k.shape[2]
        start = pos[0].item()
        torch._check(start >= 0)
        torch._check(start + t <= self.key.shape[2])
        if self.as_state:
            self.key[:, :, start:start + t] = k
            self.value[:, :, start:start + t] = v
        else:
            self.key = self.key.slice_scatter(k, 2, start, start + t)
            self.value = self.value.slice_scatter(v, 2, start, start + t)
        return self.key, self.value


class TargetForCoreML(ProgramTarget):
    """``forward(tokens [1, T], input_pos [1]) -> logits [1, T, V], features [1, T, F]``,
    the KV cache as states (``kv="state"``); with ``kv="io"`` the caches are extra inputs
    after ``input_pos`` and extra outputs after ``features`` (layer by layer, key then
    value). Replaces the target's caches: the target is the export's own copy."""

    def __init__(self, target: Target, kv: str):
        super().__init__(target, rows=1)  # the ring is unused: a constant Core ML drops
        cfg = target.cfg
        shape = (1, cfg.num_key_value_heads, cfg.max_seq_len, cfg.head_dim)
        self.kv = kv
        for layer in target.layers:
            layer.self_attn.kv_cache = SliceKVCache(shape, kv == "state")

    def norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_fp16(x, norm.weight, norm.eps)

    def caches(self) -> list[SliceKVCache]:
        return [layer.self_attn.kv_cache for layer in self.target.layers]

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, *kv: torch.Tensor):
        if self.kv == "state":
            return self.run(tokens, input_pos)
        for i, cache in enumerate(self.caches()):
            cache.bind(kv[2 * i], kv[2 * i + 1])
        logits, features = self.run(tokens, input_pos)
        return (logits, features, *(t for c in self.caches() for t in (c.key, c.value)))
