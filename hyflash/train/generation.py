"""hyflash's own continuation of prompt batches, the default engine of the data
(``engines.HyflashEngine``): the target prefills a batch of prompts and decodes the
continuation, keeping its features and greedy labels for every fed position."""

from __future__ import annotations

import torch

from hyflash.models.target import Target

PREFILL_SCORES_BYTES = 1 << 25  # attention scores of one prefill chunk (32 MB)


def prefill_chunk(target: Target, n: int, keys: int) -> int:
    """Prompt tokens per prefill call, so that one layer's attention scores (n rows x
    heads x chunk x keys, fp32) stay under PREFILL_SCORES_BYTES. A batch of 32 prompts
    of 2000 tokens in one call would need 4.6 GB for them; and chunks this small are
    faster too (measured: 20-30% less prefill time than 256 MB chunks at 512-1024 tokens;
    the scores and activations of a chunk stay in cache)."""
    per_token = n * target.cfg.num_attention_heads * keys * 4
    return max(1, PREFILL_SCORES_BYTES // per_token)


@torch.inference_mode()
def continue_batch(target: Target, prompts: torch.Tensor, gen_len: int, sample: bool,
                   temperature: float, gen: torch.Generator, features: bool = True):
    """prompts [N, L] -> tokens [N, L+gen_len] (int64), features [N, L+gen_len-1, F]
    (float16), greedy [N, L+gen_len-1] (int64: the target's argmax after each fed token;
    the drafter's labels in the prompt). The last token is generated but not fed back, so
    it has no features. features=False (a run that recomputes them in the training step):
    tokens only, (tokens, None, None), and the prefill computes last-position logits only.

    Where the time goes, and why it is spent this way: the whole batch is prefilled
    together, in chunks; the KV cache holds exactly the L+gen_len-1 positions this batch
    feeds (each decode step attends over all of it, so a cache of the target's whole
    context would cost up to 4x the weights' traffic per step); logits are computed for
    the last position only while decoding (every position in the prefill, for the greedy
    labels); features go straight into one preallocated float16 buffer; the prefill
    chunks attend through torch's fused kernel (``Target.fused_attention``)."""
    with target.fused_attention():
        return _continue(target, prompts, gen_len, sample, temperature, gen, features)


def _continue(target, prompts, gen_len, sample, temperature, gen, features):
    """continue_batch's body, run inside the fused-attention context."""
    n, length = prompts.shape
    fed = length + gen_len - 1
    target.setup_cache(n, max_len=fed)
    tokens = torch.empty(n, fed + 1, dtype=torch.long)
    tokens[:, :length] = prompts
    feats = greedy = None
    if features:
        feats = torch.empty(n, fed, target.cfg.feature_size, dtype=torch.float16)
        greedy = torch.empty(n, fed, dtype=torch.long)
    chunk = prefill_chunk(target, n, fed)
    for a in range(0, length, chunk):
        logits, f = target(prompts[:, a:a + chunk], a, last_logits=not features)
        if features:
            feats[:, a:a + f.shape[1]] = f
            greedy[:, a:a + f.shape[1]] = logits.argmax(-1)
    for pos in range(length, fed + 1):
        last = logits[:, -1].float()
        if features and pos > length:
            greedy[:, pos - 1] = last.argmax(-1)
        if sample:
            probs = torch.softmax(last / temperature, -1)
            # the shard's generator is a CPU one (the same data on any device)
            nxt = torch.multinomial(probs.cpu(), 1, generator=gen).to(probs.device)
        else:
            nxt = last.argmax(-1, keepdim=True)
        tokens[:, pos] = nxt[:, 0]
        if pos < fed:
            logits, f = target(nxt, pos, last_logits=True)
            if features:
                feats[:, pos] = f[:, 0]
    return tokens, feats, greedy
