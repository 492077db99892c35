"""`--sweep-context`: resident memory against context, HyFlash vs full-context vs no drafter.

The point of the prefix-memory prior in one picture: the HyFlash drafter's state is a
constant, the full-context drafter's grows with every token (on top of the target's own KV
cache, which all three pay), and the device limits are drawn in.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hyflash.budget.devices import GIB, Device
from hyflash.budget.memory import Plan, budget
from hyflash.budget.plan import variants

STYLE = {"HyFlash drafter": ("tab:orange", "-"), "full-context drafter": ("tab:red", "--"),
         "no drafter": ("tab:gray", ":")}
LIMIT_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:cyan", "tab:olive",
                "tab:pink")


def contexts(p: Plan) -> list[int]:
    """Powers of two from 256 up to the model's limit (at most 128k), plus the plan's own."""
    top = min(p.target.max_context or p.context, 131072)
    out, c = [], 256
    while c <= top:
        out.append(c)
        c *= 2
    return sorted(set(out + [p.context]))


def sweep(p: Plan) -> dict[str, list[tuple[int, int]]]:
    """Resident bytes per variant and context."""
    need = (p.drafter.window + p.drafter.block) if p.drafter else 1
    xs = [c for c in contexts(p) if c >= need]
    out: dict[str, list[tuple[int, int]]] = {}
    for c in xs:
        for name, v in variants(replace(p, context=c, prefill=min(p.prefill, c))).items():
            out.setdefault(name, []).append((c, budget(v).resident))
    return out


def plot(p: Plan, devices: list[Device], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = sweep(p)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for name, points in data.items():
        color, style = STYLE[name]
        ax.plot([c for c, _ in points], [b / GIB for _, b in points], style, color=color,
                marker="o", markersize=3, label=name)
    top = max(b for pts in data.values() for _, b in pts) / GIB
    for i, dev in enumerate(devices):
        color = LIMIT_COLORS[i % len(LIMIT_COLORS)]
        ax.axhline(dev.app_limit_gib, color=color, linewidth=0.8, alpha=0.7)
        ax.text(data["no drafter"][0][0], dev.app_limit_gib,
                f" {dev.name}: {dev.app_limit_gib:g} GiB", fontsize=7, va="bottom", color=color)
    bottom = min(b for pts in data.values() for _, b in pts) / GIB
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # a 0.3 GiB model and a 7 GiB limit on one chart
    ax.set_xlabel("context (tokens, static KV cache)")
    ax.set_ylabel("resident memory (GiB, log scale)")
    ax.set_ylim(bottom * 0.8, max([top] + [d.app_limit_gib for d in devices]) * 1.3)
    plain = matplotlib.ticker.FormatStrFormatter("%g")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
