"""The pocket model: the embedded default target (a small Python code LM).

`path()` is the one place the rest of the code asks for the default model; the folder
is a plain Hugging Face model folder built by `python -m hyflash.train.pocket_target`.
`drafter_path(arch)` gives its shipped drafters (`hyflash train --target pocket`).
"""

from __future__ import annotations

from pathlib import Path

from hyflash.errors import HyflashError

HERE = Path(__file__).parent


def path() -> Path:
    """Folder of the shipped pocket model (config.json, model.safetensors, tokenizer)."""
    folder = HERE / "model"
    if not (folder / "model.safetensors").exists():
        raise HyflashError(f"the pocket model is missing from {folder}; rebuild it with "
                           "`python -m hyflash.train.pocket_target --out " f"{folder}`")
    return folder


def is_pocket_folder(recorded: str | Path) -> bool:
    """Whether a recorded target path (a drafter's training report) names the pocket
    model's folder: in this checkout, or in the one that trained the drafter."""
    return Path(recorded).parts[-4:] == ("hyflash", "models", "pocket", "model")


DRAFTERS = {"pocket": "hyflash", "pocket-hyflash": "hyflash", "pocket-full": "full"}


def drafter_path(arch: str = "hyflash") -> Path:
    """Folder of a shipped pocket drafter: ``hyflash`` or the ``full``-context baseline."""
    folder = HERE / "drafters" / arch
    if not (folder / "model.safetensors").exists():
        raise HyflashError(f"the pocket {arch} drafter is missing from {folder}; train one "
                           f"with `hyflash train --target pocket --data stdlib --arch {arch}`")
    return folder

