"""Who writes the self-distillation continuations: pluggable generation engines.

Every engine continues a batch of token-id prompts [N, L] by exactly ``gen_len`` tokens
(greedy, or sampled at a temperature from the full distribution, seeded from the shard's
generator) and returns tokens [N, L + gen_len], plus the target's features and greedy
labels (its argmax after every fed token) if it computes them on the way; when it does not
and the run caches features, ``data.generate_dataset`` computes both afterwards with one
causal pass of hyflash's target per batch. ``features=False`` tells an engine the run
does not cache them (it then need not compute them).

- ``hyflash`` (default): hyflash's own ``Target`` (``generation.continue_batch``): chunked
  prefill, a KV cache sized to the batch, features for free; measured fast on CPU
  (benchmarks/results/data_gen_speed.md).
- ``transformers``: ``AutoModelForCausalLM.generate`` on the same model folder.
- ``vllm``: vLLM's offline ``LLM.generate`` with token-id prompts, for users generating
  millions of continuations on GPUs. vLLM needs Linux and a CUDA GPU, so it cannot run
  on the machine hyflash is tested on: its request/response mapping is tested with a fake
  ``LLM``; the engine itself never ran here. It runs in one process (not under torchrun):
  generate with ``--engine vllm --data-only``, then train under torchrun.

An engine is part of the data key (except the default, so existing data folders keep
their names): tokens from another engine are other data.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hyflash.errors import HyflashError
from hyflash.train.generation import continue_batch

ENGINES = ("hyflash", "transformers", "vllm")


def seeds(gen: torch.Generator, n: int) -> list[int]:
    """n request seeds drawn from the shard's generator (reproducible per shard)."""
    return torch.randint(0, 2**31 - 1, (n,), generator=gen).tolist()


def checked(rows: list[list[int]], prompts: torch.Tensor, gen_len: int, engine: str):
    """The engine's continuations -> tokens [N, L + gen_len]; any other length is refused."""
    bad = [i for i, r in enumerate(rows) if len(r) != gen_len]
    if bad:
        raise HyflashError(f"--engine {engine} returned {len(rows[bad[0]])} tokens for prompt "
                           f"{bad[0]}, not --gen-len {gen_len}: it stopped early (check that "
                           "the engine ignores EOS), or use --engine hyflash")
    return torch.cat([prompts, torch.tensor(rows, dtype=torch.long).view(-1, gen_len)], 1)


class HyflashEngine:
    name = "hyflash"

    def __init__(self, target):
        self.target = target

    def continue_batch(self, prompts, gen_len, sample, temperature, gen, features=True):
        prompts = prompts.to(self.target.embed_tokens.weight.device)
        return continue_batch(self.target, prompts, gen_len, sample, temperature, gen,
                              features)


class TransformersEngine:
    name = "transformers"

    def __init__(self, folder: Path, device: torch.device = torch.device("cpu")):
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32).eval().to(device)
        self.device = device

    @torch.inference_mode()
    def continue_batch(self, prompts, gen_len, sample, temperature, gen, features=True):
        from transformers import GenerationConfig

        # exactly gen_len tokens (EOS suppressed until then), from the full distribution
        config = GenerationConfig(max_new_tokens=gen_len, min_new_tokens=gen_len,
                                  do_sample=sample, temperature=temperature if sample else 1.0,
                                  top_k=0, top_p=1.0, pad_token_id=0)
        torch.manual_seed(seeds(gen, 1)[0])  # generate samples from the global generator
        inputs = prompts.to(self.device)
        out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs),
                                  generation_config=config)
        rows = out[:, prompts.shape[1]:].tolist()
        return checked(rows, prompts, gen_len, self.name), None, None


class VllmEngine:
    """``llm``: a ``vllm.LLM`` (or a stand-in with its ``generate``); ``params``: the
    ``vllm.SamplingParams`` class."""

    name = "vllm"

    def __init__(self, llm, params):
        self.llm, self.params = llm, params

    @classmethod
    def load(cls, folder: Path, seed: int) -> VllmEngine:
        import vllm

        return cls(vllm.LLM(model=str(folder), seed=seed), vllm.SamplingParams)

    def requests(self, prompts, gen_len, sample, temperature, gen):
        """-> (token-id prompts, one SamplingParams per prompt)."""
        inputs = [{"prompt_token_ids": row} for row in prompts.tolist()]
        params = [self.params(n=1, max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True,
                              temperature=temperature if sample else 0.0, seed=s)
                  for s in seeds(gen, len(inputs))]
        return inputs, params

    def continue_batch(self, prompts, gen_len, sample, temperature, gen, features=True):
        inputs, params = self.requests(prompts, gen_len, sample, temperature, gen)
        outputs = self.llm.generate(inputs, params, use_tqdm=False)  # in request order
        rows = [list(o.outputs[0].token_ids) for o in outputs]
        if len(rows) != len(inputs):
            raise HyflashError(f"--engine vllm answered {len(rows)} of {len(inputs)} prompts; "
                               "rerun, or use --engine hyflash")
        return checked(rows, prompts, gen_len, self.name), None, None


def check_engine(name: str, world: int) -> None:
    """Before any work: the engine exists here and fits the launch."""
    import importlib.util

    if name not in ENGINES:
        raise HyflashError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    if name == "vllm" and world > 1:
        raise HyflashError("--engine vllm runs in one process, not under torchrun: generate "
                           "with `hyflash train ... --engine vllm --data-only`, then train "
                           "under torchrun")
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise HyflashError("--engine vllm needs vLLM (Linux + CUDA GPU): pip install vllm, "
                           "or use --engine hyflash")


def make_engine(name: str, target, folder: Path, seed: int, world: int,
                device: torch.device = torch.device("cpu")):
    check_engine(name, world)
    if name == "transformers":
        return TransformersEngine(folder, device)
    if name == "vllm":
        return VllmEngine.load(folder, seed)
    return HyflashEngine(target)
