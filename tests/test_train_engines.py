"""Generation engines: vLLM's request/response mapping (with a stand-in for ``vllm.LLM``:
vLLM needs a CUDA GPU), transformers' generate, and hyflash's own target write the same
continuations; an engine that stops early, a missing vLLM and vLLM under torchrun are
one line."""

import argparse
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import WORDS

from hyflash.cli import main
from hyflash.errors import HyflashError
from hyflash.models.target import Target
from hyflash.train import command, distributed, engines, features
from hyflash.train.data import DataSpec, generate_dataset
from hyflash.train.generation import continue_batch
from hyflash.train.shards import DistillSet, Shard, shard_files, write_shard

torch.set_num_threads(1)
SPEC = DataSpec(sequences=8, gen_len=6, short_prompt=(4, 8), long_prompt=(12, 20), batch=4,
                shard=4)


class FakeParams(SimpleNamespace):
    """vllm.SamplingParams as a record of its keyword arguments."""


class FakeLLM:
    """vllm.LLM's offline ``generate``: answers token-id prompts with the target's greedy
    continuation (hyflash's own, so the data must come out the same), or ``short`` tokens."""

    def __init__(self, target, short: int | None = None):
        self.target, self.short, self.calls = target, short, []

    def generate(self, inputs, params, use_tqdm=True):
        self.calls.append((inputs, params))
        prompts = torch.tensor([x["prompt_token_ids"] for x in inputs])
        tokens, _, _ = continue_batch(self.target, prompts, params[0].max_tokens, False, 1.0,
                                   torch.Generator())
        rows = tokens[:, prompts.shape[1]:].tolist()
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=r[:self.short])])
                for r in rows]


@pytest.fixture(scope="module")
def target(model_folder):
    return Target.from_pretrained(model_folder)


@pytest.fixture(scope="module")
def stream():
    return torch.randint(2, len(WORDS), (800,), generator=torch.Generator().manual_seed(0)).numpy()


def prompts():
    return torch.randint(2, len(WORDS), (3, 10), generator=torch.Generator().manual_seed(4))


def test_vllm_requests_ask_for_exactly_gen_len_tokens_with_seeds_from_the_shard(target):
    engine = engines.VllmEngine(FakeLLM(target), FakeParams)
    inputs, params = engine.requests(prompts(), 6, True, 0.7, torch.Generator().manual_seed(9))
    assert [x["prompt_token_ids"] for x in inputs] == prompts().tolist()
    assert {(p.n, p.max_tokens, p.min_tokens, p.ignore_eos, p.temperature) for p in params} \
        == {(1, 6, 6, True, 0.7)}
    seeds = [p.seed for p in params]
    assert len(set(seeds)) == 3  # one per request, reproducible from the shard's generator
    again = engine.requests(prompts(), 6, True, 0.7, torch.Generator().manual_seed(9))[1]
    assert [p.seed for p in again] == seeds
    greedy = engine.requests(prompts(), 6, False, 0.7, torch.Generator())[1]
    assert {p.temperature for p in greedy} == {0.0}


def test_vllm_engine_data_equals_hyflash_engine_data(tmp_path, target, stream):
    """Same continuations (the stand-in answers with the target's own); the features,
    which vLLM does not give, come from one causal pass of the target."""
    generate_dataset(target, stream, SPEC, tmp_path / "ours", progress=False)
    llm = FakeLLM(target)
    generate_dataset(target, stream, SPEC, tmp_path / "vllm", progress=False,
                     engine=engines.VllmEngine(llm, FakeParams))
    target.drop_cache()
    assert len(llm.calls) == 2  # one request batch per generation batch
    ours, theirs = DistillSet(tmp_path / "ours"), DistillSet(tmp_path / "vllm")
    for i in range(SPEC.sequences):
        (ta, fa, pa), (tb, fb, pb) = ours.get(i), theirs.get(i)
        assert torch.equal(ta, tb) and pa == pb
        torch.testing.assert_close(fa, fb, atol=2e-3, rtol=1e-2)


def test_an_engine_that_stops_early_is_one_line(target):
    engine = engines.VllmEngine(FakeLLM(target, short=4), FakeParams)
    with pytest.raises(HyflashError, match="returned 4 tokens for prompt 0, not --gen-len 6"):
        engine.continue_batch(prompts(), 6, False, 1.0, torch.Generator())
    target.drop_cache()


def test_transformers_engine_writes_the_targets_greedy_continuations(model_folder, target):
    ours, f, g = continue_batch(target, prompts(), 6, False, 1.0, torch.Generator())
    target.drop_cache()
    theirs, none, no_labels = engines.TransformersEngine(model_folder).continue_batch(
        prompts(), 6, False, 1.0, torch.Generator())
    assert torch.equal(ours, theirs) and none is None and no_labels is None
    assert f is not None and g is not None


