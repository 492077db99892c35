"""The HyFlash drafter: a parallel block drafter with a prefix-memory prior.

One pass drafts a whole block ``[anchor, MASK, ..., MASK]`` (block size B) conditioned on
the target's *context features* (its tap-layer hidden states of committed tokens,
projected by ``fc``). Each layer's block queries attend, non-causally, to

- the last W context features (the local window) and the block itself, and
- a recurrent memory that absorbed the features older than the window (``memory.py``):
  read by a few learned slot queries into extra keys/values of the same softmax
  (``prefix-slots``, the default) or by every query and mixed in by a learned per-head
  gate (``decayed-linear``).

So draft-side memory is bounded: window + state, whatever the context length. The
full-context baseline is the same code with W = max_seq_len and no memory.

Two execution forms of the same weights:

- ``forward(tokens, features, anchors)``: parallel, for training. Many anchors per
  sequence in one pass: each anchor's window gathered, memory read-outs for all anchors at once.
- ``commit(state, features, n_valid)`` + ``draft(state, anchor)``: step, for inference.
  All state is fixed-shape tensors (``init_state``), so it can be explicit model I/O.
  The window holds either each layer's keys/values of the last W context features
  (``window_cache = "kv"``, the default: a draft computes K/V for the new rows only) or
  the fused features themselves (``"features"``: a quarter of the bytes for two layers,
  but every draft recomputes the window's K/V). Same weights, same outputs.

The drafter shares the target's token embedding and LM head and never trains them. With
a reduced draft vocabulary (``draft_vocab`` > 0, ``draft_vocab.py``) it scores only the
rows of that LM head for the target's most frequent tokens.
Position p's anchor has context features 0..p-1 and predicts tokens p+1..p+B-1.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.errors import HyflashError
from hyflash.models.draft_vocab import DraftHead, check_draft_vocab
from hyflash.models.memory import DEFAULT_MEMORY, MEMORY_KINDS, make_memory
from hyflash.models.target import MLP, RMSNorm, Target, TargetConfig, apply_rope

ARCHS = ("hyflash", "full")
# step-form window layouts -> what the window state holds (recorded in bundle manifests)
WINDOW_CACHES = {"kv": "per-layer keys and values (pre-rope) of the last W context features",
                 "features": "fused context features; each call derives per-layer K/V"}
FORMAT_VERSION = 2  # the newest drafter folder this reads: 1 float weights (what ``save``
# writes), 2 int8 rows too (``drafter_store.pack_rows``: the shipping form)
FLOAT_FORMAT = 1


@dataclass
class DrafterConfig:
    vocab_size: int
    hidden_size: int
    feature_size: int
    intermediate_size: int
    max_seq_len: int
    num_layers: int = 2
    num_heads: int = 8
    block_size: int = 8
    window: int = 64
    memory: str = DEFAULT_MEMORY
    arch: str = "hyflash"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tap_layers: tuple[int, ...] = field(default_factory=tuple)
    draft_vocab: int = 0  # token ids the drafter scores; 0 = the target's whole vocabulary

    def __post_init__(self):
        self.tap_layers = tuple(self.tap_layers)
        check_draft_vocab(self.draft_vocab, self.vocab_size)
        if self.arch not in ARCHS:
            raise HyflashError(f"unknown drafter arch {self.arch!r}: choose hyflash or full")
        if self.memory not in MEMORY_KINDS:
            raise HyflashError(f"unknown memory kind {self.memory!r}: choose one of "
                               f"{', '.join(MEMORY_KINDS)}")
        if not 1 <= self.num_layers <= 4:
            raise HyflashError(f"num_layers {self.num_layers} out of range: use 1..4")
        if self.hidden_size % self.num_heads:
            raise HyflashError(f"hidden size {self.hidden_size} is not divisible by "
                               f"{self.num_heads} heads")
        if not 2 <= self.block_size <= self.max_seq_len // 2:
            raise HyflashError(f"block size {self.block_size} must be in 2..{self.max_seq_len // 2}"
                               f" (half the context {self.max_seq_len})")
        if self.block_size > self.window:
            raise HyflashError(f"window {self.window} must hold at least one block "
                               f"({self.block_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict:
        """JSON-ready: what drafter folders, bundle manifests and checkpoints record."""
        return {**asdict(self), "tap_layers": list(self.tap_layers)}

    @property
    def commit_size(self) -> int:
        """Rows per step-form commit: one verify round commits at most B features."""
        return self.block_size

    @classmethod
    def for_target(cls, t: TargetConfig, arch: str = "hyflash", **kw) -> DrafterConfig:
        """A drafter sized for target t; ``full`` = window over the whole context, no memory."""
        max_seq = kw.pop("max_seq_len", t.max_seq_len)
        if arch == "full":
            kw.update(window=max_seq, memory="none")
        return cls(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                   feature_size=t.feature_size, intermediate_size=t.intermediate_size,
                   max_seq_len=max_seq, rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta,
                   tap_layers=t.tap_layers, arch=arch, **kw)


def rope_at(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N,1,S,D] for integer positions pos [N,S] (any position, no table); computed
    once per pass and shared by every layer's queries and keys."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = pos.to(torch.float32)[..., None] * inv
    ang = torch.cat([ang, ang], -1)[:, None]
    return ang.cos(), ang.sin()


def check_window_cache(name: str) -> None:
    if name not in WINDOW_CACHES:
        raise HyflashError(f"unknown window cache {name!r}: choose {' or '.join(WINDOW_CACHES)}")


def state_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype the step-form state is kept in."""
    return next(v.dtype for k, v in state.items() if k != "count")


