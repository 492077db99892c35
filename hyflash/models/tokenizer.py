"""The target's tokenizer, loaded from the same Hugging Face folder as its weights."""

from __future__ import annotations

from pathlib import Path

from hyflash.errors import HyflashError


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # missing or unreadable tokenizer files all end the same way
        raise HyflashError(f"no usable tokenizer in {folder} ({type(e).__name__}): the model "
                           "folder needs its tokenizer files (tokenizer.json or similar)") from e
