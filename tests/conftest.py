"""Shared fixtures: a tiny random Llama saved as a Hugging Face folder with a tokenizer."""

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Nothing a test runs writes into the user's ~/.cache/hyflash (simulate's tau records,
    converted GGUF folders): the whole session gets its own HYFLASH_CACHE."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HYFLASH_CACHE", str(tmp_path_factory.mktemp("hyflash-cache")))
    yield
    mp.undo()


WORDS = ["[UNK]", "<eos>"] + [f"w{i}" for i in range(46)]


def save_tiny_llama(folder, max_position_embeddings=64, seed=0, layers=3):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2,
                                   max_position_embeddings=max_position_embeddings,
                                   bos_token_id=None, eos_token_id=1)
    transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32) \
        .save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                         eos_token="<eos>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny random Llama with a word-level tokenizer, saved as a Hugging Face folder."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def onnx_bundles(tmp_path_factory):
    """The tiny ONNX pair (onnx_pairs.exported_pair): a target folder, trained drafters
    and their bundles. Exports take ~10 s each, so every module that runs bundles shares
    one set; tests must not modify these folders (copy a bundle to damage it)."""
    from onnx_pairs import exported_pair

    return exported_pair(tmp_path_factory.mktemp("onnx-pair"))


@pytest.fixture(scope="session")
def fp32_bundle(tmp_path_factory):
    """The pocket pair's fp32 ExecuTorch bundle (executorch_pairs), exported once per
    session for the Python and the C++ runtime's tests."""
    pytest.importorskip("executorch")
    from executorch_pairs import export_pocket_fp32

    return export_pocket_fp32(tmp_path_factory.mktemp("et") / "pocket-fp32")
