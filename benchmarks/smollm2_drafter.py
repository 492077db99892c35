"""Build the SmolLM2-135M-Instruct HyFlash drafter the speed benchmarks use, by one command,
across as many sessions as it takes.

The recipe is fixed here (DATA, TRAIN). Its expensive part is the self-distillation data:
greedy continuations of 128 tokens after code prompts of up to 512 tokens, through a
135M-parameter target on this CPU: with ``--nproc 2`` and bf16 features (a CPU with bf16
hardware) 32 shards of 128 took 1 h 42 min (4096 -> 8192). A session of this machine may
end before that and the next may start on a fresh disk, so the tokens travel in the
repository (``benchmarks/distill/``, about 0.4 MB a shard with the target's greedy labels
after every token, which the prompt anchors need); the features (GBs) are recomputed from
them by ``hyflash train`` (one causal pass per batch up to the last tap layer, no
decoding, no LM head where the labels are of the same precision). Where the CPU has bf16
hardware the pass and the steps run in bf16, else in float32 (``precision``).
``--sequences N`` (a multiple of 128) trains on the first N/128 shards, which are exactly
the data of a run of N continuations (a shard depends only on the seed and its number):
the committed folder of each N holds only the shards
no smaller committed run holds (4096: shards 0-31, 8192: 32-63, 16384: 64-127),
and a run restores each shard from whichever has it, decoding only the shards none has.
In the same --work, ``hyflash train`` also links the shards of a finished run of fewer
continuations (``command.grown_from``).

    python benchmarks/smollm2_drafter.py              # restore tokens, generate/train, resume
    python benchmarks/smollm2_drafter.py --sequences 1024 --steps 1000   # a smaller run
    python benchmarks/smollm2_drafter.py --data-only  # stop after the data
    python benchmarks/smollm2_drafter.py --nproc 2 --sequences 32768 --decode-only
                                 # decode the shards no committed folder holds, tokens
                                 # only (no bf16 features pass, no features on disk; 1.7
                                 # min a shard with --nproc 2); stop it any time, it
                                 # resumes at the shard it was on
    python benchmarks/smollm2_drafter.py --sequences 8192 --save-tokens  # the tokens and
                                 # labels of finished shards no committed folder holds ->
                                 # benchmarks/distill/ (then commit)
    python benchmarks/smollm2_drafter.py --nproc 2    # two processes (torchrun), one core each
    python benchmarks/smollm2_drafter.py --heads 9 --init target  # layers start as the
                                                      # target's last two decoder layers
    python benchmarks/smollm2_drafter.py --init RUN --sequences 8192 --steps 2000 \
        --eval-every 500 --lr 5e-4   # train RUN (a drafter folder) further: the second
                                     # step of what ships; its third is the same with
                                     # --init RUN2 --sequences 24960 (since 2026-12-07)
    python benchmarks/smollm2_drafter.py --ship       # the drafter in --out -> benchmarks/drafters/
                                                      # smollm2-hyflash in float16 (then commit)

The drafter lands in --out (default: the hyflash cache, runs/smollm2-hyflash); ``--ship``
copies it in float16 to benchmarks/drafters/smollm2-hyflash, the copy the repository holds
and ``make bench-smollm2`` passes to ``hyflash bench --suite smollm2 --drafter``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hyflash.models.gguf import cache_root

HERE = Path(__file__).resolve().parent
TOKENS = HERE / "distill" / "smollm2-hyflash"
SHIPPED = HERE / "drafters" / "smollm2-hyflash"  # the drafter in the repository (fp16)
SEQUENCES, SHARD = 16384, 128  # the default run: all 128 committed shards of 128 continuations
DATA = ["--data", "stdlib", "--gen-len", "128", "--max-seq-len", "640", "--data-batch", "32"]
TRAIN = ["--draft-vocab", "8192", "--anchors", "32", "--prompt-anchors", "0.5",
         "--keep", "best"]  # val.jsonl (every --eval-every steps): does the full data overfit?


def precision() -> str:
    """bfloat16 where the CPU has it (features 1.7x faster with AMX, within ~1%; steps ~1.6x,
    float32 weights), float32 where torch would emulate it (~50x slower)."""
    from hyflash.train.features import cpu_has_fast_bf16

    return "bfloat16" if cpu_has_fast_bf16() else "float32"


def recipe(sequences: int, steps: int, arithmetic: str, eval_every: int = 100,
           tokens_only: bool = False) -> list[str]:
    """The hyflash-train arguments of the recipe. tokens_only: the data without features
    (``--features recompute``: the float32 greedy continuations, in the tokens-only folder
    ``restore_tokens`` fills), as ``--decode-only`` writes it."""
    # features cached (memory-mapped from disk) past hyflash's 16 GiB default too: recomputing
    # them would rerun the target in every step (16384 continuations: 20.5 GiB of bf16)
    features = ["--features", "recompute"] if tokens_only else \
        ["--features", "cache", "--feature-precision", arithmetic]
    return [*DATA, *features, "--sequences", str(sequences), *TRAIN,
            "--eval-every", str(eval_every), "--precision", arithmetic, "--steps", str(steps)]


def gguf() -> Path:
    out = subprocess.run([sys.executable, str(HERE / "setup_models.py")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Path(out)


def folders(target: Path, work: Path, sequences: int,
            arithmetic: str) -> tuple[Path, Path, list[Path]]:
    """(the data folder with cached features, the tokens-only folder, the committed tokens
    folders of the recipe: this run's in TOKENS if there is one, then those of the same data
    with other --sequences, most first; a shard depends only on the seed and its number, so
    a shard of any of them is this run's)."""
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.train import command
    from hyflash.train.corpus import corpus_digest, read_corpus

    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args([*recipe(sequences, 1, arithmetic), "--target", str(target),
                         "--out", "unused"])
    folder = resolve_model_folder(str(target))
    t = Target.from_pretrained(folder, max_seq_len=args.max_seq_len)
    spec = command.data_spec(args, t.cfg.max_seq_len)
    corpus = corpus_digest(read_corpus(args.data))
    cached, tokens = command.folder_names(work, spec, folder, t, corpus, args.engine,
                                          args.feature_precision)
    own = TOKENS / tokens.name
    others = command.grown_from(own, spec, folder, t, corpus, args.engine,
                                args.feature_precision)
    return cached, tokens, ([own] if own.is_dir() else []) + others


def save_tokens(cached: Path, dest: Path, committed: list[Path], arithmetic: str,
                tokens: Path | None = None) -> None:
    """Every finished shard of the cached data -> a tokens-only shard with the target's
    greedy labels (computed by the cached run's ``arithmetic`` pass, so that a features
    pass at that precision on a fresh disk skips the LM head) in ``dest`` (a folder of
    TOKENS), unless a committed folder holds it already with those labels: a larger run
    commits only the shards beyond the smaller runs' ones, and a committed shard of tokens
    alone gains its labels in place (its tokens checked equal). ``tokens``: the run's
    tokens-only folder (``--decode-only``), whose finished shards no committed folder
    holds are committed too, without labels (a features pass computes them)."""
    import numpy as np

    from hyflash.errors import HyflashError
    from hyflash.train.shards import Shard, shard_files, shard_path, write_shard

    folders = [dest, *(c for c in committed if c != dest)]
    source = cached if (cached / "spec.json").exists() else tokens
    if source is None or not (source / "spec.json").exists():
        raise HyflashError(f"no data in {cached}" + (f" or {tokens}" if tokens else "") +
                           ": nothing to save (run without --save-tokens first)")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "spec.json", dest / "spec.json")
    added = labelled = 0
    found = shard_files(cached) if cached.is_dir() else {}
    if tokens is not None and tokens.is_dir():
        found = {**{s: f for s, f in shard_files(tokens).items()
                    if not any(shard_path(c, s).exists() for c in folders)}, **found}
    for s, path in sorted(found.items()):
        held = next((f for c in folders if (f := shard_path(c, s)).exists()), None)
        if held is not None and Shard(held).greedy_precision == arithmetic:
            continue
        src = Shard(path)
        toks = [src.tokens(i).numpy() for i in range(len(src))]
        if held is not None and not all(np.array_equal(a, Shard(held).tokens(i).numpy())
                                        for i, a in enumerate(toks)):
            raise HyflashError(f"{held} and {path} hold different tokens: not the same data")
        greedy = [src.greedy(i).numpy() for i in range(len(src))] if src.has_greedy else None
        write_shard(held.parent if held is not None else dest, s, toks, None, src.meta,
                    greedy=greedy, greedy_precision=arithmetic if greedy else None)
        added, labelled = added + (held is None), labelled + (held is not None)
    have = set().union(*(shard_files(c) for c in folders))
    spec = json.loads((source / "spec.json").read_text())
    total = -(-spec["sequences"] // spec["shard"])
    print(f"{added} shard(s) added to {dest}, {labelled} committed shard(s) given their "
          f"greedy labels; the committed tokens hold {len([s for s in have if s < total])}"
          f"/{total} shards of this run")


def ship(trained: Path, dest: Path = SHIPPED, store: str = "float16") -> None:
    """The drafter trained in ``trained`` -> ``dest`` in the form it is committed in:
    ``float16`` (its float weights in float16; integer tensors, the draft vocabulary's ids,
    as they are) or ``int8`` (``hyflash.models.drafter_store.pack_rows``: matrices as int8
    rows with float32 scales, the rest float16; for a drafter past ~20 MiB in float16)."""
    from collections import Counter

    from safetensors.torch import load_file, save_file

    from hyflash.models.drafter_folder import read_drafter_config
    from hyflash.models.drafter_store import PACKED_FORMAT, pack_rows

    read_drafter_config(trained)  # a drafter folder with its training report, or a clear error
    state = load_file(trained / "model.safetensors")
    meta = json.loads((trained / "config.json").read_text())
    if store == "int8":
        out = pack_rows(state)
        meta["format_version"] = PACKED_FORMAT
    else:
        out = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(meta, indent=1))
    save_file(out, dest / "model.safetensors")  # .half() and load_file give contiguous tensors
    size = (dest / "model.safetensors").stat().st_size / 2**20
    kinds = Counter(str(v.dtype).removeprefix("torch.") for v in out.values())
    print(f"{dest}: {size:.1f} MiB ({sum(v.numel() for v in out.values()):,} values; tensors: "
          f"{', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")


