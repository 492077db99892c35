"""From the command line to a ``Plan``: which target, drafter, recipe, backend and context.

A bundle fixes everything (its manifest); flags that would change it are errors, as
elsewhere in hyflash. Any other source takes them from flags, with defaults an export
would use: the recipe's own backend, a HyFlash drafter as ``hyflash train`` builds it,
and the model's context capped at 4096 positions.
"""

from __future__ import annotations

from dataclasses import replace

from hyflash.budget.memory import Plan
from hyflash.budget.phone_fit import on_phone
from hyflash.budget.recipes import default_backend, recipe, source_grid
from hyflash.budget.runtime_costs import runtime_costs
from hyflash.budget.shapes import DrafterShape, TargetShape
from hyflash.budget.sources import Source
from hyflash.errors import HyflashError

DEFAULT_CONTEXT = 4096  # hyflash.models.target.DEFAULT_MAX_SEQ_LEN
DEFAULT_PREFILL = 64  # rows per prefill call: the ExecuTorch runtime's chunk
DRAFTER_ARCHS = ("hyflash", "full", "none")
FLAGS = ("context", "quant", "backend", "drafter", "draft_vocab", "group_size", "prefill_chunk")


def check_flags(src: Source, args) -> None:
    if src.kind != "bundle":
        if args.measure:
            raise HyflashError("--measure runs an exported bundle: pass a bundle folder "
                               "(`hyflash export --out DIR`), not a " + src.kind)
        return
    fixed = [f for f, v in (("--context", args.context), ("--quant", args.quant),
                            ("--backend", args.backend), ("--drafter", args.drafter),
                            ("--draft-vocab", args.draft_vocab),
                            ("--group-size", args.group_size)) if v is not None]
    if fixed:
        raise HyflashError(f"the bundle fixes its target, drafter, recipe and context: drop "
                           f"{' and '.join(fixed)} (or budget the model itself)")


def context_of(src: Source, args) -> int:
    if src.context:
        return src.context
    limit = src.target.max_context
    if args.context is None:
        return min(DEFAULT_CONTEXT, limit) if limit else DEFAULT_CONTEXT
    if limit and args.context > limit:
        raise HyflashError(f"a context of {args.context} tokens is above the {limit} "
                           f"{src.name} supports (max_position_embeddings): pass --context "
                           f"<= {limit}")
    return args.context


def drafter_of(src: Source, args, context: int) -> DrafterShape | None:
    if src.drafter is not None:
        return src.drafter
    choice = args.drafter or "hyflash"
    if choice in DRAFTER_ARCHS:
        if choice == "none":
            if args.draft_vocab:
                raise HyflashError("--draft-vocab sizes a drafter, and --drafter none has "
                                   "none: drop one of them")
            return None
        d = DrafterShape.default_for(src.target, choice)
    else:
        from hyflash.models.drafter_folder import read_drafter_config

        folder, cfg, _ = read_drafter_config(choice)
        d = DrafterShape.from_config(cfg)
        check_fits(d, src.target, folder)
    if args.draft_vocab:
        if args.draft_vocab >= d.vocab:
            raise HyflashError(f"--draft-vocab {args.draft_vocab} is not below the vocabulary "
                               f"({d.vocab}): pass fewer ids, or 0 for the whole vocabulary")
        d = replace(d, draft_vocab=args.draft_vocab)
    need = (d.window if d.arch == "hyflash" else 1) + d.block
    if context < need:
        raise HyflashError(f"a context of {context} tokens cannot hold the drafter's window "
                           f"({d.window}) and a block ({d.block}): pass --context >= {need}")
    return d


def check_fits(d: DrafterShape, t: TargetShape, folder) -> None:
    for name, a, b in (("vocab size", d.vocab, t.vocab), ("hidden size", d.hidden, t.hidden),
                       ("feature size", d.feature_size, t.feature_size)):
        if a != b:
            raise HyflashError(f"the drafter at {folder} was trained for another target: its "
                               f"{name} is {a}, {t.name}'s is {b}; pass the drafter trained "
                               "for this model, or --drafter hyflash to size a default one")


DRAFTER_GRAPHS = {"drafter_step", "drafter_commit"}


def split_recipe(name: str, where: str) -> tuple[str, str]:
    """A bundle's recipe -> (the target's, the drafter's): ``int4`` for both, or
    ``int4:drafter_commit+drafter_step`` (``requantize_bundle(roles=...)``: only those graphs
    quantized, the rest fp32)."""
    if ":" not in name:
        return name, name
    quant, roles = name.split(":", 1)
    roles = set(roles.split("+"))
    drafter = roles & DRAFTER_GRAPHS
    if drafter and drafter != DRAFTER_GRAPHS or not roles <= DRAFTER_GRAPHS | {"target"}:
        raise HyflashError(f"{where} quantizes graphs {', '.join(sorted(roles))} only (recipe "
                           f"{name}); the budget sizes the target and the drafter (both of its "
                           "graphs) with one recipe each: requantize the bundle with the "
                           "drafter's graphs together")
    return (quant if "target" in roles else "fp32"), (quant if drafter else "fp32")


def build(src: Source, args) -> Plan:
    """The plan for a device budget (runtime term: the library; ExecuTorch's weights
    factors fitted on phones, ``phone_fit``)."""
    check_flags(src, args)
    name, drafter_name = split_recipe(src.recipe or args.quant or "fp32", src.name)
    backend = src.backend or args.backend or default_backend(name)
    if args.group_size is not None and name != "8da4w":
        raise HyflashError(f"--group-size applies to the 8da4w recipe only, not {name}: drop "
                           "it or pass --quant 8da4w")
    if args.group_size is not None and backend == "onnx":
        raise HyflashError("--group-size applies to --backend executorch: ONNX's 8da4w takes "
                           "blocks of 32")
    context = context_of(src, args)
    facts = src.facts
    target_recipe = recipe(name, backend, src.group_size or args.group_size)
    drafter_recipe = recipe(drafter_name, backend, src.group_size or args.group_size)
    kept = source_grid(target_recipe, facts.get("source_grid"))  # the drafter is never a GGUF's
    return Plan(target=src.target, drafter=drafter_of(src, args, context), recipe=kept,
                drafter_recipe=drafter_recipe if drafter_recipe != kept else None,
                context=context, prefill=min(args.prefill_chunk or DEFAULT_PREFILL, context),
                runtime=on_phone(runtime_costs(backend)),
                embedding_mapped=(backend == "onnx" and any("embed" in n for n in
                                                           facts.get("shared", [])))
                if src.kind == "bundle" else None,
                commit_rows=facts.get("commit_rows"), kv_form=facts.get("kv_form"))


def for_bundle(src: Source) -> Plan:
    """A bundle's plan as its manifest fixes it (no flags)."""
    from argparse import Namespace

    return build(src, Namespace(**dict.fromkeys(FLAGS), measure=False))


def variants(p: Plan) -> dict[str, Plan]:
    """The same budget with HyFlash, with the full-context drafter and with no drafter."""
    out = {"no drafter": replace(p, drafter=None)}
    if p.drafter is not None:
        hy = p.drafter if p.drafter.arch == "hyflash" else p.drafter.as_arch("hyflash")
        out["HyFlash drafter"] = replace(p, drafter=hy)
        out["full-context drafter"] = replace(p, drafter=hy.as_arch("full"))
    return out
