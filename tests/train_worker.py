"""`hyflash train` as a torchrun worker for the tests, with two hooks set by environment:

- HYFLASH_TEST_KILL="RANK:STEP": that rank SIGKILLs itself as it starts step STEP (a
  real crash of one process mid-run: no cleanup, the other ranks blocked in a collective
  until torchrun stops them);
- HYFLASH_TEST_OPENED=DIR: each rank appends the name of every shard whose data it opens
  to DIR/rankR.txt.

Usage: torchrun --standalone --nproc_per_node N tests/train_worker.py train ARGS...
"""

import os
import signal
import sys
from pathlib import Path

import hyflash.train.loop as loop
import hyflash.train.shards as shards
from hyflash.cli import main

RANK = int(os.environ.get("RANK", "0"))

if os.environ.get("HYFLASH_TEST_KILL"):
    kill_rank, kill_step = map(int, os.environ["HYFLASH_TEST_KILL"].split(":"))
    real_lr_at = loop.lr_at

    def lr_at(step, spec):
        if RANK == kill_rank and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_lr_at(step, spec)

    loop.lr_at = lr_at

if os.environ.get("HYFLASH_TEST_OPENED"):
    record = Path(os.environ["HYFLASH_TEST_OPENED"]) / f"rank{RANK}.txt"
    real_open = shards.Shard._open

    def recorded_open(self):
        if self._data is None:
            with record.open("a") as f:
                f.write(self.path.name + "\n")
        return real_open(self)

    shards.Shard._open = recorded_open

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
