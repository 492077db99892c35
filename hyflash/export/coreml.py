"""Convert the target and the drafter to Core ML ML Programs (.mlpackage), coremltools 9.
(Imports torch and coremltools lazily: `hyflash export --help` reads RECIPES.)

Each package is ``ct.convert`` of a ``torch.export`` program of the one model definition
(``coreml_modules``; ``run_decompositions`` first, the core ATen ops coremltools maps),
an ML Program with float16 compute precision (what the Neural Engine computes in),
converted with ``skip_model_load=True``: on Linux coremltools converts, quantizes and
saves, but only macOS compiles and predicts.

- ``target.mlpackage``: ``tokens [1, T]`` int32, ``input_pos [1]`` int32 -> ``logits [1, T,
  V]``, ``features [1, T, F]`` (float16). T is an ``EnumeratedShapes`` of {1 (decode), B
  (verify), the prefill chunk}: Apple recommends enumerated shapes, since with a
  ``RangeDim`` only the default shape runs on the Neural Engine. The KV cache is Core ML
  state (``kv="state"``, iOS 18) or explicit inputs and outputs (``io``, iOS 17).
- ``drafter.mlpackage`` (commit + draft) and ``drafter_commit.mlpackage`` (commit only,
  for a prompt's features): every window and memory tensor an input ``state_X`` and an
  output ``new_state_X`` of fixed shape, float16 (the committed count int32).

Recipes (``coremltools.optimize.coreml.linear_quantize_weights`` on the converted program,
applied to the weight matrices of the model's linears and its embedding, by name: the
rope tables and the glue's constant matrices stay float16; coremltools' default would
quantize every constant above 2048 elements, rope tables included): ``fp16``; ``int8``
(symmetric, one scale per output channel; iOS 17: ``constexpr_affine_dequantize``, iOS 18:
``constexpr_blockwise_shift_scale``); ``int4`` (symmetric, blocks of 32 along the input,
iOS 18 only). Weight-only: a verify row is computed as a decode of that row.

Deployment target: the lowest that holds what was asked (states or int4 need iOS 18, else
iOS 17); asking for iOS 17 with either is refused with one line.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from hyflash.bundle.records import KVCacheSpec
from hyflash.errors import HyflashError

RECIPES = ("fp16", "int8", "int4")
KV_FORMS = ("state", "io")  # the target's KV cache: Core ML states, or explicit I/O
DEPLOYMENTS = ("ios17", "ios18")
FILES = {"target": "target.mlpackage", "drafter_step": "drafter.mlpackage",
         "drafter_commit": "drafter_commit.mlpackage"}
PREFILL_CHUNK = 64  # the largest enumerated token count: a longer prompt goes in chunks
INT4_BLOCK = 32
FORMAT = 1  # user-defined metadata hyflash.format: bump when the packages' I/O change
KV_CACHES = {
    "state": KVCacheSpec(form="state", dtype="float16",
                         past_inputs="target_layers_{layer}_self_attn_kv_cache_{kind}",
                         present_outputs="target_layers_{layer}_self_attn_kv_cache_{kind}"),
    "io": KVCacheSpec(form="static_io", dtype="float16",
                      past_inputs="past_key_values_{layer}_{kind}",
                      present_outputs="present_{layer}_{kind}"),
}
NEEDS_IOS18 = {"state": "the KV cache as Core ML state (--coreml-kv state, the default)",
               "int4": "int4 weights in blocks (--quant int4)"}


def check_options(quant: str, kv: str, deployment: str | None = None) -> str:
    """-> the deployment target (ios17 / ios18) for the recipe and KV form, or one line."""
    if quant not in RECIPES:
        why = (" (fp32: the Neural Engine computes in float16; fp16 is the unquantized "
               "recipe)") if quant == "fp32" else ""
        raise HyflashError(f"unknown Core ML quantization recipe {quant!r}{why}: choose one "
                           f"of {', '.join(RECIPES)}")
    if kv not in KV_FORMS:
        raise HyflashError(f"unknown Core ML KV cache form {kv!r}: choose state or io")
    needs = [NEEDS_IOS18[k] for k in (kv, quant) if k in NEEDS_IOS18]
    if deployment is None:
        return "ios18" if needs else "ios17"
    if deployment not in DEPLOYMENTS:
        raise HyflashError(f"unknown Core ML deployment target {deployment!r}: choose ios17 "
                           "or ios18")
    if deployment == "ios17" and needs:
        raise HyflashError(f"{needs[0]} needs iOS 18, not the --coreml-target ios17 asked for: "
                           "pass --coreml-target ios18, or for iOS 17 --coreml-kv io with "
                           "--quant fp16 or int8")
    return deployment


def token_counts(block_size: int, max_seq_len: int) -> tuple[int, ...]:
    """The target's enumerated token counts: decode, verify, prefill chunk."""
    return tuple(sorted({1, block_size, min(PREFILL_CHUNK, max_seq_len)}))


