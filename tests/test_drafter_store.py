"""The shipping form of a drafter folder (int8 rows, ``drafter_store``): every weight within
half a step of the float it came from, loaded as float by ``load_drafter``, and a damaged
file is a one-line error naming the tensor."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.models.drafter_folder import load_drafter
from hyflash.models.drafter_store import MIN_ELEMENTS, PACKED_FORMAT, SCALE, pack_rows, unpack_rows
from hyflash.models.target import Target, TargetConfig


def target_of(hidden: int) -> Target:
    torch.manual_seed(0)
    return Target(TargetConfig(vocab_size=97, hidden_size=hidden, intermediate_size=hidden * 2,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=hidden // 4, max_seq_len=64,
                               tie_word_embeddings=True)).eval()


def test_packing_keeps_every_weight_within_half_a_step_of_its_row():
    torch.manual_seed(1)
    w = torch.randn(300, 256) * torch.linspace(0.01, 3, 300)[:, None]  # rows of every scale
    w[7] = 0  # an all-zero row stays zero (no division by zero)
    state = {"big": w, "small": torch.randn(4, 8), "ids": torch.arange(5), "vec": torch.randn(9)}
    packed = pack_rows(state)
    assert packed["big"].dtype == torch.int8 and packed["big" + SCALE].shape == (300,)
    assert packed["small"].dtype == packed["vec"].dtype == torch.float16
    assert torch.equal(packed["ids"], state["ids"])
    back = unpack_rows(packed, "x", "fix")
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert ((back["big"] - w).abs() <= step / 2 + 1e-7).all() and not back["big"][7].any()
    assert set(back) == set(state) and back["big"].dtype == torch.float32
    assert unpack_rows(state, "x", "fix") == state  # a float state comes back unchanged


@torch.no_grad()
def test_a_packed_drafter_folder_loads_as_float_and_drafts_what_the_float_one_drafts(tmp_path):
    target = target_of(256)  # matrices of 65536+ elements: packed at the default threshold
    torch.manual_seed(2)
    d = Drafter.for_target(target, num_layers=2, num_heads=4, window=8, block_size=4,
                           draft_vocab=40)
    d.draft_head.set_ids(torch.randperm(97)[:40])
    d.eval().save(tmp_path / "float")
    ship = load_script("smollm2_drafter").ship
    ship(tmp_path / "float", tmp_path / "int8", store="int8")
    meta = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert meta["format_version"] == PACKED_FORMAT
    stored = load_file(tmp_path / "int8" / "model.safetensors")
    assert stored["layers.0.mlp.up_proj.weight"].dtype == torch.int8
    assert stored["fc.weight"].numel() >= MIN_ELEMENTS and stored["fc.weight"].dtype == torch.int8
    size = (tmp_path / "int8" / "model.safetensors").stat().st_size
    ship(tmp_path / "float", tmp_path / "fp16")
    assert size < 0.6 * (tmp_path / "fp16" / "model.safetensors").stat().st_size
    a, b = load_drafter(tmp_path / "float", target), load_drafter(tmp_path / "int8", target)
    assert torch.equal(a.draft_head.ids, b.draft_head.ids)
    feats = torch.randn(1, 24, target.cfg.feature_size)
    tokens = torch.randint(0, 97, (1, 24))
    anchors = torch.tensor([[0, 9, 17]])
    la, lb = a(tokens, feats, anchors), b(tokens, feats, anchors)
    torch.testing.assert_close(lb, la, atol=0.05 * la.abs().max().item(), rtol=0)
    assert torch.equal(la.argmax(-1), lb.argmax(-1))


@pytest.mark.parametrize("damage, needle", [
    (lambda s: s.pop("fc.weight"), "fc.weight.row_scale [256] scales no int8 matrix"),
    (lambda s: s.update({"fc.weight.row_scale": torch.ones(3)}), "of as many rows"),
    (lambda s: s.pop("fc.weight.row_scale"), "int8 tensor fc.weight has no .row_scale"),
])
def test_a_damaged_packed_folder_is_a_one_line_error(tmp_path, damage, needle):
    target = target_of(256)
    d = Drafter.for_target(target, num_layers=1, num_heads=4, window=8, block_size=4)
    d.save(tmp_path / "d")
    f = tmp_path / "d" / "model.safetensors"
    state = pack_rows(load_file(f))
    damage(state)
    save_file(state, f)
    with pytest.raises(HyflashError, match=needle.replace("[", r"\[").replace("]", r"\]")) as e:
        load_drafter(tmp_path / "d", target)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def load_script(name: str):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
