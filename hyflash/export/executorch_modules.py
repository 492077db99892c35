"""The modules an ExecuTorch program is exported from, built on the one model definition.

``ProgramTarget`` runs ``hyflash.models.target.Target``'s own modules (projections,
RMSNorm weights, MLPs, rope tables, and its static ``KVCache``, whose ``update`` writes
keys and values at the call's positions with ``index_copy_``; ExecuTorch's reinplace pass
turns that into an in-place ``index_put_`` on the mutable buffer, so no call copies the
cache). Only the glue between the modules is restated, in ops XNNPACK takes, because an
op XNNPACK does not take splits the graph into another delegate (the plain ``Target``
lowered to 69 XNNPACK partitions for the pocket model):

- the causal mask is one additive bias (0 / -inf) built once per call, instead of a
  ``masked_fill`` of ``~mask`` in every layer (``where`` and ``bitwise_not`` are not
  XNNPACK ops); adding -inf or 0 gives exactly the scores ``masked_fill`` gives;
- rotate-half is a matmul with a fixed signed permutation matrix instead of a ``cat`` of
  two slices of a dynamic shape (each output is one input times +-1 plus exact zeros);
- attention matmuls are 3-D ``bmm`` (batch 1): a 4-D ``@`` decomposes into
  ``expand_copy``, which XNNPACK does not take;
- RMSNorm's mean of squares is a matmul with a 1/D column (``mean`` over the last dim of
  a 3-D tensor is not an XNNPACK op);
- every reshape of a dynamic-length tensor names its length -1 (after an explicit
  ``contiguous``): XNNPACK takes a reshape with one inferred dim but no symbolic one, and
  each refused reshape split the graph (26 partitions -> 8 for the pocket target).

These change summation order only; the tests hold the program's logits and features to
``Target``'s and its greedy tokens to the torch reference's.

The target is lowered ONCE, as ``forward`` (what ExecuTorch's LLM runner calls; one
output). Lowering dominates export time (~20 s per dynamic-shape target method for the
pocket model at fp32, ~50 s at 8da4w, nearly all of it torch's symbolic-shape work in
ExecuTorch's and XNNPACK's graph passes), so the speculative loop does not get a second
copy of the target graph: ``forward`` also writes each position's tap features into a
small ring buffer (row ``position % rows``), and ``FeaturesMethod`` reads the rows of
the positions the last call wrote. Both methods wrap the SAME ``ProgramTarget`` under the
same attribute name, so their exported programs name the buffers (KV cache, feature
ring) identically and ExecuTorch's ``share_mutable_buffers`` places each once for the
whole program.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.models.target import Target


def rotate_half_matrix(d: int) -> torch.Tensor:
    """R with x @ R == cat([-x[..., d/2:], x[..., :d/2]]) (Target's ``apply_rope``)."""
    half = d // 2
    r = torch.zeros(d, d)
    idx = torch.arange(half)
    r[idx + half, idx] = -1.0
    r[idx, idx + half] = 1.0
    return r


class ProgramTarget(nn.Module):
    """The target with its static KV cache and a ring of the last ``rows`` positions' tap
    features as mutable buffers (batch 1). A call of T <= rows tokens leaves all T
    positions' features readable; a longer call (the stock runner's prefill) overwrites
    its own rows, harmlessly: only hyflash reads them, and it calls with T <= rows."""

    def __init__(self, target: Target, rows: int):
        super().__init__()
        cfg = target.cfg
        if target.cache_batch != 1 or target.cache_len != cfg.max_seq_len:
            target.setup_cache(1, dtype=torch.float32)
        self.target = target
        self.rows = rows
        self.register_buffer("features", torch.zeros(rows, cfg.feature_size), persistent=False)
        # as linear weights [out, in]: F.linear lowers to one XNNPACK fully-connected op
        self.register_buffer("rot_t", rotate_half_matrix(cfg.head_dim).T.contiguous(),
                             persistent=False)
        self.register_buffer("mean_row", torch.full((1, cfg.hidden_size), 1.0 / cfg.hidden_size),
                             persistent=False)
        self.register_buffer("key_pos", torch.arange(cfg.max_seq_len), persistent=False)

    def norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Target's RMSNorm (fp32), mean of squares as a matmul."""
        return norm.weight * (x / torch.sqrt(F.linear(x * x, self.mean_row) + norm.eps))

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + F.linear(x, self.rot_t) * sin

    def projections(self, attn, x, cos, sin):
        """q, k, v [1, heads, T, head_dim] of the layer's input, q and k normed (if the
        target does) and rotated."""
        c = attn.cfg
        q = attn.q_proj(x).view(1, -1, c.num_attention_heads, c.head_dim)
        k = attn.k_proj(x).view(1, -1, c.num_key_value_heads, c.head_dim)
        v = attn.v_proj(x).view(1, -1, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.norm(attn.q_norm, q), self.norm(attn.k_norm, k)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        return self.rope(q, cos, sin), self.rope(k, cos, sin), v

    def attention(self, attn, x, cos, sin, pos, bias):
        """Target's ``Attention.forward`` with a KV cache, as XNNPACK ops; bias [rep*T, S]."""
        c = attn.cfg
        q, k, v = self.projections(attn, x, cos, sin)
        keys, values = attn.kv_cache.update(pos, k, v)
        kvh, rep, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, \
            c.head_dim
        q = q.contiguous().view(kvh, -1, hd)  # query heads of a KV head stacked, as Target
        scores = torch.bmm(q, keys.view(kvh, -1, hd).transpose(1, 2)) * hd ** -0.5 + bias
        y = torch.bmm(torch.softmax(scores, dim=-1), values.view(kvh, -1, hd))  # [kvh, rep*t, hd]
        y = y.view(kvh, rep, -1, hd).permute(2, 0, 1, 3).contiguous()
        return attn.o_proj(y.view(1, -1, kvh * rep * hd))

    def call_mask(self, pos: torch.Tensor):
        """What every layer's attention takes besides its input: the additive causal bias
        [rep*T, S] of the call's positions pos [T]."""
        cfg = self.target.cfg
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        visible = self.key_pos[None, :] <= pos[:, None]
        return torch.zeros(visible.shape).masked_fill(~visible, float("-inf")).repeat(rep, 1)

    def ring_rows(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Ring rows of the call's positions input_pos[0] .. input_pos[0] + T - 1."""
        return (input_pos.reshape(()) + torch.arange(tokens.shape[1])) % self.rows

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [1, T] at positions input_pos[0].. -> logits [1, T, V]; writes the KV
        cache and the positions' tap features [T, F] into the ring."""
        logits, features = self.run(tokens, input_pos)
        self.features.index_copy_(0, self.ring_rows(tokens, input_pos), features[0])
        return logits

    def run(self, tokens: torch.Tensor, input_pos: torch.Tensor):
        """-> logits [1, T, V], tap features [1, T, F]; writes the KV cache (the Core ML
        export returns both, ``hyflash.export.coreml_modules``)."""
        tg, cfg = self.target, self.target.cfg
        t = tokens.shape[1]
        pos = input_pos.reshape(()) + torch.arange(t)
        cos, sin = tg.rope_cos[pos], tg.rope_sin[pos]
        bias = self.call_mask(pos)
        x = tg.embed_tokens(tokens)
        taps = []
        for i, layer in enumerate(tg.layers):
            x = x + self.attention(layer.self_attn, self.norm(layer.input_layernorm, x), cos,
                                   sin, pos, bias)
            x = x + layer.mlp(self.norm(layer.post_attention_layernorm, x))
            if i in cfg.tap_layers:
                taps.append(x)
        return tg.lm_head(self.norm(tg.norm, x)), torch.cat(taps, -1)


class ForwardMethod(nn.Module):
    """``forward(tokens [1, T], input_pos [1]) -> logits [1, T, V]``: the one output
    ExecuTorch's LLM runner accepts (and the speculative loop's prefill and verify)."""

    def __init__(self, core: ProgramTarget):
        super().__init__()
        self.core = core

    def forward(self, tokens, input_pos):
        return self.core(tokens, input_pos)


class FeaturesMethod(nn.Module):
    """``features(tokens [1, T], input_pos [1]) -> features [1, T, F]``: the tap features
    the last ``forward`` with the same arguments wrote (T <= the ring's rows; tokens only
    give T). Reads the ring, computes nothing."""

    def __init__(self, core: ProgramTarget):
        super().__init__()
        self.core = core

    def forward(self, tokens, input_pos):
        return self.core.features[self.core.ring_rows(tokens, input_pos)][None]


# ------------------------------------------------------- attention forms (ExecuTorch only)

class OperandKVCache(nn.Module):
    """The cache of ``CacheOperandTarget`` (batch 1): keys [kv_heads, S, head_dim] and
    values TRANSPOSED [kv_heads, head_dim, S], written by position like ``KVCache``."""

    def __init__(self, heads: int, max_seq_len: int, head_dim: int):
        super().__init__()
        self.register_buffer("k", torch.zeros(heads, max_seq_len, head_dim), persistent=False)
        self.register_buffer("v", torch.zeros(heads, head_dim, max_seq_len), persistent=False)

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v [1, kv_heads, T, head_dim] at positions pos [T]."""
        self.k.index_copy_(1, pos, k[0])
        self.v.index_copy_(2, pos, v[0].transpose(1, 2))
        return self.k, self.v


class CacheOperandTarget(ProgramTarget):
    """``ProgramTarget`` with the cache as the LEFT operand of both attention matmuls
    (XNNPACK packs a matmul's right operand at every call when it is not a constant: with
    the cache on the right, every call copied the whole cache twice, once by the reshape of
    the 4-D buffer and once by that packing). scores^T = K @ q^T and y^T = V^T @ P^T read
    the 3-D buffers in place; only the small q, P and y are transposed. Each output element
    is the same dot product in the same order whatever the number of query rows, so a
    verify row is still what a decode of that row computes."""

    def __init__(self, target: Target, rows: int):
        super().__init__(target, rows)
        c = target.cfg
        for layer in target.layers:
            layer.self_attn.kv_cache = OperandKVCache(c.num_key_value_heads, c.max_seq_len,
                                                      c.head_dim)

    def attention(self, attn, x, cos, sin, pos, bias):
        c = attn.cfg
        q, k, v = self.projections(attn, x, cos, sin)
        keys, values_t = attn.kv_cache.update(pos, k, v)
        kvh, rep, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, \
            c.head_dim
        q = q.contiguous().view(kvh, -1, hd)  # query heads of a KV head stacked, as Target
        scores = torch.bmm(keys, q.transpose(1, 2)).transpose(1, 2) * hd ** -0.5 + bias
        y = torch.bmm(values_t, torch.softmax(scores, dim=-1).transpose(1, 2))  # [kvh, hd, rep*t]
        y = y.transpose(1, 2).contiguous().view(kvh, rep, -1, hd).permute(2, 0, 1, 3)
        return attn.o_proj(y.contiguous().view(1, -1, kvh * rep * hd))


# the forms export_program takes (benchmarks/executorch_profile.py measures them; it adds
# ExecuTorch's custom-op attention, which is not row-exact and so never exported here)
ATTENTION_FORMS = {"operand": CacheOperandTarget, "bmm": ProgramTarget}