def check_int4_blocks(*models) -> None:
    """int4 quantizes in blocks of 32 inputs; coremltools skips a weight that does not
    divide (with a log line), which would leave it float16 behind the recipe's name."""
    from torch import nn

    for prefix, model in zip(("target", "drafter"), models, strict=True):
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and m.in_features % INT4_BLOCK:
                raise HyflashError(f"--quant int4 quantizes weights in blocks of {INT4_BLOCK} "
                                   f"inputs, and {prefix}.{name} has {m.in_features}: export "
                                   "this model with --quant int8")


# ----------------------------------------------------------------------- convert

def convert(module, args: tuple, dynamic, inputs: list, outputs: list, deployment: str,
            what: str, states: list | None = None):
    """torch.export + ct.convert -> an MLModel (not loaded), or one line naming the op."""
    import torch

    from hyflash.runtime.coreml_spec import import_coremltools, quiet

    ct = import_coremltools("Core ML export")
    try:
        # coremltools draws a progress bar per pass: keep them off the user's terminal
        with quiet(), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            program = torch.export.export(module.eval(), args, dynamic_shapes=dynamic)
            return ct.convert(program.run_decompositions(), inputs=inputs, outputs=outputs,
                              states=states, convert_to="mlprogram",
                              minimum_deployment_target=getattr(ct.target,
                                                                deployment.replace("ios", "iOS")),
                              compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    except HyflashError:
        raise
    except Exception as e:  # torch.export / coremltools errors are pages long
        raise conversion_error(e, what, ct.__version__) from e


def conversion_error(e: Exception, what: str, version: str) -> HyflashError:
    text = str(e).strip()
    op = re.search(r"convert function for op '([^']+)' not implemented|"
                   r"Unsupported fx node \S+, kind (\w+)", text)
    fix = "export this model with --backend onnx or executorch"
    if op:
        return HyflashError(f"Core ML cannot convert the {what}: coremltools {version} has no "
                            f"conversion for the op {op.group(1) or op.group(2)!r}; {fix}")
    first = text.splitlines()[0] if text else type(e).__name__
    return HyflashError(f"Core ML conversion of the {what} failed ({type(e).__name__}: "
                        f"{first[:200]}); {fix}")


def target_program(target, kv: str, counts: tuple[int, ...]) -> tuple:
    """-> (module, example args, dynamic shapes) that ``torch.export`` turns into the
    program the target package is converted from (the tests run the same program)."""
    import torch

    from hyflash.export.coreml_modules import TargetForCoreML

    cfg = target.cfg
    module = TargetForCoreML(target, kv)
    seq = torch.export.Dim("sequence_length", min=1, max=max(counts))
    args = (torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]))  # T=2: 1 would specialise
    if kv == "state":
        return module, args, ({1: seq}, None)
    shape = (1, cfg.num_key_value_heads, cfg.max_seq_len, cfg.head_dim)
    caches = 2 * cfg.num_hidden_layers
    return (module, args + tuple(torch.zeros(shape) for _ in range(caches)),
            ({1: seq}, None, (None,) * caches))


def convert_target(target, kv: str, deployment: str, counts: tuple[int, ...]):
    """The target package: ``TargetForCoreML`` with T enumerated over counts."""
    import numpy as np

    from hyflash.runtime.coreml_spec import import_coremltools

    ct = import_coremltools("Core ML export")
    cfg = target.cfg
    module, args, dynamic = target_program(target, kv, counts)
    shape = (1, cfg.num_key_value_heads, cfg.max_seq_len, cfg.head_dim)
    inputs = [ct.TensorType(name="tokens", dtype=np.int32, shape=ct.EnumeratedShapes(
                  shapes=[[1, c] for c in counts], default=[1, 1])),
              ct.TensorType(name="input_pos", shape=(1,), dtype=np.int32)]
    outputs = [ct.TensorType(name="logits", dtype=np.float16),
               ct.TensorType(name="features", dtype=np.float16)]
    spec = KV_CACHES[kv]
    past, present = (spec.names(p, cfg.num_hidden_layers)
                     for p in (spec.past_inputs, spec.present_outputs))
    states = None
    if kv == "state":
        states = [ct.StateType(wrapped_type=ct.TensorType(shape=shape, dtype=np.float16),
                               name=f"target.layers.{i}.self_attn.kv_cache.{kind}")
                  for i in range(cfg.num_hidden_layers) for kind in ("key", "value")]
    else:
        inputs += [ct.TensorType(name=n, shape=shape, dtype=np.float16) for n in past]
        outputs += [ct.TensorType(name=n, dtype=np.float16) for n in present]
    return convert(module, args, dynamic, inputs, outputs, deployment, "target", states)


