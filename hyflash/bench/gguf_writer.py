"""A float32 GGUF of a Llama-family model folder, for llama.cpp to run when its own converter
will not (``convert_hf_to_gguf.py`` refuses a byte-level BPE whose pre-tokenizer it does not
know by hash, as the pocket model's).

Written as llama.cpp's converter writes a llama model (the q/k rows permuted for its
interleaved rope) and checked by reading it back with hyflash's own GGUF reader
(``hyflash.models.gguf``, which undoes the permutation): its logits must equal the
folder's. The bench passes token ids to llama.cpp, so the tokenizer data (vocabulary and
merges, pre-tokenizer ``gpt-2``) only has to load.
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.errors import HyflashError

NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute(w, n_heads: int):
    """llama.cpp's convert_hf_to_gguf permutation of llama q/k rows (interleaved rope)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(folder: Path, out: Path) -> Path:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("model_type") != "llama" or cfg.get("rope_scaling"):
        raise HyflashError(f"{folder}: only llama models without rope scaling are written")
    tok = json.loads((folder / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE":
        raise HyflashError(f"{folder}: only a byte-level BPE tokenizer is written")
    vocab = tok["model"]["vocab"]
    for added in tok.get("added_tokens", []):
        vocab.setdefault(added["content"], added["id"])
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tok.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_value_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                       for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    weights = load_file(str(folder / "model.safetensors"))
    for name, t in weights.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        x = t.astype(np.float32)
        parts = name.removeprefix("model.").split(".")
        if parts[0] == "layers":
            stem = ".".join(parts[2:-1])
            if stem in ("self_attn.q_proj", "self_attn.k_proj"):
                x = permute(x, cfg["num_attention_heads"] if "q_" in stem
                            else cfg["num_key_value_heads"])
            gname = f"blk.{parts[1]}.{NAMES[stem]}.{parts[-1]}"
        else:
            gname = {"embed_tokens.weight": "token_embd.weight", "norm.weight":
                     "output_norm.weight", "lm_head.weight": "output.weight"}[".".join(parts)]
        w.add_tensor(gname, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    check_round_trip(folder, tmp)
    tmp.rename(out)
    return out


def check_round_trip(folder: Path, path: Path) -> None:
    """The written file, converted back by hyflash's GGUF reader, gives the folder's logits."""
    import torch

    from hyflash.models.gguf import gguf_folder
    from hyflash.models.target import Target

    ref = Target.from_pretrained(folder, dtype="float32", max_seq_len=64)
    back = Target.from_pretrained(gguf_folder(path), dtype="float32", max_seq_len=64)
    x = torch.arange(1, 17)[None] % ref.cfg.vocab_size
    with torch.no_grad():
        diff = (ref.prefill(x)[0] - back.prefill(x)[0]).abs().max().item()
    if diff > 1e-4:
        raise HyflashError(f"the GGUF written for {folder} reads back with logits {diff:.2g} "
                           "off: not written")
