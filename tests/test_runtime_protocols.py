"""The real backends keep the engine's two protocols (hyflash.runtime.backends), in
signature and in behaviour: TorchTarget and OnnxTarget, TorchDrafter and OnnxDrafter, on
the same trained tiny pair (conftest's `onnx_bundles`: target folder, drafters,
bundles).

Each target is checked against an uncached one-pass reference, each drafter against
itself (commits in any chunking, reset, position checks), and the two drafters against
each other: same commits, same draft tokens."""

import inspect

import pytest
import torch
from onnx_pairs import prompts
from runtime_drafters import uncached

from hyflash.errors import HyflashError
from hyflash.models.target import Target
from hyflash.runtime import DrafterBackend, TargetBackend, TorchTarget
from hyflash.runtime.drafter_backend import TorchDrafter, load_torch_drafter
from hyflash.runtime.onnx_backend import OnnxDrafter, OnnxTarget, load_onnx_pair

METHODS = {TargetBackend: ("forward", "rollback"),
           DrafterBackend: ("reset", "commit", "draft")}
CLASSES = {TargetBackend: (TorchTarget, OnnxTarget), DrafterBackend: (TorchDrafter, OnnxDrafter)}


@pytest.fixture(scope="module")
def backends(onnx_bundles):
    """{"torch": (target, drafter), "onnx": (target, drafter)} of the same trained pair."""
    folder, drafters, bundles = onnx_bundles
    target = Target.from_pretrained(folder)
    _, ort_target, ort_drafter = load_onnx_pair(bundles["hyflash"], threads=1)
    return {"torch": (TorchTarget(target), load_torch_drafter(drafters["hyflash"], target)),
            "onnx": (ort_target, ort_drafter)}


@pytest.fixture(scope="module")
def reference(onnx_bundles):
    return uncached(Target.from_pretrained(onnx_bundles[0]))


@pytest.mark.parametrize("protocol", list(METHODS), ids=lambda p: p.__name__)
def test_real_backends_have_the_protocols_signatures(protocol):
    for cls in CLASSES[protocol]:
        for name in METHODS[protocol]:
            want = list(inspect.signature(getattr(protocol, name)).parameters)
            assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls, name)


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_real_backends_are_instances_with_matching_sizes(backends, kind):
    target, drafter = backends[kind]
    assert isinstance(target, TargetBackend) and isinstance(drafter, DrafterBackend)
    assert not isinstance(drafter, TargetBackend) and not isinstance(target, DrafterBackend)
    assert (drafter.vocab_size, drafter.feature_size) == (target.vocab_size,
                                                         target.feature_size)
    torch_target, torch_drafter = backends["torch"]
    assert (target.max_seq_len, target.eos_token_ids) == (torch_target.max_seq_len,
                                                          torch_target.eos_token_ids)
    assert drafter.block_size == torch_drafter.block_size


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_target_forward_and_rollback_keep_the_contract(backends, reference, kind):
    """Row i of a call at start_pos is the reference's row start_pos+i, over prefill,
    decode, a verify block, and a verify after a rollback that overwrites stale
    positions; float32 out; gaps and rollbacks past the cache are refused."""
    target, _ = backends[kind]
    seq = prompts(1, seed=7, lo=30, hi=31)[0]
    before, after = seq[:25], seq[:23] + [5, 6, 7]  # the sequence before / after rollback
    assert before[23:] != after[23:25]
    for tokens, start, end in [(before, 0, 20), (before, 20, 21), (before, 21, 25),
                               (after, 23, 26)]:
        if tokens is after:
            target.rollback(start)  # positions 23, 24 are stale: this call overwrites them
        logits, features = target.forward(torch.tensor(tokens[start:end]), start)
        assert logits.dtype == features.dtype == torch.float32
        assert logits.shape == (end - start, target.vocab_size)
        assert features.shape == (end - start, target.feature_size)
        with torch.no_grad():
            want = [x[0, start:end].float() for x in reference(torch.tensor([tokens]), 0)]
        torch.testing.assert_close(logits, want[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(features, want[1], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="roll back"):
        target.rollback(27)
    with pytest.raises(ValueError, match="gap"):
        target.forward(torch.tensor([1]), 27)


def draft_after(drafter, features, ends, anchor):
    """reset, commit feature rows 0..ends[-1]-1 in chunks that end at ends, then draft
    from the anchor at position ends[-1]."""
    drafter.reset()
    for a, b in zip([0, *ends[:-1]], ends, strict=True):
        drafter.commit(features[a:b])
    return drafter.draft(anchor, ends[-1])


@pytest.fixture(scope="module")
def context(reference):
    seq = prompts(1, seed=8, lo=60, hi=61)[0]  # more than the window of 16: memory in use
    with torch.no_grad():  # as a target backend returns them
        return seq, reference(torch.tensor([seq]), 0)[1][0].float()


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_drafter_commits_in_any_chunking_reset_and_position_check(backends, context, kind):
    """The protocol lets commit take any N: the draft depends on the committed rows, not
    on how they were split; reset forgets them; a draft at the wrong position is refused."""
    _, drafter = backends[kind]
    seq, features = context
    whole = draft_after(drafter, features, [50], seq[50])
    assert whole.dtype == torch.float32
    assert whole.shape == (drafter.block_size - 1, drafter.vocab_size)
    chunked = draft_after(drafter, features, [1, 18, 19, 35, 36, 50], seq[50])
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    other = draft_after(drafter, features, [30], seq[30])  # reset forgot the 50 rows
    assert not torch.allclose(other, whole)
    torch.testing.assert_close(draft_after(drafter, features, [50], seq[50]), whole)
    with pytest.raises(HyflashError, match="out of step"):
        drafter.draft(seq[49], 49)


def test_torch_and_onnx_drafters_draft_the_same_tokens(backends, context):
    seq, features = context
    for pos in (5, 16, 17, 33, 59):
        drafts = {kind: draft_after(d, features, [pos], seq[pos]).argmax(-1)
                  for kind, (_, d) in backends.items()}
        assert torch.equal(drafts["torch"], drafts["onnx"]), pos
