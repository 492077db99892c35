"""The bench's PNG: tokens/s per system and mode, tau by context, draft-side bytes by context."""

from __future__ import annotations

from pathlib import Path


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("speed", "acceptance", "memory") if result.get(k)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(6.5 * max(len(panels), 1), 5.2),
                             squeeze=False)
    for ax, part in zip(axes[0], panels, strict=False):
        {"speed": speed, "acceptance": acceptance, "memory": memory}[part](ax, result[part],
                                                                          result["dry_run"])
    fig.suptitle(f"hyflash bench {result['suite']}" + (" (DRY RUN: untrained drafter)"
                                                         if result["dry_run"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


COLORS = {"plain": "tab:gray", "speculative": "tab:orange",
          "speculative+auto-rows": "tab:olive", "lookup": "tab:green",
          "speculative+lookup": "tab:red", "adaptive": "tab:brown"}
PEER = "tab:purple"


def speed(ax, data: dict, dry: bool) -> None:
    from matplotlib.patches import Patch

    rows = sorted(data["rows"], key=lambda r: r["tokens_per_s"])
    color = [COLORS.get(r["mode"], "tab:blue") if r["group"] == "ours" else PEER for r in rows]
    ax.barh([f"{r['system']} / {r['mode']}" for r in rows], [r["tokens_per_s"] for r in rows],
            color=color)
    ax.set_xlabel("tokens / s (median)")
    ax.set_title("speed")
    shown = [m for m in COLORS if any(r["mode"] == m and r["group"] == "ours" for r in rows)]
    handles = [Patch(color=COLORS[m], label=f"ours, {m}") for m in shown]
    if any(r["group"] != "ours" for r in rows):
        handles.append(Patch(color=PEER, label="peers (any mode)"))
    ax.legend(handles=handles, loc="lower right", fontsize=7)  # the slowest rows are short
    ax.tick_params(axis="y", labelsize=7)


def acceptance(ax, data: dict, dry: bool) -> None:
    series: dict = {}
    for r in data["rows"]:
        series.setdefault((r["drafter"], r["temperature"]), []).append((r["context"], r["tau"]))
    for (name, temp), pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if temp == 0 else "s--",
                label=f"{name}, T={temp:g}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="context (tokens)", ylabel="tau (tokens / verify)",
           title="acceptance" + (" (dry run: meaningless)" if dry else ""))
    ax.legend(fontsize=8)


def memory(ax, data: dict, dry: bool) -> None:
    ctxs = data["contexts"]
    for r in data["rows"]:
        ax.plot(ctxs, [r["bytes"][c] / 1024 for c in ctxs], "o-",
                label=f"{r['drafter']} ({r['layout']})")
    ax.plot(ctxs, [data["target_kv_bytes"][c] / 1024 for c in ctxs], "k:", label="target KV")
    ax.set(xlabel="context (tokens)", ylabel="KiB (fp32)", yscale="log", xscale="log",
           title="draft-side memory")
    ax.legend(fontsize=7)
