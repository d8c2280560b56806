"""Run a float16/bfloat16 model on onnxruntime's CPU with its rounding and overflow made real.

onnxruntime's CPU has no float16 kernel for most ops; it inserts Casts to float32 around them and
then removes the float32→float16→float32 pairs between neighbouring such ops, so a chain of them
runs entirely in float32: measured on onnxruntime 1.32, float16 `Mul(a, a)` of 905.2 gives
819387 (float16 overflows to inf) and `Sub` of two float16-cast inputs 905.2 − 904.1 gives 1.1
(in float16: 905 − 904 = 1).  A candidate run that way hides the very faults `locate` looks for.

`emulate_low_precision` rewrites such a model so that every tensor the model stores in float16
(or bfloat16) is rounded to it explicitly — an explicit Cast pair after its producer, which
onnxruntime keeps at every optimisation level (also measured) — while each op computes in
float32, as GPU kernels accumulate in float32.  Tensor names are kept, so intermediates compare
by name.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.precision.locate.reference import infer_types

_LOW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def emulate_low_precision(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 copy of `model` in which every float16/bfloat16 tensor is rounded explicitly."""
    types = infer_types(model)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    g = result.graph
    for init in g.initializer:
        if init.data_type in _LOW:
            init.CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(init).astype("float32"), init.name)
            )
    nodes: list[onnx.NodeProto] = []
    renames: dict[str, str] = {}  # float16 graph inputs: fed as float32, rounded on entry
    for value in g.input:
        low = value.type.tensor_type.elem_type
        if low in _LOW:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
            renames[value.name] = f"{value.name}/graphfix_input"
            nodes += _round(value.name, renames[value.name], low)
    for node in g.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        low_outputs = []
        for k, out in enumerate(copy.output):
            low = types.get(out)
            if node.op_type == "Cast":
                low = next((a.i for a in node.attribute if a.name == "to"), None)
            if out and low in _LOW:
                low_outputs.append((k, out, low))
        for attr in copy.attribute:
            if copy.op_type == "Cast" and attr.name == "to" and attr.i in _LOW:
                attr.i = TensorProto.FLOAT
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _LOW:
                attr.t.CopyFrom(
                    numpy_helper.from_array(
                        numpy_helper.to_array(attr.t).astype("float32"), attr.t.name
                    )
                )
            elif attr.name in ("dtype",) and attr.i in _LOW:
                attr.i = TensorProto.FLOAT
        copy.input[:] = [renames.get(i, i) for i in copy.input]
        nodes.append(copy)
        for k, out, low in low_outputs:
            raw = f"{out}/graphfix_unrounded"
            copy.output[k] = raw
            nodes += _round(raw, out, low)
    del g.node[:]
    g.node.extend(nodes)
    for value in g.output:
        if value.type.tensor_type.elem_type in _LOW:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    del g.value_info[:]
    return result


def _round(source: str, target: str, low: int) -> list[onnx.NodeProto]:
    middle = f"{target}/graphfix_rounded"
    return [
        helper.make_node("Cast", [source], [middle], to=low, name=f"{target}/graphfix_round"),
        helper.make_node(
            "Cast", [middle], [target], to=TensorProto.FLOAT, name=f"{target}/graphfix_widen"
        ),
    ]
