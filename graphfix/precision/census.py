"""Count a converted model's compute nodes by the precision they run in (any converter's output).

A compute node does arithmetic on floating-point tensors (`policy.is_compute`: not data movement,
Casts, constants or comparisons); it runs in the type of its first floating-point output, read
from the model's own types and onnx shape inference.  `tensor_core` counts the MatMul, Gemm,
Conv, ConvTranspose, Einsum and plugin nodes among them: the nodes whose precision decides
TensorRT's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from graphfix.precision import policy

_FLOATS = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
}
_TENSOR_CORE = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "GraphfixAttention"}


@dataclass(frozen=True)
class Census:
    compute: int
    float32: int  # compute nodes running in float32 (or float64)
    tensor_core: int
    tensor_core_float32: int
    untyped: int  # compute nodes whose output type is unknown (not counted either way)

    @property
    def low_fraction(self) -> float:
        typed = self.compute - self.untyped
        return (typed - self.float32) / typed if typed else 1.0

    @property
    def tensor_core_low_fraction(self) -> float:
        if not self.tensor_core:
            return 1.0
        return (self.tensor_core - self.tensor_core_float32) / self.tensor_core


def precision_census(model: onnx.ModelProto) -> Census:
    """Compute nodes of `model` (top-level graph) and how many of them run in float32."""
    types = _types(model)
    compute = float32 = tensor_core = tensor_core_float32 = untyped = 0
    for node in model.graph.node:
        if not policy.is_compute(node.op_type):
            continue
        kinds = [types.get(o) for o in node.output if o]
        float_kinds = [k for k in kinds if k in _FLOATS]
        if not float_kinds:
            if all(k is None for k in kinds):
                untyped += 1
                compute += 1
            continue
        compute += 1
        high = _FLOATS[float_kinds[0]] in ("float32", "float64")
        float32 += high
        if node.op_type in _TENSOR_CORE:
            tensor_core += 1
            tensor_core_float32 += high
    return Census(compute, float32, tensor_core, tensor_core_float32, untyped)


def _types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    types: dict[str, int] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for tensor in inferred.graph.initializer:
        types[tensor.name] = tensor.data_type
    for node in inferred.graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to is not None:
                types.setdefault(node.output[0], to)
    return types


def is_float32_model(model: onnx.ModelProto) -> bool:
    """A float32 model: float32 weights or inputs, and no float16/bfloat16 weights or inputs
    (an export in 16 bits that computes a Softmax in float32 is not one)."""
    low = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    types = [t.data_type for t in model.graph.initializer]
    types += [v.type.tensor_type.elem_type for v in model.graph.input]
    return onnx.TensorProto.FLOAT in types and not low & set(types)
