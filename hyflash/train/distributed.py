"""`hyflash train` under torchrun: the process group, the device, and how the drafter is
wrapped (DistributedDataParallel, or FSDP2 ``fully_shard`` for targets too big to copy).

Launched by plain ``hyflash train`` (no ``WORLD_SIZE`` in the environment), nothing here
does anything: one process on the CPU, no process group, the modules as they are.
Launched by ``torchrun --nproc_per_node N [--nnodes M ...] -m hyflash train ...`` (N = 1
included: the way to train on one GPU), every process joins the group through env://
(torchrun's MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE), on nccl with one GPU per
process (LOCAL_RANK) when CUDA is there, else on gloo with the CPU. Only rank 0 prints,
shows progress, writes logs, the checkpoint's metadata and the drafter; the distributed
checkpoint itself is written by the ranks that hold its shards (``checkpoints.py``).

The process group's timeout is long (``TIMEOUT``) because ranks meet after generating
their data shards, which can take hours; a rank that dies does not leave the others
waiting for it, since torchrun stops the whole job when one worker exits.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch

from hyflash.errors import HyflashError

TIMEOUT = timedelta(hours=12)
PARALLEL = ("ddp", "fsdp")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    group: bool = False  # launched by torchrun: a process group joins the ranks

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.group:
            torch.distributed.barrier()

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise sum over ranks (a copy on every rank)."""
        x = x.detach().clone()
        if self.group:
            x = x.to(self.device)
            torch.distributed.all_reduce(x)
        return x.cpu()

    def max(self, n: int) -> int:
        x = torch.tensor([n], device=self.device)
        if self.group:
            torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.MAX)
        return int(x)

    def mean(self, x: torch.Tensor) -> float:
        return float(self.sum(x.float()) / self.world)

    def on_device(self):
        """Tensors created inside (torch.arange in the models' forward) land on the device."""
        return nullcontext() if self.device.type == "cpu" else torch.device(self.device)


SINGLE = Dist()


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise HyflashError(f"{name}={value!r} in the environment is not a whole number: "
                           "launch with torchrun, or unset it") from None


def setup() -> Dist:
    """Join torchrun's process group, if launched by torchrun with more than one process."""
    world = env_int("WORLD_SIZE")
    if world is None:
        return SINGLE
    rank, local = env_int("RANK"), env_int("LOCAL_RANK")
    if world < 1 or rank is None or local is None or not 0 <= rank < world:
        raise HyflashError(f"WORLD_SIZE={world} but RANK/LOCAL_RANK are missing or out of "
                           "range: launch with `torchrun --nproc_per_node N -m hyflash train`")
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, init_method="env://", timeout=TIMEOUT)
    return Dist(rank, world, device, group=True)


def teardown(d: Dist) -> None:
    if d.group and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def frozen(module: torch.nn.Module) -> set:
    return {p for p in module.parameters() if not p.requires_grad}


def wrap(drafter, d: Dist, parallel: str):
    """-> (the module the training step calls, the module whose parameters train).

    ddp: the drafter itself (on the device) inside DistributedDataParallel; its frozen
    embedding and LM head (the target's) take no part in the gradient all-reduce.
    fsdp: a copy of the drafter sharded with ``fully_shard`` (FSDP2) as one unit: its
    weights, gradients and AdamW states rest as 1/N per rank and are gathered for the
    step (a drafter layer's keys/values come from ``context_kv``, a method other than its
    forward, so a layer cannot be its own unit). The target's frozen embedding and LM head
    are left out (``ignored_params``) and stay whole on every rank. The caller's drafter
    keeps its own full weights, which ``unwrap`` refreshes at the end."""
    if not d.group:
        return drafter, drafter
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        drafter.to(d.device)
        ids = None if d.device.type == "cpu" else [d.device.index]
        return DistributedDataParallel(drafter, device_ids=ids,
                                       gradient_as_bucket_view=True), drafter
    from torch.distributed.fsdp import fully_shard

    from hyflash.models.drafter import Drafter

    replica = Drafter(drafter.cfg, drafter.embed_tokens, drafter.lm_head)
    replica.load_state_dict(drafter.state_dict())
    replica.to(d.device)
    fully_shard(replica, ignored_params=frozen(replica))
    return replica, replica


def unwrap(model, drafter, d: Dist) -> None:
    """Give the caller's drafter the trained weights, whole, on every rank (collective)."""
    if model is drafter or getattr(model, "module", None) is drafter:
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                ignore_frozen_params=True))
    drafter.load_state_dict(full, strict=False)
    drafter.to(d.device)


def place_target(target, d: Dist, parallel: str) -> None:
    """The frozen target for features in the training step: what it needs (embedding,
    rope tables, the layers up to the last tap layer) on the device, whole (ddp) or with
    each of those layers sharded (fsdp: gathered for its forward, freed after). The
    embedding stays whole: the drafter shares it; later layers and the norm stay put."""
    if not d.group:
        return
    target.embed_tokens.to(d.device)
    target.rope_cos, target.rope_sin = target.rope_cos.to(d.device), target.rope_sin.to(d.device)
    for layer in target.layers[: max(target.cfg.tap_layers) + 1]:
        layer.to(d.device)
        if parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(layer)
