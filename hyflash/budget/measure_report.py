"""The estimate next to what `--measure` read from the running bundle, with the error.

The child's three checkpoints are cumulative, and so is the estimate at each: the process
before the bundle (runtime term), after opening it (+ the weights, and on ExecuTorch the
KV cache the program allocates), and the peak while running (every term, with the KV cache
and the prefill sized for the run that was measured). Each checkpoint's step is compared
too, so a miss is pinned on the terms that step adds.
"""

from __future__ import annotations

from dataclasses import replace

from hyflash.budget.memory import Budget, Plan, budget
from hyflash.budget.report import size
from hyflash.budget.runtime_costs import runtime_costs

WEIGHTS = ("target.layers", "target.embedding", "target.lm_head", "drafter.weights",
           "drafter.head")


def measured_plan(p: Plan, src, stages: dict, prompt_tokens: int) -> Plan:
    """The desktop plan of the measured run: the Python process as the runtime term, the
    prefill of the whole prompt in one call, and the KV positions the run wrote (the lean
    ONNX graph's buffers are zero pages until written; ExecuTorch allocates all of them)."""
    positions = stages["run"]["kv_positions"]
    written = min(p.context, positions) if src.facts.get("kv_form") != "mutable_buffers" \
        else p.context
    if src.facts.get("kv_form") == "past_present":
        written = 2 * written  # the past and the present both live during a call
    # the process as it is: what the shared libraries' file-backed pages add to it depends on
    # the host's kernel and page cache (RssFile 126 MiB where data/runtime.json was recorded,
    # 86 MiB on a later host, with the same anonymous memory), so the bundle's terms are
    # judged on top of the measured process, and the recorded figure is shown beside it
    runtime = replace(runtime_costs(p.runtime.backend),
                      desktop_process_bytes=stages["imports"]["VmRSS"])
    return replace(p, desktop=True, prefill=prompt_tokens, kv_positions=written,
                   runtime=runtime)  # measured here, not phone-fitted


def checkpoints(b: Budget, src) -> list[tuple[str, str, tuple[str, ...]]]:
    """(label, stage, terms it adds): a memory-mapped embedding becomes resident as the
    prompt's gathers touch it, so it joins the peak, not the opening."""
    from hyflash.budget.memory import mapped

    at_open = tuple(k for k in WEIGHTS if k != "target.embedding" or not mapped(b.plan))
    at_open += ("sessions",)
    if src.facts.get("kv_form") == "mutable_buffers":
        at_open += ("target.kv",)
    rest = tuple(t.key for t in b.terms if t.key not in at_open + ("runtime",))
    return [("process before the bundle", "imports", ("runtime",)),
            ("after opening the bundle", "open", at_open),
            ("peak while running (VmHWM)", "run", rest)]


def compare(b: Budget, src, stages: dict) -> list[dict]:
    """Rows per checkpoint. The first compares the process with the figure recorded in
    ``data/runtime.json`` (informative: ``judged`` False, see ``measured_plan``); the others
    the estimate, on top of the measured process, with the reading."""
    rows, keys, previous, previous_est = [], (), 0, 0
    for label, stage, adds in checkpoints(b, src):
        keys = keys + adds
        estimate = (b.resident if stage == "run" else
                    sum(b.term(k).resident for k in keys if any(t.key == k for t in b.terms)))
        field = "VmHWM" if stage == "run" else "VmRSS"
        measured = stages[stage][field]
        terms = [b.term(k).label for k in adds if any(t.key == k for t in b.terms)]
        shown = estimate
        if not rows:  # the process: the recorded figure, for comparison only
            shown = runtime_costs(b.plan.runtime.backend).desktop_process_bytes
            terms = ["runtime as recorded in data/runtime.json; not judged: the bundle's terms "
                     "are estimated on top of the measured process"]
        rows.append({"checkpoint": label, "measured_bytes": measured, "estimated_bytes": shown,
                     "error": shown / measured - 1, "step_measured_bytes": measured - previous,
                     "step_estimated_bytes": estimate - previous_est, "judged": bool(rows),
                     "terms": terms})
        previous, previous_est = measured, estimate
    files = weight_files(src)
    rows.append({"checkpoint": "weights on disk", "measured_bytes": files,
                 "estimated_bytes": b.stored, "error": b.stored / files - 1 if files else None,
                 "terms": ["stored column"]})
    return rows


def weight_files(src) -> int:
    """Bytes of the bundle's model files and shared weights (no tokenizer, no configs)."""
    files = src.facts.get("files", {})
    models = set(src.facts.get("models", {}).values())
    return sum(n for name, n in files.items() if name in models or name.startswith("shared/"))


def worst(rows: list[dict]) -> dict:
    """The checkpoint step whose estimate misses most, relative to the peak."""
    peak = rows[2]["measured_bytes"]
    return max((r for r in rows[:3] if r.get("judged", True)),
               key=lambda r: abs(r["step_estimated_bytes"] - r["step_measured_bytes"]) / peak)


def table(rows: list[dict], run: dict, prompt_tokens: int) -> str:
    head = ("checkpoint", "measured", "estimated", "error", "step: measured / estimated")
    lines = [head]
    for r in rows:
        step = (f"{size(r['step_measured_bytes'])} / {size(r['step_estimated_bytes'])}: "
                f"{', '.join(r['terms'])}" if "step_measured_bytes" in r else ", ".join(r["terms"]))
        error = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        lines.append((r["checkpoint"], size(r["measured_bytes"]), size(r["estimated_bytes"]),
                      error, step))
    w = [max(len(x[i]) for x in lines) for i in range(4)]
    text = "\n".join(f"{x[0]:<{w[0]}}  {x[1]:>{w[1]}}  {x[2]:>{w[2]}}  {x[3]:>{w[3]}}  {x[4]}"
                     for x in lines)
    bad = worst(rows)
    miss = abs(bad["step_estimated_bytes"] - bad["step_measured_bytes"])
    share = miss / rows[2]["measured_bytes"]
    return (f"measured on this machine: a desktop Python process running the bundle, prompt "
            f"{prompt_tokens} tokens + {run['new_tokens']} new (tau {run['tau']:.2f})\n{text}\n"
            f"largest miss: the step '{bad['checkpoint']}' ({', '.join(bad['terms'])}), "
            f"{100 * share:.1f}% of the peak")


def measured(p: Plan, src, stages: dict, prompt_tokens: int) -> tuple[Budget, list[dict]]:
    b = budget(measured_plan(p, src, stages, prompt_tokens))
    return b, compare(b, src, stages)
