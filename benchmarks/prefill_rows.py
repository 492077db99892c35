"""Prefill of a 1018-token random prompt through the lean target of two bundles, side by
side: one exported before the graph took logits_rows (every row's logits) and one after
(the engine asks for the last row). Medians of interleaved rounds (the first dropped),
2 threads.

    python benchmarks/prefill_rows.py OLD_BUNDLE NEW_BUNDLE
"""
import sys
import time

import numpy as np
import torch

from hyflash.runtime.onnx_backend import load_onnx_pair

bundles = sys.argv[1:]
targets = {b: load_onnx_pair(b, threads=2)[1] for b in bundles}
ids = torch.from_numpy(np.random.default_rng(0).integers(0, 49152, 1018))
res = {b: [] for b in bundles}
first = {}
for _ in range(6):
    for b, t in targets.items():
        t.rollback(0)
        t0 = time.perf_counter()
        logits, _ = t.forward(ids, 0, logits_rows=1)
        res[b].append(time.perf_counter() - t0)
        first[b] = int(logits[-1].argmax())
for b in bundles:
    ms = [round(x * 1000) for x in res[b]]
    print(f"{b}: takes logits_rows {getattr(targets[b], 'takes_rows', False)}, median "
          f"{np.median(res[b][1:]) * 1000:.0f} ms (rounds {ms}), first token {first[b]}")
