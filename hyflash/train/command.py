"""`hyflash train`: distil data from a target, train a drafter, write it atomically.

Work (the generated data and the training checkpoint) lives in ``--work`` (default
``OUT.work``) so that rerunning the same command resumes instead of starting over; the
data folder is keyed by the target, the corpus content and the data settings, and each
training run lives inside the data it trains on, so another corpus never resumes an old
checkpoint. The drafter folder appears only when training has finished; the work folder
is then removed unless ``--keep-work``. ``--seed`` fixes the drafter's initial weights,
the prompts and the batches: the same command on the same machine gives the same drafter.

The same command runs unchanged under ``torchrun`` (``distributed.py``): every rank
generates its own data shards, trains on them (DDP, or FSDP2 with ``--parallel fsdp``)
and resumes from the distributed checkpoint at any world size; rank 0 alone prints and
writes the drafter. ``--engine`` picks who generates (``engines.py``), ``--features``
whether the target's features are cached or recomputed in the step (``features.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hyflash.argtypes import (
    fraction,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    threads,
)
from hyflash.atomic import write_folder_atomically
from hyflash.errors import HyflashError

# hyflash.models.memory.MEMORY_KINDS, default first; spelled out so that --help does not
# import torch (tests/test_train.py checks they agree); likewise engines.ENGINES,
# features.FEATURE_MODES / PRECISIONS and distributed.PARALLEL
# (tests/test_train_distributed.py), and models.drafter_init.INITS
MEMORY_KINDS = ("prefix-slots", "decayed-linear", "recall", "none")
ENGINES = ("hyflash", "transformers", "vllm")
FEATURE_MODES = ("auto", "cache", "recompute")
INITS = ("random", "target")
PRECISIONS = ("float32", "bfloat16")
PARALLEL = ("ddp", "fsdp")
KEEP = ("last", "best")  # loop.KEEP


def init_choice(value: str) -> str:
    """--init: one of INITS or a drafter folder (checked when the target is loaded)."""
    if value in INITS or Path(value).is_dir():
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither {' nor '.join(INITS)} nor a "
                                     "drafter folder")


def init_tag(init: str) -> str:
    """--init in the run folder's name: the name of INITS, or the init drafter's weights'
    digest (runs from different drafters never resume each other's checkpoint)."""
    import hashlib

    if init in INITS:
        return init
    digest = hashlib.sha1((Path(init) / "model.safetensors").read_bytes()).hexdigest()
    return f"drafter{digest[:8]}"


def run_suffix(spec) -> str:
    """The training settings that differ from the defaults, in the run folder's name: runs
    of other settings on the same data live side by side instead of refusing to resume
    each other's checkpoint (runs of the default settings keep their old names)."""
    from hyflash.train.loop import TrainSpec

    base = TrainSpec()
    short = {"steps": "s", "batch": "b", "anchors": "a", "lr": "lr", "seed": "seed",
             "memory_lr_scale": "mls", "prompt_anchors": "pa", "kl": "kl"}
    return "".join(f"-{tag}{getattr(spec, k):g}" for k, tag in short.items()
                   if getattr(spec, k) != getattr(base, k)) + (
        "-bf16" if spec.precision != base.precision else "")


SHAPE_TAGS = {"layers": "L", "heads": "h", "block_size": "B", "window": "w"}


def shape_suffix(args: argparse.Namespace) -> str:
    """The drafter's shape settings that differ from the defaults, for the run folder's
    name: a run of another shape on the same data must not resume this one's checkpoint."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return "".join(f"-{tag}{getattr(args, k)}" for k, tag in SHAPE_TAGS.items()
                   if getattr(args, k) != p.get_default(k))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True,
                   help="the target: a Hugging Face model folder, a .gguf file, a hub id, "
                        "or `pocket` (the embedded pocket model)")
    p.add_argument("--data", required=True,
                   help="prompt corpus: a folder of text files, a .txt, a .jsonl with "
                        "'text'/'prompt' fields, or `stdlib` (the pocket model's train split)")
    p.add_argument("--out", type=Path, required=True, help="drafter folder to write")
    p.add_argument("--arch", choices=("hyflash", "full"), default="hyflash",
                   help="hyflash: local window + recurrent memory; full: the full-context "
                        "baseline (no window limit, no memory)")
    p.add_argument("--work", type=Path, default=None,
                   help="data cache + checkpoints, reused on rerun (default: OUT.work)")
    p.add_argument("--keep-work", action="store_true",
                   help="keep the work folder after a successful run (default: remove it)")
    p.add_argument("--data-only", action="store_true",
                   help="generate (or resume) the self-distillation data, then stop")
    g = p.add_argument_group("drafter")
    g.add_argument("--layers", type=positive_int, default=2)
    g.add_argument("--heads", type=positive_int, default=8)
    g.add_argument("--init", type=init_choice, default=INITS[0], metavar="random|target|DIR",
                   help="the drafter's starting weights: random; target (its layers start as "
                        "the target's last --layers decoder layers; needs --heads = the "
                        "target's attention heads and a Llama-style attention); or DIR, a "
                        "drafter written by `hyflash train` for this target, to train further "
                        "(its weights and draft vocabulary; the shape flags must match its "
                        "config; the optimizer and the learning-rate schedule start afresh)")
    g.add_argument("--block-size", type=positive_int, default=8,
                   help="B: one pass drafts B-1 tokens")
    g.add_argument("--window", type=positive_int, default=64, help="local window W (hyflash only)")
    g.add_argument("--memory", default=MEMORY_KINDS[0], choices=MEMORY_KINDS,
                   help="memory kind (hyflash only): prefix-slots (default: learned slot "
                        "queries read the memory into extra keys of the softmax), "
                        "decayed-linear (every query reads it, a gate mixes it in), recall "
                        "(decayed-linear keyed by each old token, valued by the one after "
                        "it) or none (window only)")
    g.add_argument("--draft-vocab", type=nonneg_int, default=0,
                   help="score only this many token ids, the ones the target writes most in "
                        "the distillation data (EAGLE-3's reduced draft vocabulary: a smaller "
                        "LM head, still lossless); 0 = the whole vocabulary")
    g.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="context the drafter serves (default: the target's, at most "
                        "its max_position_embeddings)")
    g = p.add_argument_group("self-distillation data")
    g.add_argument("--sequences", type=positive_int, default=2048,
                   help="continuations to generate")
    g.add_argument("--gen-len", type=positive_int, default=128,
                   help="tokens the target writes per prompt")
    g.add_argument("--sampled-fraction", type=fraction, default=0.0,
                   help="share of continuations sampled (temperature 1) instead of greedy")
    g.add_argument("--data-batch", type=positive_int, default=32, help="prompts generated together")
    g.add_argument("--shard-size", type=positive_int, default=128,
                   help="continuations per data shard (a file; each torchrun rank reads its "
                        "own shards, so a job needs at least as many shards as processes)")
    g.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                   help="who writes the continuations: hyflash (default: its own target), "
                        "transformers (generate) or vllm (installed separately; one process, "
                        "then train under torchrun)")
    g.add_argument("--feature-precision", choices=PRECISIONS, default=PRECISIONS[0],
                   help="compute precision of the pass that computes cached features: "
                        "float32 (default: the features decoding computes) or bfloat16 "
                        "(continuations still decoded at float32, features then from one "
                        "bf16 causal pass; 1.7x faster with AMX, features within ~1%%; "
                        "~50x slower on a CPU without bf16 hardware: `hyflash train` says so)")
    g.add_argument("--features", choices=FEATURE_MODES, default=FEATURE_MODES[0],
                   help="the target's features: cached with the data, or recomputed by the "
                        "frozen target in every training step; auto (default) recomputes "
                        "when caching would exceed 16 GiB")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=positive_int, default=1500)
    g.add_argument("--batch", type=positive_int, default=8, help="sequences per step")
    g.add_argument("--anchors", type=positive_int, default=16, help="anchors (blocks) per sequence")
    g.add_argument("--prompt-anchors", type=fraction, default=0.0,
                   help="share of each sequence's anchors placed in its prompt, labelled with "
                        "the target's greedy tokens while the text agrees with them (every "
                        "prefix of a prompt is a prompt: more data from the same target "
                        "passes; default 0: anchors in the continuation only)")
    g.add_argument("--kl", type=nonneg_float, default=0.0, metavar="W",
                   help="add W x KL(target || drafter) to the cross-entropy at every block "
                        "position: the target's distribution, recomputed from the last tap "
                        "layer's features by the target's layers above it and its LM head, "
                        "teaches the drafter its spread as well as its argmax (default 0: "
                        "cross-entropy only)")
    g.add_argument("--lr", type=positive_float, default=1e-3)
    g.add_argument("--memory-lr-scale", type=positive_float, default=10.0,
                   help="learning-rate multiplier for the memory's decay logits and gate "
                        "biases (a few scalars per layer)")
    g.add_argument("--checkpoint-every", type=positive_int, default=100,
                   help="steps between checkpoints (a rerun resumes from the last one)")
    g.add_argument("--eval-every", type=nonneg_int, default=0,
                   help="steps between validations of the held-out 5%% of the data, each a "
                        "line of val.jsonl in the run folder (loss, accuracy by position, "
                        "expected tau); 0 (default): validate once, at the end")
    g.add_argument("--keep", choices=KEEP, default=KEEP[0],
                   help="the drafter written: the run's last weights (default) or the best "
                        "validated ones (needs --eval-every; for a run that overfits)")
    g.add_argument("--precision", choices=PRECISIONS, default=PRECISIONS[0],
                   help="the drafter's training arithmetic: float32 (default) or bfloat16 "
                        "autocast (float32 weights and optimizer; ~1.6x faster steps with "
                        "AMX, far slower on a CPU without bf16 hardware)")
    g.add_argument("--seed", type=nonneg_int, default=0,
                   help="seeds the drafter's initial weights, the prompts and the batches")
    g.add_argument("--threads", type=threads, default=None,
                   help="torch CPU threads (default: torch's, one per core)")
    g.add_argument("--parallel", choices=PARALLEL, default=None,
                   help="under torchrun: ddp (default: every rank holds the drafter) or fsdp "
                        "(FSDP2: drafter, and the target when features are recomputed, "
                        "sharded over the ranks)")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def data_spec(args, max_seq_len: int):
    from hyflash.train.data import DataSpec

    room = max_seq_len - args.gen_len
    if room < 8:
        raise HyflashError(f"--gen-len {args.gen_len} leaves no room for prompts in a "
                           f"{max_seq_len}-token context")
    long_hi = min(1920, room)
    return DataSpec(sequences=args.sequences, gen_len=args.gen_len,
                    short_prompt=(min(32, room), min(128, room)),
                    long_prompt=(min(256, long_hi), long_hi),
                    sampled_fraction=args.sampled_fraction, batch=args.data_batch,
                    shard=args.shard_size, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    from hyflash.train import distributed

    d = distributed.setup()
    try:
        return run_on(args, d)
    finally:
        distributed.teardown(d)


def run_on(args: argparse.Namespace, d) -> int:
    import torch

    from hyflash.models.draft_vocab import rank_counts
    from hyflash.models.drafter import Drafter
    from hyflash.models.drafter_init import init_from_drafter, init_from_target
    from hyflash.models.target import Target, resolve_model_folder
    from hyflash.models.tokenizer import load_tokenizer
    from hyflash.train.corpus import corpus_digest, read_corpus
    from hyflash.train.data import DistillSet, check_tokenizer
    from hyflash.train.engines import check_engine
    from hyflash.train.features import choose, cpu_has_fast_bf16
    from hyflash.train.folders import check_out, check_work, claim_work, finish_work
    from hyflash.train.lanes import check_world, rank_shards
    from hyflash.train.loop import TrainSpec, train
    from hyflash.train.teacher import Teacher

    say = print if d.main else (lambda *a, **k: None)
    if args.parallel and not d.group:
        raise HyflashError(f"--parallel {args.parallel} applies under torchrun only: launch "
                           "with `torchrun --nproc_per_node N -m hyflash train ...`, or drop it")
    train_spec = TrainSpec(steps=args.steps, batch=args.batch, anchors=args.anchors,
                           lr=args.lr, memory_lr_scale=args.memory_lr_scale, seed=args.seed,
                           checkpoint_every=args.checkpoint_every,
                           prompt_anchors=args.prompt_anchors, eval_every=args.eval_every,
                           keep=args.keep, precision=args.precision,
                           kl=args.kl)  # checked before
    # hours of data generation
    work = args.work or args.out.with_name(args.out.name + ".work")
    check_out(args.out)
    check_work(work, args.out)
    if args.sequences < args.batch:
        raise HyflashError(f"too few examples: --sequences {args.sequences} is less than one "
                           f"batch ({args.batch})")
    texts = read_corpus(args.data)
    corpus_id = corpus_digest(texts)
    if args.threads:
        torch.set_num_threads(args.threads)
    target_path = resolve_model_folder(args.target)
    target = Target.from_pretrained(target_path, max_seq_len=args.max_seq_len)
    tokenizer = load_tokenizer(target_path)
    check_tokenizer(tokenizer, target)
    torch.manual_seed(args.seed)  # the drafter's initial weights
    drafter = Drafter.for_target(target, args.arch, num_layers=args.layers,
                                 num_heads=args.heads, block_size=args.block_size,
                                 draft_vocab=args.draft_vocab,
                                 **({} if args.arch == "full" else
                                    {"window": args.window, "memory": args.memory}))
    if args.init == "target":
        say(f"init: drafter layers start as target layers {init_from_target(drafter, target)}")
    elif args.init != INITS[0]:
        drafter = init_from_drafter(drafter, args.init, target)
        say(f"init: weights and draft vocabulary of the drafter at {args.init}")
    spec = data_spec(args, target.cfg.max_seq_len)
    lanes = check_world(d.world, args.batch, spec.shards)
    mine = rank_shards(d.rank, d.world, spec.shards, lanes)
    recompute, why = choose(args.features, spec, target.cfg.feature_size)
    say(why)
    slow = [f"--{k} bfloat16" for k, v in (("precision", args.precision),
                                           ("feature-precision", args.feature_precision))
            if v == "bfloat16"]
    if slow and d.device.type == "cpu" and not cpu_has_fast_bf16():
        say(f"note: {' and '.join(slow)} on a CPU without AVX512-BF16 or AMX: torch emulates "
            "bf16 matmuls here, ~50x slower than float32; float32 is faster on this machine")
    if recompute and args.feature_precision != PRECISIONS[0]:
        raise HyflashError(f"--feature-precision {args.feature_precision} applies to cached "
                           "features; these are recomputed in each training step (float32)")
    data_dir, tokens_from = data_folders(work, spec, target_path, target, corpus_id,
                                         args.engine, recompute, args.feature_precision)
    if tokens_from is not None and not (data_dir / "done").exists():
        say(f"tokens: taken from {tokens_from} where it has them (features computed, no "
            "decoding)")
    if not (data_dir / "done").exists():
        check_engine(args.engine, d.world)
    if d.main:
        claim_work(work, args.out)
    d.barrier()
    t0 = time.time()
    if not (data_dir / "done").exists():
        grown = grown_from(data_dir, spec, target_path, target, corpus_id, args.engine,
                           args.feature_precision)
        if grown:
            say(f"data: the full shards of {', '.join(p.name for p in grown)} (the same data "
                "with another --sequences) are linked, not generated again")
        generate(args, d, target, target_path, tokenizer, texts, spec, data_dir, mine,
                 not recompute, tokens_from, grown)
    target.drop_cache()
    if args.data_only:
        say(f"data ready in {data_dir}; rerun without --data-only to train")
        return 0
    data = DistillSet(data_dir).keep(mine)
    if drafter.draft_head is not None and args.init in INITS:  # else the init drafter's
        gen, prompt = data.token_counts(target.cfg.vocab_size)
        drafter.draft_head.set_ids(rank_counts(d.sum(torch.from_numpy(gen)).numpy(),
                                               d.sum(torch.from_numpy(prompt)).numpy(),
                                               args.draft_vocab))
    run_name = f"train-{args.arch}" + (f"-dv{args.draft_vocab}" if args.draft_vocab else "")
    run_name += shape_suffix(args) + run_suffix(train_spec)
    run_name += "" if args.init == INITS[0] else f"-init{init_tag(args.init)}"
    if args.arch == "hyflash" and args.memory != MEMORY_KINDS[0]:
        run_name += f"-{args.memory}"
    teacher = Teacher(target, drafter) if args.kl else None
    report = train(drafter, data, train_spec, data_dir / run_name, progress=not args.quiet,
                   target=target if recompute else None, d=d,
                   parallel=args.parallel or PARALLEL[0], teacher=teacher)
    report.update(target=str(target_path), data=str(args.data), corpus_sha1=corpus_id,
                  arch=args.arch, init=args.init, features="recomputed" if recompute else "cached",
                  params=sum(p.numel() for p in drafter.parameters() if p.requires_grad),
                  state_bytes_fp32=drafter.state_bytes(), data_spec=spec.__dict__,
                  total_seconds=round(time.time() - t0, 1))
    del data  # its shards are memory-mapped from the work folder
    d.barrier()
    if not d.main:
        return 0
    drafter.cpu()
    write_folder_atomically(args.out, lambda tmp: drafter.save(tmp, {"training": report}))
    print(json.dumps({k: report[k] for k in ("val_accuracy", "val_expected_tau", "params",
                                             "state_bytes_fp32")}))
    print(f"wrote {args.out}")
    print(finish_work(work, args.keep_work))
    return 0


def data_folders(work: Path, spec, target_path, target, corpus_id: str, engine: str,
                 recompute: bool, feature_precision: str = PRECISIONS[0]
                 ) -> tuple[Path, Path | None]:
    """(the data folder of these settings, a tokens-only folder of the same data or None).
    Non-default settings join the key. Data with cached features also serves a run that
    recomputes them (it reads the tokens only); a run that caches features takes the
    tokens of a tokens-only folder (``--features recompute``, e.g. generated in an earlier
    session or on another machine) and computes only their features."""
    cached, tokens_only = folder_names(work, spec, target_path, target, corpus_id, engine,
                                       feature_precision)
    if recompute:
        return (cached if (cached / "done").exists() else tokens_only), None
    return cached, (tokens_only if tokens_only.is_dir() else None)


def folder_names(work: Path, spec, target_path, target, corpus_id: str, engine: str,
                 feature_precision: str = PRECISIONS[0]) -> tuple[Path, Path]:
    """(the folder of these settings with cached features, its tokens-only folder). The
    feature precision names the cached folder only: the tokens do not depend on it."""
    target_id = str(target_path) + json.dumps(target.cfg.to_dict(), sort_keys=True)
    extra = {} if engine == ENGINES[0] else {"engine": engine}
    precision = {} if feature_precision == PRECISIONS[0] else {"features": feature_precision}
    cached = work / f"data-{spec.key(target_id, corpus_id, {**extra, **precision})}"
    tokens_key = spec.key(target_id, corpus_id, {**extra, "features": "recompute"})
    return cached, work / f"data-{tokens_key}"


def grown_from(data_dir: Path, spec, target_path, target, corpus_id: str, engine: str,
               feature_precision: str = PRECISIONS[0]) -> list[Path]:
    """The other data folders in data_dir's work folder that hold this data with another
    --sequences (same target, corpus and every other setting; the same kind of folder,
    features cached or tokens only), most sequences first: their full shards are this
    run's (``data.link_shard``)."""
    from dataclasses import replace

    from hyflash.train.data import DataSpec

    work = data_dir.parent
    kind = 0 if data_dir == folder_names(work, spec, target_path, target, corpus_id, engine,
                                         feature_precision)[0] else 1
    found = []
    for path in work.glob("data-*/spec.json"):
        try:
            other = DataSpec.read(path.parent)
        except (ValueError, TypeError):
            continue
        if other.sequences == spec.sequences or replace(other, sequences=spec.sequences) != spec:
            continue
        names = folder_names(work, other, target_path, target, corpus_id, engine,
                             feature_precision)
        if path.parent == names[kind]:
            found.append((other.sequences, path.parent))
    return [p for _, p in sorted(found, reverse=True)]


def generate(args, d, target, target_path, tokenizer, texts, spec, data_dir: Path,
             mine: list[int], features: bool, tokens_from: Path | None,
             grown: list[Path]) -> None:
    """Every rank writes its own shards; rank 0 marks the folder done once all have."""
    from hyflash.train.corpus import token_stream
    from hyflash.train.data import generate_dataset
    from hyflash.train.engines import make_engine

    engine = make_engine(args.engine, target, target_path, args.seed, d.world, d.device)
    eos = target.cfg.eos_token_ids[0] if target.cfg.eos_token_ids else 0
    stream = token_stream(texts, tokenizer, eos)
    target.to(d.device)  # a GPU rank generates on its GPU, then frees it for training
    with d.on_device():
        generate_dataset(target, stream, spec, data_dir, progress=d.main and not args.quiet,
                         engine=engine, shards=mine, features=features,
                         tokens_from=tokens_from, feature_precision=args.feature_precision,
                         grown_from=grown)
    target.drop_cache()
    target.to("cpu")
    d.barrier()
    if d.main:
        (data_dir / "done").touch()
    d.barrier()
