"""Test drafters for the speculative engine, and the references they are checked against.

They implement hyflash.runtime.DrafterBackend without being trained:

- OracleDrafter proposes the target's own greedy continuation (every draft accepted in
  greedy mode, so tau == B);
- WrongDrafter proposes a first token guaranteed to differ from the target's greedy one
  (tau == 1);
- RandomDrafter proposes seeded random logits (partial, unpredictable acceptance);
- BrokenDrafter writes NaN / inf into another drafter's logits;
- Stopwatch wraps a target or drafter and times its calls with its own clock.

The first three also check the engine's side of the contract: ``draft(anchor, pos)`` comes
only after the features of exactly ``x_0 .. x_{pos-1}`` were committed, and they record
every committed feature row so a test can compare them with the target's own features
of the final sequence (only verified features may reach a drafter).

The DrafterBackend contract hands a drafter no tokens but the anchor. The oracle still
knows the committed sequence: tokens between two anchors are its own accepted proposals
(its logits are exactly one-hot, so whatever the engine drafts from them is the
proposal), and the test tells it the prompt.
"""

from __future__ import annotations

import copy
import time

import torch

from hyflash.models.target import Target, TargetConfig

# Tiny models gain nothing from intra-op threads, and on a busy machine an oversubscribed
# thread pool makes each op hundreds of times slower.
torch.set_num_threads(1)

ONE_HOT_OFF = -1e4  # logit of every token but the proposed one: exp underflows to 0


def tiny_target(vocab=101, hidden=32, layers=3, max_seq_len=32, seed=0,
                dtype=torch.float64) -> Target:
    """A random target. float64 by default so that a verify pass over a block and a
    one-token step cannot disagree on an argmax through rounding (in float32 a near-tie
    could flip; that is arithmetic, not a verification bug)."""
    torch.manual_seed(seed)
    cfg = TargetConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=hidden // 4, max_seq_len=max_seq_len)
    return Target(cfg).cast(dtype).eval()


def uncached(target: Target) -> Target:
    """A copy of target without KV cache: plain causal passes over whole sequences."""
    model = copy.deepcopy(target)
    model.drop_cache()
    return model


