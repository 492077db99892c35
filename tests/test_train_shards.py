"""Sharded self-distillation data: shards written by several ranks read back as the set one
process writes, older .npy shards still read, the shards split across ranks with no
overlap and no loss, the global batch the same at every world size, features
recomputed in the step equal to the cached ones, and bad data as one line."""

import hashlib
import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from conftest import WORDS

import hyflash.train.loop as loop
from hyflash.errors import HyflashError
from hyflash.models.drafter import Drafter
from hyflash.models.target import Target
from hyflash.train import features as feats_mod
from hyflash.train.data import DataSpec, generate_dataset
from hyflash.train.lanes import Sampler, check_world, lane_count, rank_shards
from hyflash.train.shards import DistillSet, shard_path

torch.set_num_threads(1)
SPEC = DataSpec(sequences=22, gen_len=8, short_prompt=(4, 8), long_prompt=(12, 20), batch=4,
                shard=6)  # 4 shards: 6, 6, 6, 4 sequences


@pytest.fixture(scope="module")
def target(model_folder):
    return Target.from_pretrained(model_folder)


@pytest.fixture(scope="module")
def stream():
    return torch.randint(2, len(WORDS), (1500,), generator=torch.Generator().manual_seed(0)).numpy()


@pytest.fixture(scope="module")
def whole(tmp_path_factory, target, stream):
    """The data set written by one process."""
    out = tmp_path_factory.mktemp("whole")
    generate_dataset(target, stream, SPEC, out, progress=False)
    target.drop_cache()
    return out


def test_shards_written_by_two_ranks_read_back_as_one_processs(tmp_path, target, stream, whole):
    for mine in ([0, 2], [3, 1]):  # each "rank" writes its own shards, in any order
        generate_dataset(target, stream, SPEC, tmp_path, progress=False, shards=mine)
    target.drop_cache()
    a, b = DistillSet(whole), DistillSet(tmp_path)
    assert len(a) == len(b) == SPEC.sequences and a.shard_sizes == [6, 6, 6, 4]
    for i in range(len(a)):
        (ta, fa, pa), (tb, fb, pb) = a.get(i), b.get(i)
        assert torch.equal(ta, tb) and torch.equal(fa, fb) and pa == pb
        assert len(ta) == pa + SPEC.gen_len and fa.shape == (len(ta) - 1, target.cfg.feature_size)


def test_npy_shards_of_earlier_runs_read_like_safetensors_ones(tmp_path, whole):
    """A folder of the earlier layout (tokens/features .npy + a JSON index), or one that
    mixes both (a run resumed by a newer hyflash), reads the same sequences."""
    import shutil

    new = DistillSet(whole)
    for s in range(4):
        shutil.copy(shard_path(whole, s), tmp_path)
    for s in (1, 3):  # rewrite these as the earlier layout did
        k = new.numbers.index(s)
        ids = range(new.starts[k], new.starts[k + 1])
        seqs = [new.get(i) for i in ids]
        np.save(tmp_path / f"shard{s:04d}.tokens.npy",
                np.concatenate([t.numpy().astype(np.int32) for t, _, _ in seqs]))
        np.save(tmp_path / f"shard{s:04d}.features.npy",
                np.concatenate([f.numpy().astype(np.float16) for _, f, _ in seqs]))
        offs = np.cumsum([0] + [len(t) for t, _, _ in seqs]).tolist()
        foffs = np.cumsum([0] + [len(f) for _, f, _ in seqs]).tolist()
        (tmp_path / f"shard{s:04d}.json").write_text(json.dumps(
            {"token_offsets": offs, "feature_offsets": foffs,
             "sequences": [{"prompt_len": p, "sampled": False} for _, _, p in seqs]}))
        shard_path(tmp_path, s).unlink()
    mixed = DistillSet(tmp_path)
    assert [s.legacy for s in mixed.shards] == [False, True, False, True]
    for i in range(len(new)):
        for x, y in zip(new.get(i), mixed.get(i), strict=True):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


@pytest.mark.parametrize("batch", [1, 2, 4, 6, 8, 12])
@pytest.mark.parametrize("n_shards", [1, 3, 4, 7, 16])
def test_ranks_split_the_shards_with_no_overlap_and_no_loss(batch, n_shards):
    lanes = lane_count(batch, n_shards)
    assert batch % lanes == 0 and lanes <= n_shards
    for world in (w for w in range(1, lanes + 1) if lanes % w == 0):
        parts = [rank_shards(r, world, n_shards, lanes) for r in range(world)]
        assert sorted(sum(parts, [])) == list(range(n_shards))  # every shard exactly once
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= lanes // world  # at most one shard per lane more


