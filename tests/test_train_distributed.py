"""`hyflash train` under torchrun on this CPU (gloo, two processes): it trains the drafter
one process trains on the same global batch, a run whose rank is killed mid-run resumes,
and a checkpoint resumes at another world size, with DDP and with FSDP2 (features
recomputed by the frozen target, its layers sharded too).

Tolerance: two processes average two half-batch gradients where one process takes one
whole-batch gradient: the same sums in another order, so losses and weights agree to
float32 rounding, which AdamW (lr 0.05 here) amplifies a little over 8 steps. Measured:
loss curves within 2.4e-7, weights within 2.0e-6 (DDP and FSDP2 alike); the bounds below
leave a 25-40x margin, and training moves the weights by more than 1e-2.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_llama
from safetensors.torch import load_file

import hyflash
import hyflash.train.loop as loop
from hyflash.cli import main
from hyflash.train.shards import DistillSet

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with gloo")

ROOT = Path(hyflash.__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("train_worker.py")
LOSS_TOL = 1e-5
WEIGHT_TOL = 5e-5
MOVED = 1e-2  # training moves some weight at least this much (so the checks can fail)
STEPS = 8
COMMON = ["--layers", "1", "--heads", "4", "--block-size", "4", "--window", "8",
          "--sequences", "32", "--gen-len", "16", "--data-batch", "8", "--shard-size", "8",
          "--steps", str(STEPS), "--batch", "4", "--anchors", "4", "--lr", "0.05",
          "--checkpoint-every", "2", "--threads", "1", "--quiet", "--keep-work"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    target = save_tiny_llama(root / "target")
    corpus = root / "words.txt"
    g = torch.Generator().manual_seed(1)
    corpus.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, 46, (3000,), generator=g)))
    return root, target, corpus


def argv(setup, name: str, *extra) -> list[str]:
    root, target, corpus = setup
    return ["train", "--target", str(target), "--data", str(corpus), "--out",
            str(root / name), *COMMON, *extra]


def torchrun(n: int, args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(n), str(WORKER), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
        capture_output=True, text=True, timeout=300)


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def run_dir(work: Path) -> Path:
    (run,) = work.glob("data-*/train-hyflash*")
    return run


def losses(work: Path) -> list[float]:
    lines = (run_dir(work) / "log.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    return [s["loss"] for s in steps]


def assert_same_training(a: Path, b: Path):
    """Drafters a and b (and their loss curves) agree within the stated tolerances."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=WEIGHT_TOL, rtol=0, msg=k)
    la, lb = losses(Path(f"{a}.work")), losses(Path(f"{b}.work"))
    assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < LOSS_TOL, (la, lb)


@pytest.fixture(scope="module")
def one(setup):
    """One process, straight through: the reference."""
    assert main(argv(setup, "one")) == 0
    return setup[0] / "one"


@pytest.fixture(scope="module")
def killed(setup, one):
    """Two DDP processes; rank 1 is SIGKILLed as it starts step 5 (checkpoint at 4). The
    work folder is copied for the resume on one process."""
    root = setup[0]
    opened = root / "opened"
    opened.mkdir()
    r = torchrun(2, argv(setup, "two"), HYFLASH_TEST_KILL="1:4", HYFLASH_TEST_OPENED=str(opened))
    assert r.returncode != 0 and not (root / "two").exists(), r.stderr[-3000:]
    shutil.copytree(root / "two.work", root / "two-one.work")
    return root / "two", opened


def test_a_killed_rank_resumes_and_two_processes_train_what_one_does(setup, one, killed):
    out, opened = killed
    meta = torch.load(run_dir(Path(f"{out}.work")) / "checkpoint.pt", weights_only=False)
    assert meta["step"] == 4 and meta["dcp"] == "checkpoint-000004"
    ckpt = run_dir(Path(f"{out}.work")) / "checkpoint-000004"
    assert (ckpt / "__0_0.distcp").stat().st_size > 0
    assert (ckpt / "__1_0.distcp").stat().st_size == 0  # DDP: rank 0 alone writes tensors
    r = torchrun(2, argv(setup, "two"), HYFLASH_TEST_OPENED=str(opened))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count(f"wrote {out}") == 1  # rank 0 alone reports and writes
    assert json.loads((out / "config.json").read_text())["training"]["world_size"] == 2
    assert_same_training(out, one)
    # each rank read its own shards only, and together all of them
    mine = [set((opened / f"rank{r}.txt").read_text().split()) for r in (0, 1)]
    assert mine[0] & mine[1] == set()
    assert mine[0] | mine[1] == {f"shard{s:04d}.safetensors" for s in range(4)}
    # the two ranks generated the data one process generated
    a, b = (DistillSet(next(Path(f"{x}.work").glob("data-*"))) for x in (out, one))
    for i in range(len(a)):
        for x, y in zip(a.get(i), b.get(i), strict=True):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_training_moves_the_weights_far_beyond_the_tolerance(setup, one):
    target = setup[1]
    from hyflash.models.drafter import Drafter
    from hyflash.models.target import Target

    torch.manual_seed(0)
    init = Drafter.for_target(Target.from_pretrained(target), "hyflash", num_layers=1,
                              num_heads=4, block_size=4, window=8).trainable_state()
    trained = weights(one)
    assert max(float((trained[k] - init[k]).abs().max()) for k in trained) > MOVED


