"""GGUF files as targets: dequantized once into a Hugging Face folder, cached by content.

Many users hold their small models as GGUF (llama.cpp's format). Every hyflash command
reads a Hugging Face model folder (config.json, model.safetensors, tokenizer files), so a
``.gguf`` passed as ``--target`` is converted once into exactly such a folder under
``$HYFLASH_CACHE/gguf/<sha256 of the file>-v<CONVERSION>/`` (default cache
``~/.cache/hyflash``) and every later call reuses it. One loader
(``Target.from_pretrained``) then serves both, and the folder also loads in
``transformers.AutoModelForCausalLM`` / ``AutoTokenizer``.

Weights are dequantized by the ``gguf`` package (llama.cpp's own reader) to float32: a
quantized GGUF's values (scale * q + min) are exact in fp32, not in fp16. llama.cpp's
converter permutes the q/k projection rows of ``llama`` models for its interleaved rope;
``unpermute`` undoes it so Hugging Face's rotate-half rope applies again.

The tokenizer is rebuilt from the GGUF's own vocabulary with ``tokenizers``: byte-level
BPE (``tokenizer.ggml.model = gpt2``, used by SmolLM, Llama 3, Qwen) with the
pre-tokenizer named by ``tokenizer.ggml.pre``. transformers' GGUF tokenizer conversion is
not used: for a llama-architecture GGUF it assumes a SentencePiece-style tokenizer, sets
eos to the bos token and prepends bos even when the file says not to.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from hyflash.atomic import write_folder_atomically
from hyflash.errors import HyflashError

GGUF_MAGIC = b"GGUF"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
SUPPORTED = "supported are GGUF files of architecture llama, qwen2 or qwen3 with a byte-level " \
            "BPE tokenizer (tokenizer.ggml.model gpt2)"

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), as Hugging Face tokenizers spell them
_GPT2 = None  # ByteLevel's own regex
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {"default": _GPT2, "gpt-2": _GPT2, "smollm": "digits", "llama-bpe": _LLAMA3,
                  "qwen2": _QWEN2}

TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types that are added tokens
CONVERSION = 1  # part of the cache key: bump it whenever the converted folder would change

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                "output": "lm_head"}


class GGUFError(HyflashError):
    """A GGUF file hyflash cannot use; the message names the file and what is supported."""


def cache_root() -> Path:
    """Where converted models and downloaded files live: $HYFLASH_CACHE or ~/.cache/hyflash."""
    return Path(os.environ.get("HYFLASH_CACHE") or Path.home() / ".cache" / "hyflash")


def gguf_folder(path: str | Path) -> Path:
    """The Hugging Face folder converted from the GGUF file at path (converted on first use)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}: pass an existing .gguf file or a model folder")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF'); "
                            f"{SUPPORTED}")
    out = cache_root() / "gguf" / f"{file_sha256(path)}-v{CONVERSION}"
    if not (out / "config.json").is_file():
        reader = open_reader(path)
        write_folder_atomically(out, lambda tmp: convert(reader, path, tmp))
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def open_reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:  # the reader's errors on a cut file are struct/numpy errors
        raise GGUFError(f"{path} is truncated or corrupt ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}): download it again; "
                        f"{SUPPORTED}") from e


def read_metadata(reader) -> dict:
    """Key -> value (str, number, bool or list) of every metadata field."""
    return {name: field.contents() for name, field in reader.fields.items()}


def convert(reader, path: Path, out: Path) -> None:
    """Write config.json, model.safetensors, generation_config.json and tokenizer files."""
    from safetensors.numpy import save_file

    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path} holds architecture {arch!r}; {SUPPORTED}")
    names = {t.name: hf_tensor_name(t.name, path) for t in reader.tensors}
    shapes = {names[t.name]: tuple(reversed(t.shape.tolist())) for t in reader.tensors}
    config = hf_config(meta, arch, shapes, path)
    tokenizer = build_tokenizer(meta, path)  # every check before the slow part
    state = read_weights(reader, names, config, path)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    (out / "SOURCE").write_text(f"converted by hyflash from {path.resolve()}\n")


# ------------------------------------------------------------------------ weights

