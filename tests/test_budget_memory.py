"""The budget's memory model: shapes equal the real modules, every term equals a hand
computation for a small config, the HyFlash state is constant in context and the
full-context one linear, and the stored bytes equal what our exporters wrote."""

from dataclasses import replace

import onnx
import pytest
import torch

from hyflash.budget import memory
from hyflash.budget.plan import for_bundle
from hyflash.budget.recipes import recipe
from hyflash.budget.runtime_costs import RuntimeCosts
from hyflash.budget.shapes import DrafterShape, TargetShape
from hyflash.budget.sources import resolve
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.target import Target, TargetConfig

# a tiny Llama (conftest's shape): V 48, H 32, I 64, 3 layers, 4 heads over 2 kv heads of 8
TINY = TargetConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_seq_len=128,
                    tie_word_embeddings=True)
def costs(backend, factors, **kw):
    return RuntimeCosts(**{"backend": backend, "library_bytes": 0, "desktop_process_bytes": 0,
                           "session_bytes": 0, "run_bytes": 0, "weights_factor": factors,
                           "load_transient_factor": 0.0,
                           "embedding_mapped": backend == "onnx", **kw})


UNIT = {"onnx": costs("onnx", {"fp32": 1.0, "int4": 1.0, "int8": 1.0}),
        "executorch": costs("executorch", {"fp32": 1.0, "8da4w": 1.0})}


def tiny_plan(quant="fp32", backend="onnx", context=128, arch="hyflash", **drafter):
    t = TargetShape.from_config(TINY, "tiny")
    d = replace(DrafterShape.default_for(t, arch), layers=1, heads=4, window=16, block=4,
                **drafter)
    return memory.Plan(t, d, recipe(quant, backend), context, 8, UNIT[backend])


def meta_params(module, skip=()):
    return sum(p.numel() for n, p in module.named_parameters()
               if not n.startswith(skip))


# ------------------------------------------------------------- shapes vs modules

@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=False),
                                dict(qkv_bias=True, model_type="qwen2"),
                                dict(qk_norm=True, model_type="qwen3")])
def test_target_shape_counts_the_parameters_of_the_real_target(kw):
    cfg = replace(TINY, **kw)
    with torch.device("meta"):
        target = Target(cfg)
    assert TargetShape.from_config(cfg, "t").params == meta_params(target)


@pytest.mark.parametrize("arch,mem", [("hyflash", "prefix-slots"), ("hyflash", "decayed-linear"),
                                      ("hyflash", "none"), ("full", "none")])
@pytest.mark.parametrize("cache", ["kv", "features"])
def test_drafter_shape_counts_parameters_and_state_of_the_real_drafter(arch, mem, cache):
    cfg = DrafterConfig(vocab_size=48, hidden_size=32, feature_size=96, intermediate_size=64,
                        max_seq_len=128, num_layers=2, num_heads=4, block_size=4,
                        window=128 if arch == "full" else 16, memory=mem, arch=arch)
    with torch.device("meta"):
        d = Drafter(cfg, torch.nn.Embedding(1, 1), torch.nn.Linear(1, 1))
    d.window_cache = cache
    shape = DrafterShape.from_config(cfg, cache)
    assert shape.params == meta_params(d, skip=("embed_tokens.", "lm_head.", "draft_head."))
    assert shape.state_bytes(128) == d.state_bytes()


# --------------------------------------------------------- terms vs hand numbers

def test_target_terms_equal_a_hand_computation_for_a_small_config():
    p = tiny_plan()
    # per layer q 32x32 + k 16x32 + v 16x32 + o 32x32 + gate/up 64x32 + down 32x64 = 9216
    linears = 3 * 9216
    norms = 3 * 2 * 32 + 32
    # head_dim 8 is no multiple of 16: the optimum graph, whose cos and sin tables are
    # context x head_dim float32 (the lean graph's are half as wide)
    rope = 2 * 128 * 8 * 4
    assert memory.target_layers(p).stored == 4 * (linears + norms) + rope
    assert memory.target_layers(replace(p, kv_form="in_place")).stored \
        == 4 * (linears + norms) + rope // 2
    assert memory.embedding(p).stored == 48 * 32 * 4
    assert memory.embedding(p).resident == 48 * 32 * 4  # mapped, but touched soon enough
    assert memory.kv_cache(p).resident == 2 * 3 * 2 * 8 * 4 * 128


