"""Target features for training: cached with the data, or recomputed in the training step.

Caching is free while generating (the target computes them anyway) and makes a training
step cheap, but it costs F x 2 bytes per token on disk: 3.4 KiB for SmolLM2-135M (7.7 GiB
for its 4096-sequence run), 24 KiB for an 8B target with 4096-wide layers, i.e. 38 GiB for
the default 2048 continuations of ~810 tokens. Past ``CACHE_LIMIT`` the training step
instead runs the frozen target over the batch (up to its last tap layer, no LM head, no KV
cache) and the data keeps tokens only. ``--features auto`` decides from
``cache_estimate``; ``cache`` and ``recompute`` override it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from hyflash.train.folders import human_bytes

FEATURE_MODES = ("auto", "cache", "recompute")
# The compute precision of the causal feature pass. bfloat16 runs the target's matmuls on
# AMX / AVX-512-BF16 where the CPU has them; on this machine's Xeon it is about 1.7x faster
# than float32 for SmolLM2-135M, its features within ~0.8% (relative L2); the greedy labels
# come from float32 logits either way (benchmarks/precision_speed.py measures all three).
PRECISIONS = ("float32", "bfloat16")
CACHE_LIMIT = 16 * 2**30  # bytes of cached features; above it, recompute


def expected_tokens(spec) -> float:
    """Tokens with features in a data set of this DataSpec (mean prompt + continuation)."""
    short = sum(spec.short_prompt) / 2
    long = sum(spec.long_prompt) / 2
    prompt = spec.long_fraction * long + (1 - spec.long_fraction) * short
    return spec.sequences * (prompt + spec.gen_len - 1)


def cache_estimate(spec, feature_size: int) -> int:
    """Bytes the cached features would take (float16)."""
    return int(expected_tokens(spec) * feature_size * 2)


def choose(mode: str, spec, feature_size: int) -> tuple[bool, str]:
    """-> (recompute?, the line that says why)."""
    est = cache_estimate(spec, feature_size)
    size = f"{feature_size * 2} B/token x {expected_tokens(spec):,.0f} tokens = " \
           f"{human_bytes(est)}"
    if mode == "cache":
        return False, f"features: cached with the data ({size}; --features cache)"
    if mode == "recompute":
        return True, f"features: recomputed in each training step (--features recompute; " \
                     f"caching them would take {size})"
    if est > CACHE_LIMIT:
        return True, (f"features: recomputed in each training step (caching them would take "
                      f"{size} > {human_bytes(CACHE_LIMIT)}; --features cache to cache anyway)")
    return False, f"features: cached with the data ({size} <= {human_bytes(CACHE_LIMIT)})"


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX): without it
    torch emulates bf16 matmuls, ~50x slower than float32 (an AVX2-only EPYC here: 1.3 vs
    68 GFLOP/s, one core). Reads the CPU flags; without that file (macOS) True."""
    try:
        words = set(cpuinfo.read_text().split())
    except OSError:
        return True
    return bool(words & {"avx512_bf16", "amx_bf16"})


def autocast(precision: str, device_type: str):
    """The context a pass runs in (the feature pass, the drafter's training step):
    nothing for float32, bf16 autocast otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16)


@torch.no_grad()
def target_features(target, tokens: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """tokens [N, T] -> the target's tap features [N, T, F] (float32), as generation
    computes them, by a causal pass from position 0 without a KV cache; layers after the
    last tap layer and the LM head are skipped. Padding after a sequence's end changes
    nothing before it (causal). precision: as ``features_and_greedy``'s, whose features
    these equal (the same layers, the same arithmetic)."""
    with autocast(precision, tokens.device.type):
        return causal_pass(target, tokens, greedy=False)[0]


@torch.no_grad()
def features_and_greedy(target, tokens: torch.Tensor,
                        precision: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N, T] -> (features [N, T, F] float32, greedy [N, T] int64): the same pass
    run through every layer and the LM head, greedy[:, j] being the target's argmax after
    tokens 0..j. These are the drafter's labels wherever the data's text is not the
    target's own greedy continuation (a prompt): see ``loop.block_labels``. precision:
    the pass's compute precision (``PRECISIONS``); the results are float32 either way."""
    with autocast(precision, tokens.device.type):
        return causal_pass(target, tokens, greedy=True)


GREEDY_ROWS = 256  # LM-head rows per chunk: 256 x 49152 fp32 logits = 48 MiB


def causal_layers(target, x: torch.Tensor, first: int, stop: int, taps=()):
    """x [N, T, D], the input of layer ``first`` at positions 0..T-1 -> (the output of
    layer stop - 1, [the outputs of the layers in taps]): layers first..stop-1 in one
    causal pass without a KV cache, through fused attention (T x T scores never
    materialised)."""
    if target.cache_batch:  # a cache left by generation would be written, and read
        target.drop_cache()
    pos = torch.arange(x.shape[1], device=x.device)
    cos, sin = target.rope_cos[pos], target.rope_sin[pos]
    mask = pos[None, :] <= pos[:, None]
    kept = []
    with target.fused_attention():
        for i in range(first, stop):
            x, _ = target.layers[i](x, cos, sin, pos, mask)
            if i in taps:
                kept.append(x)
    return x, kept


def causal_pass(target, tokens: torch.Tensor, greedy: bool):
    cfg = target.cfg
    last = len(target.layers) - 1 if greedy else max(cfg.tap_layers)
    x, taps = causal_layers(target, target.embed_tokens(tokens), 0, last + 1, cfg.tap_layers)
    feats = torch.cat(taps, dim=-1).float()
    if not greedy:
        return feats, None
    rows = x.reshape(-1, x.shape[-1]).float()
    with torch.autocast(tokens.device.type, enabled=False):  # labels from float32 logits
        arg = torch.cat([target.lm_head(target.norm(rows[a:a + GREEDY_ROWS])).argmax(-1)
                         for a in range(0, rows.shape[0], GREEDY_ROWS)])
    return feats, arg.view(tokens.shape)
