"""Which rank reads which shards, and which sequences make up each step's batch.

Two promises at once: every rank streams only its own shards, and the global batch of
step s is the same at every world size (so a run resumed on another number of processes
continues exactly where it stopped, and N processes train the same drafter as one).

The shards are dealt round-robin into L *lanes* (shard k -> lane k mod L); lane j owns
the training sequences of its shards, walks them in a seeded permutation per epoch, and
gives ``batch / L`` sequences to every step, each with its own seeded anchor generator.
L is the largest divisor of ``--batch`` that is at most the number of shards, so it
depends on the data and the batch only; rank r of W owns lanes r*L/W .. (r+1)*L/W - 1
(W must divide L). The lanes partition the shards: every shard belongs to exactly one
rank, and every sequence to exactly one lane.

Sequences are sampled with a per-lane epoch permutation rather than uniformly, so within
an epoch each lane sees every one of its sequences once. When the shards are not a
multiple of L, some lanes hold one shard more: their sequences come round a little less
often, and a rank may hold up to L/W shards more than another.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hyflash.errors import HyflashError

ANCHOR_STREAM = 7_777  # seeds the per-sequence anchor generators apart from the permutations


def lane_count(batch: int, n_shards: int) -> int:
    """Largest divisor of batch that is at most n_shards."""
    return max(k for k in range(1, min(batch, n_shards) + 1) if batch % k == 0)


def check_world(world: int, batch: int, n_shards: int) -> int:
    """-> lanes, or a one-line error when the world size cannot split them evenly."""
    lanes = lane_count(batch, n_shards)
    if lanes % world:
        fits = ", ".join(str(w) for w in range(1, lanes + 1) if lanes % w == 0)
        raise HyflashError(
            f"{world} processes cannot share {lanes} data lanes evenly (the largest divisor "
            f"of --batch {batch} that is at most the {n_shards} data shards): run {fits} "
            "process(es), or change --batch or --shard-size")
    return lanes


def rank_lanes(rank: int, world: int, lanes: int) -> range:
    per = lanes // world
    return range(rank * per, (rank + 1) * per)


def rank_shards(rank: int, world: int, n_shards: int, lanes: int) -> list[int]:
    """Positions of the shards rank reads (and generates): those of its lanes."""
    mine = set(rank_lanes(rank, world, lanes))
    return [k for k in range(n_shards) if k % lanes in mine]


class Sampler:
    """Global batch of a step, as (sequence id, anchor generator) pairs; ``local(step)`` is
    the part of it this rank computes: its lanes', in lane order."""

    def __init__(self, data, train_ids, batch: int, seed: int, rank: int = 0, world: int = 1):
        n_shards = len(data.shard_sizes)
        self.lanes = check_world(world, batch, n_shards)
        self.per_lane = batch // self.lanes
        self.seed = seed
        self.mine = rank_lanes(rank, world, self.lanes)
        train = set(int(i) for i in train_ids)
        self.pool = {}
        for j in self.mine:
            ids = [i for i in data.ids_of(range(j, n_shards, self.lanes)) if i in train]
            if not ids:
                raise HyflashError(f"data lane {j} has no training sequences (its shards are "
                                   "all held out): generate more --sequences")
            self.pool[j] = np.asarray(ids)
        self._perm = lru_cache(maxsize=8)(self._permutation)

    def _permutation(self, lane: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, lane, epoch]).permutation(len(self.pool[lane]))

    def lane(self, lane: int, step: int) -> list[tuple[int, np.random.Generator]]:
        ids, out = self.pool[lane], []
        for k in range(self.per_lane):
            pos = step * self.per_lane + k
            epoch, at = divmod(pos, len(ids))
            rng = np.random.default_rng([self.seed, ANCHOR_STREAM, step, lane, k])
            out.append((int(ids[self._perm(lane, epoch)[at]]), rng))
        return out

    def local(self, step: int) -> list[tuple[int, np.random.Generator]]:
        return [pick for j in self.mine for pick in self.lane(j, step)]
