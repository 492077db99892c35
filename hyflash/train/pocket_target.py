"""Build the pocket model: a small Llama-family code LM trained on the Python stdlib.

Every machine with Python has the standard library's source, so this model can be
rebuilt anywhere without a download. The build has three stages:

1. split the stdlib ``.py`` files into train / held-out by a hash of their path
   (``hyflash/train/corpus.py``: `hyflash train --data stdlib` and the benchmarks read
   the same split),
2. train a byte-level BPE tokenizer (Hugging Face ``tokenizers``) on the train files,
3. train a causal LM (``transformers.LlamaForCausalLM``) with AdamW + warmup + cosine
   decay, checkpointing to ``--work`` so that an interrupted build resumes where it
   stopped (schedule and checkpoints: ``hyflash/train/scaffold.py``, shared with
   `hyflash train`).

The result is a plain Hugging Face model folder (config.json, model.safetensors,
tokenizer.json, generation_config.json, README.md model card), written atomically.

Takes about an hour on a 2-core CPU with the default settings (``--steps``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.atomic import write_folder_atomically
from hyflash.errors import HyflashError
from hyflash.models.tokenizer import MODEL_INPUT_NAMES
from hyflash.train.corpus import HELDOUT_PERCENT, read_text, split_files
from hyflash.train.scaffold import load_checkpoint, save_checkpoint, warmup_cosine

EOS = "<|endoftext|>"
LR_FLOOR = 0.1  # the cosine ends at 10% of the peak learning rate
MIN_FREE_BYTES = 1 << 30

MODEL_CONFIG = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=0,
)

CARD_PROMPTS = ["def __init__(self", "import os\n", "class Stack:\n    "]


# ------------------------------------------------------------------------ tokenizer

def train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((read_text(f) for f in files), trainer=trainer)
    return tok


def encode_files(tok, files: list[Path]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([read_text(f) for f in files]):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


# --------------------------------------------------------------------------- train

def make_model(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**MODEL_CONFIG, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    return warmup_cosine(step, steps, peak, warmup, LR_FLOOR)


def seq_len_at(step: int, steps: int, short: int, long: int) -> int:
    """Short sequences for the first 70% of steps (cheap), full context after."""
    return short if step < int(0.7 * steps) else long


def batch(data: np.ndarray, gen: torch.Generator, bsz: int, seq: int) -> torch.Tensor:
    starts = torch.randint(0, len(data) - seq - 1, (bsz,), generator=gen)
    return torch.stack([torch.from_numpy(data[s : s + seq + 1].astype(np.int64)) for s in starts])


@torch.no_grad()
def evaluate(model, data: np.ndarray, seq: int, max_tokens: int) -> float:
    model.eval()
    losses = []
    for s in range(0, min(len(data), max_tokens) - seq - 1, seq):
        x = torch.from_numpy(data[s : s + seq + 1].astype(np.int64))[None]
        losses.append(next_token_loss(model, x).item())
    model.train()
    return float(np.mean(losses)) if losses else float("nan")


def train(args, work: Path, train_ids: np.ndarray):
    """-> (model, training seconds summed over every run that led to it)."""
    from tqdm import tqdm

    model = make_model(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    ckpt = work / "checkpoint.pt"
    step, before = 0, 0.0
    state = load_checkpoint(ckpt)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, before = state["step"], state.get("seconds", 0.0)
        print(f"resuming from {ckpt} at step {step}/{args.steps}")
    model.train()
    bar = tqdm(total=args.steps, initial=step, desc="pocket", dynamic_ncols=True)
    t0 = time.time()
    while step < args.steps:
        seq = seq_len_at(step, args.steps, args.short_seq, MODEL_CONFIG["max_position_embeddings"])
        bsz = max(1, args.tokens_per_step // seq)
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_ids, gen, bsz, seq)
        loss = next_token_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}", seq=seq)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(),
                                   "step": step, "gen": gen.get_state(),
                                   "seconds": before + time.time() - t0})
    bar.close()
    print(f"trained {args.steps} steps ({time.time() - t0:.0f}s this run)")
    return model, before + time.time() - t0


def next_token_loss(model, x: torch.Tensor) -> torch.Tensor:
    logits = model(x[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             x[:, 1:].reshape(-1))


# ---------------------------------------------------------------------------- save

@torch.no_grad()
def greedy(model, tok, prompt: str, n: int) -> str:
    ids = torch.tensor([tok.encode(prompt)])
    out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0].tolist())


def write_folder(out: Path, model, tok, stats: dict, args) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    def write(tmp: Path) -> None:
        half = model.to(torch.float16)
        half.config.torch_dtype = torch.float16
        half.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0,
                         do_sample=False).save_pretrained(tmp)
        PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS,
            pad_token=EOS, model_max_length=MODEL_CONFIG["max_position_embeddings"],
            model_input_names=MODEL_INPUT_NAMES,
        ).save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(stats, args))

    write_folder_atomically(out, write)


def model_card(stats: dict, args) -> str:
    c = MODEL_CONFIG
    samples = "\n".join(
        f"Prompt `{json.dumps(p)}`:\n\n```python\n{s}\n```\n" for p, s in stats["samples"]
    )
    return f"""# pocket: a {stats['params'] / 1e6:.1f}M-parameter Python code model

