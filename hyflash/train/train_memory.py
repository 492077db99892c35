"""Memory per GPU of a `hyflash train` job under torchrun, computed from the budget's shapes.

``hyflash/budget/`` sizes inference on a device (weights in a recipe's format, KV cache,
drafter state); training has other terms, so they are here, built on its ``TargetShape``
and ``DrafterShape`` parameter counts (no weights are read; any source ``hyflash budget``
reads works: a model folder, its config.json, a GGUF file, a preset). All float32, as
``hyflash train`` trains. Per GPU, N processes:

- drafter: trainable parameters x (4 weights + 4 gradients + 8 AdamW moments) bytes;
  ddp: whole on every GPU (gradients are DDP's bucket views, no second copy); fsdp: 1/N
  at rest, plus the whole drafter gathered with its gradients during a step (it is one
  FSDP unit, ``distributed.wrap``);
- the target's embedding and LM head: frozen, shared by the drafter, whole on every GPU
  (fsdp leaves them out of the sharding);
- target layers, when features are recomputed in the step: the decoder layers up to the
  last tap layer, frozen: whole (ddp), or 1/N plus one layer gathered (fsdp); none when
  features are cached (they come from disk);
- activations, an estimate of the largest tensors of a step with ``batch / N`` sequences
  of ``seq_len`` tokens on a GPU: the drafter's logits (anchors x (B-1) rows x vocabulary,
  x3: logits, log-softmax, gradient), the features (tokens x F), and with recompute one
  target layer's attention scores (heads x tokens x tokens; hyflash's eager attention).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hyflash.budget.shapes import DrafterShape, TargetShape
from hyflash.errors import HyflashError

F32 = 4


@dataclass(frozen=True)
class Line:
    label: str
    bytes: int
    formula: str


def layer_params(t: TargetShape) -> int:
    """One decoder layer: its projections and two norms (+ q/k norms, biases)."""
    per = sum(m.rows * m.cols for m in t.linears())
    return per + (t.small_params - t.hidden) // t.layers


def training_memory(t: TargetShape, d: DrafterShape, world: int, parallel: str,
                    recompute: bool, batch: int, anchors: int, seq_len: int,
                    taps: tuple[int, ...]) -> list[Line]:
    if batch % world:
        raise HyflashError(f"--batch {batch} does not split over {world} GPUs: pass a "
                           "--batch that --world divides")
    shard = world if parallel == "fsdp" else 1
    p = d.params
    lines = [Line("drafter weights + gradients + AdamW", 16 * p // shard,
                  f"{p / 1e6:.0f}M params x 16 B" + (f" / {world}" if shard > 1 else ""))]
    if shard > 1:
        lines.append(Line("drafter gathered for the step", 2 * F32 * p,
                          f"{p / 1e6:.0f}M params x 8 B (weights + gradients)"))
    heads = 1 if t.tied else 2
    lines.append(Line("target embedding + LM head (frozen)", heads * t.vocab * t.hidden * F32,
                      f"{heads} x {t.vocab} x {t.hidden} x 4 B"))
    if recompute:
        n, per = max(taps) + 1, layer_params(t)
        lines.append(Line(f"target layers 0..{n - 1} (frozen)", n * per * F32 // shard,
                          f"{n} x {per / 1e6:.0f}M params x 4 B" +
                          (f" / {world}" if shard > 1 else "")))
        if shard > 1:
            lines.append(Line("target layer, gathered", per * F32,
                              f"{per / 1e6:.0f}M params x 4 B"))
    rows = batch // world
    act = 3 * rows * anchors * (d.block - 1) * d.head_rows * F32 + rows * seq_len * \
        d.feature_size * F32
    formula = f"{rows} seq x ({anchors} x {d.block - 1} x {d.head_rows} x 4 B x 3 + " \
              f"{seq_len} x {d.feature_size} x 4 B)"
    if recompute:
        act += rows * t.heads * seq_len * seq_len * F32
        formula += f" + {rows} x {t.heads} x {seq_len}^2 x 4 B"
    lines.append(Line("activations (largest tensors, estimate)", act, formula))
    return lines


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def table(lines: list[Line]) -> str:
    rows = [f"| {x.label} | {gib(x.bytes)} | {x.formula} |" for x in lines]
    total = sum(x.bytes for x in lines)
    return "\n".join(["| per GPU | bytes | formula |", "|---|---|---|", *rows,
                      f"| **total** | **{gib(total)}** | |"])


def main(argv=None) -> int:
    from hyflash.argtypes import positive_int
    from hyflash.budget.sources import resolve
    from hyflash.models.target import default_tap_layers

    ap = argparse.ArgumentParser(prog="python -m hyflash.train.train_memory",
                                 description="memory per GPU of `hyflash train` under torchrun")
    ap.add_argument("source", help="a model folder, its config.json, a .gguf file or a preset")
    ap.add_argument("--world", type=positive_int, default=8, help="GPUs (torchrun processes)")
    ap.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--features", choices=("cache", "recompute"), default="recompute")
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--anchors", type=positive_int, default=16)
    ap.add_argument("--seq-len", type=positive_int, default=2048,
                    help="tokens of the longest sequence (prompt + continuation)")
    args = ap.parse_args(argv)
    try:
        t = resolve(args.source).target
        d = DrafterShape.default_for(t, "hyflash")
        lines = training_memory(t, d, args.world, args.parallel, args.features == "recompute",
                                args.batch, args.anchors, args.seq_len,
                                default_tap_layers(t.layers))
    except HyflashError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(table(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
