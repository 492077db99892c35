"""The loop's per-round choices as command-line flags, shared by `hyflash generate` and
`hyflash simulate`: where drafts come from (``--lookup``), whether a measured gate picks
each round's source (``--adaptive``) and how many draft rows a verify takes
(``--draft-rows``). ``engine`` builds the speculative engine they describe."""

from __future__ import annotations

import argparse

from hyflash.runtime.draft_rows import ROWS_HELP, parse_policy, policy_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", action="store_true",
                   help="draft by copying from the context where its last tokens occurred "
                        "before (prompt lookup), with the drafter where they did not; still "
                        "lossless (runtime/lookup.py)")
    p.add_argument("--adaptive", action="store_true",
                   help="each round, take whichever of the lookup (with --lookup), the drafter "
                        "and a plain one-token decode has committed the most tokens per "
                        "second so far (measured; still lossless; runtime/gate.py)")
    p.add_argument("--draft-rows", type=policy_arg, default="all", metavar="all|auto|P",
                   help=ROWS_HELP)


def engine(args: argparse.Namespace, target, drafter):
    """The speculative engine over ``target`` and ``drafter`` (None: plain decoding, or
    lookup alone) with the rounds ``args`` asked for; the lookup drafts blocks of the
    drafter's size, or of its own default without a drafter."""
    from hyflash.runtime.engine import SpeculativeEngine
    from hyflash.runtime.gate import RateGate
    from hyflash.runtime.lookup import ContextLookup

    lookup = None
    if args.lookup:
        lookup = ContextLookup() if drafter is None else ContextLookup(
            block_size=drafter.block_size)
    gate = RateGate() if args.adaptive else None
    return SpeculativeEngine(target, drafter, lookup, gate, parse_policy(args.draft_rows))
