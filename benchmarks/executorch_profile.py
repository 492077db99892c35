"""Where an ExecuTorch program's decode (T=1) and verify (T=B) time goes, per operator,
for each attention form of the target (``hyflash.export.executorch_modules``), side by
side in one run; plus what each method runs outside XNNPACK and what the .pte holds.

    python benchmarks/executorch_profile.py --target pocket --drafter pocket \
        --context 1000 --repeats 7 --threads 1 --forms bmm,operand,sdpa \
        --out benchmarks/results/executorch_profile

Per form: exports the pair at fp32 into a temporary folder (``export_program``, the
exporter's own code), prefills ``--context`` random tokens, then calls ``forward`` at the
same position over and over (T=1, then T=B; the forms take turns every repeat, so the
machine's load hits them alike; medians). The per-operator split is ExecuTorch's ETDump
(the runtime's event tracer, ``_load_program(enable_etdump=True)``) read with
``executorch.devtools.Inspector``: operators outside a delegate by kernel name, XNNPACK's
own per-operator events inside ``DELEGATE_CALL``. Row exactness: the logits of a verify of
B tokens against B decodes of the same tokens, bit for bit (what losslessness rests on).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from hyflash.export import executorch as et
from hyflash.export.bundle import load_pair
from hyflash.export.executorch_modules import ATTENTION_FORMS, ProgramTarget
from hyflash.models.target import Target

# ------------------------------------------- ExecuTorch's custom-op attention (measured only)

class SdpaKVCache(nn.Module):
    """The cache of ExecuTorch's LLM custom ops: [1, S, kv_heads, head_dim] per layer."""

    def __init__(self, heads: int, max_seq_len: int, head_dim: int):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, max_seq_len, heads, head_dim),
                             persistent=False)
        self.register_buffer("v", torch.zeros(1, max_seq_len, heads, head_dim),
                             persistent=False)

    def update(self, start, k: torch.Tensor, v: torch.Tensor):
        """k, v [1, T, kv_heads, head_dim] at positions start.. (``llama::update_cache``)."""
        torch.ops.llama.update_cache(k, self.k, start)
        torch.ops.llama.update_cache(v, self.v, start)
        return self.k, self.v


class CustomSdpaTarget(ProgramTarget):
    """Attention through ExecuTorch's LLM custom ops (``llama::update_cache``,
    ``llama::custom_sdpa``, as its own Llama export): attends to the written positions only.
    NOT row-exact: custom_sdpa's result for a row depends on how many query rows the call
    has (measured, benchmarks/executorch_profile.py), so a verify row is not bit for bit
    what a decode computes; kept for measurement only."""

    def __init__(self, target: Target, rows: int):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (registers)

        super().__init__(target, rows)
        c = target.cfg
        for layer in target.layers:
            layer.self_attn.kv_cache = SdpaKVCache(c.num_key_value_heads, c.max_seq_len,
                                                   c.head_dim)

    def call_mask(self, pos: torch.Tensor):
        """The call's first position as a size (the custom ops mask causally from it)."""
        start = pos[0].item()
        torch._check_is_size(start)
        torch._check(start < self.target.cfg.max_seq_len)
        return start

    def attention(self, attn, x, cos, sin, pos, start):
        c = attn.cfg
        q, k, v = (z.transpose(1, 2) for z in self.projections(attn, x, cos, sin))
        keys, values = attn.kv_cache.update(start, k, v)
        y = torch.ops.llama.custom_sdpa(q, keys, values, start, None, 0.0, True,
                                        c.head_dim ** -0.5)
        return attn.o_proj(y.view(1, -1, c.num_attention_heads * c.head_dim))


def add_sdpa_form() -> None:
    """Register ``sdpa`` as an attention form of export_program, for this measurement."""
    ATTENTION_FORMS["sdpa"] = CustomSdpaTarget


def export(target_path: str, drafter_dir: str, max_seq_len: int | None, form: str,
           folder: Path) -> dict:
    _, _, target, drafter = load_pair(target_path, drafter_dir, max_seq_len, "kv")
    path = folder / f"{form}.pte"
    t0 = time.perf_counter()
    et.export_program(target, drafter, path, attention=form)
    return {"pte": str(path), "export_s": time.perf_counter() - t0,
            "pte_bytes": path.stat().st_size, "vocab": target.cfg.vocab_size,
            "max_seq_len": target.cfg.max_seq_len,
            "block": drafter.cfg.block_size}


