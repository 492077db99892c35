"""Draft-side memory against context: what each drafter holds while the context grows.

From the drafter's config alone (a drafter on the meta device: no weights read), in fp32,
for both window layouts (per-layer keys/values, fused features). A HyFlash drafter holds
its window and memory state, a fixed size whatever the context; a full-context drafter
holds one window row per context token (its fixed-shape export allocates the maximum,
shown as "allocated"). With no full-context drafter at hand (SmolLM2 before its baseline
is trained) the same-size full-context drafter is sized from the HyFlash one's config.
The target's KV cache (fp32, as the ONNX bundles hold it) is the yardstick.
"""

from __future__ import annotations

import dataclasses

CONTEXTS = (64, 256, 512, 1024, 2048)


def drafter_bytes(cfg, layout: str) -> int:
    import torch

    from hyflash.models.drafter import Drafter

    with torch.device("meta"):  # the state does not depend on the draft vocabulary
        d = Drafter(dataclasses.replace(cfg, draft_vocab=0), torch.nn.Embedding(1, 1),
                    torch.nn.Linear(1, 1))
    d.window_cache = layout
    return d.state_bytes()


def table(drafters: dict[str, str], target_path: str, contexts=CONTEXTS) -> dict:
    from hyflash.models.drafter_folder import read_drafter_config
    from hyflash.models.target import TargetConfig, read_hf_config, resolve_model_folder

    t = TargetConfig.from_hf(read_hf_config(resolve_model_folder(target_path)))
    cfgs = {name: read_drafter_config(path)[1] for name, path in drafters.items()}
    if not any(c.arch == "full" for c in cfgs.values()):
        name, cfg = next(iter(cfgs.items()))
        cfgs[f"full-context, sized like {name}"] = dataclasses.replace(
            cfg, arch="full", window=cfg.max_seq_len, memory="none")
    rows = []
    for name, cfg in cfgs.items():
        for layout in ("kv", "features"):
            fixed = drafter_bytes(cfg, layout)
            if cfg.arch == "full":
                per_token = (fixed - 8) // cfg.window  # the window is all it holds (+ a count)
                held = {n: min(n, cfg.window) * per_token + 8 for n in contexts}
            else:
                held = {n: fixed for n in contexts}
            rows.append({"drafter": name, "arch": cfg.arch, "layout": layout,
                         "bytes": held, "allocated": fixed})
    kv = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 4
    return {"rows": rows, "contexts": list(contexts),
            "target_kv_bytes": {n: n * kv for n in contexts}}
