"""Training checkpoints that resume at any world size: torch.distributed.checkpoint (DCP).

A checkpoint is a folder ``checkpoint-SSSSSS/`` in DCP's format (the drafter's trainable
weights and AdamW's state, keyed by parameter name, as ``get_state_dict`` gives them for
a plain, a DDP or an FSDP2-sharded drafter alike) plus ``checkpoint.pt``: the step, the
loss, the run's settings and the name of that folder. DCP reshards at load, so a run
saved by N processes, sharded or not, resumes on M processes or on one.

Who writes: every rank calls DCP's save; replicated tensors (DDP: all of them) are
written once, by the lowest rank that holds them, so under DDP only rank 0 writes files,
and under FSDP2 each rank writes its own shards. Rank 0 alone renames the folder into
place, then replaces ``checkpoint.pt`` (atomically), then removes older folders: a crash
at any point leaves ``checkpoint.pt`` naming a complete folder.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

from hyflash.errors import HyflashError
from hyflash.train.scaffold import load_checkpoint

META = "checkpoint.pt"


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # the drafter's frozen embedding and LM head are the target's: never saved, never loaded
    return StateDictOptions(ignore_frozen_params=True, strict=False)


QUIET = "torch.distributed is disabled"  # DCP's note that it runs in one process: it should


def read_meta(work: Path) -> dict | None:
    """The checkpoint's metadata, or None if there is none yet."""
    meta = load_checkpoint(work / META)
    if meta is not None and "dcp" not in meta:
        raise HyflashError(f"{work / META} was written by an earlier hyflash (one file, not a "
                           "distributed checkpoint): finish that run with the hyflash that "
                           "started it, or delete the file to start the run over")
    return meta


def save(model, opt, work: Path, meta: dict, d, write_meta) -> None:
    """Collective: every rank calls it. write_meta(path, dict) writes checkpoint.pt."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = f"checkpoint-{meta['step']:06d}"
    tmp = work / f"{name}.tmp"
    if d.main and tmp.exists():  # left by a run killed while saving
        shutil.rmtree(tmp)
    d.barrier()
    model_sd, opt_sd = get_state_dict(model, opt, options=_options())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=QUIET)
        dcp.save({"drafter": model_sd, "opt": opt_sd}, checkpoint_id=tmp, no_dist=not d.group,
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    d.barrier()
    if d.main:
        final = work / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_meta(work / META, {**meta, "dcp": name})
        for old in work.glob("checkpoint-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    d.barrier()


def load(model, opt, work: Path, meta: dict, d) -> None:
    """Collective: fill model and optimizer from the checkpoint meta names, resharded to
    this run's world size and wrapping."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = work / meta["dcp"]
    if not (folder / ".metadata").is_file():
        raise HyflashError(f"checkpoint {folder} is missing or incomplete: delete {work / META} "
                           "to start that run over")
    model_sd, opt_sd = get_state_dict(model, opt, options=_options())
    state = {"drafter": model_sd, "opt": opt_sd}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=QUIET)
        dcp.load(state, checkpoint_id=folder, no_dist=not d.group)
    set_state_dict(model, opt, model_state_dict=state["drafter"], optim_state_dict=state["opt"],
                   options=_options())