@torch.no_grad()
def plain_greedy(model: Target, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy decode, the slow obvious way: a full pass per token."""
    seq = list(prompt)
    for _ in range(n):
        logits, _ = model(torch.tensor([seq]), 0)
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt):]


@torch.no_grad()
def features_of(model: Target, tokens: list[int]) -> torch.Tensor:
    """The target's features [T, F] of a whole sequence, computed in one uncached pass."""
    return model(torch.tensor([tokens]), 0)[1][0].float()


def one_hot_logits(tokens: list[int], vocab: int) -> torch.Tensor:
    logits = torch.full((len(tokens), vocab), ONE_HOT_OFF)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 0.0
    return logits


class ContractDrafter:
    """Records commits and asserts the order of commit and draft calls."""

    def __init__(self, vocab_size: int, feature_size: int, block_size: int):
        self.vocab_size, self.feature_size, self.block_size = vocab_size, feature_size, block_size
        self.reset()

    def reset(self) -> None:
        self.committed: list[torch.Tensor] = []
        self.n_committed = 0

    def commit(self, features: torch.Tensor) -> None:
        assert features.ndim == 2 and features.shape[1] == self.feature_size, features.shape
        self.committed.append(features.clone())
        self.n_committed += features.shape[0]

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        assert self.n_committed == pos, (
            f"draft at {pos} but {self.n_committed} feature rows committed")
        return self.propose(anchor, pos)

    def committed_features(self) -> torch.Tensor:
        return torch.cat(self.committed)

    def propose(self, anchor: int, pos: int) -> torch.Tensor:
        raise NotImplementedError


class OracleDrafter(ContractDrafter):
    """Proposes the target's greedy continuation of the committed sequence."""

    def __init__(self, target: Target, block_size: int, prompt: list[int] = ()):
        self.model = uncached(target)
        self.prompt = list(prompt)
        self.memo: dict[tuple[int, ...], list[int]] = {}  # sequence -> greedy continuation
        cfg = target.cfg
        super().__init__(cfg.vocab_size, cfg.feature_size, block_size)

    def reset(self) -> None:
        super().reset()
        self.seq = list(self.prompt)
        self.proposal: list[int] = []

    def sequence(self, anchor: int, pos: int) -> list[int]:
        """x_0..x_pos: the previous sequence, our accepted proposals, then the anchor."""
        self.seq = (self.seq + self.proposal)[:pos] + [anchor]
        assert len(self.seq) == pos + 1, "the oracle lost track of the sequence"
        return self.seq

    def greedy(self, seq: list[int], n: int) -> list[int]:
        key = tuple(seq)
        if len(self.memo.get(key, ())) < n:
            self.memo[key] = plain_greedy(self.model, seq, n)
        return self.memo[key][:n]

    def propose(self, anchor: int, pos: int) -> torch.Tensor:
        seq = self.sequence(anchor, pos)
        # near the end of the context the engine verifies fewer drafts; pad the rest
        n = min(self.block_size - 1, self.model.cfg.max_seq_len - len(seq))
        self.proposal = self.greedy(seq, n) + [0] * (self.block_size - 1 - n)
        return one_hot_logits(self.proposal, self.vocab_size)


class WrongDrafter(OracleDrafter):
    """First proposal is the target's greedy token + 1 (mod V): never accepted greedily."""

    def propose(self, anchor: int, pos: int) -> torch.Tensor:
        seq = self.sequence(anchor, pos)
        first = (self.greedy(seq, 1)[0] + 1) % self.vocab_size
        self.proposal = [(first + i) % self.vocab_size for i in range(self.block_size - 1)]
        return one_hot_logits(self.proposal, self.vocab_size)


class RandomDrafter(ContractDrafter):
    """Seeded random logits (scale sets how peaked q is); reproducible from reset()."""

    def __init__(self, vocab_size: int, feature_size: int, block_size: int, seed: int = 0,
                 scale: float = 1.0):
        self.seed, self.scale = seed, scale
        super().__init__(vocab_size, feature_size, block_size)

    def reset(self) -> None:
        super().reset()
        self.gen = torch.Generator().manual_seed(self.seed)

    def propose(self, anchor: int, pos: int) -> torch.Tensor:
        return self.scale * torch.randn(self.block_size - 1, self.vocab_size,
                                        generator=self.gen)


class BrokenDrafter:
    """Another drafter whose logits get a non-finite value written into some rows (and
    columns): a drafter that overflowed in fp16, or a buggy graph. Everything else,
    including the recorded commits, is the wrapped drafter's."""

    def __init__(self, inner: ContractDrafter, value: float, rows=slice(None),
                 cols=slice(None)):
        self.inner, self.value, self.rows, self.cols = inner, value, rows, cols

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def reset(self) -> None:
        self.inner.reset()

    def commit(self, features: torch.Tensor) -> None:
        self.inner.commit(features)

    def draft(self, anchor: int, pos: int) -> torch.Tensor:
        logits = self.inner.draft(anchor, pos).clone()
        logits[self.rows, self.cols] = self.value
        return logits


class Stopwatch:
    """Wraps a target or drafter: each call first waits a known time (so that every phase
    is long against timer noise), and the wrapper times its own calls with its own clock,
    per method; prefill (the first forward) apart from verify. It waits by spinning: after
    a 20 ms ``time.sleep`` the core's caches are cold and the engine's own arithmetic of
    the next round (argmax, acceptance) took 0.5-2 ms instead of microseconds (measured),
    which the overhead bound then counted against the engine."""

    SLEEP_S = 0.05

    def __init__(self, inner):
        self.inner = inner
        self.spent: dict[str, float] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def timed(self, method, *args):
        t = time.perf_counter()
        while time.perf_counter() - t < self.SLEEP_S:  # spin, not sleep: see below
            pass
        out = getattr(self.inner, method)(*args)
        if method == "forward" and "prefill" not in self.spent:
            method = "prefill"
        self.spent[method] = self.spent.get(method, 0.0) + time.perf_counter() - t
        return out

    def forward(self, tokens, start_pos, logits_rows=None):
        return self.timed("forward", tokens, start_pos, logits_rows)

    def rollback(self, pos):
        return self.timed("rollback", pos)

    def reset(self):
        return self.timed("reset")

    def commit(self, features):
        return self.timed("commit", features)

    def draft(self, anchor, pos):
        return self.timed("draft", anchor, pos)
