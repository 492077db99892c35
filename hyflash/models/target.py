"""The target: one export-friendly decoder for the Llama family.

Covers Llama (including Llama-3 rope scaling), Mistral / SmolLM (plain Llama), Qwen2
(q/k/v bias) and Qwen3 (per-head q/k RMSNorm), tied or untied embeddings, GQA.

``forward(tokens, start_pos)`` returns logits for every position and the *features*:
the hidden states after the tap layers, concatenated per token. That is what the
drafter conditions on. With a static KV cache set up (``setup_cache``), keys and values
are written at ``start_pos .. start_pos+T-1``; rolling back is just calling forward
again at an earlier ``start_pos``: stale entries beyond it are masked and overwritten.
Without a cache, forward is a plain causal pass (used to compute training features).

No data-dependent Python control flow runs in forward, so torch.export can trace it.
Module names mirror Hugging Face's, so a checkpoint's state dict loads one to one.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.models.folders import (
    TargetLoadError,
    check_shapes,
    load_safetensors,
    read_hf_config,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_SCALING = (None, "default", "llama3", "linear")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_seq_len: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    tap_layers: tuple[int, ...] = ()
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        self.tap_layers = tuple(self.tap_layers) or default_tap_layers(self.num_hidden_layers)
        bad = [i for i in self.tap_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise TargetLoadError(
                f"tap layers {bad} out of range: the model has {self.num_hidden_layers} "
                f"layers (0..{self.num_hidden_layers - 1})"
            )
        self.eos_token_ids = tuple(self.eos_token_ids)

    @property
    def feature_size(self) -> int:
        return len(self.tap_layers) * self.hidden_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TargetConfig:
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict, max_seq_len: int | None = None,
                tap_layers: tuple[int, ...] = ()) -> TargetConfig:
        """Translate a Hugging Face config.json dict."""
        mt = hf.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise TargetLoadError(
                f"unsupported model_type {mt!r}: supported are {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        rs = hf.get("rope_scaling")
        kind = None if rs is None else rs.get("rope_type", rs.get("type"))
        if kind not in SUPPORTED_ROPE_SCALING:
            raise TargetLoadError(
                f"unsupported rope_scaling type {kind!r}: supported are llama3, linear or none"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise TargetLoadError(f"unsupported hidden_act {hf['hidden_act']!r}: only silu")
        if hf.get("mlp_bias"):
            raise TargetLoadError("unsupported mlp_bias=true: only bias-free MLPs")
        heads = hf["num_attention_heads"]
        kv_heads = hf.get("num_key_value_heads") or heads
        if heads % kv_heads or (not hf.get("head_dim") and hf["hidden_size"] % heads):
            raise TargetLoadError(
                f"inconsistent config: {heads} attention heads over {kv_heads} kv heads and "
                f"hidden size {hf['hidden_size']} do not divide; restore config.json from the "
                "model's source")
        limit = context_length(hf, max_seq_len)
        eos = hf.get("eos_token_id")
        eos = () if eos is None else (tuple(eos) if isinstance(eos, list) else (eos,))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_seq_len=limit,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=hf.get("rope_theta", 10000.0),
            rope_scaling=None if kind in (None, "default") else dict(rs),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=mt == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=mt == "qwen3",
            tap_layers=tuple(tap_layers),
            model_type=mt,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos,
        )


def context_length(hf: dict, max_seq_len: int | None) -> int:
    """The static cache length: max_seq_len if given and the model supports it, else the
    model's own limit (max_position_embeddings, sliding window) capped at 4096 tokens."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
    limits = [(hf.get("max_position_embeddings"), "max_position_embeddings"),
              (window, "sliding window")]
    if max_seq_len is None:
        return min([DEFAULT_MAX_SEQ_LEN] + [n for n, _ in limits if n])
    if max_seq_len < 1:
        raise TargetLoadError(f"max_seq_len must be >= 1, got {max_seq_len}")
    for n, what in limits:
        if n and max_seq_len > n:
            raise TargetLoadError(f"a context of {max_seq_len} tokens is above the {n} the model "
                                  f"supports (its {what}): pass --max-seq-len <= {n}")
    return max_seq_len


def default_tap_layers(n_layers: int, k: int = 3) -> tuple[int, ...]:
    """k layers spread over depth, skipping the embedding-like first and the last layer."""
    if n_layers <= k:
        return tuple(range(n_layers))
    lo, hi = 1, n_layers - 2
    return tuple(sorted({round(lo + (hi - lo) * i / (k - 1)) for i in range(k)}))


