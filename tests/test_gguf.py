"""A .gguf target: a tiny random model written as GGUF here (as llama.cpp's converter writes
it, q/k rows permuted for llama) loads with the same logits as its safetensors original,
its tokenizer matches the original's, and bad files fail in one line naming the file."""

import json

import gguf
import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.target import Target, resolve_model_folder
from hyflash.models.tokenizer import load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 1234 héllo"
CORPUS = [TEXT, "import os\nprint('hello world', 42)\n", "for i in range(10):\n    x += i\n"] * 4

HF_TO_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def bpe():
    """A tiny byte-level BPE (GPT-2 style) trained on a few lines of code."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of llama q/k rows (interleaved rope)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def save_hf(folder, bpe, arch="llama", tied=False):
    torch.manual_seed(0)
    cfg = CONFIGS[arch](vocab_size=bpe.get_vocab_size(), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, max_position_embeddings=64, rope_theta=10000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=1,
                        eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():  # non-trivial norms and biases, so a mix-up of them shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(1 + 0.5 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=SPECIALS[1],
                                         eos_token=SPECIALS[2]).save_pretrained(folder)
    return model


def write_gguf(path, model, bpe, arch="llama", tokenizer=True, pre="default", add_bos=False,
               quant=None):
    """Write model + tokenizer as GGUF the way llama.cpp's converter does (F32 tensors;
    ``quant``: {"blk" or "token_embd": GGML type} quantizes the layers' 2-D weights or the
    embedding with the gguf package)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_theta)
    w.add_vocab_size(c.vocab_size)
    if tokenizer:
        state = json.loads(bpe.to_str())["model"]
        tokens = sorted(state["vocab"], key=state["vocab"].get)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL
                           for t in tokens])
        w.add_token_merges([" ".join(m) for m in state["merges"]])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(add_bos)
    for name, t in model.state_dict().items():
        if c.tie_word_embeddings and name == "lm_head.weight":
            continue
        x = t.float().numpy()
        parts = name.removeprefix("model.").split(".")
        if parts[0] == "layers":
            stem, kind = ".".join(parts[2:-1]), parts[-1]
            if arch == "llama" and stem in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = c.num_attention_heads if "q_" in stem else c.num_key_value_heads
                x = llamacpp_permute(x, heads)
            gname = f"blk.{parts[1]}.{HF_TO_GGUF[stem]}.{kind}"
        else:
            gname = {"embed_tokens.weight": "token_embd.weight", "norm.weight":
                     "output_norm.weight", "lm_head.weight": "output.weight"}[".".join(parts)]
        kind = (quant or {}).get(gname.split(".")[0]) if x.ndim == 2 else None
        if kind is None:
            w.add_tensor(gname, np.ascontiguousarray(x))
        else:
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(x), kind),
                         raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", True),
                                       ("qwen3", False)])
def test_gguf_target_logits_equal_the_safetensors_original(tmp_path, bpe, arch, tied):
    model = save_hf(tmp_path / "hf", bpe, arch, tied)
    g = write_gguf(tmp_path / "m.gguf", model, bpe, arch)
    ref = Target.from_pretrained(tmp_path / "hf")
    got = Target.from_pretrained(g)
    assert got.cfg == ref.cfg
    tokens = torch.tensor([bpe.encode(TEXT).ids])
    with torch.no_grad():
        (a, fa), (b, fb) = ref(tokens), got(tokens)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(fb, fa, atol=1e-5, rtol=0)


def test_gguf_folder_also_loads_in_transformers(tmp_path, bpe):
    model = save_hf(tmp_path / "hf", bpe)
    folder = resolve_model_folder(write_gguf(tmp_path / "m.gguf", model, bpe))
    again = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokens = torch.tensor([bpe.encode(TEXT).ids])
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, model(tokens).logits, atol=1e-5,
                                   rtol=0)


