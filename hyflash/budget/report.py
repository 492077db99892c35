"""What `hyflash budget` prints: the terms, a verdict per device, the phone speed projection.

Kept apart from the model (``memory``, ``roofline``) so numbers and presentation can be
read and tested on their own; ``as_json`` is the same content for machines.
"""

from __future__ import annotations

from dataclasses import asdict

from hyflash.budget.devices import GIB, Device
from hyflash.budget.memory import Budget, Plan, budget
from hyflash.budget.plan import variants
from hyflash.budget.roofline import Calibration, Projection, project, target_call
from hyflash.budget.runtime_costs import MIB

PROJECTION = "projection (bandwidth roofline, calibrated on published phone numbers)"
SMALL_CALL = 64 * MIB  # below this per decode, the calibration points say nothing


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.1f} MiB"


def describe(p: Plan, src) -> str:
    d = p.drafter
    drafter = "no drafter" if d is None else (
        f"{'HyFlash' if d.arch == 'hyflash' else 'full-context'} drafter ({d.layers} layers, "
        f"window {d.window if d.arch == 'hyflash' else p.context}, block {d.block}"
        + (f", draft vocabulary {d.draft_vocab}" if d.draft_vocab else "") + ")")
    origin = src.facts.get("source") or src.name
    offered = "" if p.recipe.offered else " (not an export recipe: sized as described)"
    return (f"{src.target.name} ({src.kind}: {origin})\n{p.recipe_name()} on {p.recipe.backend}"
            f"{offered}, context {p.context}, {drafter}, prefill chunk {p.prefill} rows")


def terms_table(b: Budget) -> str:
    rows = [("component", "stored", "resident", "")]
    for t in b.terms:
        rows.append((t.label, size(t.stored) if t.stored else "-", size(t.resident),
                     "grows with context" if t.grows else ""))
    rows.append(("total", size(b.stored), size(b.resident),
                 "peak: the larger of load transient and activations counts"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    top = max(b.terms, key=lambda t: t.resident)
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]}".rstrip()
                     for r in rows) + (f"\nlargest: {top.label}, {size(top.resident)} "
                                       f"({100 * top.resident / b.resident:.0f}% of the total)")


def variants_table(p: Plan) -> tuple[str, dict[str, int]]:
    totals = {name: budget(v).resident for name, v in variants(p).items()}
    lines = [f"  {name:<22} {size(total):>10}" for name, total in totals.items()]
    return "same budget with:\n" + "\n".join(lines), totals


def verdict(total: int, dev: Device) -> dict:
    entitled = dev.app_limit_entitled_gib
    out = {"device": dev.key, "name": dev.name, "limit_bytes": dev.limit_bytes,
           "resident_bytes": total, "headroom_bytes": dev.limit_bytes - total,
           "fits": total <= dev.limit_bytes, "share_of_limit": total / dev.limit_bytes}
    if entitled:
        out["entitled_limit_bytes"] = int(entitled * GIB)
        out["fits_with_entitlement"] = total <= entitled * GIB
    return out


def verdict_word(v: dict) -> str:
    if v["fits"]:
        return "fits"
    if v.get("fits_with_entitlement"):
        return "fits with increased-memory-limit"
    return "does not fit"


def devices_table(b: Budget, devs: list[Device], cal: Calibration, tau, tau_full
                  ) -> tuple[str, list[dict]]:
    head = ("device", "app limit", "headroom", "verdict", "plain tok/s", "HyFlash tok/s",
            "full-context tok/s")
    rows, out = [head], []
    for dev in devs:
        v = verdict(b.resident, dev)
        proj = (project(b.plan, dev.bandwidth_gbs, dev.key, cal, tau, tau_full)
                if dev.bandwidth_gbs else None)
        v["projection"] = asdict(proj) if proj else None
        out.append(v)
        limit = size(v["limit_bytes"]) + (f" ({dev.app_limit_entitled_gib:g} GiB entitled)"
                                          if dev.app_limit_entitled_gib else "")
        rows.append((dev.name, limit, size(v["headroom_bytes"]), verdict_word(v),
                     *speeds(proj, b.plan)))
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(f"{c:<{w[i]}}" if i < 4 else f"{c:>{w[i]}}" for i, c in enumerate(r))
             for r in rows]
    note = (f"speeds: {PROJECTION}, context {b.plan.context}, +-{100 * cal.error:.0f}% on the "
            f"calibration points; " + tau_note(b.plan, tau, tau_full))
    streamed = target_call(b.plan, 1, b.plan.context)
    if streamed < SMALL_CALL:
        note += (f"\nnote: a decode streams only {size(streamed)}: per-call costs the roofline "
                 "leaves out (kernel dispatch, ~1 ms a call on a desktop CPU) dominate at this "
                 "size, so these speeds are upper bounds")
    return "\n".join(lines) + "\n" + note, out