def test_a_tied_fp32_lm_head_is_the_table_unless_the_onnx_exporter_folds_its_transpose():
    small = tiny_plan()  # 48 x 32 <= 8192 elements: torch.onnx folds it into its own matrix
    assert memory.lm_head(small).stored == 48 * 32 * 4
    assert memory.lm_head(small).resident == 2 * 48 * 32 * 4  # target + full-vocab drafter
    lean = replace(small, kv_form="in_place")  # the lean graph reads the table itself
    assert memory.lm_head(lean).stored == 0
    big = replace(small, target=replace(small.target, vocab=4096))  # too big to fold
    assert memory.lm_head(big).stored == 0
    assert memory.lm_head(big).resident == 2 * 4096 * 32 * 4


def test_int4_stores_blocks_of_32_with_a_float32_scale_and_keeps_the_embedding_float():
    p = tiny_plan("int4")
    # rows x ceil(cols / 32) blocks x (16 B of nibbles + 4 B scale): down_proj has 2 blocks
    per_layer = 20 * (32 + 16 + 16 + 32 + 64 + 64) + 20 * 2 * 32
    assert memory.target_layers(p).stored == 3 * per_layer + 4 * (3 * 2 * 32 + 32) + 8192
    # the tied head gets its own int4 matrix; under 4096 bytes it is not shared, so the
    # full-vocabulary drafter graph stores a second one
    assert memory.lm_head(p).stored == 2 * 48 * 1 * 20
    assert memory.embedding(p).stored == 48 * 32 * 4


def test_8da4w_stores_int4_groups_with_2_byte_scales_and_the_tied_table_twice_in_fp32():
    q = tiny_plan("8da4w", "executorch")
    assert memory.lm_head(q).stored == 48 * 1 * (16 + 2)
    f = tiny_plan("fp32", "executorch")
    assert memory.lm_head(f).stored == memory.embedding(f).stored == 48 * 32 * 4
    assert memory.embedding(f).resident == 48 * 32 * 4  # a program constant, loaded


def test_drafter_terms_equal_a_hand_computation():
    p = tiny_plan()
    # fc 32x96 + q,k,v,o 4 x 32x32 + gate/up/down 3 x 64x32 = 13312; norms 2x32, fc_norm,
    # norm, mask_embed 3x32; prefix slots: 4 decay logits + 2 x 4 heads x 4 slots x 8
    params = 13312 + 64 + 96 + 4 + 256
    commit = 4 * (32 * 96 + 2 * 32 * 32)  # the commit graph's fc and k/v (ONNX session)
    assert memory.drafter_weights(p).stored == 4 * params  # shared with the commit graph
    assert memory.drafter_weights(p).resident == 4 * params + commit
    # window K and V 2 x 1 layer x 16 x 32, memory S 4 x 8 x 8 + z 4 x 8, count int64
    state = (2 * 16 * 32 + 4 * 64 + 4 * 8) * 4 + 8
    assert memory.drafter_state(p).resident == 2 * state + 4 * 96 * 4  # in + out + commit rows


def test_float_kv_projections_too_big_to_fold_are_stored_again_by_the_commit_graph():
    p = tiny_plan(hidden=128)  # 128 x 128 > 8192 elements: the step graph keeps [out, in]
    base = tiny_plan("int4", hidden=128)
    again = 2 * 128 * 128 * 4
    own = sum(m.params for m in p.drafter.linears()) * 4 + p.drafter.small_params * 4
    assert memory.drafter_weights(p).stored == own + again
    assert "k_proj/v_proj" in memory.drafter_weights(p).formula
    assert "commit graph stores" not in memory.drafter_weights(base).formula  # int4 is shared


def test_activations_are_the_larger_of_prefill_and_verify():
    p = tiny_plan()
    prefill = 8 * (48 + 96 + 3 * 64 + 4 * 32) * 4 + 4 * 8 * 8 * 4
    verify = 4 * (48 + 96 + 3 * 64 + 4 * 32) * 4 + 4 * 4 * 128 * 4 + 3 * 48 * 4
    assert memory.activations(p).resident == max(prefill, verify)