def test_a_checkpoint_of_two_processes_resumes_in_one(setup, one, killed):
    root = setup[0]
    assert main(argv(setup, "two-one")) == 0
    assert json.loads((root / "two-one" / "config.json").read_text())["training"][
        "world_size"] == 1
    assert_same_training(root / "two-one", one)


def test_fsdp_resumes_a_one_process_checkpoint_with_recomputed_features(setup, monkeypatch):
    root = setup[0]
    assert main(argv(setup, "rc-one", "--features", "recompute")) == 0
    data = next((root / "rc-one.work").glob("data-*"))
    assert not DistillSet(data).has_features  # tokens only on disk

    real = loop.lr_at

    def stop_at_4(step, spec):
        if step == 4:
            raise KeyboardInterrupt
        return real(step, spec)

    monkeypatch.setattr(loop, "lr_at", stop_at_4)
    assert main(argv(setup, "rc-fsdp", "--features", "recompute")) == 130  # interrupted
    monkeypatch.setattr(loop, "lr_at", real)
    r = torchrun(2, argv(setup, "rc-fsdp", "--features", "recompute", "--parallel", "fsdp"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_training(root / "rc-fsdp", root / "rc-one")
    ckpt = run_dir(root / "rc-fsdp.work") / f"checkpoint-{STEPS:06d}"
    assert all((ckpt / f"__{r}_0.distcp").stat().st_size > 0 for r in (0, 1))  # sharded


@pytest.mark.parametrize("env,message", [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' in the environment is not a whole number"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK/LOCAL_RANK are missing"),
])
def test_a_broken_torchrun_environment_is_one_line(setup, monkeypatch, capsys, env, message):
    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(argv(setup, "bad")) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_readme_memory_per_gpu_is_what_train_memory_computes():
    """The 8B recipe's figures come from hyflash.train.train_memory, not by hand."""
    from hyflash.budget.shapes import DrafterShape
    from hyflash.budget.sources import resolve
    from hyflash.models.target import default_tap_layers
    from hyflash.train.train_memory import gib, training_memory

    t = resolve(str(Path(__file__).parent / "data" / "llama-3.1-8b" / "config.json")).target
    d = DrafterShape.default_for(t, "hyflash")
    assert round(t.params / 1e9, 2) == 8.03 and round(d.params / 1e6) == 537
    readme = (ROOT / "README.md").read_text()
    row = {}
    for recompute in (False, True):
        row[recompute] = [gib(sum(x.bytes for x in training_memory(
            t, d, 8, parallel, recompute, 8, 16, 2048, default_tap_layers(t.layers))))
            for parallel in ("ddp", "fsdp")]
    assert f"| features cached | {row[False][0]} | {row[False][1]} |" in readme
    assert f"recomputed (what `auto` picks for this target) | {row[True][0]} | " \
           f"{row[True][1]} |" in readme


def test_train_memory_bad_input_is_one_line(capsys):
    from hyflash.train.train_memory import main as memory_main

    config = str(Path(__file__).parent / "data" / "llama-3.1-8b" / "config.json")
    with pytest.raises(SystemExit) as e:
        memory_main([config, "--world", "3", "--batch", "8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--batch 8 does not split over 3 GPUs" in err
    assert err.count("\n") == 1


@pytest.fixture(scope="module")
def deep(setup):
    """setup with a 4-layer target, whose last tap (layer 2) has a layer above it: the KL
    term's teacher runs that layer (FSDP-sharded in the fsdp case)."""
    root, _, corpus = setup
    return root, save_tiny_llama(root / "target4", layers=4), corpus


@pytest.mark.parametrize("extra", [(), ("--features", "recompute", "--parallel", "fsdp")],
                         ids=["ddp", "fsdp-recompute"])
def test_the_kl_term_under_two_processes_trains_what_one_process_does(deep, extra):
    from hyflash.models.target import Target

    assert Target.from_pretrained(deep[1]).cfg.tap_layers == (1, 2)
    root = deep[0]
    name = "kl-" + ("fsdp" if extra else "ddp")
    assert main(argv(deep, f"{name}-one", "--kl", "1", *extra[:2])) == 0
    r = torchrun(2, argv(deep, f"{name}-two", "--kl", "1", *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_training(root / f"{name}-two", root / f"{name}-one")
