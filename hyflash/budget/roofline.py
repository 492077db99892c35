"""Phone decode speed as a bandwidth roofline, calibrated on published phone numbers.

Decoding a 0.1-3B model on a phone is bound by memory bandwidth: every call streams the
weights it computes with, the KV cache it attends over and the state it reads. So a call
takes ``bytes / (bandwidth x efficiency)``, where efficiency (the share of peak DRAM
bandwidth a runtime really gets) is fitted once on published measurements
(``data/calibration.json``: ExecuTorch on a OnePlus 12) and reported with its error: the
largest miss over those points. A verify of B tokens reads the same weights as a decode,
so on a phone it costs about one decode (compute for B rows is not modelled).

- plain: tokens/s = 1 / t(decode at context c);
- speculative: tau tokens per round of t(verify) + t(draft);
- full-context drafter: the same round, its drafter reading its whole context window.

A projection, not a measurement: other runtimes (ONNX Runtime on a phone), the NPU, thermal
throttling and other apps sharing the bus are outside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hyflash.budget.data import load
from hyflash.budget.memory import F32, Plan
from hyflash.budget.recipes import custom
from hyflash.budget.shapes import DrafterShape

GB = 1e9


def weight_bytes(p: Plan) -> int:
    """Weights a target call streams: projections, norms, the whole LM head (tied: the
    embedding table itself) and one embedding row per token (negligible, left out)."""
    t, r = p.target, p.recipe
    own = not t.tied or r.tied_head_stored
    head = r.lm_head.bytes(t.vocab, t.hidden) if own else r.embedding.bytes(t.vocab, t.hidden)
    return (sum(r.linear.bytes(m.rows, m.cols, m.count) for m in t.linears())
            + t.small_params * F32 + head)


def target_call(p: Plan, rows: int, context: int) -> int:
    """Bytes of one target call of ``rows`` tokens with ``context`` cached: weights, the KV
    cache read, the logits written."""
    t = p.target
    return (weight_bytes(p) + t.kv_bytes(context, p.recipe.kv_bytes)
            + rows * t.vocab * F32)


def drafter_call(p: Plan, d: DrafterShape, context: int) -> int:
    """Bytes of one drafter call: its weights, its LM head rows, its state (a full-context
    drafter's window is the whole context), its B-1 logits rows."""
    r = p.draft_recipe
    own = sum(r.linear.bytes(m.rows, m.cols, m.count) for m in d.linears()) + d.small_params * F32
    head = r.lm_head.bytes(d.head_rows, d.hidden)
    return own + head + d.state_bytes(context) + (d.block - 1) * d.vocab * F32


@dataclass(frozen=True)
class Calibration:
    efficiency: float  # share of peak bandwidth a runtime reaches
    error: float  # largest relative miss of the fitted roofline over the points
    points: list[dict]
    source: str


def calibration() -> Calibration:
    """Fit the efficiency (geometric mean over the published points) and its error."""
    from hyflash.budget.devices import device
    from hyflash.budget.runtime_costs import runtime_costs
    from hyflash.budget.sources import resolve

    data = load("calibration")
    recipes = {name: custom(name, d) for name, d in data["recipes"].items()}
    rows = []
    for point in data["points"]:
        target = resolve(point["model"]).target
        plan = Plan(target, None, recipes[point["recipe"]], data["context"], 1,
                    runtime_costs("executorch"))
        dev = device(point["device"])
        bytes_ = target_call(plan, 1, data["context"])
        roof = dev.bandwidth_gbs * GB / bytes_
        rows.append({**point, "bytes_per_token": bytes_, "roofline_tok_s": roof,
                     "efficiency": point["decode_tok_s"] / roof,
                     "modelled_file_mib": file_bytes(plan) / 2 ** 20})
    eff = math.exp(sum(math.log(r["efficiency"]) for r in rows) / len(rows))
    for r in rows:
        r["projected_tok_s"] = r["roofline_tok_s"] * eff
        r["miss"] = r["projected_tok_s"] / r["decode_tok_s"] - 1
    return Calibration(eff, max(abs(r["miss"]) for r in rows), rows, data["source"])


def file_bytes(p: Plan) -> int:
    """The target's weights as stored (a calibration point's .pte, less its few constants)."""
    t, r = p.target, p.recipe
    own = not t.tied or r.tied_head_stored
    return (weight_bytes(p) + r.embedding.bytes(t.vocab, t.hidden)
            if own else weight_bytes(p))


@dataclass(frozen=True)
class Projection:
    device: str
    context: int
    plain_tok_s: float
    spec_tok_s: float | None
    full_tok_s: float | None
    tau: float | None
    tau_full: float | None
    ms_decode: float
    ms_verify: float
    ms_draft: float | None
    ms_draft_full: float | None
    error: float


def project(p: Plan, bandwidth_gbs: float, name: str, cal: Calibration,
            tau: float | None, tau_full: float | None = None) -> Projection:
    """Tokens/s at the plan's context on a device of this bandwidth."""
    rate = bandwidth_gbs * GB * cal.efficiency  # bytes per second
    c = p.context
    block = p.drafter.block if p.drafter else 1
    decode = target_call(p, 1, c) / rate
    verify = target_call(p, block, c) / rate
    draft = full = None
    spec = full_tps = None
    if p.drafter is not None:
        hy = p.drafter if p.drafter.arch == "hyflash" else p.drafter.as_arch("hyflash")
        draft = drafter_call(p, hy, c) / rate
        full = drafter_call(p, hy.as_arch("full"), c) / rate
        if tau:
            spec = tau / (verify + draft)
            full_tps = (tau_full or tau) / (verify + full)
    return Projection(name, c, 1 / decode, spec, full_tps, tau, tau_full or tau,
                      1e3 * decode, 1e3 * verify, draft and 1e3 * draft, full and 1e3 * full,
                      cal.error)
