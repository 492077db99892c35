"""Store once what several graphs of a bundle hold: the tied token embedding.

The target graph and the drafter's step graph each carry the target's token embedding
(the drafter embeds its anchor with it; a full-vocabulary drafter also scores with it as
its LM head). For SmolLM2 that is 49152 x 576 fp32 = 113 MB twice on disk, and twice in
RAM once both sessions load it. Here every large initializer that appears, byte for
byte, in more than one graph is moved into one raw file and referenced from each graph
as ONNX external data under one name; the manifest records it (``SharedWeight``).
External data is standard ONNX: any client runs each graph as it is, and ONNX Runtime
memory-maps the file, so two sessions share its pages, and a Gather touches only the
embedding rows it reads (0 kB resident after loading the SmolLM2 pair).

Handing both sessions one buffer instead (``SessionOptions.add_initializer``) was
measured and dropped: ONNX Runtime prepacks MatMul weights into per-session copies
anyway, and a buffer it does not own stays resident next to them (peak RSS up to
~250 MiB higher on SmolLM2 fp32, ``benchmarks/lean_drafter.py``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from hyflash.bundle.records import SharedWeight

MIN_BYTES = 4096  # smaller initializers are not worth a file
DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 2: "uint8", 3: "int8"}  # ONNX codes


def share_weights(folder: Path, files: dict[str, str]) -> dict[str, SharedWeight]:
    """Rewrite the graphs (role -> file in folder) so that initializers two or more of them
    hold byte for byte live once in ``shared/<name>.bin``; -> the manifest's records."""
    import onnx

    models = {role: onnx.load(str(folder / name)) for role, name in files.items()}
    seen: dict[str, list[tuple[str, onnx.TensorProto]]] = {}
    for role, model in models.items():
        for init in model.graph.initializer:
            if init.data_type in DTYPES and len(init.raw_data) >= MIN_BYTES:
                digest = hashlib.sha256(init.raw_data).hexdigest()
                seen.setdefault(digest, []).append((role, init))
    shared, touched = {}, set()
    for users in seen.values():
        roles = sorted({role for role, _ in users})
        if len(roles) < 2:
            continue
        first = users[0][1]
        base = first.name.removeprefix("shared.")  # requantizing a bundle shares again
        name, file = f"shared.{base}", f"shared/{re.sub(r'[^A-Za-z0-9._-]', '_', base)}.bin"
        (folder / "shared").mkdir(exist_ok=True)
        (folder / file).write_bytes(first.raw_data)
        shared[name] = SharedWeight(file, tuple(first.dims), DTYPES[first.data_type],
                                    tuple(roles))
        for role, init in users:
            rename(models[role].graph, init.name, name)
            to_external(init, name, file)
            touched.add(role)
    for role in touched:
        onnx.save_model(models[role], str(folder / files[role]))
    return shared


def rename(graph, old: str, new: str) -> None:
    """Every use of value old in graph (and its subgraphs) now reads new."""
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x == old:
                node.input[i] = new
        for attr in node.attribute:
            if attr.g.node:
                rename(attr.g, old, new)


def to_external(init, name: str, file: str) -> None:
    from onnx.external_data_helper import set_external_data

    init.name = name
    set_external_data(init, location=file, offset=0, length=len(init.raw_data))
    init.ClearField("raw_data")
