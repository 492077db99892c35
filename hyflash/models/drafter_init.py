"""Start a drafter from the target's own weights instead of random ones.

``--init target``: drafter layer i (of L) takes the weights of target decoder layer
N-L+i (the last L layers, the ones nearest the LM head the drafter shares): RMSNorms, the
MLP, and q/o projections as they are; the target's grouped keys/values (kv_heads < heads)
are widened to one key/value head per query head by repeating each kv head for the query
heads that share it (query head h reads kv head h // (heads / kv_heads)), so each drafter
head starts as the target head it copies. The final norm is the target's. The context
projection ``fc``, the mask embedding and the memory stay random: the target has nothing
of their shape.

This needs the drafter's heads to match the target's (``--heads`` = the target's query
heads, so head_dim agrees) and a Llama-style attention (no q/k norm, no q/k/v bias):
anything else is a clear error, not a silent partial copy.

``--init DIR``: every weight of a drafter trained earlier for the same target, draft
vocabulary included, to train it further (on more data, or for more steps in a later
session, whose disk may not hold the first run's checkpoint). Its config must equal the
one the flags ask for; a difference names the flag to change. The one difference allowed is
more layers (``--layers`` above DIR's): DIR's layers keep their weights and the new ones
go on top, each starting as the identity (its attention output and MLP down projections
zero, so the residual stream passes through unchanged and the grown drafter drafts exactly
what DIR drafts until training moves them).
"""

from __future__ import annotations

import torch

from hyflash.errors import HyflashError

INITS = ("random", "target")
FLAGS = {"num_layers": "--layers", "num_heads": "--heads", "block_size": "--block-size",
         "window": "--window", "memory": "--memory", "arch": "--arch",
         "draft_vocab": "--draft-vocab", "max_seq_len": "--max-seq-len"}


def check_target_init(drafter, target) -> None:
    """Raise HyflashError unless ``init_from_target`` can copy target into drafter."""
    d, t = drafter.cfg, target.cfg
    problems = []
    if d.hidden_size != t.hidden_size or d.intermediate_size != t.intermediate_size:
        problems.append(f"the drafter's hidden/intermediate sizes {d.hidden_size}/"
                        f"{d.intermediate_size} differ from the target's {t.hidden_size}/"
                        f"{t.intermediate_size}")
    if d.num_heads != t.num_attention_heads:
        problems.append(f"--heads {d.num_heads} differs from the target's "
                        f"{t.num_attention_heads} attention heads (use --heads "
                        f"{t.num_attention_heads})")
    if t.qkv_bias or t.qk_norm:
        problems.append("the target's attention has q/k/v biases or q/k norms, which the "
                        "drafter's layers do not")
    if d.num_layers > t.num_hidden_layers:
        problems.append(f"{d.num_layers} drafter layers but the target has only "
                        f"{t.num_hidden_layers}")
    if problems:
        raise HyflashError("--init target: " + "; ".join(problems))


def widen_kv(weight: torch.Tensor, kv_heads: int, heads: int) -> torch.Tensor:
    """[kv_heads*hd, D] grouped projection -> [heads*hd, D], kv head j repeated for the
    heads/kv_heads query heads that read it (in order)."""
    hd = weight.shape[0] // kv_heads
    rep = heads // kv_heads
    return weight.view(kv_heads, 1, hd, -1).expand(kv_heads, rep, hd, weight.shape[1]) \
        .reshape(heads * hd, -1)


@torch.no_grad()
def init_from_target(drafter, target) -> list[int]:
    """Copy the target's last layers into the drafter (see the module doc); -> the target
    layer indices copied, in drafter order."""
    check_target_init(drafter, target)
    t = target.cfg
    first = t.num_hidden_layers - drafter.cfg.num_layers
    copied = list(range(first, t.num_hidden_layers))
    for layer, i in zip(drafter.layers, copied, strict=True):
        src = target.layers[i]
        a = src.self_attn
        layer.input_layernorm.load_state_dict(src.input_layernorm.state_dict())
        layer.post_attention_layernorm.load_state_dict(src.post_attention_layernorm.state_dict())
        layer.mlp.load_state_dict(src.mlp.state_dict())
        layer.q_proj.weight.copy_(a.q_proj.weight)
        layer.o_proj.weight.copy_(a.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(a, name).weight
            getattr(layer, name).weight.copy_(widen_kv(w, t.num_key_value_heads,
                                                       t.num_attention_heads))
    drafter.norm.load_state_dict(target.norm.state_dict())
    return copied


def init_from_drafter(drafter, folder, target):
    """The drafter saved in folder, loaded onto target (its dtype) to train on, if its config
    is the one drafter (built from the flags) has; else a HyflashError naming the flags."""
    from hyflash.models.drafter_folder import load_drafter, read_drafter_config

    folder, cfg, _ = read_drafter_config(folder)
    grow = drafter.cfg.num_layers > cfg.num_layers
    diff = [f"{FLAGS.get(k, k)} {getattr(drafter.cfg, k)!r} here, {v!r} there"
            + (" (more layers than that grow it; fewer cannot)" if k == "num_layers" else "")
            for k, v in vars(cfg).items()
            if getattr(drafter.cfg, k) != v and not (grow and k == "num_layers")]
    if diff:
        raise HyflashError(f"--init {folder}: that drafter's shape differs from this run's "
                           f"({'; '.join(diff)}): pass its values")
    trained = load_drafter(folder, target)
    if grow:
        grow_layers(drafter, trained)
        return drafter.to(trained.embed_tokens.weight.dtype).train()
    return trained.train()


@torch.no_grad()
def grow_layers(drafter, trained) -> None:
    """Copy trained (fewer layers, else the same shape) into drafter: every weight, its
    layers as drafter's first ones; drafter's further layers start as the identity."""
    missing, unexpected = drafter.load_state_dict(trained.state_dict(), strict=False)
    new = tuple(f"layers.{i}." for i in range(trained.cfg.num_layers, drafter.cfg.num_layers))
    if unexpected or any(not k.startswith(new) for k in missing):
        raise HyflashError(f"cannot grow the drafter: unmatched weights {unexpected[:3]} "
                           f"{[k for k in missing if not k.startswith(new)][:3]}")
    for layer in drafter.layers[trained.cfg.num_layers:]:
        layer.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