def test_hyflash_state_is_constant_in_context_and_full_context_state_is_linear():
    hy = [memory.drafter_state(tiny_plan(context=c)).resident for c in (128, 512, 2048, 8192)]
    assert len(set(hy)) == 1
    contexts = (128, 512, 2048, 8192)
    full = [memory.drafter_state(tiny_plan(context=c, arch="full")).resident for c in contexts]
    slopes = {(b - a) / (cb - ca)
              for a, b, ca, cb in zip(full, full[1:], contexts, contexts[1:], strict=False)}
    assert slopes == {2 * 2 * 1 * 32 * 4}  # in + out x K, V x 1 layer x H x float32


def test_weights_factor_and_runtime_terms_come_from_the_measured_data():
    p = tiny_plan()
    rt = costs("onnx", {"fp32": 1.5}, library_bytes=7, desktop_process_bytes=9,
               session_bytes=3, run_bytes=5)
    measured = replace(p, runtime=rt)
    assert memory.target_layers(measured).resident == round(1.5 * memory.target_layers(p).stored)
    phone = {t.key: t.resident for t in memory.runtime(measured)}
    assert phone == {"runtime": 7, "sessions": 2 * 3}  # the drafter's two graphs
    desktop = {t.key: t.resident for t in memory.runtime(replace(measured, desktop=True))}
    assert desktop == {"runtime": 9, "sessions": 6, "run": 5}
    alone = {t.key: t.resident for t in memory.runtime(replace(measured, drafter=None))}
    assert alone == {"runtime": 7}


def test_the_peak_counts_the_larger_of_loading_and_the_calls_not_both():
    p = replace(tiny_plan(), runtime=costs("onnx", {"fp32": 1.0}, load_transient_factor=50.0))
    b = memory.budget(p)
    load, act = b.term("load").resident, b.term("activations").resident
    assert load > act
    assert b.resident == sum(t.resident for t in b.terms) - act


def test_sliding_window_layers_cap_their_kv_cache():
    gemma = resolve("gemma-3-1b").target
    assert gemma.sliding_layers == 26 - 26 // 6 and gemma.sliding_window == 512
    per_position = 2 * 1 * 256 * 2
    assert gemma.kv_bytes(4096, 2) == per_position * (4 * 4096 + 22 * 512)
    assert not gemma.exportable and gemma.notes


# ------------------------------------------------- stored bytes vs real bundles

def initializer_bytes(bundle) -> int:
    """Bytes of every initializer of the bundle's graphs, shared files counted once."""
    total, seen = 0, set()
    for name in {c.file for c in bundle.manifest.models.values()}:
        model = onnx.load(str(bundle.folder / name), load_external_data=False)
        for init in model.graph.initializer:
            ext = {e.key: e.value for e in init.external_data}
            if ext:
                if ext["location"] not in seen:
                    seen.add(ext["location"])
                    total += (bundle.folder / ext["location"]).stat().st_size
            else:
                total += len(init.raw_data)
    return total


def test_the_sharing_threshold_is_the_exporters():
    from hyflash.export.shared_weights import MIN_BYTES

    assert memory.SHARE_MIN == MIN_BYTES


def test_the_folding_limit_is_the_onnx_exporters():
    from onnxscript.optimizer._constant_folding import DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT

    assert memory.FOLD_LIMIT == DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT


@pytest.mark.parametrize("name", ["hyflash", "full", "hyflash-features", "hyflash-dv", "int8",
                                  "int4"])
def test_stored_bytes_match_the_initializers_our_exporter_wrote(onnx_bundles, name):
    src = resolve(str(onnx_bundles[2][name]))
    estimate = memory.budget(for_bundle(src)).stored
    real = initializer_bytes(src.bundle)
    assert abs(estimate / real - 1) < 0.03, (estimate, real)


@pytest.mark.parametrize("name", ["hyflash", "full", "hyflash-features"])
def test_kv_and_state_sizes_agree_with_what_the_manifest_records(onnx_bundles, name):
    src = resolve(str(onnx_bundles[2][name]))
    m = src.bundle.manifest
    assert src.target.kv_bytes(m.max_context, 4) == m.kv_bytes_per_token * m.max_context
    assert src.drafter.state_bytes(m.max_context) == m.state_bytes
