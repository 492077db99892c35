"""Tiny target + drafter pairs for the ONNX tests, saved the way users have them: a
Hugging Face model folder (conftest's tiny Llama with its word-level tokenizer) and drafter
folders written by ``Drafter.save``.

The drafters get a few dozen steps of real self-distillation (``hyflash.train``) so that
they propose tokens the target accepts: then tau > 1, verify rounds accept some drafts
and reject others, and the ONNX runtime's rollback paths all run.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import torch
from conftest import WORDS, save_tiny_llama

import hyflash.train.loop as loop
from hyflash.models.drafter import Drafter
from hyflash.models.target import Target
from hyflash.train.data import DataSpec, DistillSet, generate_dataset

torch.set_num_threads(1)  # tiny models; on a busy 2-core machine threads only add overhead
ort.set_default_logger_severity(3)

CONTEXT = 128
WINDOW = 16  # small, so that prompts overflow it and the memory state absorbs rows


def prompts(n: int = 4, seed: int = 0, lo: int = 6, hi: int = 40) -> list[list[int]]:
    """Random word-id prompts of varied length (some longer than the drafter's window)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(2, len(WORDS), (k,), generator=g).tolist() for k in lengths]


def tiny_pair(root: Path, archs=("hyflash", "full"), steps: int = 60) -> tuple[Path, dict]:
    """-> (target model folder, {arch: drafter folder}) under root."""
    folder = save_tiny_llama(root / "target", max_position_embeddings=CONTEXT)
    target = Target.from_pretrained(folder)
    stream = torch.randint(2, len(WORDS), (2000,),
                           generator=torch.Generator().manual_seed(0)).numpy()
    spec = DataSpec(sequences=32, gen_len=32, short_prompt=(4, 8), long_prompt=(16, 36),
                    batch=16, shard=16)
    generate_dataset(target, stream, spec, root / "data", progress=False)
    target.drop_cache()
    data = DistillSet(root / "data")
    drafters = {}
    for arch in archs:
        torch.manual_seed(0)
        kw = {"window": WINDOW} if arch == "hyflash" else {}
        d = Drafter.for_target(target, arch, num_layers=1, num_heads=4, block_size=4, **kw)
        loop.train(d, data, loop.TrainSpec(steps=steps, batch=4, anchors=8, lr=1e-2, warmup=5),
                   root / f"work-{arch}", progress=False)
        d.save(root / f"drafter-{arch}")
        drafters[arch] = root / f"drafter-{arch}"
    if "hyflash" in drafters:
        drafters["hyflash-dv"] = draft_vocab_variant(target, data, drafters["hyflash"], root)
    return folder, drafters


DRAFT_VOCAB = 24  # of the tiny vocabulary's 48 words


def draft_vocab_variant(target: Target, data: DistillSet, trained: Path, root: Path) -> Path:
    """The trained hyflash drafter restricted to the DRAFT_VOCAB words the target wrote
    most: same weights, a reduced draft vocabulary (-inf logits outside it)."""
    from hyflash.models.drafter_folder import load_drafter

    src = load_drafter(trained, target)
    d = Drafter(type(src.cfg)(**{**src.cfg.to_dict(), "draft_vocab": DRAFT_VOCAB}),
                target.embed_tokens, target.lm_head)
    d.load_state_dict(src.state_dict(), strict=False)
    d.draft_head.set_ids(data.draft_vocabulary(DRAFT_VOCAB, target.cfg.vocab_size))
    d.save(root / "drafter-hyflash-dv")
    return root / "drafter-hyflash-dv"


# bundle name -> (drafter, window cache); hyflash-features keeps fused features,
# hyflash-dv scores a reduced draft vocabulary
BUNDLES = {"hyflash": ("hyflash", "kv"), "full": ("full", "kv"),
           "hyflash-features": ("hyflash", "features"), "hyflash-dv": ("hyflash-dv", "kv")}


def exported_pair(root: Path) -> tuple[Path, dict, dict]:
    """tiny_pair plus its ONNX bundles (one fp32 bundle per BUNDLES entry, int8 and int4
    requantized from the hyflash one) -> (target folder, drafters, {name: bundle})."""
    from hyflash.export.bundle import export_onnx_bundle, requantize_bundle

    folder, drafters = tiny_pair(root)
    bundles = {name: root / f"bundle-{name}" for name in BUNDLES}
    for name, (arch, cache) in BUNDLES.items():
        export_onnx_bundle(folder, drafters[arch], bundles[name], "fp32", progress=False,
                           window_cache=cache)
    for quant in ("int8", "int4"):
        bundles[quant] = root / f"bundle-{quant}"
        requantize_bundle(bundles["hyflash"], quant, bundles[quant])
    return folder, drafters, bundles