@pytest.mark.parametrize("pre", ["default", "smollm"])
def test_gguf_tokenizer_round_trips_text(tmp_path, bpe, pre):
    model = save_hf(tmp_path / "hf", bpe)
    tok = load_tokenizer(resolve_model_folder(write_gguf(tmp_path / "m.gguf", model, bpe,
                                                         pre=pre)))
    text = TEXT + "<|im_end|>"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert ids[-1] == 2 and tok.eos_token == "<|im_end|>" and ids[0] != 1  # no bos added
    ref = Tokenizer.from_str(bpe.to_str())
    if pre == "smollm":  # as SmolLM's tokenizer.json: every digit split off, then GPT-2's regex
        ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     ref.pre_tokenizer])
        assert all(sum(ch.isdigit() for ch in tok.decode([i])) <= 1 for i in ids)
    assert ids == ref.encode(text).ids


def test_gguf_tokenizer_adds_bos_when_the_file_says_so(tmp_path, bpe):
    model = save_hf(tmp_path / "hf", bpe)
    tok = load_tokenizer(resolve_model_folder(write_gguf(tmp_path / "m.gguf", model, bpe,
                                                         pre="llama-bpe", add_bos=True)))
    ids = tok(TEXT).input_ids
    assert ids[0] == 1 and tok.bos_token == "<|im_start|>"
    assert tok.decode(ids, skip_special_tokens=True) == TEXT


def test_gguf_conversion_is_cached_by_content(tmp_path, bpe, monkeypatch):
    model = save_hf(tmp_path / "hf", bpe)
    g = write_gguf(tmp_path / "m.gguf", model, bpe)
    first = resolve_model_folder(g)
    assert first.parent.parent == tmp_path / "cache"
    with monkeypatch.context() as m:
        m.setattr("hyflash.models.gguf.convert", lambda *a: pytest.fail("converted twice"))
        assert resolve_model_folder(g) == first
        (tmp_path / "copy.gguf").write_bytes(g.read_bytes())
        assert resolve_model_folder(tmp_path / "copy.gguf") == first
    other = write_gguf(tmp_path / "other.gguf", save_hf(tmp_path / "hf2", bpe, tied=True), bpe)
    second = resolve_model_folder(other)
    assert second != first and second.parent == first.parent


def test_inspect_describes_a_gguf(tmp_path, bpe, capsys):
    g = write_gguf(tmp_path / "m.gguf", save_hf(tmp_path / "hf", bpe), bpe)
    assert main(["inspect", str(g)]) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "4 / 2 / 8" in out


# ------------------------------------------------------------------ bad input

@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory, bpe):
    d = tmp_path_factory.mktemp("bad")
    model = save_hf(d / "hf", bpe)
    good = write_gguf(d / "good.gguf", model, bpe).read_bytes()
    (d / "truncated.gguf").write_bytes(good[: len(good) // 2])
    (d / "text.gguf").write_text("not a model\n")
    write_gguf(d / "notok.gguf", model, bpe, tokenizer=False)
    write_gguf(d / "pre.gguf", model, bpe, pre="deepseek-coder")
    w = gguf.GGUFWriter(str(d / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d


@pytest.mark.parametrize("name,problem", [
    ("truncated.gguf", "truncated or corrupt"), ("text.gguf", "not a GGUF file"),
    ("notok.gguf", "no tokenizer data"), ("gpt2.gguf", "architecture 'gpt2'"),
    ("pre.gguf", "pre-tokenizer 'deepseek-coder'"), ("missing.gguf", "no GGUF file at")])
def test_bad_gguf_is_one_line_naming_the_file_and_what_is_supported(tmp_path, bad_dir, name,
                                                                    problem, capsys):
    with pytest.raises(HyflashError) as e:
        Target.from_pretrained(bad_dir / name)
    msg = str(e.value)
    assert problem in msg and name in msg and "\n" not in msg
    if name != "missing.gguf":
        assert "supported are" in msg
    assert main(["inspect", str(bad_dir / name)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not list((tmp_path / "cache").glob("gguf/*"))  # nothing half-written left
