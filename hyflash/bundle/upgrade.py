"""Readers for older manifest formats: each turns an old manifest into the current
layout, in memory, so every consumer reads one format. Add one per format bump."""

from __future__ import annotations

from hyflash.bundle.fields import ManifestError, Obj


def upgrade_v1(d: dict) -> dict:
    """A format 1 manifest in the format 2 layout, in memory. Format 1 stored block size,
    window, tap layers, max context and the KV sizes twice and had no hash: the copies must
    agree with the configs, or the manifest was edited."""
    o = Obj(d, "")
    tcfg = o.obj("target").obj("config").d
    drafter = o.obj("drafter")
    dcfg = drafter.obj("config").d
    kv = o.obj("kv_cache")
    copies = (("tap_layers", o, tcfg, "tap_layers", "target.config"),
              ("max_context", o, tcfg, "max_seq_len", "target.config"),
              ("block_size", o, dcfg, "block_size", "drafter.config"),
              ("window", o, dcfg, "window", "drafter.config"),
              ("layers", kv, tcfg, "num_hidden_layers", "target.config"),
              ("kv_heads", kv, tcfg, "num_key_value_heads", "target.config"),
              ("head_dim", kv, tcfg, "head_dim", "target.config"))
    for key, obj, cfg, cfg_key, cfg_path in copies:
        value = obj.take(key)
        if cfg.get(cfg_key) != value:
            raise ManifestError(obj.at(key), f"is {value} but {cfg_path}.{cfg_key} is "
                                             f"{cfg.get(cfg_key)}: one of the two was edited")
    state = []
    for s, p in o.items("state"):
        entry = Obj(s, p)
        state.append({k: entry.take(k) for k in ("name", "input", "output", "shape", "dtype")})
    q = o.obj("quantization").d
    graphs = {role: {k: v for k, v in Obj(g, f"quantization.{role}").d.items() if k != "recipe"}
              for role, g in q.items() if role != "recipe"}
    return {
        "format_version": 1, "hyflash_version": o.take("hyflash_version"),
        "backend": o.take("backend"), "target": o.take("target"),
        "drafter": {**drafter.d, "window_cache": d.get("window_cache", "features"),
                    "state": state},
        "kv_cache": {"form": "past_present", "dtype": kv.take("dtype"),
                     "past_inputs": "past_key_values.{layer}.{kind}",
                     "present_outputs": "present.{layer}.{kind}"},
        "quantization": {"recipe": q.get("recipe"), "graphs": graphs},
        "tokenizer": o.take("tokenizer"), "models": o.take("models"), "files": o.take("files"),
    }
