"""graphfix's reference implementation of its plugin ops, for onnxruntime.

`with_reference_ops` returns a copy of a rewritten model in which every graphfix plugin node is
replaced by standard ONNX ops with the same semantics (float32 math whatever the I/O type), so the
rewrite can be validated on any machine.  The tensor names are kept, so outputs compare 1:1.
"""

from __future__ import annotations

import onnx

from graphfix.errors import UnsupportedModelError
from graphfix.graph_index import GraphIndex
from graphfix.plugin_spec import PLUGIN_DOMAIN, SOFTMAX


def _lower_softmax(index: GraphIndex, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    x, y = node.input[0], node.output[0]
    if index.opset < 13:
        rank = index.rank(x)
        if axis not in (-1, None) and (rank is None or axis != rank - 1):
            raise UnsupportedModelError(
                f"{SOFTMAX.op_type} '{node.name}' has axis {axis} in an opset-{index.opset} "
                "model, whose Softmax has different axis semantics; convert the model to opset "
                "13 or newer (onnx.version_converter) to validate it"
            )
    elem = index.elem_type(x) or index.elem_type(y)
    base = node.name or y
    if elem == onnx.TensorProto.FLOAT:
        return [onnx.helper.make_node("Softmax", [x], [y], name=f"{base}/ref", axis=axis)]
    x32, y32 = f"{base}/ref_x32", f"{base}/ref_y32"
    nodes = [
        onnx.helper.make_node("Cast", [x], [x32], name=f"{base}/ref_in", to=onnx.TensorProto.FLOAT),
        onnx.helper.make_node("Softmax", [x32], [y32], name=f"{base}/ref", axis=axis),
    ]
    if elem is not None:
        nodes.append(onnx.helper.make_node("Cast", [y32], [y], name=f"{base}/ref_out", to=elem))
    elif index.opset >= 15:
        nodes.append(onnx.helper.make_node("CastLike", [y32, x], [y], name=f"{base}/ref_out"))
    else:
        raise UnsupportedModelError(
            f"cannot tell the element type of '{x}' feeding {SOFTMAX.op_type} '{node.name}'; "
            "run onnx.shape_inference.infer_shapes on the model first"
        )
    return nodes


# op_type → lowering; one explicit table, extended by each plugin op graphfix emits.
LOWERINGS = {SOFTMAX.op_type: _lower_softmax}


def has_plugin_ops(model: onnx.ModelProto) -> bool:
    return any(n.domain == PLUGIN_DOMAIN for n in model.graph.node)


def with_reference_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with graphfix plugin nodes replaced by equivalent standard ONNX ops."""
    index = GraphIndex(model)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.domain != PLUGIN_DOMAIN:
            nodes.append(node)
            continue
        lowering = LOWERINGS.get(node.op_type)
        if lowering is None:
            raise UnsupportedModelError(
                f"node '{node.name}' is {PLUGIN_DOMAIN}::{node.op_type}, which graphfix has no "
                f"reference implementation for (known: {', '.join(LOWERINGS)})"
            )
        nodes.extend(lowering(index, node))
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    still_used = any(n.domain == PLUGIN_DOMAIN for n in nodes)
    if not still_used:
        kept = [o for o in result.opset_import if o.domain != PLUGIN_DOMAIN]
        del result.opset_import[:]
        result.opset_import.extend(kept)
    return result
