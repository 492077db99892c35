"""The op-level facts of a graph that tests/test_coreml.py compares between the ONNX and
the Core ML conversion of the same torch program: I/O (names, shapes, float / int), the
count of matrix products, the elements of each constant matrix they multiply, softmaxes
and KV scatters. Read from the saved files (onnx.load, coremltools' spec): no runtime."""

import math
from collections import Counter


def onnx_structure(path):
    """(inputs, outputs as (name, shape, dtype)), matrix products, elements of each constant
    matrix they multiply (the last two dims: coremltools broadcasts the rotate-half matrix
    per head), softmaxes, KV scatters; dynamic dims as None."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    dims = {i.name: tuple(i.dims) for i in g.initializer}
    dims.update({n.output[0]: tuple(a.t.dims) for n in g.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value"})
    types = {1: "float", 7: "int", 10: "float"}

    def io(vs):
        return [(v.name.replace(".", "_"), tuple(d.dim_value or None
                                                 for d in v.type.tensor_type.shape.dim),
                 types[v.type.tensor_type.elem_type]) for v in vs]

    products = [n for n in g.node if n.op_type in ("MatMul", "Gemm")]
    count = Counter(n.op_type for n in g.node)
    return (io(g.input), io(g.output), len(products),
            sorted(math.prod(dims[i][-2:]) for n in products for i in n.input[:2]
                   if len(dims.get(i, ())) >= 2), count["Softmax"], count["ScatterND"])


def coreml_structure(path):
    """The same facts of a Core ML package (weights: const or constexpr-dequantized)."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(path))
    fn = spec.mlProgram.functions["main"]
    ops = fn.block_specializations[fn.opset].operations
    made_by = {o.name: op.type for op in ops for o in op.outputs}
    dims = {o.name: tuple(d.constant.size if d.HasField("constant") else None
                          for d in o.type.tensorType.dimensions) for op in ops for o in op.outputs}
    dims.update({v.name: tuple(d.constant.size if d.HasField("constant") else None
                               for d in v.type.tensorType.dimensions) for v in fn.inputs})

    def io(features):
        kind = ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name
        return [(f.name, dims[f.name], "float" if "FLOAT" in kind(f.type.multiArrayType.dataType)
                 else "int") for f in features]

    products = [op for op in ops if op.type in ("linear", "matmul")]
    count = Counter(op.type for op in ops)
    weights = sorted(math.prod(dims[a.name][-2:]) for op in products
                     for key in ("x", "y", "weight")
                     if key in op.inputs for a in op.inputs[key].arguments
                     if made_by.get(a.name, "").startswith("const") and len(dims[a.name]) >= 2)
    return (io(spec.description.input), io(spec.description.output), len(products), weights,
            count["softmax"], count["scatter"])