# -------------------------------------------------------------------------- layers

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt(...) rather than x * rsqrt(...): the exported graph then matches ONNX
        # Runtime's SimplifiedLayerNormalization fusion (one node instead of six per norm)
        dtype = x.dtype
        x = x.float()
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling["factor"]
    if kind == "linear":
        return inv / factor
    # llama3: keep high frequencies, divide low ones by factor, blend in between
    lo_f, hi_f = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old_ctx / wavelen - lo_f) / (hi_f - lo_f)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > old_ctx / lo_f, inv / factor, blended)
    return torch.where(wavelen < old_ctx / hi_f, inv, out)


def rope_tables(cfg: TargetConfig) -> tuple[torch.Tensor, torch.Tensor]:
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    ang = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; cos/sin: [T, D] (Hugging Face's rotate-half convention)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rot * sin).to(x.dtype)


class KVCache(nn.Module):
    """Static per-layer cache [B, kv_heads, max_seq_len, head_dim], written by position."""

    def __init__(self, batch: int, heads: int, max_seq_len: int, head_dim: int, dtype):
        super().__init__()
        shape = (batch, heads, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.k.index_copy_(2, pos, k.to(self.k.dtype))
        self.v.index_copy_(2, pos, v.to(self.v.dtype))
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.kv_cache: KVCache | None = None
        self.fused = False  # set by fused_attention()

    def forward(self, x, cos, sin, pos, mask, past=None, fresh=False):
        """-> (output, (k, v) the keys/values attended to: past + new, or the cache).
        fresh: write the cache but attend only to the new keys (a prefill at 0)."""
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat([past[0], k.to(past[0].dtype)], dim=2)
            v = torch.cat([past[1], v.to(past[1].dtype)], dim=2)
        elif self.kv_cache is not None:
            written = self.kv_cache.update(pos, k, v)
            if not fresh:
                k, v = written
        present = (k, v)
        if self.fused and t > 1:
            y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                               enable_gqa=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, -1)), present
        # GQA without copying the cache: the query heads sharing a KV head are stacked
        # along the query axis, so each KV head is read once (no repeat, no broadcast copy)
        rep = c.num_attention_heads // c.num_key_value_heads
        q = q.reshape(b, c.num_key_value_heads, rep * t, c.head_dim)
        scores = (q @ k.to(q.dtype).transpose(-1, -2)) * c.head_dim ** -0.5
        scores = scores.masked_fill(~mask.repeat(rep, 1), float("-inf"))
        y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v.to(q.dtype)
        y = y.unflatten(2, (rep, t)).permute(0, 3, 1, 2, 4)  # [b, t, kv heads, rep, hd]
        return self.o_proj(y.reshape(b, t, -1)), present


class MLP(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, pos, mask, past=None, fresh=False):
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, pos, mask, past, fresh)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


# --------------------------------------------------------------------------- model

