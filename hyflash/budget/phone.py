"""The phone next to the desktop: what `hyflash simulate --device NAME` adds to its report.

The desktop run measures tau exactly (the same graphs, the same lossless loop); its
tokens/s say little about a phone, where decoding is bound by memory bandwidth. So the
simulate report gets this bundle's projection on the chosen device, with the tau just
measured, and the memory verdict, both from `hyflash budget`'s model.
"""

from __future__ import annotations

from pathlib import Path

from hyflash.budget.report import PROJECTION, SMALL_CALL, size


def check_device(name: str, user_file: str | None = None) -> None:
    """An unknown device is one line before the bundle loads."""
    from hyflash.budget.devices import device

    device(name, user_file)


def projection(folder: str | Path, name: str, summary: dict) -> dict:
    from hyflash.budget.devices import device
    from hyflash.budget.memory import budget
    from hyflash.budget.plan import for_bundle
    from hyflash.budget.roofline import calibration, project, target_call
    from hyflash.budget.sources import resolve

    dev = device(name)
    plan = for_bundle(resolve(str(folder)))
    resident = budget(plan).resident
    tau = summary.get("tau")
    tau = tau if isinstance(tau, float) and tau == tau else None
    out = {"device": dev.key, "name": dev.name, "what": PROJECTION, "tau": tau,
           "resident_bytes": resident, "limit_bytes": dev.limit_bytes,
           "fits": resident <= dev.limit_bytes, "bandwidth_gbs": dev.bandwidth_gbs}
    if dev.bandwidth_gbs:
        cal = calibration()
        p = project(plan, dev.bandwidth_gbs, dev.key, cal, tau)
        out.update(plain_tok_s=p.plain_tok_s, spec_tok_s=p.spec_tok_s,
                   speedup=p.spec_tok_s / p.plain_tok_s if p.spec_tok_s else None,
                   full_context_tok_s=p.full_tok_s, error=cal.error, context=p.context,
                   decode_bytes=target_call(plan, 1, plan.context))
    return out


def rows(d: dict) -> list[tuple[str, str]]:
    """Report rows: the phone figures under the desktop ones."""
    where = f"{d['name']} (projection)"
    fits = "fits" if d["fits"] else "does NOT fit"
    memory = (f"{size(d['resident_bytes'])} of {size(d['limit_bytes'])} for one app: {fits} "
              "(hyflash budget's estimate)")
    if not d.get("bandwidth_gbs"):
        return [(f"{where}: memory", memory),
                (f"{where}: speed", "no bandwidth in the profile: no projection")]
    spec = "-" if d.get("spec_tok_s") is None else f"{d['spec_tok_s']:.1f}"
    extra = [f"+-{100 * d['error']:.0f}% at context {d['context']}"]
    if d.get("speedup"):
        extra.insert(0, f"speedup {d['speedup']:.2f}x with this run's tau")
        extra.append(f"full-context drafter {d['full_context_tok_s']:.1f}")
    if d["decode_bytes"] < SMALL_CALL:
        extra.append(f"upper bounds: a decode streams only {size(d['decode_bytes'])}, "
                     "per-call costs dominate")
    return [(f"{where}: tokens/s plain | drafting",
             f"{d['plain_tok_s']:.1f} | {spec} ({'; '.join(extra)})"),
            (f"{where}: memory", memory)]
