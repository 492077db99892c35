"""The simulation report: totals over prompts, a terminal table, JSON and a PNG plot.

Kept apart from ``command`` (which runs the engines) so the numbers and their
presentation can be read, and tested, on their own. Rates are totals over prompts
(sum of tokens / sum of seconds), not means of per-prompt rates, so long generations
weigh what they cost. A prompt that stops (EOS) after fewer than ``MIN_SPEEDUP_TOKENS``
new tokens never decodes after its prefill, so it says nothing about drafting: it is
shown with its stop reason but left out of the speed figures, and the report says so.

Draft-side memory is reported as what it is: the drafter's fixed state (what the
manifest and ``hyflash inspect`` show) plus the ONNX runtime's commit buffer (the
feature rows waiting for the next drafter call).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hyflash.runtime.stats import GenerationStats

MIN_SPEEDUP_TOKENS = 2


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


class Report:
    def __init__(self, bundle, args, n_prompts: int):
        m = bundle.manifest
        self.meta = {
            "bundle": str(bundle.folder), "quantization": m.quantization.recipe,
            "drafter": m.drafter.config.arch, "block_size": m.block_size,
            "window": m.window, "window_cache": m.drafter.window_cache,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "seed": args.seed, "threads": args.threads,
            "prompts": n_prompts, "lookup": bool(getattr(args, "lookup", False)),
            "adaptive": bool(getattr(args, "adaptive", False)),
            "draft_rows": getattr(args, "draft_rows", "all"),
        }
        self.fixed_state_bytes = m.state_bytes
        self.kv_bytes_per_token = m.kv_bytes_per_token
        self.greedy = args.temperature == 0
        self.rows: list[dict] = []
        self.plain: list[GenerationStats] = []
        self.spec: list[GenerationStats] = []
        self.commit_calls = 0
        self.state_bytes = 0
        self.kv_bytes = 0
        self.summary: dict = {}
        self.phone: dict | None = None  # hyflash.budget.phone.projection, with --device

    def add(self, i: int, plain, spec, calls: dict, state_bytes: int, kv_bytes: int) -> None:
        a, b = plain.stats, spec.stats
        self.plain.append(a)
        self.spec.append(b)
        self.commit_calls += calls.get("commit", 0)
        self.state_bytes = max(self.state_bytes, state_bytes)
        self.kv_bytes = max(self.kv_bytes, kv_bytes)
        counted = min(a.new_tokens, b.new_tokens) >= MIN_SPEEDUP_TOKENS
        self.rows.append({
            "prompt": i + 1, "prompt_tokens": a.prompt_tokens,
            "new_tokens": b.new_tokens, "identical": plain.tokens == spec.tokens,
            "stop_reason": b.stop_reason, "plain_stop_reason": a.stop_reason,
            "in_speedup": counted,
            "tau": round(b.tau, 3) if b.rounds else None,
            "plain_tokens_per_s": round(a.tokens_per_s, 2),
            "spec_tokens_per_s": round(b.tokens_per_s, 2),
            "speedup": round(ratio(b.tokens_per_s, a.tokens_per_s), 3) if counted else None,
        })

    def finish(self) -> dict:
        P, S = self.plain, self.spec

        def total(stats, field):
            return sum(getattr(s, field) for s in stats)

        rounds, accepted = total(S, "rounds"), total(S, "accepted_drafts")
        proposed = [sum(col) for col in zip(*(s.position_proposed for s in S), strict=True)]
        taken = [sum(col) for col in zip(*(s.position_accepted for s in S), strict=True)]
        kept = [i for i, r in enumerate(self.rows) if r["in_speedup"]]
        plain_tps = ratio(sum(P[i].new_tokens for i in kept), sum(P[i].total_s for i in kept))
        spec_tps = ratio(sum(S[i].new_tokens for i in kept), sum(S[i].total_s for i in kept))
        draft_call = ratio(total(S, "draft_s"), total(S, "drafter_calls"))
        verify_call = ratio(total(S, "verify_s"), rounds)
        plain_call = ratio(total(P, "verify_s"), total(P, "rounds"))
        # a round costs one drafter + one verify call and yields tau tokens; plain
        # decoding yields one token per call: speedup ~ tau * plain_call / round
        break_even = ratio(draft_call + verify_call, plain_call)
        identical = sum(r["identical"] for r in self.rows)
        self.summary = {
            "tau": ratio(accepted + rounds, rounds),
            "acceptance_by_position": [ratio(a, n) for a, n in zip(taken, proposed,
                                                                    strict=True)],
            "plain_tokens_per_s": plain_tps,
            "spec_tokens_per_s": spec_tps,
            "speedup": ratio(spec_tps, plain_tps),
            "speedup_prompts": len(kept),
            "left_out_of_speedup": [r["prompt"] for r in self.rows if not r["in_speedup"]],
            "ms_per_drafter_call": 1000 * draft_call,
            "ms_per_verify_call": 1000 * verify_call,
            "ms_per_plain_decode_call": 1000 * plain_call,
            "break_even_tau": break_even,
            "tau_for_2x": 2 * break_even,
            "drafter_over_verify": ratio(draft_call, verify_call),
            "drafter_calls": total(S, "drafter_calls"),
            "commit_only_calls": self.commit_calls,
            "verify_calls": rounds,
            "spec_time_split_s": {k: total(S, f"{k}_s") for k in
                                  ("prefill", "draft", "verify", "total")},
            "peak_rss_mib": max(s.peak_rss_mib for s in P + S),
            "draft_side_bytes": self.state_bytes,
            "draft_state_fixed_bytes": self.fixed_state_bytes,
            "draft_commit_buffer_bytes": self.state_bytes - self.fixed_state_bytes,
            "target_kv_bytes_at_end": self.kv_bytes,
            "lossless": (f"{identical}/{len(self.rows)} prompts identical to plain decoding"
                         if self.greedy else "n/a (sampling: same distribution, not tokens)"),
        }
        return self.summary

    # ------------------------------------------------------------------ output

    def table(self) -> str:
        s = self.summary

        def num(x, fmt):
            return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt % x

        rates = " ".join(num(r, "%.2f") for r in s["acceptance_by_position"]) or "-"
        rows = [
            ("bundle", f"{self.meta['bundle']} ({self.meta['quantization']}, "
                       f"{self.meta['drafter']} drafter, B={self.meta['block_size']}, "
                       f"W={self.meta['window']}, window cache {self.meta['window_cache']})"),
            ("prompts / new tokens", f"{len(self.rows)} / "
                                     f"{sum(r['new_tokens'] for r in self.rows)}"),
            ("lossless", s["lossless"]),
            ("tau (tokens per verify)", num(s["tau"], "%.2f")),
            ("acceptance by position", rates),
            ("tokens/s plain | drafting", f"{num(s['plain_tokens_per_s'], '%.1f')} | "
                                          f"{num(s['spec_tokens_per_s'], '%.1f')}"),
            ("speedup", num(s["speedup"], "%.2fx") + self.left_out_note()),
            ("ms per plain decode call", num(s["ms_per_plain_decode_call"], "%.3f")),
            ("ms per drafter call", num(s["ms_per_drafter_call"], "%.3f")
             + f"  ({s['drafter_calls']} calls, {s['commit_only_calls']} commit-only)"),
            ("ms per verify call", num(s["ms_per_verify_call"], "%.3f")
             + f"  ({s['verify_calls']} calls)"),
            ("drafter / verify", num(100 * s["drafter_over_verify"], "%.0f %%")),
            ("break-even tau | for 2x", f"{num(s['break_even_tau'], '%.2f')} | "
                                        f"{num(s['tau_for_2x'], '%.2f')}  (at these call "
                                        "costs, prefill aside)"),
            ("peak RSS", f"{s['peak_rss_mib']:.0f} MiB"),
            ("draft-side memory", f"{s['draft_side_bytes'] / 1024:.1f} KiB = "
                                  f"{s['draft_state_fixed_bytes'] / 1024:.1f} KiB fixed state "
                                  "(as `hyflash inspect` shows) + "
                                  f"{s['draft_commit_buffer_bytes'] / 1024:.1f} KiB commit "
                                  "buffer; any context length"),
            ("target KV cache at end", f"{s['target_kv_bytes_at_end'] / 1024:.1f} KiB "
                                       f"({self.kv_bytes_per_token} B/token)"),
        ]
        if self.phone:
            from hyflash.budget.phone import rows as phone_rows

            rows += phone_rows(self.phone)
        width = max(len(k) for k, _ in rows)
        head = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
        limit = self.meta["max_new_tokens"]
        per = ["", f"{'prompt':>6} {'tokens':>7} {'new':>5} {'stop':>14} {'tau':>6} "
                   f"{'plain/s':>9} {'draft/s':>9} {'speedup':>8}  same"]
        for r in self.rows:
            per.append(f"{r['prompt']:>6} {r['prompt_tokens']:>7} {r['new_tokens']:>5} "
                       f"{stop_label(r, limit):>14} "
                       f"{num(r['tau'], '%.2f'):>6} {r['plain_tokens_per_s']:>9.1f} "
                       f"{r['spec_tokens_per_s']:>9.1f} {num(r['speedup'], '%.2fx'):>8}  "
                       f"{'yes' if r['identical'] else 'no'}")
        if any(early_eos(r, limit) or not r["in_speedup"] for r in self.rows):
            per.append("(* stopped on EOS before --max-new-tokens; - not in the speedup: "
                       f"fewer than {MIN_SPEEDUP_TOKENS} new tokens)")
        return head + "\n".join(per)

    def left_out_note(self) -> str:
        out = self.summary["left_out_of_speedup"]
        if not out:
            return ""
        return (f"  (over {self.summary['speedup_prompts']} of {len(self.rows)} prompts; "
                f"prompt{'s' if len(out) > 1 else ''} {', '.join(map(str, out))} stopped after "
                f"< {MIN_SPEEDUP_TOKENS} new tokens, left out)")

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        data = clean({"settings": self.meta, "summary": self.summary, "prompts": self.rows,
                      **({"phone": self.phone} if self.phone else {})})
        files = [out / "report.json", out / "report.txt", out / "report.png"]
        files[0].write_text(json.dumps(data, indent=1) + "\n")
        files[1].write_text(self.table() + "\n")
        self.plot(files[2])
        return files

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        s = self.summary
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        acc = [0 if math.isnan(a) else a for a in s["acceptance_by_position"]]
        ax1.bar(range(1, len(acc) + 1), acc, color="tab:blue")
        ax1.set_xlabel("draft position")
        ax1.set_ylabel("acceptance rate")
        ax1.set_ylim(0, 1)
        ax1.set_xticks(range(1, len(acc) + 1))
        ax1.set_title(f"acceptance (tau = {s['tau']:.2f})")
        rows = [r for r in self.rows if r["in_speedup"]]
        x = range(1, len(rows) + 1)
        w = 0.4
        ax2.bar([i - w / 2 for i in x], [r["plain_tokens_per_s"] for r in rows], w,
                label="plain", color="tab:gray")
        ax2.bar([i + w / 2 for i in x], [r["spec_tokens_per_s"] for r in rows], w,
                label="drafting", color="tab:orange")
        left_out = len(rows) < len(self.rows)
        ax2.set_xlabel("prompt (* stopped on EOS)" + (f"; left out: < {MIN_SPEEDUP_TOKENS} new "
                                                      "tokens" if left_out else ""))
        ax2.set_ylabel("tokens / s")
        limit = self.meta["max_new_tokens"]
        ax2.set_xticks(list(x), [f"{r['prompt']}" + ("*" if early_eos(r, limit) else "")
                                 for r in rows])
        ax2.set_title(f"same ONNX target, speedup {s['speedup']:.2f}x")
        ax2.legend(loc="lower right", framealpha=0.9)
        fig.suptitle(f"hyflash simulate: {Path(self.meta['bundle']).name} "
                     f"({self.meta['quantization']})")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def early_eos(row: dict, max_new_tokens: int) -> bool:
    return row["stop_reason"] == "eos" and row["new_tokens"] < max_new_tokens


def stop_label(row: dict, max_new_tokens: int) -> str:
    """The stop reason, marked * for an EOS before max tokens, - when not in the speedup."""
    return (row["stop_reason"] + ("*" if early_eos(row, max_new_tokens) else "")
            + ("" if row["in_speedup"] else " -"))


def clean(x):
    """JSON has no NaN: turn them into null; round floats for readability."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    return x
