"""Recurrent memory kinds for the drafter's prefix-memory prior.

A memory absorbs context features as they leave the local window and is read by the
block's queries. Each kind offers the same computation in two forms:

- ``read_parallel``: for training, every query reads "the state it would have had"
  directly from all context keys with a decay mask. Exact, no loop over tokens.
- ``absorb`` / ``read_state``: for inference, a fixed-size state updated as features
  leave the window, so it can be explicit model I/O.

Both kinds keep the same state, linear attention with a learned per-head decay g:
``S <- g*S + phi(k) v^T``, ``z <- g*z + phi(k)``, read as ``phi(q) S / (phi(q) z)``.
They differ in how the block uses it (the two readings of "prefix memory"):

- ``decayed-linear``: each block query reads the state, and a learned per-head gate adds
  the read-out to the local attention output.
- ``prefix-slots``: M learned slot queries read the state; the read-outs become M extra
  keys/values (learned keys) that the block attends to inside the same softmax as the
  window, so attention itself decides how much to take from memory.
- ``recall``: ``decayed-linear`` whose state pairs each evicted feature's key with the
  value of the feature that FOLLOWED it, so a block query matching an old token reads
  what came next (an induction read of evicted context; issue 14's "memory write that
  keeps token identity": the target's early tap layer carries the token's identity).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MEMORY_KINDS = ("prefix-slots", "decayed-linear", "recall", "none")
DEFAULT_MEMORY = "prefix-slots"  # the better of the two readings on the pocket model (README)
EPS = 1e-6


def phi(x: torch.Tensor) -> torch.Tensor:
    """Positive feature map for linear attention."""
    return F.elu(x) + 1.0


class DecayedState(nn.Module):
    """Per-head decayed linear attention state [H, hd, hd] + normaliser [H, hd]."""

    slots = 0  # extra keys/values the kind adds to the block's attention
    successor = False  # values from the feature after each key's (recall)

    def __init__(self, heads: int, head_dim: int,
                 half_lives: tuple[float, float] = (16.0, 1024.0)):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        lo, hi = half_lives
        hl = torch.logspace(math.log10(lo), math.log10(hi), heads)
        g = torch.pow(2.0, -1.0 / hl)
        self.decay_logit = nn.Parameter(torch.log(g / (1 - g)))

    def log_decay(self) -> torch.Tensor:
        return F.logsigmoid(self.decay_logit)  # [H], log g in (-inf, 0)

    def read_parallel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      age: torch.Tensor) -> torch.Tensor:
        """q [N,H,Q,hd], k/v [N,H,K,hd] (pre-rope), age [N,Q,K]: steps since the key entered
        the memory (>= 0), negative where the key is not (yet) in memory."""
        w = phi(q) @ phi(k).transpose(-1, -2)  # [N, H, Q, K]
        decay = torch.exp(age.clamp(min=0).unsqueeze(1) * self.log_decay()[:, None, None])
        w = w * decay * (age >= 0).unsqueeze(1)
        return (w @ v) / (w.sum(-1, keepdim=True) + EPS)

    def empty_state(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        h, d = self.heads, self.head_dim
        return torch.zeros(h, d, d, dtype=dtype), torch.zeros(h, d, dtype=dtype)

    def absorb(self, S: torch.Tensor, z: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               steps: torch.Tensor, weight_exp: torch.Tensor, valid: torch.Tensor):
        """Absorb leaving keys k/v [H, N, hd]: S <- g^steps S + sum_i g^e_i phi(k_i) v_i^T
        over valid i, where e_i (weight_exp) counts the later absorptions."""
        ld = self.log_decay()  # [H]
        w = torch.exp(weight_exp[None, :] * ld[:, None]) * valid[None, :]  # [H, N]
        pk = phi(k) * w.unsqueeze(-1)
        carry = torch.exp(steps * ld)  # [H]
        S = carry[:, None, None] * S + pk.transpose(-1, -2) @ v
        z = carry[:, None] * z + pk.sum(1)
        return S, z

    def read_state(self, q: torch.Tensor, S: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """q [1,H,Q,hd], S [H,hd,hd], z [H,hd] -> [1,H,Q,hd]."""
        pq = phi(q)
        return (pq @ S) / ((pq @ z.unsqueeze(-1)) + EPS)


class GatedReadout(DecayedState):
    """decayed-linear: every block query reads the state; a gate mixes it in."""

    def __init__(self, heads: int, head_dim: int, hidden: int):
        super().__init__(heads, head_dim)
        self.gate = nn.Linear(hidden, heads)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def mix(self, x: torch.Tensor, local: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        """local, mem: [N, H, Q, hd]; x: the normed block input [N, Q, D]."""
        gate = torch.sigmoid(self.gate(x)).transpose(1, 2).unsqueeze(-1)  # [N, H, Q, 1]
        return local + gate * mem


class RecallReadout(GatedReadout):
    """recall: the gated read-out of a state that maps each evicted feature (key) to the
    feature after it (value)."""

    successor = True

    def read_parallel(self, q, k, v, age):
        """As the parent, with key j's value taken from context position j+1 (a key in
        memory is at least W+1 before the anchor, so its successor is context too)."""
        nxt = torch.cat([v[:, :, 1:], torch.zeros_like(v[:, :, :1])], dim=2)
        return super().read_parallel(q, k, nxt, age)


class PrefixSlots(DecayedState):
    """prefix-slots: M learned queries read the state into M keys/values for the block."""

    def __init__(self, heads: int, head_dim: int, slots: int = 4):
        super().__init__(heads, head_dim)
        self.slots = slots
        self.slot_q = nn.Parameter(torch.randn(heads, slots, head_dim) * 0.5)
        self.slot_k = nn.Parameter(torch.randn(heads, slots, head_dim) * head_dim ** -0.5)

    def slots_parallel(self, k: torch.Tensor, v: torch.Tensor, age: torch.Tensor):
        """k/v [N,H,K,hd], age [N,A,K] per anchor -> slot keys, values [N,H,A,M,hd]: what
        ``read_parallel`` gives the M slot queries of every anchor, without its [A*M, K]
        weights. The slot queries are the same for every anchor and only the decay differs,
        so the weights factor as phi(q_m).phi(k_j) [M, K] times decay [A, K]."""
        n, a = age.shape[:2]
        h, m, d = self.slot_q.shape
        w = phi(self.slot_q)[None] @ phi(k).transpose(-1, -2)  # [N, H, M, K]
        decay = torch.exp(age.clamp(min=0).unsqueeze(1) * self.log_decay()[:, None, None])
        decay = (decay * (age >= 0).unsqueeze(1)).to(w.dtype)  # [N, H, A, K]
        wv = (w.unsqueeze(-1) * v.unsqueeze(2)).transpose(2, 3).flatten(3)  # [N, H, K, M*hd]
        num = (decay @ wv).view(n, h, a, m, d)
        den = (decay @ w.transpose(-1, -2)).unsqueeze(-1)  # [N, H, A, M, 1]
        vals = num / (den + EPS)
        keys = self.slot_k[None, :, None].expand(n, h, a, m, d)
        return keys, vals

    def slots_state(self, S: torch.Tensor, z: torch.Tensor):
        """-> slot keys, values [1,H,M,hd] from the state."""
        return self.slot_k[None], self.read_state(self.slot_q[None], S, z)


def make_memory(kind: str, heads: int, head_dim: int, hidden: int) -> nn.Module | None:
    if kind == "none":
        return None
    if kind == "decayed-linear":
        return GatedReadout(heads, head_dim, hidden)
    if kind == "recall":
        return RecallReadout(heads, head_dim, hidden)
    if kind == "prefix-slots":
        return PrefixSlots(heads, head_dim)
    raise ValueError(f"unknown memory kind {kind!r}: choose one of {', '.join(MEMORY_KINDS)}")