def speeds(proj: Projection | None, p: Plan) -> tuple[str, str, str]:
    if proj is None:
        return "no bandwidth", "-", "-"
    if p.drafter is None:
        return f"{proj.plain_tok_s:.1f}", "-", "-"
    spec = f"{proj.spec_tok_s:.1f}" if proj.spec_tok_s else "needs tau"
    full = f"{proj.full_tok_s:.1f}" if proj.full_tok_s else "needs tau"
    return f"{proj.plain_tok_s:.1f}", spec, full


def tau_note(p: Plan, tau, tau_full) -> str:
    if p.drafter is None:
        return "plain decoding only (no drafter)"
    if not tau:
        return ("speculative speeds need tau: pass --tau, or run `hyflash simulate` on the "
                "bundle first")
    if not tau_full:
        return f"tau {tau:.2f} for both drafters (--tau-full sets the full-context one's)"
    return f"tau {tau:.2f} for HyFlash, {tau_full:.2f} for the full-context drafter"


def explain(b: Budget, cal: Calibration) -> str:
    lines = ["formulas (V vocabulary, H hidden, I intermediate, F feature size, B block):"]
    for t in b.terms:
        lines.append(f"- {t.label}: {t.formula}")
    lines += [
        "", "decode-speed projection (per device):",
        "- t(call) = bytes read / (bandwidth x efficiency); bytes of a target call = weights "
        "(projections + the whole LM head) + KV cache at the context + logits written",
        "- a verify of B tokens reads the same weights: on a phone it costs about one decode",
        "- plain tok/s = 1 / t(decode); HyFlash = tau / (t(verify) + t(draft)); full-context = "
        "tau_full / (t(verify) + t(draft reading its whole-context window))",
        f"- efficiency {cal.efficiency:.3f}, fitted on {len(cal.points)} published points "
        f"({cal.source}); largest miss {100 * cal.error:.1f}%:"]
    for r in cal.points:
        lines.append(f"    {r['model']} {r['recipe']} on {r['device']}: published "
                     f"{r['decode_tok_s']} tok/s, projected {r['projected_tok_s']:.1f} "
                     f"({100 * r['miss']:+.1f}%); .pte {r['pte_mib']} MiB published, "
                     f"{r['modelled_file_mib']:.0f} MiB from the weight model")
    if b.plan.runtime.backend == "executorch" and not b.plan.desktop:
        from hyflash.budget.phone_fit import fit

        lines += ["", "ExecuTorch weights factor on a phone (fitted on the same points' "
                      "published RSS; the desktop factor is measured in a Python process):"]
        for name, f in fit().items():
            points = "; ".join(f"{p['model']} {p['recipe']}: {p['rss_mib']} MiB published, "
                               f"{p['modelled_rss_mib']:.0f} modelled ({100 * p['miss']:+.1f}%)"
                               for p in f["points"])
            lines.append(f"- {name}: {f['factor']:.3f} ({points})")
    return "\n".join(lines)


def as_json(b: Budget, src, totals: dict, verdicts: list[dict], cal: Calibration, tau,
            tau_full) -> dict:
    p = b.plan
    return {
        "source": {"kind": src.kind, "name": src.name, **src.facts},
        "target": asdict(p.target), "drafter": asdict(p.drafter) if p.drafter else None,
        "recipe": asdict(p.recipe), "drafter_recipe": asdict(p.draft_recipe),
        "context": p.context, "prefill_rows": p.prefill,
        "terms": [asdict(t) for t in b.terms],
        "stored_bytes": b.stored, "resident_bytes": b.resident,
        "variants_resident_bytes": totals,
        "devices": verdicts,
        "projection": {"what": PROJECTION, "tau": tau, "tau_full": tau_full,
                       "efficiency": cal.efficiency, "calibration_error": cal.error,
                       "calibration_points": cal.points},
        "notes": list(p.target.notes),
    }
