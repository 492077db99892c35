"""The HyFlash drafter (plain torch) behind the engine's DrafterBackend protocol.

The backend owns the drafter's fixed-shape state; ``commit`` feeds verified features in
chunks of at most the window (the step form's limit), ``draft`` checks that the engine's
anchor position is exactly the number of committed features.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.target import Target


class TorchDrafter:
    def __init__(self, drafter: Drafter):
        cfg = drafter.cfg
        self.drafter = drafter.eval()
        self.block_size = cfg.block_size
        self.feature_size = cfg.feature_size
        self.vocab_size = cfg.vocab_size
        self.dtype = drafter.fc.weight.dtype
        self.reset()

    def reset(self) -> None:
        self.state = self.drafter.init_state(self.dtype)
        self.count = 0

    @torch.inference_mode()
    def commit(self, features: torch.Tensor) -> None:
        step = self.drafter.cfg.window
        for a in range(0, features.shape[0], step):
            chunk = features[a:a + step].to(self.dtype)
            self.state = self.drafter.commit(self.state, chunk, chunk.shape[0])
            self.count += chunk.shape[0]

    @torch.inference_mode()
    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        if pos != self.count:
            raise HyflashError(f"draft at position {pos} but the drafter holds {self.count} "
                               "context features: the engine and drafter are out of step")
        return self.drafter.draft(self.state, torch.tensor([anchor])).float()


def load_torch_drafter(path: str | Path, target: Target) -> TorchDrafter:
    return TorchDrafter(load_drafter(path, target))
