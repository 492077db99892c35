"""What a saved Core ML package declares, read from its spec (any OS: no model is loaded
or compiled, so this runs on Linux too): inputs, outputs and states with their shapes and
dtypes, the enumerated token counts, the ML Program's ops and the metadata hyflash wrote.

The Core ML export records the manifest's I/O contracts from it (the contract of the file
as written, as the ONNX export reads its graphs), the runtime checks a package against
the manifest with it before loading, and the tests compare it with the manifest. Shapes
come from the ML Program's typed function (the description leaves the output shapes of a
flexible model empty); a dim that varies (the enumerated token count) is recorded under
the manifest's symbolic name.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hyflash.bundle import REEXPORT
from hyflash.bundle.records import ModelContract, TensorSpec
from hyflash.errors import HyflashError
from hyflash.extras import require_coreml_extra

SEQ = "sequence_length"  # the symbolic name of the token-count dim (as in the other backends)
DTYPES = {"FLOAT16": "float16", "FLOAT32": "float32", "INT32": "int32", "INT64": "int64",
          "BOOL": "bool", "INT8": "int8", "UINT8": "uint8"}
META = "hyflash."  # prefix of hyflash's user-defined metadata keys


@dataclass(frozen=True)
class PackageIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    states: tuple[TensorSpec, ...]
    token_counts: tuple[int, ...]  # the enumerated sizes of the dynamic dim; () if fixed
    spec_version: int  # Core ML specification version: 8 = iOS 17, 9 = iOS 18
    ops: Counter  # op types of the ML Program's main function
    weight_dtypes: Counter  # dtype of each constexpr op's stored data (int8, int4, ...)
    metadata: dict[str, str]  # hyflash's user-defined metadata, prefix removed
    author: str
    version: str
    descriptions: dict[str, str]  # input / output / state name -> its description

    def contract(self, role: str, file: str, rows: int | None) -> ModelContract:
        return ModelContract(role, file, self.inputs, self.outputs, rows)


def load_spec(path: Path):
    """The package's protobuf spec, or one line saying the package is damaged."""
    ct = import_coremltools("reading a Core ML package")
    with quiet():
        try:
            return ct.utils.load_spec(str(path))
        except Exception as e:  # protobuf / file errors
            raise HyflashError(f"cannot read the Core ML package {path} ({type(e).__name__}: "
                               f"{str(e).strip()[:120]}): it is damaged; {REEXPORT}") from e


@contextmanager
def quiet():
    """coremltools logs a warning per native library it cannot load (on Linux: all of
    them, since only macOS predicts; reading and converting need none), per torch version
    it was not tested with, and per renamed input: none of it is the user's business."""
    loggers = [logging.getLogger(n) for n in ("coremltools", "torchao")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def import_coremltools(what: str):
    """coremltools, imported quietly, or one line naming the extra to install."""
    require_coreml_extra(what)
    with quiet():
        import coremltools

    return coremltools


def read_package(path: Path) -> PackageIO:
    spec = load_spec(path)
    if spec.WhichOneof("Type") != "mlProgram":
        raise HyflashError(f"{path} is not a Core ML ML Program: {REEXPORT}")
    fn = spec.mlProgram.functions["main"]
    block = fn.block_specializations[fn.opset]
    types = {v.name: v.type for v in fn.inputs}
    types.update({o.name: o.type for op in block.operations for o in op.outputs})
    d = spec.description

    def tensor(name: str) -> TensorSpec:
        t = types[name].tensorType if types[name].HasField("tensorType") else \
            types[name].stateType.wrappedType.tensorType
        shape = tuple(dim.constant.size if dim.HasField("constant") else SEQ
                      for dim in t.dimensions)
        return TensorSpec(name, shape, dtype_name(t.dataType))

    counts: set[int] = set()
    for f in d.input:
        shapes = [tuple(s.shape) for s in f.type.multiArrayType.enumeratedShapes.shapes]
        for axis in range(len(shapes[0]) if shapes else 0):
            sizes = {s[axis] for s in shapes}
            if len(sizes) > 1:
                counts |= sizes
    meta = d.metadata
    return PackageIO(
        inputs=tuple(tensor(f.name) for f in d.input),
        outputs=tuple(tensor(f.name) for f in d.output),
        states=tuple(tensor(f.name) for f in d.state),
        token_counts=tuple(sorted(counts)), spec_version=spec.specificationVersion,
        ops=Counter(op.type for op in block.operations),
        weight_dtypes=Counter(stored_dtype(op) for op in block.operations
                              if op.type.startswith("constexpr_")),
        metadata={k.removeprefix(META): v for k, v in meta.userDefined.items()
                  if k.startswith(META)},
        author=meta.author, version=meta.versionString,
        descriptions={f.name: f.shortDescription for f in (*d.input, *d.output, *d.state)})


def dtype_name(value: int) -> str:
    from coremltools.proto import MIL_pb2

    name = MIL_pb2.DataType.Name(value)
    return DTYPES.get(name, name.lower())


def stored_dtype(op) -> str:
    """The dtype a constexpr op stores its weight in: iOS 18's blockwise ops take it as the
    ``data`` input, iOS 16/17's ``constexpr_affine_dequantize`` as an attribute."""
    value = (op.inputs["data"].arguments[0].value if "data" in op.inputs
             else op.attributes["quantized_data"])
    return dtype_name(value.type.tensorType.dataType)
