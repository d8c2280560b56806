"""graphfix's reference implementation of its plugin ops, for onnxruntime.

`with_reference_ops` returns a copy of a rewritten model in which every graphfix plugin node is
replaced by standard ONNX ops with the same semantics (float32 math whatever the I/O type), so the
rewrite can be validated on any machine.  The tensor names are kept, so outputs compare 1:1.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.errors import UnsupportedModelError
from graphfix.graph.index import GraphIndex, all_graphs
from graphfix.plugins.spec import ATTENTION, PLUGIN_DOMAIN, SOFTMAX


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


def _lower_attention(index: GraphIndex, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """ATTENTION's math (plugin_spec.py) in float32, whatever the I/O type."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    base = node.name or node.output[0]
    nodes: list[onnx.NodeProto] = []
    counter = iter(range(1 << 30))

    def add(op: str, inputs: list[str], output: str | None = None, **kwargs) -> str:
        out = output or f"{base}/ref_{op}_{next(counter)}"
        nodes.append(onnx.helper.make_node(op, inputs, [out], name=f"{out}/node", **kwargs))
        return out

    def const(value: float | list[int], dtype=np.float32) -> str:
        out = f"{base}/ref_const_{next(counter)}"
        tensor = numpy_helper.from_array(np.array(value, dtype=dtype), out)
        nodes.append(onnx.helper.make_node("Constant", [], [out], name=f"{out}/node", value=tensor))
        return out

    def f32(name: str) -> str:
        return (
            name
            if index.elem_type(name) == onnx.TensorProto.FLOAT
            else add("Cast", [name], to=onnx.TensorProto.FLOAT)
        )

    q, k, v = (f32(n) for n in node.input[:3])
    rank = index.rank(node.input[0]) or 4
    if not attrs.get("k_transposed", 0):
        k = add("Transpose", [k], perm=[*range(rank - 2), rank - 1, rank - 2])
    q_shape, k_shape = index.shape(node.input[0]), index.shape(node.input[1])
    if (
        rank == 4
        and q_shape
        and k_shape
        and all(isinstance(d, int) for d in (q_shape[1], k_shape[1]))
    ):
        group = q_shape[1] // k_shape[1]
        if group > 1:  # grouped heads: repeat each key/value head `group` times
            k, v = (_repeat_heads(add, const, t, group) for t in (k, v))
    scores = add("Mul", [add("MatMul", [q, k]), const(attrs.get("scale", 1.0))])
    softcap = attrs.get("softcap", 0.0)
    if softcap:
        cap = const(softcap)
        scores = add("Mul", [add("Tanh", [add("Div", [scores, cap])]), cap])
    if len(node.input) > 3 and node.input[3]:
        mask = node.input[3]
        if index.elem_type(mask) == onnx.TensorProto.BOOL:
            scores = add("Where", [mask, scores, const(attrs.get("mask_fill", -np.inf))])
        else:
            scores = add("Add", [scores, f32(mask)])
    if attrs.get("causal", 0):
        sizes = add(
            "Concat",
            [add("Shape", [scores], start=-2, end=-1), add("Shape", [scores], start=-1)],
            axis=0,
        )
        ones = add("ConstantOfShape", [sizes], value=numpy_helper.from_array(np.array([True])))
        scores = add("Where", [add("Trilu", [ones], upper=0), scores, const(-np.inf)])
    probs = add("Softmax", [scores], axis=-1)
    if attrs.get("nan_to_zero", 0):
        probs = add("Where", [add("IsNaN", [probs]), const(0.0), probs])
    elem = index.elem_type(node.input[0])
    if elem == onnx.TensorProto.FLOAT:
        add("MatMul", [probs, v], node.output[0])
    else:
        add("Cast", [add("MatMul", [probs, v])], node.output[0], to=elem)
    return nodes


def _repeat_heads(add, const, tensor: str, group: int) -> str:
    """[B, H, X, Y] → [B, H·group, X, Y], each head repeated `group` times in a row."""
    target = add("Mul", [add("Shape", [tensor]), const([1, group, 1, 1], np.int64)])
    unsqueezed = add("Unsqueeze", [tensor, const([2], np.int64)])
    tiled = add("Tile", [unsqueezed, const([1, 1, group, 1, 1], np.int64)])
    return add("Reshape", [tiled, target])


# op_type → lowering; one explicit table, extended by each plugin op graphfix emits.
LOWERINGS = {SOFTMAX.op_type: _lower_softmax, ATTENTION.op_type: _lower_attention}


def plugin_node_count(model: onnx.ModelProto) -> int:
    """graphfix plugin nodes in `model`, in every graph (what `with_reference_ops` lowers)."""
    return sum(n.domain == PLUGIN_DOMAIN for g in all_graphs(model.graph) for n in g.node)


def has_plugin_ops(model: onnx.ModelProto) -> bool:
    return plugin_node_count(model) > 0


def with_reference_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with graphfix plugin nodes replaced by equivalent standard ONNX ops,
    in the main graph and in every If/Loop/Scan body.  (TensorRT's TRT_Attention and
    TRT_QuantizedAttention nodes: `graphfix.attention.native.decompose.lower_trt_ops`.)"""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    main = GraphIndex(result)
    scopes = [(None, main), *((target, index) for _, target, index in main.subgraph_scopes())]
    for target, index in reversed(scopes):  # bodies first, written back before their parent
        nodes: list[onnx.NodeProto] = []
        for node in index.graph.node:
            if node.domain != PLUGIN_DOMAIN:
                nodes.append(node)
                continue
            lowering = LOWERINGS.get(node.op_type)
            if lowering is None:
                raise UnsupportedModelError(
                    f"node '{node.name}' is {PLUGIN_DOMAIN}::{node.op_type}, which graphfix has "
                    f"no reference implementation for (known: {', '.join(LOWERINGS)})"
                )
            nodes.extend(lowering(index, node))
        graph = index.graph
        del graph.node[:]
        graph.node.extend(nodes)
        if target is not None:
            target.CopyFrom(graph)
    if not has_plugin_ops(result):
        kept = [o for o in result.opset_import if o.domain != PLUGIN_DOMAIN]
        del result.opset_import[:]
        result.opset_import.extend(kept)
    return result
