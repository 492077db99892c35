"""Validation during a training run: ``val.jsonl`` and the best weights so far.

Every ``eval_every`` steps the run scores its validation sequences (``loop.evaluate``) and
appends one line to ``val.jsonl`` in its run folder: the step, the validation loss, the
per-position accuracy and the expected tau. The weights of the highest expected tau so
far are kept beside the checkpoint (``best-SSSSSS.safetensors``), so a run that overfits
its data can end with them instead of its last ones (``TrainSpec.keep = "best"``). A
resumed run drops the lines and weights written after its checkpoint: it recomputes those
steps from the same batches. Like the checkpoints, the files are read by every rank and
written by rank 0 (a shared folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LOG = "val.jsonl"


def best_name(step: int) -> str:
    return f"best-{step:06d}.safetensors"


class Validation:
    def __init__(self, work: Path, step: int, main: bool):
        self.work, self.main = work, main
        self.best: tuple[float, int] | None = None  # (expected tau, step)
        path = work / LOG
        kept = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    if row["step"] <= step:
                        kept.append(row)
                except (ValueError, KeyError, TypeError):  # a line torn by a killed run
                    continue
        for row in kept:
            if self.better(row["val_expected_tau"]):
                self.best = (row["val_expected_tau"], row["step"])
        if main:
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            for f in work.glob("best-*.safetensors"):
                if self.best is None or f.name != best_name(self.best[1]):
                    f.unlink()

    @property
    def rows(self) -> list[dict]:
        path = self.work / LOG
        return [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []

    def better(self, tau: float) -> bool:
        """Would a validation of this expected tau be the best so far (ties: the earlier)?"""
        return self.best is None or tau > self.best[0]

    def record(self, step: int, result: dict, weights: dict | None) -> None:
        """Append the line; weights (the drafter's trainable state, given when ``better``)
        become the best ones, replacing the previous best file."""
        from safetensors.torch import save_file

        tau = result["val_expected_tau"]
        if weights is not None:
            self.best = (tau, step)
        if not self.main:
            return
        if weights is not None:
            tmp = self.work / (best_name(step) + ".tmp")
            save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, tmp)
            os.replace(tmp, self.work / best_name(step))
            for f in self.work.glob("best-*.safetensors"):
                if f.name != best_name(step):
                    f.unlink()
        row = {"step": step, **{k: result[k] for k in ("val_loss", "val_accuracy",
                                                       "val_expected_tau")},
               "best": weights is not None}
        with (self.work / LOG).open("a") as f:
            f.write(json.dumps(row) + "\n")

    def best_weights(self) -> dict:
        from safetensors.torch import load_file

        return load_file(self.work / best_name(self.best[1]))