def read_weights(reader, names: dict, config: dict, path: Path) -> dict[str, np.ndarray]:
    """Dequantized float32 tensors under Hugging Face names, q/k rows as Hugging Face has them."""
    from gguf import dequantize

    permuted = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    state = {}
    for t in reader.tensors:
        name = names[t.name]
        try:
            w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError as e:
            raise GGUFError(f"{path}: tensor {t.name} is stored as {t.tensor_type.name}, which "
                            "the gguf package cannot dequantize; use another quantization of "
                            "the model") from e
        proj = name.split(".")[-2]
        if config["model_type"] == "llama" and proj in permuted:
            w = unpermute(w, permuted[proj])
        state[name] = w
    return state


def hf_tensor_name(name: str, path: Path) -> str:
    stem, _, suffix = name.rpartition(".")
    if stem in _TOP_TENSORS:
        return f"{_TOP_TENSORS[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{suffix}"
    if stem == "rope_freqs":
        raise GGUFError(f"{path} carries Llama-3.1-style rope scaling factors (rope_freqs), "
                        "which hyflash does not read from GGUF yet; use the model's Hugging "
                        "Face folder instead")
    raise GGUFError(f"{path} has tensor {name!r}, which a plain decoder does not; {SUPPORTED}")


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: within each head it interleaves the two rotary
    halves (rows 0, d/2, 1, d/2+1, ...); Hugging Face's rope wants them as two halves."""
    half = w.shape[0] // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def hf_config(meta: dict, arch: str, shapes: dict, path: Path) -> dict:
    """config.json from the metadata and the tensors' (Hugging Face) shapes."""
    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFError(f"{path} lacks metadata {arch}.{name}; {SUPPORTED}")
        # GGUF stores float32: write its shortest decimal (1e-05, not 9.99999974e-06)
        return float(str(np.float32(value))) if isinstance(value, float) else value

    heads = key("attention.head_count")
    q = shapes.get("model.layers.0.self_attn.q_proj.weight")
    if "model.embed_tokens.weight" not in shapes or q is None:
        raise GGUFError(f"{path} lacks token_embd / blk.0.attn_q tensors; {SUPPORTED}")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{path} uses rope scaling {scaling!r}; hyflash reads none or linear "
                        "from GGUF")
    eos = list(dict.fromkeys(meta[k] for k in ("tokenizer.ggml.eos_token_id",
                                                "tokenizer.ggml.eot_token_id") if k in meta))
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": shapes["model.embed_tokens.weight"][0],
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": q[0] // heads,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": None if scaling == "none" else
        {"rope_type": "linear", "factor": key("rope.scaling.factor")},
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in shapes,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos if len(eos) > 1 else (eos or [None])[0],
        "torch_dtype": "float32",
    }


# ---------------------------------------------------------------------- tokenizer

def build_tokenizer(meta: dict, path: Path):
    """A transformers fast tokenizer equal to llama.cpp's for this vocabulary."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    kind, tokens = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise GGUFError(f"{path} has no tokenizer data (tokenizer.ggml.model / .tokens); "
                        f"{SUPPORTED} and its vocabulary inside the file")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or "tokenizer.ggml.merges" not in meta or pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{path} has a {kind!r} tokenizer with pre-tokenizer {pre!r}; "
                        f"{SUPPORTED} and pre-tokenizer {', '.join(PRE_TOKENIZERS)}")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                               ignore_merges=pre == "llama-bpe"))
    regex = PRE_TOKENIZERS[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=regex in (_GPT2, "digits"))
    if regex is _GPT2:
        tok.pre_tokenizer = byte_level
    elif regex == "digits":  # llama.cpp splits off every digit, then applies GPT-2's regex
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{path} lists {len(types)} token types for {len(tokens)} tokens: "
                        "the file is corrupt; download it again")
    added = [(t, ty) for t, ty in zip(tokens, types, strict=True)
             if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    tok.add_tokens([AddedToken(t, special=ty == TOKEN_CONTROL, normalized=False)
                    for t, ty in added])

    def token(field):
        i = meta.get(f"tokenizer.ggml.{field}_token_id")
        return None if i is None or i >= len(tokens) else tokens[i]

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and token("bos") is not None:
        bos = token("bos")
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    extra = {"chat_template": meta["tokenizer.chat_template"]} \
        if "tokenizer.chat_template" in meta else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=token("bos"), eos_token=token("eos"),
        unk_token=token("unknown"), pad_token=token("padding"),
        clean_up_tokenization_spaces=False, **extra)