The default target of HyFlash. It ships inside the package so that the demo, the
tests and the benchmarks run offline on any machine.

- Architecture: Llama (`LlamaForCausalLM`), {c['num_hidden_layers']} layers, hidden \
{c['hidden_size']}, {c['num_attention_heads']} heads ({c['num_key_value_heads']} KV heads), \
context {c['max_position_embeddings']}, tied embeddings, stored in float16.
- Tokenizer: byte-level BPE, vocabulary {c['vocab_size']}, `{EOS}` = id 0 (BOS, EOS and \
padding).
- Training data: the `.py` files of the CPython {stats['python']} standard library \
(`sysconfig.get_paths()["stdlib"]`, site-packages excluded). Files whose relative path \
hashes (sha1 mod 100) below {HELDOUT_PERCENT} are held out: {stats['n_heldout_files']} files, \
{stats['heldout_tokens']} tokens. Training: {stats['n_train_files']} files, \
{stats['train_tokens']} tokens.
- Training: {args.steps} AdamW steps of ~{args.tokens_per_step} tokens, cosine decay from \
{args.lr}, {args.short_seq}-token sequences for 70% of the steps and \
{c['max_position_embeddings']} after; {stats['train_seconds']:.0f} s of training on \
{stats['machine']}.
- Command: `python -m hyflash.train.pocket_target --out DIR` (seed {args.seed}).

## Held-out quality
Loss {stats['heldout_loss']:.3f} nats/token, perplexity {math.exp(stats['heldout_loss']):.1f}, \
measured on the float16 weights as shipped, over held-out files in \
{stats['eval_seq']}-token windows (up to {stats['eval_tokens']} tokens).

## Greedy completions
{samples}
## License
The training text is the CPython standard library, copyright the Python Software
Foundation, under the PSF License Agreement. We treat the weights as derived from it:
they are distributed with HyFlash under its license, and this notice keeps the PSF
attribution that the PSF License asks of derived works.
"""


# ----------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m hyflash.train.pocket_target",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="model folder to write")
    p.add_argument("--work", type=Path, default=Path("work/pocket"),
                   help="scratch folder for token cache and checkpoints (resume from here)")
    p.add_argument("--stdlib", type=Path, default=None, help="stdlib source folder")
    p.add_argument("--steps", type=int, default=1200,
                   help="optimizer steps (about 3 s each on 2 cores)")
    p.add_argument("--tokens-per-step", type=int, default=8192)
    p.add_argument("--short-seq", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return build(args)
    except HyflashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def build(args) -> int:
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.resolve().parent.mkdir(parents=True, exist_ok=True)
    for d in (args.work, args.out.resolve().parent):
        if shutil.disk_usage(d).free < MIN_FREE_BYTES:
            raise HyflashError(f"no disk space: less than 1 GiB free under {d}")
    train_files, held_files, root = split_files(args.stdlib)
    print(f"stdlib {root}: {len(train_files)} train files, {len(held_files)} held-out")

    tok_path = args.work / "tokenizer.json"
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = train_tokenizer(train_files, MODEL_CONFIG["vocab_size"])
        tok.save(str(tok_path))
    assert tok.token_to_id(EOS) == 0
    ids = {}
    for name, files in (("train", train_files), ("heldout", held_files)):
        cache = args.work / f"{name}.npy"
        if not cache.exists():
            np.save(cache, encode_files(tok, files))
        ids[name] = np.load(cache)
    print(f"tokens: train {len(ids['train'])}, held-out {len(ids['heldout'])}")

    model, train_seconds = train(args, args.work, ids["train"])
    model = model.to(torch.float16).float()  # measure exactly the weights that ship
    eval_seq, eval_tokens = min(1024, MODEL_CONFIG["max_position_embeddings"]), 200_000
    loss = evaluate(model, ids["heldout"], eval_seq, eval_tokens)
    print(f"held-out loss {loss:.3f}, perplexity {math.exp(loss):.1f}")
    from transformers import PreTrainedTokenizerFast
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    samples = [(p, greedy(model, hf_tok, p, 48)) for p in CARD_PROMPTS]
    stats = dict(
        params=sum(p.numel() for p in model.parameters()),
        python=sys.version.split()[0],
        n_train_files=len(train_files), n_heldout_files=len(held_files),
        train_tokens=len(ids["train"]), heldout_tokens=len(ids["heldout"]),
        heldout_loss=loss, eval_seq=eval_seq, eval_tokens=eval_tokens,
        train_seconds=train_seconds, machine=f"{os.cpu_count()} CPU cores",
        samples=samples,
    )
    (args.work / "stats.json").write_text(json.dumps(stats, indent=1))
    write_folder(args.out, model, tok, stats, args)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