def test_every_world_size_computes_the_same_global_batch_from_its_own_shards(whole):
    data = DistillSet(whole)
    train_ids, _ = loop.split(len(data), loop.TrainSpec(seed=3))
    one = Sampler(data, train_ids, batch=4, seed=3)
    assert one.lanes == 4
    for world in (2, 4):
        ranks = [Sampler(data, train_ids, 4, 3, r, world) for r in range(world)]
        for r, sampler in enumerate(ranks):
            own = set(data.ids_of(rank_shards(r, world, 4, 4)))
            assert all(i in own for step in range(12) for i, _ in sampler.local(step))
        for step in range(12):
            got = [pick for s in ranks for pick in s.local(step)]
            want = one.local(step)
            assert [i for i, _ in got] == [i for i, _ in want]
            assert [g.integers(1 << 30) for _, g in got] == [g.integers(1 << 30) for _, g in want]
    # within an epoch a lane gives each of its training sequences once
    lane0 = [i for step in range(len(one.pool[0])) for i, _ in one.lane(0, step)]
    assert sorted(lane0) == sorted(one.pool[0].tolist())


def test_a_rank_reads_only_its_own_shards(whole):
    data = DistillSet(whole).keep([0, 2])
    assert data.local_ids() == list(range(0, 6)) + list(range(12, 18))
    data.get(13)
    with pytest.raises(IndexError, match="sequence 7 is in shard 1, which this reader does not"):
        data.get(7)


def test_features_recomputed_in_the_step_equal_the_cached_ones(target, whole):
    data = DistillSet(whole)
    target.drop_cache()
    picks = [(i, np.random.default_rng(i)) for i in (0, 7, 20)]
    tokens, cached, _, _ = loop.make_batch(data, picks, 4, 4)
    fresh = feats_mod.target_features(target, tokens)
    for r, (i, _) in enumerate(picks):
        n = len(data.get(i)[0]) - 1
        torch.testing.assert_close(fresh[r, :n], cached[r, :n], atol=2e-3, rtol=1e-2)  # fp16


@pytest.mark.parametrize("features,sequences,long_prompt,expect", [
    (3 * 576, 4096, (256, 1152), False),   # SmolLM2-135M, the 4096-sequence run: 7.7 GiB
    (3 * 4096, 2048, (256, 1920), True),   # an 8B target, the defaults: 38.1 GiB
    (3 * 4096, 256, (256, 1920), False),   # the same target, a small run: 4.8 GiB
])
def test_auto_recomputes_features_when_caching_them_would_exceed_the_limit(
        features, sequences, long_prompt, expect):
    spec = DataSpec(sequences=sequences, long_prompt=long_prompt)
    recompute, why = feats_mod.choose("auto", spec, features)
    assert recompute == expect
    assert (feats_mod.cache_estimate(spec, features) > feats_mod.CACHE_LIMIT) == expect
    assert ("recomputed" in why) == expect and "B/token" in why
    assert feats_mod.choose("cache", spec, features)[0] is False
    assert feats_mod.choose("recompute", spec, features)[0] is True


def test_the_data_key_is_unchanged_unless_a_new_setting_differs():
    """Folders written before engines and recomputed features keep their names (the
    SmolLM2 data set in the work folder is found again); other settings get new ones."""
    spec = DataSpec()
    blob = json.dumps({"target": "t", "corpus": "c", **asdict(spec)}, sort_keys=True)
    assert spec.key("t", "c") == hashlib.sha1(blob.encode()).hexdigest()[:12]
    keys = {spec.key("t", "c"), spec.key("t", "c", {"engine": "vllm"}),
            spec.key("t", "c", {"features": "recompute"}), DataSpec(shard=64).key("t", "c")}
    assert len(keys) == 4


def test_training_on_tokens_only_data_without_the_target_is_one_line(tmp_path, target, stream):
    generate_dataset(target, stream, SPEC, tmp_path, progress=False, features=False)
    target.drop_cache()
    data = DistillSet(tmp_path)
    assert not data.has_features and data.get(0, features=False)[1] is None
    torch.manual_seed(0)
    d = Drafter.for_target(target, "hyflash", num_layers=1, num_heads=4, block_size=4, window=8)
    with pytest.raises(HyflashError, match="no cached features .* --features recompute"):
        loop.train(d, data, loop.TrainSpec(steps=2, batch=2, anchors=2), tmp_path / "w",
                   progress=False)


def test_bad_data_and_launches_are_one_line(tmp_path, whole):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "shard0000.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(HyflashError, match="shard0000.safetensors is damaged .* delete it"):
        DistillSet(bad)
    with pytest.raises(HyflashError, match="no generated data in"):
        DistillSet(tmp_path)
    with pytest.raises(HyflashError, match=r"3 processes cannot share 4 data lanes evenly .* "
                                           r"run 1, 2, 4 process\(es\)"):
        check_world(3, 8, 4)
    from hyflash.train import checkpoints

    torch.save({"step": 3, "drafter": {}, "opt": {}}, tmp_path / "checkpoint.pt")
    with pytest.raises(HyflashError, match="written by an earlier hyflash .* delete the file"):
        checkpoints.read_meta(tmp_path)