def program_contents(path: str) -> dict:
    """Per method: operators run outside any delegate and the XNNPACK delegates' blob
    bytes; the file by segment: the constant segment (tensors of operators outside a
    delegate; its largest tensors), each delegate blob and each named-data entry (the
    weights XNNPACK reads, stored once per distinct content)."""
    from executorch.exir._serialize._program import (
        _flatbuffer_to_program,
        _get_extended_header,
    )

    data = Path(path).read_bytes()
    eh = _get_extended_header(data)
    prog = _flatbuffer_to_program(data[:eh.program_size])
    segs = [s.size for s in prog.segments]
    owner = {}  # segment -> what it holds
    methods = {}
    for plan in prog.execution_plan:
        if not plan.chains:  # constant methods
            continue
        calls = collections.Counter()
        for chain in plan.chains:
            for ins in chain.instructions:
                arg = ins.instr_args
                if hasattr(arg, "op_index"):
                    op = plan.operators[arg.op_index]
                    calls[f"{op.name}.{op.overload}" if op.overload else op.name] += 1
        blobs = []
        for i, d in enumerate(plan.delegates):
            ref = d.processed
            if ref.location == 1:  # segment
                owner[ref.index] = f"{plan.name} delegate {i} ({d.id})"
                blobs.append(segs[ref.index])
            else:
                blobs.append(len(prog.backend_delegate_data[ref.index].data))
        methods[plan.name] = {"non_delegated": dict(calls.most_common()),
                              "delegate_blob_bytes": blobs}
    const_seg = prog.constant_segment
    offsets = list(const_seg.offsets)
    owner[const_seg.segment_index] = "constant segment"
    const_sizes = sorted((b - a for a, b in zip(offsets, offsets[1:], strict=False)),
                         reverse=True)
    named = collections.defaultdict(list)
    for nd in prog.named_data or []:
        named[nd.segment_index].append(nd.key)
        owner.setdefault(nd.segment_index, "named data")
    by_kind = collections.Counter()
    for i, size in enumerate(segs):
        by_kind[owner.get(i, "other").split(" (")[0].split(" delegate")[0]
                if owner.get(i, "").startswith(("constant", "named")) else
                "delegate blobs" if "delegate" in owner.get(i, "") else "other"] += size
    return {"file_bytes": len(data), "flatbuffer_bytes": eh.program_size,
            "segments_by_kind": dict(by_kind), "methods": methods,
            "constant_segment_bytes": segs[const_seg.segment_index],
            "largest_constants": const_sizes[:5],
            "named_data": sorted(([segs[i], len(keys)] for i, keys in named.items()),
                                 reverse=True)[:8],
            "named_data_entries": sum(map(len, named.values()))}


def tokens(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (1, n), generator=g)


class Runner:
    """One form's program, prefilled to the context; calls forward at the context."""

    def __init__(self, info: dict, context: int, etdump: bool):
        from executorch.extension.pybindings import portable_lib as pl

        self.program = pl._load_program(info["pte"], enable_etdump=etdump)
        self.forward = self.program.load_method("forward")
        self.context = context
        prompt = tokens(context, info["vocab"], 0)
        self.calls = []
        for at in range(0, context, 64):
            self.call(prompt[:, at:at + 64], at, "prefill")
        self.one = tokens(1, info["vocab"], 1)
        self.block = tokens(info["block"], info["vocab"], 2)

    def call(self, toks: torch.Tensor, pos: int, label: str) -> tuple[float, torch.Tensor]:
        t0 = time.perf_counter()
        out = self.forward.call([toks, torch.tensor([pos])])[0]
        ms = 1000 * (time.perf_counter() - t0)
        self.calls.append(label)
        return ms, out

    def decode(self) -> float:
        return self.call(self.one, self.context, "decode")[0]

    def verify(self) -> float:
        return self.call(self.block, self.context, "verify")[0]

    def rows_exact(self) -> bool:
        """A verify's logits == the decodes of the same tokens, bit for bit."""
        _, block = self.call(self.block, self.context, "check")
        rows = [self.call(self.block[:, i:i + 1], self.context + i, "check")[1][0, 0]
                for i in range(self.block.shape[1])]
        return bool(torch.equal(block[0], torch.stack(rows)))