def restore_tokens(work: Path, tokens_name: str, committed: list[Path],
                   sequences: int) -> None:
    """The committed tokens of the first sequences/SHARD shards -> this run's tokens-only
    folder, each shard from the first committed folder that holds it, under this run's spec
    (the run decodes the shards none holds)."""
    from hyflash.train.folders import claim_work
    from hyflash.train.shards import shard_path

    if not committed:
        return
    claim_work(work, Path("unused"))
    dest = work / tokens_name
    dest.mkdir(exist_ok=True)
    spec = json.loads((committed[0] / "spec.json").read_text())
    (dest / "spec.json").write_text(json.dumps({**spec, "sequences": sequences}, indent=1))
    n = 0
    for s in range(sequences // SHARD):
        src = next((f for c in committed if (f := shard_path(c, s)).exists()), None)
        if src is None:
            continue
        mine = dest / src.name  # replaced when it differs: the committed one gained labels
        if not mine.exists() or mine.stat().st_size != src.stat().st_size:
            shutil.copy(src, mine.with_suffix(".tmp"))
            os.replace(mine.with_suffix(".tmp"), mine)
            n += 1
    print(f"{n} shard(s) of tokens restored from {', '.join(str(c) for c in committed)} "
          f"into {dest}")


def train_command(args: argparse.Namespace, target: Path, arithmetic: str) -> list[str]:
    """The ``hyflash train`` arguments of a run of the recipe (``-m hyflash train ...``)."""
    cmd = ["-m", "hyflash", "train", "--target", str(target), "--out", str(args.out),
           "--work", str(args.work), "--keep-work", "--threads", str(args.threads),
           *recipe(args.sequences, args.steps, arithmetic, args.eval_every,
                   tokens_only=args.decode_only),
           "--layers", str(args.layers), "--heads", str(args.heads), "--init", args.init,
           "--lr", str(args.lr), "--kl", str(args.kl)]
    if args.data_only or args.decode_only:
        cmd.append("--data-only")
    return cmd


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    root = cache_root()
    ap.add_argument("--out", type=Path, default=root / "runs" / "smollm2-hyflash")
    ap.add_argument("--work", type=Path, default=root / "work" / "smollm2-hyflash")
    ap.add_argument("--data-only", action="store_true",
                    help="stop once the data (tokens and cached features) is ready")
    ap.add_argument("--decode-only", action="store_true",
                    help="only decode the continuations of the shards no committed folder "
                         "holds, tokens only (no features pass, no labels); resumable, "
                         "then --save-tokens commits the finished shards")
    ap.add_argument("--save-tokens", action="store_true",
                    help="copy the tokens and greedy labels of the finished shards that no "
                         "committed folder holds into benchmarks/distill/, and add the labels "
                         "to committed shards without them (then commit)")
    ap.add_argument("--ship", action="store_true",
                    help="write the drafter in --out to --dest in --store's form (default: "
                         f"float16, to {SHIPPED.relative_to(HERE.parent)}; then commit)")
    ap.add_argument("--dest", type=Path, default=SHIPPED,
                    help=f"where --ship writes (default {SHIPPED.relative_to(HERE.parent)}, "
                         "the copy the benchmarks use)")
    ap.add_argument("--store", choices=("float16", "int8"), default="float16",
                    help="--ship's form: float16, or int8 rows with float32 scales (half "
                         "the size, within half a step of each weight; for drafters past "
                         "~20 MiB in float16)")
    ap.add_argument("--nproc", type=int, default=1, help="processes (torchrun when > 1)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process")
    ap.add_argument("--sequences", type=int, default=SEQUENCES,
                    help=f"continuations to train on, a multiple of {SHARD} (default "
                         f"{SEQUENCES}): the shards benchmarks/distill/ holds are restored, "
                         "the rest decoded; a finished run of fewer in --work lends its "
                         "shards")
    ap.add_argument("--steps", type=int, default=4500, help="training steps")
    ap.add_argument("--eval-every", type=int, default=250,
                    help="steps between validations (each ~40 s with 16384 continuations; "
                         "a run resumes under another value)")
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--heads", type=int, default=9,
                    help="drafter attention heads (9, the target's: head size 64)")
    ap.add_argument("--init", default="random", metavar="random|target|DIR",
                    help="the drafter's starting weights (hyflash train --init): DIR = a "
                         "drafter to train further, e.g. the shipped one (its fp16 weights)")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="peak learning rate (hyflash train --lr; default 1e-3)")
    ap.add_argument("--kl", type=float, default=0.0, metavar="W",
                    help="weight of the KL term to the target's distribution (hyflash train "
                         "--kl; default 0, cross-entropy only)")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.sequences % SHARD or args.sequences <= 0:
        ap.error(f"--sequences must be a positive multiple of {SHARD}, not {args.sequences}")

    if args.ship:
        ship(args.out, args.dest, store=args.store)
        return
    target = gguf()
    arithmetic = precision()
    cached, tokens, committed = folders(target, args.work, args.sequences, arithmetic)
    if args.save_tokens:
        save_tokens(cached, TOKENS / tokens.name, committed, arithmetic, tokens)
        return
    restore_tokens(args.work, tokens.name, committed, args.sequences)
    cmd = train_command(args, target, arithmetic)
    if args.nproc > 1:
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc}", *cmd]
    else:
        run = [sys.executable, *cmd]
    print(" ".join(run), flush=True)
    sys.exit(subprocess.run(run).returncode)


if __name__ == "__main__":
    main()
