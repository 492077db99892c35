"""The pocket model: the embedded default target (a small Python code LM).

`path()` is the one place the rest of the code asks for the default model; the folder
is a plain Hugging Face model folder built by `python -m hyflash.models.pocket.build`.
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
                           "`python -m hyflash.models.pocket.build --out " f"{folder}`")
    return folder