def op_split(etdump: str, calls: list[str], label: str) -> dict:
    """Mean ms per call labelled `label`: per operator outside a delegate, per XNNPACK
    operator kind inside one, and the totals."""
    from executorch.devtools import Inspector

    ins = Inspector(etdump_path=etdump)
    block = next(b for b in ins.event_blocks if b.name == "Execute")
    idx = [i for i, c in enumerate(calls) if c == label]
    agg, prev = collections.Counter(), None
    for e in block.events:
        raw = e.perf_data.raw if e.perf_data else []
        if len(raw) != len(calls):
            continue
        ms = sum(raw[i] for i in idx) / len(idx)
        if e.is_delegated_op:
            agg["xnnpack: " + re.sub(r" #\d+$", "", e.name)] += ms
        elif e.name == "OPERATOR_CALL":  # wraps the native_call_<op> just before it
            op = prev[len("native_call_"):] if prev and prev.startswith("native_call_") \
                else "(executorch_prim)"
            agg["outside: " + op] += ms
            agg["= outside delegates"] += ms
        elif e.name == "DELEGATE_CALL":
            agg["= XNNPACK delegate calls"] += ms
        prev = e.name
    return {k: round(v, 4) for k, v in agg.most_common()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="pocket")
    p.add_argument("--drafter", default="pocket")
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--forms", default="bmm,operand,sdpa")
    p.add_argument("--work", type=Path, default=None, help="folder for the .pte files "
                   "(default: a temporary folder, deleted)")
    p.add_argument("--out", type=Path, default=None, help="write <out>.json and <out>.md")
    p.add_argument("--from-json", type=Path, default=None,
                   help="only re-render the markdown of a result .json")
    args = p.parse_args()
    if args.from_json:
        args.from_json.with_suffix(".md").write_text(
            markdown(json.loads(args.from_json.read_text())))
        return
    from executorch.extension.pybindings import portable_lib as pl

    torch.set_num_threads(args.threads)
    pl._unsafe_reset_threadpool(args.threads)
    forms = args.forms.split(",")
    if "sdpa" in forms:
        add_sdpa_form()
    with tempfile.TemporaryDirectory(prefix="hyflash-etprof-", dir=args.work) as tmp:
        infos = {}
        for form in forms:
            infos[form] = export(args.target, args.drafter, args.max_seq_len, form, Path(tmp))
            infos[form]["contents"] = program_contents(infos[form]["pte"])
            print(form, "exported", infos[form]["pte_bytes"], "bytes in",
                  round(infos[form]["export_s"], 1), "s", flush=True)
        # wall times: the forms take turns
        runners = {f: Runner(infos[f], args.context, etdump=False) for f in forms}
        wall = {f: {"decode": [], "verify": []} for f in forms}
        for f in forms:
            runners[f].decode()
            runners[f].verify()
        for _ in range(args.repeats):
            for f in forms:
                wall[f]["decode"].append(runners[f].decode())
                wall[f]["verify"].append(runners[f].verify())
        for f in forms:
            infos[f]["rows_exact"] = runners[f].rows_exact()
            infos[f]["decode_ms"] = statistics.median(wall[f]["decode"])
            infos[f]["verify_ms"] = statistics.median(wall[f]["verify"])
            infos[f]["decode_runs_ms"] = [round(x, 3) for x in wall[f]["decode"]]
            infos[f]["verify_runs_ms"] = [round(x, 3) for x in wall[f]["verify"]]
        del runners
        # per-operator split (ETDump), one form at a time
        for f in forms:
            r = Runner(infos[f], args.context, etdump=True)
            for _ in range(max(3, args.repeats // 2)):
                r.decode()
                r.verify()
            path = str(Path(tmp) / f"{f}.etdp")
            r.program.write_etdump_result_to_file(path, None)
            infos[f]["ops_decode"] = op_split(path, r.calls, "decode")
            infos[f]["ops_verify"] = op_split(path, r.calls, "verify")
            del r
    for info in infos.values():
        info.pop("pte")
    result = {"command": vars(args) | {"work": None, "out": str(args.out)},
              "torch_threads": args.threads, "forms": infos}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    print(text)
    if args.out:
        args.out.with_suffix(".md").write_text(text)


def markdown(result: dict) -> str:
    c = result["command"]
    forms = result["forms"]
    out = [f"## target {c['target']}, drafter {c['drafter']}, context {c['context']}, "
           f"{c['threads']} thread(s), median of {c['repeats']}", "",
           "| attention form | ms decode (T=1) | ms verify (T=B) | verify rows == decodes "
           "| .pte MB | export s |", "|---|---|---|---|---|---|"]
    for f, i in forms.items():
        out.append(f"| {f} | {i['decode_ms']:.2f} | {i['verify_ms']:.2f} | "
                   f"{'yes' if i['rows_exact'] else 'NO'} | {i['pte_bytes'] / 1e6:.1f} | "
                   f"{i['export_s']:.0f} |")
    out += ["", "### What the .pte holds (MB)", "",
            "| form | constant segment (operators outside XNNPACK) | its largest tensor | "
            "XNNPACK named data (distinct weights) | its largest entry (keys) | delegate "
            "blobs | file |", "|---|---|---|---|---|---|---|"]
    for f, i in forms.items():
        k = i["contents"]
        kinds = k["segments_by_kind"]
        big, keys = k["named_data"][0] if k["named_data"] else (0, 0)
        out.append(f"| {f} | {kinds.get('constant segment', 0) / 1e6:.1f} | "
                   f"{(k['largest_constants'] or [0])[0] / 1e6:.1f} | "
                   f"{kinds.get('named data', 0) / 1e6:.1f} | {big / 1e6:.1f} ({keys}) | "
                   f"{kinds.get('delegate blobs', 0) / 1e6:.2f} | {k['file_bytes'] / 1e6:.1f} |")
    for f, i in forms.items():
        out += ["", f"### {f}: operators outside XNNPACK per method (calls in the program)",
                ""]
        for m, d in i["contents"]["methods"].items():
            ops = ", ".join(f"{k} x{n}" for k, n in d["non_delegated"].items())
            out.append(f"- `{m}` ({len(d['delegate_blob_bytes'])} XNNPACK delegates): {ops}")
        out += ["", f"### {f}: ms per call by operator (ETDump; top 15)", "",
                "| operator | decode | verify |", "|---|---|---|"]
        keys = list(i["ops_verify"])[:15]
        keys += [k for k in list(i["ops_decode"])[:15] if k not in keys]
        for k in keys:
            out.append(f"| {k} | {i['ops_decode'].get(k, 0):.3f} | "
                       f"{i['ops_verify'].get(k, 0):.3f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