def test_vllm_is_refused_in_one_line_where_it_cannot_run(model_folder, tmp_path, capsys,
                                                         monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(f"w{i % 40}" for i in range(500)))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # vLLM not installed (as here)
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["train", "--target", str(model_folder), "--data", str(corpus), "--out",
                 str(tmp_path / "d"), "--engine", "vllm", "--gen-len", "16", "--sequences",
                 "8", "--batch", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm needs vLLM (Linux + CUDA GPU)" in err and err.count("\n") == 1
    assert not (tmp_path / "d.work").exists()  # refused before any work
    with pytest.raises(HyflashError, match="runs in one process, not under torchrun"):
        engines.check_engine("vllm", world=2)


def test_parallel_without_torchrun_is_one_line(model_folder, tmp_path, capsys):
    assert main(["train", "--target", str(model_folder), "--data", "stdlib", "--out",
                 str(tmp_path / "d"), "--parallel", "fsdp", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--parallel fsdp applies under torchrun only" in err and err.count("\n") == 1


def test_command_choices_are_the_modules():
    assert command.ENGINES == engines.ENGINES and command.ENGINES[0] == "hyflash"
    assert command.FEATURE_MODES == features.FEATURE_MODES
    assert command.PRECISIONS == features.PRECISIONS and command.PRECISIONS[0] == "float32"
    assert command.PARALLEL == distributed.PARALLEL


class NoDecoding:
    """An engine that must not be asked: every shard's tokens exist already."""

    def continue_batch(self, *args, **kwargs):
        raise AssertionError("decoded although the tokens were there")


def test_features_are_computed_for_tokens_generated_earlier(tmp_path, target, stream):
    """A tokens-only folder (an earlier session, another machine) gives its tokens to a
    run that caches features: the same tokens, metadata and features as a fresh cached
    generation, without decoding; a shard it lacks is generated."""
    fresh = generate_dataset(target, stream, SPEC, tmp_path / "fresh", progress=False)
    tokens = generate_dataset(target, stream, SPEC, tmp_path / "tokens", progress=False,
                              features=False)
    taken = generate_dataset(target, stream, SPEC, tmp_path / "taken", progress=False,
                             engine=NoDecoding(), tokens_from=tokens)
    a, b = DistillSet(fresh), DistillSet(taken)
    assert b.has_features and not DistillSet(tokens).has_features
    for i in range(SPEC.sequences):
        (ta, fa, pa), (tb, fb, pb) = a.get(i), b.get(i)
        assert torch.equal(ta, tb) and pa == pb
        torch.testing.assert_close(fa, fb, atol=2e-3, rtol=1e-2)
    (tokens / "shard0001.safetensors").unlink()  # the second shard: generated again
    with pytest.raises(AssertionError, match="decoded"):
        generate_dataset(target, stream, SPEC, tmp_path / "partial", progress=False,
                         engine=NoDecoding(), tokens_from=tokens)
    assert (tmp_path / "partial" / "shard0000.safetensors").exists()


def labelled_tokens(cached, out, precision):
    """The tokens-only form of a cached folder that keeps its greedy labels, recorded as
    computed at ``precision`` (what ``benchmarks/smollm2_drafter.py --save-tokens``
    commits)."""
    out.mkdir()
    (out / "spec.json").write_text((cached / "spec.json").read_text())
    for s, path in shard_files(cached).items():
        src = Shard(path)
        write_shard(out, s, [src.tokens(i).numpy() for i in range(len(src))], None, src.meta,
                    greedy=[src.greedy(i).numpy() for i in range(len(src))],
                    greedy_precision=precision)
    return out


def test_greedy_labels_that_travel_with_the_tokens_spare_the_lm_head(tmp_path, target, stream,
                                                                     monkeypatch):
    """Tokens with their labels of the same precision: the features pass stops at the last
    tap layer (no LM head: the labelling pass is never called) and writes the same features
    and labels as the pass that computes both; labels of another precision are recomputed."""
    fresh = generate_dataset(target, stream, SPEC, tmp_path / "fresh", progress=False)
    tokens = labelled_tokens(fresh, tmp_path / "tokens", "float32")
    assert not DistillSet(tokens).has_features and DistillSet(tokens).has_greedy
    calls = []
    labelling = features.features_and_greedy
    monkeypatch.setattr(features, "features_and_greedy",
                        lambda *a, **k: calls.append(1) or labelling(*a, **k))
    taken = generate_dataset(target, stream, SPEC, tmp_path / "taken", progress=False,
                             engine=NoDecoding(), tokens_from=tokens)
    assert calls == []
    a, b = DistillSet(fresh), DistillSet(taken)
    for i in range(SPEC.sequences):
        (ta, fa, pa), (tb, fb, pb) = a.get(i), b.get(i)
        assert torch.equal(ta, tb) and pa == pb and torch.equal(a.greedy(i), b.greedy(i))
        torch.testing.assert_close(fa, fb, atol=2e-3, rtol=1e-2)
    other = labelled_tokens(fresh, tmp_path / "other", "bfloat16")
    generate_dataset(target, stream, SPEC, tmp_path / "relabelled", progress=False,
                     engine=NoDecoding(), tokens_from=other)
    assert len(calls) == SPEC.sequences // SPEC.batch  # one labelling pass per batch
    with pytest.raises(ValueError, match="one per fed token"):
        write_shard(tmp_path, 9, [np.arange(5)], None, [{"prompt_len": 2, "sampled": False}],
                    greedy=[np.arange(5)])



class Counting(engines.HyflashEngine):
    """hyflash's engine, counting the batches it decodes."""

    calls = 0

    def continue_batch(self, *args, **kwargs):
        self.calls += 1
        return super().continue_batch(*args, **kwargs)


def test_growing_the_data_decodes_only_the_new_shards(tmp_path, target, stream):
    """A run of 12 sequences beside a finished run of 8 (same data otherwise) links the
    smaller run's full shards and decodes only its third: the result equals a fresh run of
    12. A shard the smaller run holds only in part (6 sequences: 2 of 4) is generated."""
    from dataclasses import replace

    small = generate_dataset(target, stream, SPEC, tmp_path / "small", progress=False)
    part = generate_dataset(target, stream, replace(SPEC, sequences=6), tmp_path / "part",
                            progress=False)
    big = replace(SPEC, sequences=12)
    fresh = generate_dataset(target, stream, big, tmp_path / "fresh", progress=False)
    engine = Counting(target)
    grown = generate_dataset(target, stream, big, tmp_path / "grown", progress=False,
                             engine=engine, grown_from=[part, small])
    assert engine.calls == 1  # shard 2: one batch of 4
    for s, source in ((0, part), (1, small)):  # the first folder with the full shard
        assert (grown / f"shard000{s}.safetensors").stat().st_ino == \
            (source / f"shard000{s}.safetensors").stat().st_ino
    a, b = DistillSet(fresh), DistillSet(grown)
    for i in range(big.sequences):
        (ta, fa, pa), (tb, fb, pb) = a.get(i), b.get(i)
        assert torch.equal(ta, tb) and torch.equal(fa, fb) and pa == pb
        assert torch.equal(a.greedy(i), b.greedy(i))
    engine = Counting(target)
    generate_dataset(target, stream, replace(SPEC, sequences=8), tmp_path / "from-part",
                     progress=False, engine=engine, grown_from=[part])
    assert engine.calls == 1  # shard 0 linked; shard 1 (2 sequences in part) generated


def test_the_folders_of_the_same_data_with_other_sequence_counts_are_found(tmp_path,
                                                                           model_folder,
                                                                           target):
    """``command.grown_from`` picks the folders of this target, corpus and spec but for
    --sequences, of the same kind (features cached or tokens only), most sequences first;
    another gen_len, corpus or kind is other data."""
    import json
    from dataclasses import asdict, replace

    def folder(spec, corpus="c", kind=0):
        path = command.folder_names(tmp_path, spec, model_folder, target, corpus,
                                    "hyflash")[kind]
        path.mkdir(exist_ok=True)
        (path / "spec.json").write_text(json.dumps(asdict(spec)))
        return path

    spec = replace(SPEC, sequences=16)
    mine = folder(spec)
    eight, twelve = folder(SPEC), folder(replace(SPEC, sequences=12))
    folder(replace(SPEC, gen_len=7)), folder(SPEC, corpus="other"), folder(SPEC, kind=1)
    (tmp_path / "data-torn").mkdir()
    (tmp_path / "data-torn" / "spec.json").write_text("{")
    assert command.grown_from(mine, spec, model_folder, target, "c", "hyflash") == \
        [twelve, eight]
    tokens_only = folder(spec, kind=1)
    assert command.grown_from(tokens_only, spec, model_folder, target, "c", "hyflash") == \
        [folder(SPEC, kind=1)]


def test_bf16_features_keep_the_tokens_and_stay_close_to_float32(tmp_path, target, stream):
    """--feature-precision bfloat16: the continuations are the float32 ones (decoded at
    float32), the features come from a bf16 pass (close to, not equal to, float32), and
    the greedy labels from float32 logits of that pass."""
    fp32 = generate_dataset(target, stream, SPEC, tmp_path / "fp32", progress=False)
    bf16 = generate_dataset(target, stream, SPEC, tmp_path / "bf16", progress=False,
                            feature_precision="bfloat16")
    a, b = DistillSet(fp32), DistillSet(bf16)
    same_greedy = total = 0
    for i in range(SPEC.sequences):
        (ta, fa, pa), (tb, fb, pb) = a.get(i), b.get(i)
        assert torch.equal(ta, tb) and pa == pb
        assert not torch.equal(fa, fb)  # the pass really ran in bf16
        rel = (fb.float() - fa.float()).norm(dim=-1) / fa.float().norm(dim=-1)
        assert rel.mean() < 0.05
        same_greedy += int((a.greedy(i) == b.greedy(i)).sum())
        total += a.greedy(i).numel()
    assert same_greedy / total > 0.9


def test_feature_precision_names_the_cached_folder_but_not_the_tokens(tmp_path, model_folder,
                                                                      target):
    spec = DataSpec(sequences=8)
    fp = command.folder_names(tmp_path, spec, model_folder, target, "c", "hyflash")
    bf = command.folder_names(tmp_path, spec, model_folder, target, "c", "hyflash", "bfloat16")
    assert fp[0] != bf[0] and fp[1] == bf[1]


@pytest.mark.parametrize("flags, fast", [("fpu avx2 fma", False), ("avx512f avx512_bf16", True),
                                         ("avx512f amx_tile amx_bf16 amx_int8", True),
                                         ("avx512f avx512_bf16x", False)])
def test_bf16_hardware_is_read_off_the_cpu_flags(tmp_path, flags, fast):
    """--precision / --feature-precision bfloat16 on a CPU without bf16 hardware gets a note
    (torch emulates it there, ~50x slower): that check reads the CPU's flags."""
    from hyflash.train.features import cpu_has_fast_bf16

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_has_fast_bf16(info) is fast
    assert cpu_has_fast_bf16(tmp_path / "absent") is True


def test_bf16_features_with_recomputed_features_is_one_line(model_folder, tmp_path, capsys):
    assert main(["train", "--target", str(model_folder), "--data", "stdlib", "--out",
                 str(tmp_path / "d"), "--features", "recompute", "--gen-len", "16",
                 "--feature-precision",
                 "bfloat16", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--feature-precision bfloat16 applies to cached features" in err
    assert err.count("\n") == 1


def smollm2_drafter():
    """benchmarks/smollm2_drafter.py as a module (tests do not import benchmarks/)."""
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "smollm2_drafter.py"
    spec = importlib.util.spec_from_file_location("smollm2_drafter", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flags, features, precision", [
    ([], "cache", "bfloat16"), (["--data-only"], "cache", "bfloat16"),
    (["--decode-only"], "recompute", "float32")])
def test_the_smollm2_script_runs_hyflash_train_in_the_data_mode_asked(flags, features,
                                                                       precision):
    """The script's runs are valid ``hyflash train`` commands: --decode-only stops after the
    data and writes tokens only (features recomputed, so no bf16 features pass), the
    others cache bf16 features; only the two data modes stop after the data."""
    module = smollm2_drafter()
    args = module.parser().parse_args(["--sequences", "256", *flags])
    cmd = module.train_command(args, Path("model.gguf"), "bfloat16")
    assert cmd[:3] == ["-m", "hyflash", "train"]
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    parsed = p.parse_args(cmd[3:])
    assert (parsed.features, parsed.feature_precision) == (features, precision)
    assert parsed.data_only == bool(flags) and parsed.sequences == 256


def test_decoded_tokens_only_shards_are_committed_without_labels(tmp_path, target, stream):
    """``smollm2_drafter.py --decode-only`` leaves tokens-only shards (no features, no
    labels); ``--save-tokens`` then commits those no committed folder holds, tokens as
    decoded, and a later features pass labels them itself."""
    module = smollm2_drafter()
    tokens = generate_dataset(target, stream, SPEC, tmp_path / "tokens", progress=False,
                              features=False)
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "shard0000.safetensors").write_bytes(
        (tokens / "shard0000.safetensors").read_bytes())
    dest = tmp_path / "dest"
    module.save_tokens(tmp_path / "no-cache", dest, [committed], "float32", tokens)
    assert sorted(shard_files(dest)) == [1]  # shard 0 is committed already
    a, b = Shard(tokens / "shard0001.safetensors"), Shard(dest / "shard0001.safetensors")
    assert not b.has_greedy and len(b) == SPEC.shard
    for i in range(SPEC.shard):
        assert torch.equal(a.tokens(i), b.tokens(i))
    with pytest.raises(HyflashError, match="nothing to save"):
        module.save_tokens(tmp_path / "no-cache", tmp_path / "d2", [committed], "float32",
                           tmp_path / "no-tokens")
