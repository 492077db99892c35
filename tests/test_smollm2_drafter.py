"""The SmolLM2-135M-Instruct drafter shipped in benchmarks/drafters/: small, float16, trained
(its report is what makes `hyflash bench` measure rather than dry-run), and it loads onto a
target of SmolLM2's published shape and drafts a block. The GGUF itself is not needed (no
test downloads it): the shape comes from the budget's preset of the same model."""

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hyflash.budget.sources import presets
from hyflash.models.drafter_folder import load_drafter, read_drafter_config
from hyflash.models.target import Target, TargetConfig

SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks" / "drafters" / "smollm2-hyflash"


def test_shipped_folder_is_small_float16_and_trained():
    weights = SHIPPED / "model.safetensors"
    assert weights.stat().st_size <= 20 * 2**20  # issue #11: fp16, at most ~20 MB
    with safe_open(weights, "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes <= {"F16", "I64"} and "F16" in dtypes
    _, cfg, meta = read_drafter_config(SHIPPED)
    assert cfg.arch == "hyflash" and cfg.vocab_size == 49152 and cfg.draft_vocab == 8192
    report = meta["training"]
    assert report["validations"] and report["kept"].startswith("best")
    assert report["val_expected_tau"] > 1.0


@pytest.fixture(scope="module")
def smollm2_shaped_target():
    torch.manual_seed(0)
    hf = presets()["smollm2-135m"]["config"]
    cfg = TargetConfig.from_hf(hf, max_seq_len=read_drafter_config(SHIPPED)[1].max_seq_len)
    return Target(cfg).eval()


def test_loads_onto_smollm2_shape_and_drafts_a_block(smollm2_shaped_target):
    target = smollm2_shaped_target
    drafter = load_drafter(SHIPPED, target)  # checks taps, sizes and every weight's shape
    b = drafter.cfg.block_size
    with torch.no_grad():
        state = drafter.init_state()
        feats = torch.randn(drafter.cfg.window, target.cfg.feature_size)
        state = drafter.commit(state, feats, torch.tensor([20]))
        logits = drafter.draft(state, torch.tensor([42]))
    assert logits.shape[-2:] == (b - 1, target.cfg.vocab_size)
    assert torch.isfinite(logits).any(-1).all()  # ids outside the draft vocabulary are -inf