def convert_drafter(drafter, deployment: str, commit_rows: int) -> tuple:
    """The drafter's step package (``DrafterStep``) and commit package (``DrafterCommit``)."""
    import numpy as np
    import torch

    from hyflash.export.coreml_modules import safe_norms
    from hyflash.export.onnx import DrafterCommit
    from hyflash.models.drafter import DrafterStep
    from hyflash.runtime.coreml_spec import import_coremltools

    ct = import_coremltools("Core ML export")
    drafter = safe_norms(drafter)  # float16 compute (the export's own copy of the drafter)
    cfg = drafter.cfg
    state = drafter.init_state()

    def io_type(name, t):
        dtype = np.int32 if t.dtype == torch.long else np.float16
        return ct.TensorType(name=name, shape=tuple(t.shape), dtype=dtype)

    s_in = [io_type(state_input(k), v) for k, v in state.items()]
    s_out = [ct.TensorType(name=state_output(k), dtype=io_type(k, v).dtype)
             for k, v in state.items()]
    n_valid = torch.tensor([1])
    feats = torch.zeros(cfg.commit_size, cfg.feature_size)
    step = convert(DrafterStep(drafter), (torch.tensor([0]), feats, n_valid, *state.values()),
                   None, [io_type("anchor", n_valid), io_type("features", feats),
                          io_type("n_valid", n_valid), *s_in],
                   [ct.TensorType(name="logits", dtype=np.float16), *s_out], deployment,
                   "drafter")
    rows = torch.zeros(commit_rows, cfg.feature_size)
    commit = convert(DrafterCommit(drafter), (rows, n_valid, *state.values()), None,
                     [io_type("features", rows), io_type("n_valid", n_valid), *s_in], s_out,
                     deployment, "drafter's commit")
    return step, commit


def state_input(name: str) -> str:
    return f"state_{name}"  # Core ML names are identifiers: no dots


def state_output(name: str) -> str:
    return f"new_state_{name}"


# -------------------------------------------------------------------- quantize

def weight_names(ml) -> list[str]:
    """The constants that are weight matrices of the model: its parameters (``p_`` after
    torch.export lifts them) of rank 2, i.e. linear and embedding weights; norms, biases
    and the drafter's memory slots (rank 1 / 3) and buffers (rope tables) stay float16."""
    spec = ml.get_spec()
    fn = spec.mlProgram.functions["main"]
    return [o.name for op in fn.block_specializations[fn.opset].operations if op.type == "const"
            for o in op.outputs
            if o.name.startswith("p_") and len(o.type.tensorType.dimensions) == 2]


def quantize(ml, recipe: str):
    """-> (the quantized MLModel, what the manifest records about it)."""
    from hyflash.runtime.coreml_spec import import_coremltools, quiet

    import_coremltools("Core ML quantization")
    import coremltools.optimize.coreml as cto

    if recipe == "int8":
        config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                             granularity="per_channel", weight_threshold=0)
        weights = "int8 symmetric, one float16 scale per output channel"
    else:
        config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4",
                                             granularity="per_block", block_size=INT4_BLOCK,
                                             weight_threshold=0)
        weights = f"int4 symmetric, blocks of {INT4_BLOCK} inputs, one float16 scale each"
    names = weight_names(ml)
    with quiet(), contextlib.redirect_stderr(io.StringIO()):
        out = cto.linear_quantize_weights(ml, cto.OptimizationConfig(
            op_name_configs={n: config for n in names}))
    return out, {"tool": "coremltools.optimize.coreml.linear_quantize_weights",
                 "weights": weights, "weight_matrices": len(names),
                 "activations": "float16"}


def describe(ml, author: str, version: str, summary: str, metadata: dict[str, str],
             texts: dict[str, str]) -> None:
    """The package's description: author, version, summary, hyflash's user-defined
    metadata (``hyflash.*``) and a line per input, output and state."""
    ml.author, ml.version, ml.short_description = author, version, summary
    ml.user_defined_metadata.update({f"hyflash.{k}": v for k, v in metadata.items()})
    # coremltools has no setter for state descriptions: they live next to the others
    for f in (*ml._spec.description.input, *ml._spec.description.output,
              *ml._spec.description.state):
        f.shortDescription = texts.get(f.name, f.shortDescription)


def save(ml, path: Path) -> None:
    ml.save(str(path))
    # coremltools adds a map from torch.export debug handles to MIL ops for its debugger,
    # outside the package's own Manifest.json: no app reads it (97 KB for the tiny model)
    (path / "executorch_debug_handle_mapping.json").unlink(missing_ok=True)
