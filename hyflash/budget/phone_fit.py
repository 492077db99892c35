"""ExecuTorch's weights factor on a phone, fitted on published resident memory.

The desktop factors (``data/runtime.json``) are measured in a Python process, which reads
the whole .pte into memory and keeps it next to XNNPACK's packed copy. A phone runner
maps the file instead, and the published OnePlus 12 numbers (``data/calibration.json``:
.pte size and RSS of Llama 3.2 1B / 3B, bf16 and SpinQuant) show it holds much less: so
the device budget of an ExecuTorch bundle uses factors fitted on those points, one for
float weights and one for quantized ones, each with its error; ONNX Runtime has no
published phone numbers here and keeps its desktop factors.

Per point: factor = (RSS - KV cache - activations - runtime library - embedding) / the
weights a graph computes with, at factor 1 (the same terms ``memory`` sums).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from hyflash.budget.data import load
from hyflash.budget.memory import Plan, budget
from hyflash.budget.recipes import custom
from hyflash.budget.runtime_costs import MIB, RuntimeCosts

FLOAT = ("fp32", "fp16", "bf16")
SCALED = ("target.layers", "target.lm_head")


def kind(recipe: str) -> str:
    return "float" if recipe in FLOAT else "quantized"


@cache
def fit() -> dict[str, dict]:
    """{"float" | "quantized": {"factor", "error", "points"}} from the published RSS."""
    from hyflash.budget.runtime_costs import runtime_costs
    from hyflash.budget.sources import resolve

    data = load("calibration")
    unit = replace(runtime_costs("executorch"), weights_factor={"fp32": 1.0},
                   load_transient_factor=0.0, run_weights_factor={})
    groups: dict[str, list[dict]] = {}
    for point in data["points"]:
        r = custom(point["recipe"], data["recipes"][point["recipe"]])
        b = budget(Plan(resolve(point["model"]).target, None, r, data["kv_context"], 64, unit))
        scaled = sum(b.term(k).resident for k in SCALED)
        fixed = b.resident - scaled
        factor = (point["rss_mib"] * MIB - fixed) / scaled
        groups.setdefault(kind(point["recipe"]), []).append(
            {"model": point["model"], "recipe": point["recipe"], "rss_mib": point["rss_mib"],
             "factor": factor, "fixed_mib": fixed / MIB, "weights_mib": scaled / MIB})
    out = {}
    for name, points in groups.items():
        mean = sum(p["factor"] for p in points) / len(points)
        for p in points:
            p["modelled_rss_mib"] = p["fixed_mib"] + mean * p["weights_mib"]
            p["miss"] = p["modelled_rss_mib"] / p["rss_mib"] - 1
        out[name] = {"factor": mean, "error": max(abs(p["miss"]) for p in points),
                     "points": points}
    return out


def on_phone(desktop: RuntimeCosts) -> RuntimeCosts:
    """The runtime costs a device budget uses (ExecuTorch: factors fitted on phones)."""
    if desktop.backend != "executorch":
        return desktop
    fitted = fit()
    factors = {r: fitted[kind(r)]["factor"] for r in ("fp32", "fp16", "8da4w", "int4", "int8")
               if kind(r) in fitted}
    errors = ", ".join(f"{k} +-{100 * v['error']:.0f}%" for k, v in fitted.items())
    return replace(desktop, weights_factor=factors, load_transient_factor=0.0,
                   source=f"fitted on published phone RSS: {errors}")