@dataclass
class AnchorMemory:
    """How the parallel form reads one layer's memory: every anchor's "state it would have
    had", from the layer's pre-rope context keys/values k, v [N,H,T,hd] and each anchor's
    ages of them, age [N,A,T] (steps since the key entered memory; < 0: not yet absorbed).
    The layer sees the anchors as a batch of N*A blocks."""
    k: torch.Tensor
    v: torch.Tensor
    age: torch.Tensor

    def read(self, memory, q, k, v):
        """Gated read-out: q [N*A,H,B,hd] of the block queries -> [N*A,H,B,hd]."""
        n, a = self.age.shape[:2]
        _, h, b, d = q.shape
        qq = q.view(n, a, h, b, d).transpose(1, 2).reshape(n, h, a * b, d)
        o = memory.read_parallel(qq, self.k, self.v, self.age.repeat_interleave(b, dim=1))
        return o.view(n, h, a, b, d).transpose(1, 2).reshape(n * a, h, b, d)

    def slots(self, memory, k, v, queries: int):
        n, a = self.age.shape[:2]
        ks, vs = memory.slots_parallel(self.k, self.v, self.age)  # [N,H,A,M,hd]
        filled = self.age[..., 0] >= 0  # anything left the window (position 0 first)
        mask = filled.reshape(n * a, 1, 1).expand(n * a, queries, memory.slots)
        return ks.transpose(1, 2).flatten(0, 1), vs.transpose(1, 2).flatten(0, 1), mask


