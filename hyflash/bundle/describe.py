"""A bundle's manifest, readably: what `hyflash inspect` (and `hyflash export`) print."""

from __future__ import annotations

import re

from hyflash.bundle import FORMAT_VERSION, Bundle
from hyflash.bundle.records import KV_FORMS, TensorSpec

MIB = 2 ** 20


def describe(bundle: Bundle) -> str:
    m = bundle.manifest
    t, d = m.target.config, m.drafter.config
    version = f"format {m.format_version}" + (f", read as {FORMAT_VERSION}"
                                              if m.format_version < FORMAT_VERSION else "")
    step = m.models.get("drafter_step")
    rows = [
        ("bundle", f"{bundle.folder} ({version}, hyflash {m.hyflash_version}, backend "
                   f"{m.backend})"),
        ("target", f"{t.model_type}, {t.num_hidden_layers} layers, hidden {t.hidden_size}, "
                   f"vocab {t.vocab_size}  ({m.target.source})"),
        ("drafter", f"{d.arch}, {d.num_layers} layers, block {m.block_size}, window "
                    f"{m.window}, window cache {m.drafter.window_cache} "
                    f"({m.drafter.window_holds}), memory {d.memory}"),
        ("tap layers -> features", f"{list(m.tap_layers)} -> {t.feature_size}"),
        ("max context", m.max_context),
        ("quantization", quantization(m)),
        ("KV cache", f"{KV_FORMS[m.kv_cache.form]}, {m.kv_cache.dtype}, "
                     f"{m.kv_bytes_per_token} B/token, "
                     f"{m.kv_bytes_per_token * m.max_context / MIB:.1f} MiB at max context"),
        ("drafter state", f"{m.state_bytes / 1024:.1f} KiB ({m.state_bytes} B) fixed state, any "
                          "context length: " + ", ".join(f"{s.name} {list(s.shape)} {s.dtype}"
                                                         for s in m.drafter.state)),
    ]
    if step is not None and step.commit_rows:
        buffer = step.commit_rows * t.feature_size * 4
        rows.append(("commit buffer", f"{buffer / 1024:.1f} KiB more while running: up to "
                                      f"{step.commit_rows} feature rows x {t.feature_size} "
                                      "float32 wait for the next drafter call (`simulate` "
                                      "counts state + buffer)"))
    rows.append(("tokenizer", ", ".join(m.tokenizer_files) or "-"))
    for role, c in m.models.items():
        ins = ", ".join(f"{s.name}{list(s.shape)}" for s in compact(c.inputs))
        outs = ", ".join(f"{s.name}{list(s.shape)}" for s in compact(c.outputs))
        size = m.file_bytes(c.file) / MIB
        method = f" {c.method}" if c.method else ""
        rows.append((f"{role} ({c.file}{method}, {size:.1f} MiB)", f"{ins} -> {outs}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def compact(specs: tuple[TensorSpec, ...]) -> list[TensorSpec]:
    """Fold per-layer KV entries (past_key_values.N.key ...) into one line each."""
    out, seen = [], set()
    for s in specs:
        parts = re.fullmatch(r"(.+?)[._](\d+)[._](key|value)", s.name)  # . ONNX, _ Core ML
        if parts:
            key = f"{parts[1]}.*.{parts[3]}"
            if key in seen:
                continue
            seen.add(key)
            s = TensorSpec(key, s.shape, s.dtype)
        out.append(s)
    return out


def quantization(m) -> str:
    """The recipe, the target's weights, and its activations and pad row where recorded."""
    target = m.quantization.graphs.get("target", {})
    parts = [target.get("weights", "")]
    if target.get("accuracy_level"):
        parts.append(f"activations {target['activations']}")
    if (rows := m.quantization.min_rows()) > 1:
        parts.append(f"one-token calls run as {rows} rows (a pad row, so "
                     "that a decode computes what a verify row does)")
    return f"{m.quantization.recipe}: " + "; ".join(p for p in parts if p)
