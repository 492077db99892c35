"""The shapes the budget sizes: a target and a drafter as plain numbers, no weights, no torch.

A budget answers before any export, for models hyflash cannot even load yet (Gemma-3), so
it reads shapes, not modules: ``TargetShape`` from a ``TargetConfig`` (bundles, model
folders, GGUF files) or from any Hugging Face config.json that names the usual fields;
``DrafterShape`` from a ``DrafterConfig`` or from the drafter defaults for a target. Their
parameter counts and state sizes are formulas over those numbers; the tests pin them to
the real ``Target`` and ``Drafter`` modules built on the meta device.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from hyflash.errors import HyflashError

DEFAULT_TAPS = 3  # tap layers a drafter reads (hyflash.models.target.default_tap_layers)


@dataclass(frozen=True)
class Matrix:
    """A group of equally shaped weight matrices: ``count`` of [rows (out), cols (in)]."""

    name: str
    rows: int
    cols: int
    count: int = 1

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class TargetShape:
    name: str
    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    feature_size: int
    qkv_bias: bool = False
    qk_norm: bool = False
    max_context: int | None = None  # the model's own limit (max_position_embeddings)
    sliding_window: int = 0  # positions a sliding-window layer keeps (0: none)
    sliding_layers: int = 0  # layers with a sliding window (Gemma-3: 5 of every 6)
    exportable: bool = True  # hyflash.models.target can load and export it
    notes: tuple[str, ...] = field(default=())  # what the sizes approximate

    def linears(self) -> list[Matrix]:
        """The decoder layers' projections (what every quantization recipe quantizes)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.layers
        i = self.intermediate
        return [Matrix("q_proj", q, h, n), Matrix("k_proj", kv, h, n), Matrix("v_proj", kv, h, n),
                Matrix("o_proj", h, q, n), Matrix("gate_proj", i, h, n),
                Matrix("up_proj", i, h, n), Matrix("down_proj", h, i, n)]

    @property
    def small_params(self) -> int:
        """Norms and biases: kept in float32 by every recipe."""
        norms = self.layers * 2 * self.hidden + self.hidden
        qk = self.layers * 2 * self.head_dim if self.qk_norm else 0
        bias = (self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim
                if self.qkv_bias else 0)
        return norms + qk + bias

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return (sum(m.params for m in self.linears()) + self.vocab * self.hidden + head
                + self.small_params)

    def kv_positions(self, context: int) -> int:
        """Cached positions summed over layers: a sliding-window layer keeps at most its
        window, every other layer the whole context."""
        window = min(context, self.sliding_window) if self.sliding_window else context
        return (self.layers - self.sliding_layers) * context + self.sliding_layers * window

    def kv_bytes(self, context: int, dtype_bytes: int) -> int:
        """Keys and values of every layer: 2 x kv_heads x head_dim x bytes per position."""
        return 2 * self.kv_heads * self.head_dim * dtype_bytes * self.kv_positions(context)

    # ------------------------------------------------------------------ readers

    @classmethod
    def from_config(cls, cfg, name: str) -> TargetShape:
        """From hyflash's TargetConfig (a bundle's manifest, a model folder, a GGUF file)."""
        return cls(name=name, model_type=cfg.model_type, vocab=cfg.vocab_size,
                   hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                   layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                   kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                   tied=cfg.tie_word_embeddings, feature_size=cfg.feature_size,
                   qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm, max_context=cfg.max_seq_len)

    @classmethod
    def from_hf(cls, hf: dict, name: str, where: str) -> TargetShape:
        """From a Hugging Face config.json dict. A model hyflash supports goes through its
        own reader (TargetConfig.from_hf); any other decoder that names the usual fields
        is sized from them, and the shape says what that approximates."""
        from hyflash.models.folders import REQUIRED_SIZES, TargetLoadError
        from hyflash.models.target import TargetConfig

        missing = [k for k in REQUIRED_SIZES if not isinstance(hf.get(k), int) or hf[k] < 1]
        if missing:
            raise HyflashError(f"{where} lacks {', '.join(missing)} (or they are not positive "
                               "integers): pass the model's complete config.json")
        limit = hf.get("max_position_embeddings")
        try:
            cfg = TargetConfig.from_hf(hf, max_seq_len=None)
        except TargetLoadError as e:
            return cls.generic(hf, name, limit, str(e))
        return cls.from_config(cfg, name).with_limit(limit)

    def with_limit(self, limit) -> TargetShape:
        fields_ = {f.name: getattr(self, f.name) for f in fields(self)}
        return TargetShape(**{**fields_, "max_context": limit if isinstance(limit, int) else
                              self.max_context})

    @classmethod
    def generic(cls, hf: dict, name: str, limit, why: str) -> TargetShape:
        """A decoder hyflash cannot load (``why``), sized from its config's fields."""
        heads = hf["num_attention_heads"]
        kv = hf.get("num_key_value_heads") or heads
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        window, sliding = sliding_layers(hf)
        notes = [f"hyflash cannot export it ({why}); sized from config.json alone",
                 "norms beyond two per layer and any activation-specific weights are left out "
                 "(< 0.1% of the weights)"]
        if "tie_word_embeddings" not in hf:
            notes.append("tie_word_embeddings is not in the config: assumed tied")
        if sliding:
            notes.append(f"{sliding} of {hf['num_hidden_layers']} layers keep a sliding window "
                         f"of {window} positions in their KV cache")
        return cls(name=name, model_type=str(hf.get("model_type")), vocab=hf["vocab_size"],
                   hidden=hf["hidden_size"], intermediate=hf["intermediate_size"],
                   layers=hf["num_hidden_layers"], heads=heads, kv_heads=kv, head_dim=head_dim,
                   tied=bool(hf.get("tie_word_embeddings", True)),
                   feature_size=min(DEFAULT_TAPS, hf["num_hidden_layers"]) * hf["hidden_size"],
                   qkv_bias=bool(hf.get("attention_bias")),
                   qk_norm=str(hf.get("model_type", "")).startswith(("qwen3", "gemma3")),
                   max_context=limit if isinstance(limit, int) else None,
                   sliding_window=window, sliding_layers=sliding, exportable=False,
                   notes=tuple(notes))


