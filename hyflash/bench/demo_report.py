"""The demo's closing table and its report folder (summary.md, demo.json, demo.png, and each
bundle's simulate report)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path


def num(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec % x


def rows(results: dict) -> list[dict]:
    out = []
    for r in results.values():
        s, phone = r["report"].summary, r["report"].phone or {}
        out.append({"bundle": r["recipe"], "tau": s["tau"], "lossless": s["lossless"],
                    "desktop_plain": s["plain_tokens_per_s"],
                    "desktop_spec": s["spec_tokens_per_s"],
                    "desktop_speedup": s["speedup"], "peak_rss_mib": s["peak_rss_mib"],
                    "draft_state_kib": s["draft_side_bytes"] / 1024,
                    "device": phone.get("name"), "phone_plain": phone.get("plain_tok_s"),
                    "phone_spec": phone.get("spec_tok_s"), "phone_speedup": phone.get("speedup"),
                    "resident_mib": phone.get("resident_bytes", 0) / 2**20,
                    "fits": phone.get("fits"), "acceptance": s["acceptance_by_position"]})
    return out


def table(results: dict) -> str:
    lines = []
    for r, res in zip(rows(results), results.values(), strict=True):
        s = res["report"].summary
        lines += [f"{r['bundle']}: tau {num(r['tau'], '%.2f')}; lossless: {r['lossless']}",
                  f"  desktop (this CPU, measured):  plain {num(r['desktop_plain'], '%.0f')} "
                  f"tok/s, HyFlash {num(r['desktop_spec'], '%.0f')} tok/s "
                  f"({num(r['desktop_speedup'], '%.2fx')}); drafting pays off here above tau "
                  f"{num(s['break_even_tau'], '%.1f')} (verify "
                  f"{num(s['ms_per_verify_call'], '%.1f')} ms + draft "
                  f"{num(s['ms_per_drafter_call'], '%.1f')} ms vs decode "
                  f"{num(s['ms_per_plain_decode_call'], '%.1f')} ms)",
                  f"  {r['device'] or 'phone'} (projection):  plain {num(r['phone_plain'], '%.0f')}"
                  f" tok/s, HyFlash {num(r['phone_spec'], '%.0f')} tok/s "
                  f"({num(r['phone_speedup'], '%.2fx')}); {r['resident_mib']:.0f} MiB resident: "
                  f"{'fits' if r['fits'] else 'does NOT fit'}"]
    lines.append("(phone: bandwidth roofline with the tau measured here; for a model this small "
                 "an upper bound, as per-call costs dominate)")
    return "\n".join(lines)


def summary_md(results: dict, args, seconds: float, bundles: dict) -> str:
    out = ["# HyFlash demo", "",
           f"`hyflash demo` ({seconds:.0f} s, {args.threads} thread(s)): the pocket code model "
           "and its HyFlash drafter exported for a phone, simulated on "
           f"{args.prompts} held-out code prompts ({args.max_new_tokens} new tokens, greedy), "
           f"memory budget and speed projected on {args.device}.", "",
           "| bundle | export | tau | lossless | desktop plain tok/s | desktop HyFlash tok/s | "
           "speedup | phone plain tok/s | phone HyFlash tok/s | resident memory |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in zip(results, rows(results), strict=True):
        b = bundles[name]
        out.append(f"| {r['bundle']} | {'reused' if b.reused else f'{b.seconds:.0f} s'} | "
                   f"{num(r['tau'], '%.2f')} | {r['lossless']} | "
                   f"{num(r['desktop_plain'], '%.0f')} | {num(r['desktop_spec'], '%.0f')} | "
                   f"{num(r['desktop_speedup'], '%.2fx')} | {num(r['phone_plain'], '%.0f')} | "
                   f"{num(r['phone_spec'], '%.0f')} | {r['resident_mib']:.0f} MiB "
                   f"({'fits' if r['fits'] else 'does not fit'}) |")
    out += ["", "Each bundle's full simulate report: `BACKEND/report.txt` (and .json, .png); "
            "the memory budget per component: `BACKEND/budget.txt`."]
    return "\n".join(out) + "\n"


def write(out: Path, results: dict, bundles: dict, args, seconds: float) -> list[Path]:
    from hyflash.simulate.report import clean

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, r in results.items():
        r["report"].write(tmp / name)
        (tmp / name / "budget.txt").write_text(r["budget"] + "\n")
    data = {"settings": {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                         "threads": args.threads, "device": args.device, "seconds": seconds},
            "bundles": {n: {"folder": str(b.folder), "reused": b.reused,
                            "export_seconds": b.seconds, "note": b.note}
                        for n, b in bundles.items()},
            "results": {n: {**row, "summary": r["report"].summary, "phone": r["report"].phone,
                            "prompts": r["report"].rows}
                        for (n, r), row in zip(results.items(), rows(results), strict=True)}}
    files = [tmp / "summary.md", tmp / "demo.json", tmp / "demo.png"]
    files[0].write_text(summary_md(results, args, seconds, bundles))
    files[1].write_text(json.dumps(clean(data), indent=1, default=str) + "\n")
    plot(rows(results), files[2])
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return [out / f.name for f in files] + [out / n for n in results]


def plot(data: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in data:
        acc = [0 if x is None or math.isnan(x) else x for x in r["acceptance"]]
        a.plot(range(1, len(acc) + 1), acc, "o-", label=f"{r['bundle']} (tau {r['tau']:.2f})")
    a.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1),
          title="acceptance by draft position")
    a.legend()
    labels, plain, spec = [], [], []
    for r in data:
        for where in ("desktop", "phone"):
            labels.append(f"{r['bundle']}\n{where}")
            plain.append(r[f"{where}_plain"] or 0)
            spec.append(r[f"{where}_spec"] or 0)
    x = range(len(labels))
    b.bar([i - 0.2 for i in x], plain, 0.4, label="plain", color="tab:gray")
    b.bar([i + 0.2 for i in x], spec, 0.4, label="HyFlash", color="tab:orange")
    b.set_xticks(list(x), labels, fontsize=8)
    b.set(ylabel="tokens / s", yscale="log",
          title="desktop (measured) and phone (projection)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
