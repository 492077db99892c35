"""The target's tokenizer, loaded from the same Hugging Face folder as its weights."""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.errors import HyflashError

# What a causal LM's forward takes. Tokenizers saved as a bare PreTrainedTokenizerFast
# also return token_type_ids, which `model.generate(**tokenizer(text, return_tensors="pt"))`
# rejects under transformers and optimum ("model_kwargs are not used by the model").
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]
# transformers' own "no limit" value for model_max_length
NO_LENGTH_LIMIT = int(1e30)


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # missing or unreadable tokenizer files all end the same way
        raise HyflashError(f"no usable tokenizer in {folder} ({type(e).__name__}): the model "
                           "folder needs its tokenizer files (tokenizer.json or similar)") from e
    # Every caller checks token counts against the target's context itself (the engine,
    # simulate, train); the tokenizer's own limit would only add a "Token indices sequence
    # length is longer than the specified maximum" warning on top of that check.
    tokenizer.model_max_length = NO_LENGTH_LIMIT
    return tokenizer


def fix_model_input_names(tokenizer_config: Path) -> None:
    """Rewrite a tokenizer_config.json (a copy we own) so the tokenizer returns only what a
    causal LM takes: MODEL_INPUT_NAMES."""
    from hyflash.models.folders import read_json_object

    config = read_json_object(tokenizer_config, "restore the model's tokenizer files")
    config["model_input_names"] = MODEL_INPUT_NAMES
    tokenizer_config.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                encoding="utf-8")
