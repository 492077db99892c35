"""How a drafter folder stores its weights: as trained (float), or in the shipping form that
``pack_rows`` writes, its large matrices as int8 with one float32 scale per output row.

The shipping form exists for drafters committed to a repository (a 3-layer SmolLM2-135M
drafter is 24.8 MiB in float16, 12.5 MiB packed). A row's scale is its largest magnitude over
127, so every weight is within half a step (max |row| / 254) of the float it came from;
``load_drafter`` unpacks to float before anything else sees the weights. Vectors, small
matrices and integer tensors (the draft vocabulary's ids) stay as they are, floats in
float16.
"""

from __future__ import annotations

import torch

from hyflash.errors import HyflashError

PACKED_FORMAT = 2  # config.json's format_version of a folder in the shipping form
SCALE = ".row_scale"  # suffix of a packed matrix's per-row scales
MIN_ELEMENTS = 65536  # smaller matrices stay float16, as do vectors and the 3-D slots


def pack_rows(state: dict[str, torch.Tensor],
              min_elements: int = MIN_ELEMENTS) -> dict[str, torch.Tensor]:
    """{name: tensor} -> the shipping form: 2-D float tensors of at least min_elements as
    int8 ``name`` + float32 ``name.row_scale``, other floats as float16, the rest as is."""
    out = {}
    for k, v in state.items():
        if not v.is_floating_point():
            out[k] = v.contiguous()
        elif v.dim() == 2 and v.numel() >= min_elements:
            w = v.float()
            scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
            out[k] = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
            out[k + SCALE] = scale.contiguous()
        else:
            out[k] = v.half().contiguous()
    return out


def unpack_rows(state: dict[str, torch.Tensor], source, fix: str) -> dict[str, torch.Tensor]:
    """The inverse of ``pack_rows`` (float32 matrices), checked: a scale without its int8
    matrix, or of the wrong length, is a HyflashError naming the tensor. A state without
    scales comes back unchanged."""
    out = dict(state)
    for key in [k for k in state if k.endswith(SCALE)]:
        name, scale = key[: -len(SCALE)], out.pop(key)
        q = out.get(name)
        if q is None or q.dtype != torch.int8 or q.dim() != 2 or \
                tuple(scale.shape) != (q.shape[0],) or not scale.is_floating_point():
            what = "no such tensor" if q is None else f"{q.dtype} {list(q.shape)}"
            raise HyflashError(f"{source}: {key} {list(scale.shape)} scales no int8 matrix "
                               f"of as many rows ({name}: {what}): {fix}")
        out[name] = q.float() * scale.float()[:, None]
    stray = [k for k, v in out.items() if v.dtype == torch.int8]
    if stray:
        raise HyflashError(f"{source}: int8 tensor {stray[0]} has no {SCALE}: {fix}")
    return out