@dataclass
class StateMemory:
    """How a step reads memory: from the fixed-size state of one layer."""
    S: torch.Tensor
    z: torch.Tensor
    filled: torch.Tensor  # [1] bool: has anything left the window yet?

    def read(self, memory, q, k, v):
        return memory.read_state(q, self.S, self.z)

    def slots(self, memory, k, v, queries: int):
        ks, vs = memory.slots_state(self.S, self.z)
        return ks, vs, self.filled.view(1, 1, 1).expand(1, queries, memory.slots)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked attention. bf16 on the CPU (training under autocast) computes at float32:
    torch's bf16 CPU kernel took 154 ms for the forward + backward of the windowed
    training shape (256 blocks x 8 heads, 8 queries, 76 keys) against 41 ms at float32."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        with torch.autocast("cpu", enabled=False):  # autocast would cast back to bf16
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        return o.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.memory = make_memory(cfg.memory, cfg.num_heads, cfg.head_dim, d)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        return x.view(n, s, self.cfg.num_heads, self.cfg.head_dim).transpose(1, 2)

    def kv_rows(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-rope keys and values of context features [..., K, D] -> [..., K, D]."""
        return self.k_proj(ctx), self.v_proj(ctx)

    def context_kv(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-rope keys and values of context features [N, K, D] -> [N, H, K, hd]."""
        k, v = self.kv_rows(ctx)
        return self.heads(k), self.heads(v)

    def forward(self, h, h_rope, kc, vc, ctx_rope, mask, mem):
        """h [N,Q,D] block states; kc/vc [N,H,K,hd] pre-rope context keys and values;
        h_rope / ctx_rope: ``rope_at`` of the block's and the context's positions;
        mask [N,Q,K+Q]; mem: an AnchorMemory, a StateMemory, or None (memory off)."""
        x = self.input_layernorm(h)
        q = self.heads(self.q_proj(x))
        kb, vb = self.context_kv(x)
        k = torch.cat([apply_rope(kc, *ctx_rope), apply_rope(kb, *h_rope)], dim=2)
        v = torch.cat([vc, vb], dim=2)
        memory = self.memory if mem is not None else None
        if memory is not None and memory.slots:  # prefix slots join the softmax
            ks, vs, slot_mask = mem.slots(memory, kc, vc, mask.shape[1])
            k, v = torch.cat([k, ks], dim=2), torch.cat([v, vs], dim=2)
            mask = torch.cat([mask, slot_mask], dim=-1)
        o = attend(apply_rope(q, *h_rope), k, v, mask[:, None])
        if memory is not None and not memory.slots:  # gated read-out beside attention
            o = memory.mix(x, o, mem.read(memory, q, kc, vc))
        n, _, s, _ = o.shape
        h = h + self.o_proj(o.transpose(1, 2).reshape(n, s, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.fc_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mask_embed = nn.Parameter(torch.randn(cfg.hidden_size) * 0.02)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # shared with the target, frozen, and never saved with the drafter
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        for p in (*embed_tokens.parameters(), *lm_head.parameters()):
            p.requires_grad_(False)
        self.draft_head = DraftHead(lm_head, cfg.draft_vocab) if cfg.draft_vocab else None
        self.memory_off = False  # ablation switch: zero the memory read-out at inference
        self.window_cache = "kv"  # step-form window layout: per-layer "kv" or "features"

    @classmethod
    def for_target(cls, target: Target, arch: str = "hyflash", **kw) -> Drafter:
        cfg = DrafterConfig.for_target(target.cfg, arch, **kw)
        return cls(cfg, target.embed_tokens, target.lm_head)

    def block_input(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[..] anchor ids -> [.., B, D]: the anchor embedding then B-1 mask embeddings."""
        a = self.embed_tokens(anchor_tokens).unsqueeze(-2)
        m = self.mask_embed.to(a.dtype).expand(*a.shape[:-2], self.cfg.block_size - 1, -1)
        return torch.cat([a, m], dim=-2)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the drafter's output vocabulary: the draft vocabulary if it has
        one ([..., Vd]), else the target's ([..., V])."""
        x = self.norm(h)
        return self.lm_head(x) if self.draft_head is None else self.draft_head(x)

    def label_space(self, labels: torch.Tensor) -> torch.Tensor:
        """Token ids -> indices into ``head``'s output (-1: outside the draft vocabulary)."""
        return labels if self.draft_head is None else self.draft_head.labels(labels)

    # ---------------------------------------------------------------- parallel form

    def forward(self, tokens: torch.Tensor, features: torch.Tensor,
                anchors: torch.Tensor) -> torch.Tensor:
        """tokens [N,T], features [N,T,F], anchors [N,A] -> logits [N,A,B-1,V] (V: the
        output vocabulary of ``head``; compare with ``label_space`` of the labels).

        A window shorter than the sequence: each anchor's block attends to its own W
        context rows (gathered) and reads the memory (``AnchorMemory``), anchors batched
        as in the step form. Otherwise (full-context, or short sequences, where nothing
        has left the window and the memory is empty): every block attends to all earlier
        context rows of its sequence through one masked attention."""
        bsz = self.cfg.block_size
        n, t = tokens.shape
        a = anchors.shape[1]
        ctx = self.fc_norm(self.fc(features))
        h = self.block_input(tokens.gather(1, anchors))  # [N, A, B, D]
        h_pos = anchors[..., None] + torch.arange(bsz)  # [N, A, B]
        if self.cfg.window < t:
            h = self.windowed(h, h_pos, ctx, anchors)
        else:
            h = self.whole_context(h.flatten(1, 2), h_pos.flatten(1), ctx, anchors)
        return self.head(h.view(n, a, bsz, -1)[:, :, 1:])

    def windowed(self, h, h_pos, ctx, anchors):
        bsz, w = self.cfg.block_size, self.cfg.window
        n, a = anchors.shape
        rows = anchors[..., None] - w + torch.arange(w)  # [N, A, W] each anchor's window
        ok = (rows >= 0).view(n * a, 1, w)
        rows = rows.clamp(min=0)
        mask = torch.cat([ok.expand(-1, bsz, -1), ok.new_ones(n * a, bsz, bsz)], dim=-1)
        age = anchors[..., None] - w - 1 - torch.arange(ctx.shape[1])  # [N, A, T]
        h = h.flatten(0, 1)  # [N*A, B, D]
        h_rope, win_rope = self.rope_at(h_pos.flatten(0, 1)), self.rope_at(rows.flatten(0, 1))
        batch = torch.arange(n)[:, None, None]
        for layer in self.layers:
            kc, vc = layer.context_kv(ctx)  # [N, H, T, hd]
            kw, vw = (x.transpose(1, 2)[batch, rows].flatten(0, 1).transpose(1, 2)
                      for x in (kc, vc))  # [N*A, H, W, hd]
            mem = None if self.memory_off or layer.memory is None else AnchorMemory(kc, vc, age)
            h = layer(h, h_rope, kw, vw, win_rope, mask, mem)
        return h

    def whole_context(self, h, h_pos, ctx, anchors):
        bsz = self.cfg.block_size
        n, t = ctx.shape[:2]
        a = anchors.shape[1]
        p = anchors.repeat_interleave(bsz, dim=1)  # [N, A*B] anchor of each query
        j = torch.arange(t)
        ctx_ok = j < p[..., None]
        aid = torch.arange(a).repeat_interleave(bsz)
        blk_ok = (aid[:, None] == aid[None, :]).expand(n, -1, -1)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1)
        h_rope, ctx_rope = self.rope_at(h_pos), self.rope_at(j.expand(n, t))
        for layer in self.layers:
            h = layer(h, h_rope, *layer.context_kv(ctx), ctx_rope, mask, None)
        return h

    def rope_at(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_at(pos, self.cfg.head_dim, self.cfg.rope_theta)

    # -------------------------------------------------------------------- step form

    def init_state(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Fixed-shape state: the window (per-layer K/V or fused features, see
        ``window_cache``), the committed count, and per-layer memory."""
        cfg = self.cfg
        check_window_cache(self.window_cache)
        w, d, n_layers = cfg.window, cfg.hidden_size, cfg.num_layers
        if self.window_cache == "kv":
            state = {"window_k": torch.zeros(n_layers, w, d, dtype=dtype),
                     "window_v": torch.zeros(n_layers, w, d, dtype=dtype)}
        else:
            state = {"window": torch.zeros(w, d, dtype=dtype)}
        state["count"] = torch.zeros(1, dtype=torch.long)
        mems = [layer.memory.empty_state(dtype) for layer in self.layers if layer.memory]
        if mems:
            state["memory_S"] = torch.stack([s for s, _ in mems])
            state["memory_z"] = torch.stack([z for _, z in mems])
        return state

    def window_kv(self, state: dict[str, torch.Tensor], li: int, rows: slice | None = None):
        """Layer li's pre-rope keys/values [R, D] of window rows (all by default)."""
        rows = rows or slice(None)
        if "window" in state:
            k, v = self.layers[li].kv_rows(state["window"][rows][None])
            return k[0], v[0]
        return state["window_k"][li][rows], state["window_v"][li][rows]

    def commit(self, state: dict[str, torch.Tensor], features: torch.Tensor,
               n_valid: torch.Tensor | int) -> dict[str, torch.Tensor]:
        """Absorb the first n_valid rows of features [N,F] (N <= window): they join the
        window; the rows that leave it enter the memory."""
        cfg = self.cfg
        count = state["count"]
        n = torch.as_tensor(n_valid, dtype=torch.long).reshape(1)
        rows = features.shape[0]
        if rows > cfg.window:
            raise HyflashError(f"commit of {rows} rows exceeds the window ({cfg.window}); "
                               "commit in chunks")
        dtype = state_dtype(state)
        # projections see 3-D inputs throughout the step form: they export as MatMul,
        # the op ONNX Runtime's int4/int8 quantizers rewrite (a 2-D Linear becomes Gemm)
        new = self.fc_norm(self.fc(features[None].to(self.fc.weight.dtype)))[0].to(dtype)
        keep = torch.arange(cfg.window) + n  # rows of [window; new] that stay

        out = {}
        if "window" in state:
            out["window"] = torch.cat([state["window"], new], dim=0)[keep]
        else:
            ks, vs = [], []
            for li, layer in enumerate(self.layers):  # new rows' K/V join each layer's window
                k, v = layer.kv_rows(new[None])
                ks.append(torch.cat([state["window_k"][li], k[0].to(dtype)])[keep])
                vs.append(torch.cat([state["window_v"][li], v[0].to(dtype)])[keep])
            out["window_k"], out["window_v"] = torch.stack(ks), torch.stack(vs)
        out["count"] = count + n
        if "memory_S" in state:
            i = torch.arange(rows)
            valid = ((i < n) & (count - cfg.window + i >= 0)).to(dtype)
            weight_exp = (n - 1 - i).to(dtype)
            steps = n.to(dtype)
            S_all, z_all = [], []
            for li, layer in enumerate(self.layers):
                k, v = self.window_kv(state, li, slice(0, rows))  # the rows that leave
                if layer.memory.successor:  # recall: the value of the row after each
                    v_new = layer.kv_rows(new[None])[1][0].to(dtype)
                    v = torch.cat([self.window_kv(state, li)[1], v_new])[1:rows + 1]
                heads = (rows, cfg.num_heads, cfg.head_dim)
                S, z = layer.memory.absorb(state["memory_S"][li], state["memory_z"][li],
                                           k.view(heads).transpose(0, 1),
                                           v.view(heads).transpose(0, 1),
                                           steps, weight_exp, valid)
                S_all.append(S)
                z_all.append(z)
            out["memory_S"] = torch.stack(S_all)
            out["memory_z"] = torch.stack(z_all)
        return out

    def draft(self, state: dict[str, torch.Tensor], anchor: torch.Tensor) -> torch.Tensor:
        """anchor token [1] at position count -> block logits [B-1, V] over the target's
        whole vocabulary (-inf outside a draft vocabulary)."""
        cfg, bsz = self.cfg, self.cfg.block_size
        count = state["count"]
        dtype = state_dtype(state)
        h = self.block_input(anchor.reshape(1)).reshape(1, bsz, -1).to(dtype)
        h_pos = (count + torch.arange(bsz))[None]
        ctx_pos = (count - cfg.window + torch.arange(cfg.window))[None]
        ctx_ok = (ctx_pos >= 0)[:, None, :].expand(1, bsz, cfg.window)
        mask = torch.cat([ctx_ok, torch.ones(1, bsz, bsz, dtype=torch.bool)], dim=-1)
        h_rope, ctx_rope = self.rope_at(h_pos), self.rope_at(ctx_pos)
        for li, layer in enumerate(self.layers):
            mem = None
            if "memory_S" in state and not self.memory_off:
                mem = StateMemory(state["memory_S"][li], state["memory_z"][li],
                                  count - cfg.window - 1 >= 0)
            k, v = self.window_kv(state, li)
            h = layer(h, h_rope, layer.heads(k[None]), layer.heads(v[None]), ctx_rope, mask,
                      mem)
        logits = self.head(h[:, 1:])[0]  # 3-D: exports as MatMul, which int4/int8 quantize
        return logits if self.draft_head is None else self.draft_head.to_full(logits)

    def state_bytes(self, dtype_bytes: int = 4) -> int:
        """Draft-side memory: every state tensor, whatever the context length."""
        return sum(t.numel() * (8 if t.dtype == torch.long else dtype_bytes)
                   for t in self.init_state().values())

    # --------------------------------------------------------------- save / load

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What a drafter folder saves: everything but what derives from the target."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(DERIVED)}

    def save(self, folder: Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FLOAT_FORMAT, "config": self.cfg.to_dict(), **(extra or {})}
        (folder / "config.json").write_text(json.dumps(meta, indent=1))
        save_file({k: v.contiguous() for k, v in self.trainable_state().items()},
                  folder / "model.safetensors")


DERIVED = ("embed_tokens.", "lm_head.", "draft_head.proj.")  # the target's weights


class DrafterStep(nn.Module):
    """Commit + draft in one call with every state tensor an explicit input and output
    (the exported drafter graph). Inputs: anchor [1] int64, features [N, F] (N = the
    config's commit_size, zero-padded), n_valid [1] int64, then the state tensors in
    ``state_names`` order; outputs: logits [B-1, V], then the new state, same order."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter
        self.state_names = list(drafter.init_state())

    def forward(self, anchor, features, n_valid, *state):
        st = self.drafter.commit(dict(zip(self.state_names, state, strict=True)), features,
                                 n_valid)
        logits = self.drafter.draft(st, anchor)
        return (logits, *(st[k] for k in self.state_names))