class Target(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.cache_batch = 0

    def setup_cache(self, batch: int = 1, dtype: torch.dtype | None = None,
                    max_len: int | None = None) -> None:
        """Allocate the static KV cache; forward then reads and writes it by position.
        max_len: positions it holds (default max_seq_len); every call attends over all of
        them, so a batch that needs fewer (data generation) runs faster with fewer."""
        c = self.cfg
        dtype = dtype or self.embed_tokens.weight.dtype
        length = max_len or c.max_seq_len
        for layer in self.layers:
            layer.self_attn.kv_cache = KVCache(batch, c.num_key_value_heads, length,
                                               c.head_dim, dtype)
        self.cache_batch, self.cache_len = batch, length

    @contextlib.contextmanager
    def fused_attention(self):
        """Within it, calls of more than one token attend through torch's fused
        scaled_dot_product_attention instead of the explicit scores / mask / softmax
        (single-token decode steps stay explicit: faster there). For the data passes
        (prefill chunks and the causal feature pass), where the explicit form spends most of
        its time writing and re-reading the score tensor: measured by
        benchmarks/data_gen_speed.py. Outside it the model computes exactly what every
        exported graph computes, so the runtime's parity and losslessness are untouched."""
        layers = [layer.self_attn for layer in self.layers]
        before = [a.fused for a in layers]
        for a in layers:
            a.fused = True
        try:
            yield self
        finally:
            for a, was in zip(layers, before, strict=True):
                a.fused = was

    def drop_cache(self) -> None:
        for layer in self.layers:
            layer.self_attn.kv_cache = None
        self.cache_batch = 0

    def forward(self, tokens: torch.Tensor, start_pos: torch.Tensor | int = 0,
                last_logits: bool = False):
        """tokens [B, T] at positions start_pos.. -> (logits [B, T, V], features [B, T, F]);
        last_logits: logits of the last position only ([B, 1, V]), for callers that only
        pick the next token (the LM head over T positions is a fifth of a long prefill)."""
        t = tokens.shape[1]
        start = torch.as_tensor(start_pos, dtype=torch.long).reshape(())
        pos = start + torch.arange(t, dtype=torch.long)
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        if self.cache_batch:
            keys = torch.arange(self.cache_len, dtype=torch.long)
        else:
            keys = pos
        mask = keys[None, :] <= pos[:, None]
        logits, features, _ = self.run_layers(tokens, cos, sin, pos, mask,
                                              last_logits=last_logits)
        return logits, features

    def prefill(self, tokens: torch.Tensor):
        """forward(tokens, 0), but attending only to the T prompt keys instead of the whole
        static cache: same result, far cheaper for long prompts in eager torch."""
        t = tokens.shape[1]
        pos = torch.arange(t, dtype=torch.long)
        mask = pos[None, :] <= pos[:, None]
        logits, features, _ = self.run_layers(tokens, self.rope_cos[:t], self.rope_sin[:t],
                                              pos, mask, fresh=True)
        return logits, features

    def forward_past(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     past: list[tuple[torch.Tensor, torch.Tensor]],
                     attention_mask: torch.Tensor | None = None):
        """Explicit-KV form, as optimum's ONNX models do it: past k/v [1, kv_heads, P,
        head_dim] per layer in, present [1, kv_heads, P+T, head_dim] out. Keys are at
        positions 0..P+T-1; attention_mask [1, P+T] can mask some out.
        -> (logits [1,T,V], features [1,T,F], presents)."""
        pos = position_ids[0]
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        keys = torch.arange(past[0][0].shape[2] + input_ids.shape[1], dtype=torch.long)
        mask = keys[None, :] <= pos[:, None]
        if attention_mask is not None:
            mask = mask & attention_mask[0].bool()[None, :]
        return self.run_layers(input_ids, cos, sin, pos, mask, past)

    def run_layers(self, tokens, cos, sin, pos, mask, past=None, fresh=False,
                   last_logits=False):
        x = self.embed_tokens(tokens)
        taps, presents = [], []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, cos, sin, pos, mask, None if past is None else past[i],
                               fresh)
            presents.append(present)
            if i in self.cfg.tap_layers:
                taps.append(x)
        logits = self.lm_head(self.norm(x[:, -1:] if last_logits else x))
        return logits, torch.cat(taps, dim=-1), presents

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, *, dtype: str = "float32",
                        max_seq_len: int | None = None,
                        tap_layers: tuple[int, ...] = ()) -> Target:
        """Load a Hugging Face model folder (or hub id) with safetensors weights."""
        if dtype not in DTYPES:
            raise TargetLoadError(f"unsupported dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        folder = resolve_model_folder(path_or_id)
        cfg = TargetConfig.from_hf(read_hf_config(folder), max_seq_len, tap_layers)
        state = load_safetensors(folder)
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device="cpu")
        state = {k.removeprefix("model."): v for k, v in state.items()}
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        check_shapes(model, state, folder, "the config and the weights come from "
                     "different models: restore config.json", TargetLoadError)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
        unexpected = [k for k in unexpected if "rotary_emb" not in k]
        if missing or unexpected:
            raise TargetLoadError(
                f"weights in {folder} do not match a {cfg.model_type} model: "
                f"missing {missing[:3]}, unexpected {unexpected[:3]}; the weights are "
                "incomplete or from another model: re-download or re-save the model"
            )
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        return model.cast(DTYPES[dtype]).eval()

    def cast(self, dtype: torch.dtype) -> Target:
        """Cast weights; rope tables stay float32 (positions up to max_seq_len need it)."""
        self.to(dtype)
        self.rope_cos, self.rope_sin = rope_tables(self.cfg)
        return self


def resolve_model_folder(path_or_id: str | Path) -> Path:
    """A local folder, a ``.gguf`` file (converted once into a cached folder), the keyword
    ``pocket`` (the embedded model), or a hub id."""
    if str(path_or_id) == "pocket":
        from hyflash.models import pocket

        return pocket.path()
    p = Path(path_or_id)
    if p.is_dir():
        return p
    if p.suffix.lower() == ".gguf":
        from hyflash.models.gguf import gguf_folder

        return gguf_folder(p)
    if p.exists() or str(path_or_id).startswith((".", "/", "~")) or str(path_or_id).count("/") != 1:
        raise TargetLoadError(f"no model folder at {path_or_id}: pass a Hugging Face model "
                              "folder (config.json + *.safetensors), a .gguf file or a hub id "
                              "like org/name")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path_or_id),
                                      allow_patterns=["*.json", "*.safetensors", "*.model",
                                                      "*.txt"]))
    except Exception as e:  # network, auth, missing repo: all end the same way for the user
        raise TargetLoadError(f"could not fetch hub model {path_or_id}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from e
