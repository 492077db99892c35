"""One ONNX Runtime session of a bundle's graph, opened the way every ONNX backend opens
it (``onnx_backend``'s optimum-form target and drafter, ``onnx_lean``'s in-place target):
on the CPU, intra-op threads that never spin, and the graph's real I/O checked against
the contract the manifest records, so a graph that does not match stops with one line
instead of failing inside ONNX Runtime."""

from __future__ import annotations

from hyflash.bundle import REEXPORT, Bundle
from hyflash.bundle.records import ModelContract, TensorSpec
from hyflash.errors import HyflashError

ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
              "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(bool)": "bool"}


def make_session(bundle: Bundle, role: str, threads: int = 0):
    """An InferenceSession on the CPU for a graph role, checked against its contract;
    threads 0 = ONNX Runtime's default (all cores)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3  # warnings about unused initializers are not the user's
    # shared weights (bundle.shared_weights) are external data: ONNX Runtime memory-maps
    # their file, so sessions share its pages and a Gather touches only the rows it reads
    session = ort.InferenceSession(str(bundle.path(role)), opts,
                                   providers=["CPUExecutionProvider"])
    contract = bundle.contract(role)
    check_io(contract, "input", session.get_inputs(), contract.inputs)
    check_io(contract, "output", session.get_outputs(), contract.outputs)
    return session


def check_io(contract: ModelContract, kind: str, real: list, recorded: tuple[TensorSpec, ...]):
    """The graph's real I/O (ONNX Runtime NodeArgs) has the recorded names, dtypes, ranks
    and fixed dims."""
    def mismatch(what: str) -> HyflashError:
        return HyflashError(f"{contract.file} does not match manifest.json: {what}; the graph "
                            f"was replaced or edited after export: {REEXPORT}")

    args = {a.name: a for a in real}
    for spec in recorded:
        arg = args.get(spec.name)
        if arg is None:
            names = list(args)
            raise mismatch(f"it has no {kind} {spec.name!r} (its {kind}s: "
                           f"{', '.join(names[:4]) or 'none'}{', ...' if names[4:] else ''})")
        dtype = ORT_DTYPES.get(arg.type, arg.type)
        if dtype != spec.dtype:
            raise mismatch(f"{kind} {spec.name!r} is {dtype}, the manifest records {spec.dtype}")
        fixed = [a == b for a, b in zip(arg.shape, spec.shape, strict=False)
                 if isinstance(a, int) and isinstance(b, int)]
        if len(arg.shape) != len(spec.shape) or not all(fixed):
            raise mismatch(f"{kind} {spec.name!r} has shape {arg.shape}, the manifest records "
                           f"{list(spec.shape)}")
    extra = [n for n in args if n not in {s.name for s in recorded}]
    if extra:
        raise mismatch(f"it has {kind} {extra[0]!r}, which the manifest does not record")