def sliding_layers(hf: dict) -> tuple[int, int]:
    """(window, layers with it) from ``layer_types`` or ``sliding_window_pattern`` (every
    pattern-th layer is global, Gemma-3's convention); (0, 0) without a sliding window."""
    window = hf.get("sliding_window")
    if not isinstance(window, int) or window < 1 or hf.get("use_sliding_window") is False:
        return 0, 0
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return window, sum(t == "sliding_attention" for t in types)
    pattern = hf.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        return window, n - n // pattern
    return window, n  # every layer slides (Mistral)


@dataclass(frozen=True)
class DrafterShape:
    """A drafter as the budget sizes it. ``arch`` hyflash: window + fixed memory state;
    full: the same network attending to the whole context (its window is the context)."""

    arch: str
    layers: int
    heads: int
    hidden: int
    intermediate: int
    feature_size: int
    vocab: int
    block: int
    window: int
    memory: str
    draft_vocab: int = 0
    window_cache: str = "kv"
    slots: int = 4  # prefix-slot memory's slot queries (hyflash.models.memory.PrefixSlots)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def head_rows(self) -> int:
        """Rows its LM head scores: the draft vocabulary, or the target's whole one."""
        return self.draft_vocab or self.vocab

    def linears(self) -> list[Matrix]:
        h, n, i = self.hidden, self.layers, self.intermediate
        out = [Matrix("fc", h, self.feature_size), Matrix("q_proj", h, h, n),
               Matrix("k_proj", h, h, n), Matrix("v_proj", h, h, n), Matrix("o_proj", h, h, n),
               Matrix("gate_proj", i, h, n), Matrix("up_proj", i, h, n),
               Matrix("down_proj", h, i, n)]
        if self.memory in ("decayed-linear", "recall"):
            out.append(Matrix("memory.gate", self.heads, h, n))
        return out

    @property
    def small_params(self) -> int:
        """Norms, the mask embedding and the memory's scalars and slots (float32)."""
        h, n = self.hidden, self.layers
        memory = 0
        if self.memory == "prefix-slots":
            memory = n * (self.heads + 2 * self.heads * self.slots * self.head_dim)
        elif self.memory in ("decayed-linear", "recall"):
            memory = n * (self.heads + self.heads)  # decay logits + gate bias
        return 2 * n * h + 3 * h + memory  # per-layer norms; fc_norm, norm, mask_embed

    @property
    def params(self) -> int:
        """Trainable parameters (the embedding and LM head are the target's)."""
        return sum(m.params for m in self.linears()) + self.small_params

    def state_bytes(self, context: int, dtype_bytes: int = 4) -> int:
        """The step-form state: window (per-layer K and V, or fused features), the count
        (int64) and per-layer memory S [heads, hd, hd] + z [heads, hd]. A full-context
        drafter's window is the whole context."""
        window = context if self.arch == "full" else self.window
        rows = window * self.hidden
        win = 2 * self.layers * rows if self.window_cache == "kv" else rows
        memory = 0
        if self.arch == "hyflash" and self.memory != "none":
            memory = self.layers * self.heads * (self.head_dim ** 2 + self.head_dim)
        return (win + memory) * dtype_bytes + 8

    @classmethod
    def from_config(cls, cfg, window_cache: str = "kv") -> DrafterShape:
        return cls(arch=cfg.arch, layers=cfg.num_layers, heads=cfg.num_heads,
                   hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                   feature_size=cfg.feature_size, vocab=cfg.vocab_size, block=cfg.block_size,
                   window=cfg.window, memory=cfg.memory, draft_vocab=cfg.draft_vocab,
                   window_cache=window_cache)

    @classmethod
    def default_for(cls, t: TargetShape, arch: str) -> DrafterShape:
        """What ``hyflash train --arch ARCH`` builds for target t by default (the
        DrafterConfig field defaults, read from the dataclass, not repeated here)."""
        from hyflash.models.drafter import DrafterConfig

        d = {f.name: f.default for f in fields(DrafterConfig) if f.default is not MISSING}
        heads = d["num_heads"] if t.hidden % d["num_heads"] == 0 else math.gcd(t.hidden, 8)
        return cls(arch=arch, layers=d["num_layers"], heads=heads, hidden=t.hidden,
                   intermediate=t.intermediate, feature_size=t.feature_size, vocab=t.vocab,
                   block=d["block_size"], window=d["window"],
                   memory=d["memory"] if arch == "hyflash" else "none")

    def as_arch(self, arch: str) -> DrafterShape:
        """The same network as the other architecture (the baseline HyFlash is compared to)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if arch == "full":
            values["memory"] = "none"
        elif self.arch == "full":
            from hyflash.models.memory import DEFAULT_MEMORY

            values["memory"] = DEFAULT_MEMORY
        return DrafterShape(**{**values, "arch": arch})
