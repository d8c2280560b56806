"""Decompose ONNX `Attention` ops (opset 23+) into the explicit chain the rewrites understand.

Supported: 4-D Q [B, H, S, D], K [B, H, T, D], V [B, H, T, Dv] with equal head counts; optional
boolean (True keeps) or additive float mask; `is_causal` (top-left aligned, as the ONNX spec's
reference); `scale` (default 1/√D computed in-graph); `softcap`.  Anything else (3-D inputs,
grouped heads, KV cache inputs, extra outputs) raises UnsupportedModelError naming the feature.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix.errors import UnsupportedModelError
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex


def decompose_attention_ops(model: onnx.ModelProto) -> int:
    """Replace every ONNX Attention node of `model` in place; return how many were replaced."""
    index = GraphIndex(model)
    edit = GraphEdit(model, index)
    count = 0
    for position, node in enumerate(model.graph.node):
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            edit.replace(position, _decompose(edit, node, position))
            count += 1
    edit.commit()
    return count


def _unsupported(node: onnx.NodeProto, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"ONNX Attention node '{node.name}' uses {what}, which graphfix cannot decompose yet; "
        "export with opset ≤ 22 (torch.onnx.export(..., opset_version=18)) to get the explicit chain"
    )


def _decompose(edit: GraphEdit, node: onnx.NodeProto, position: int) -> list[onnx.NodeProto]:
    index = edit.index
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * 6
    q, k, v, mask = inputs[0], inputs[1], inputs[2], inputs[3]
    if any(inputs[4:7]):
        raise _unsupported(node, "past_key/past_value or nonpad_kv_seqlen inputs (a KV cache)")
    if len([o for o in node.output if o]) > 1:
        raise _unsupported(node, "present_key/present_value/qk_matmul_output outputs")
    for name in (q, k, v):
        rank = index.rank(name)
        if rank is not None and rank != 4:
            raise _unsupported(
                node, f"rank-{rank} input '{name}' (only 4-D [B, H, S, D] is supported)"
            )
    q_heads, k_heads = (index.shape(q) or (None,) * 4)[1], (index.shape(k) or (None,) * 4)[1]
    if isinstance(q_heads, int) and isinstance(k_heads, int) and q_heads != k_heads:
        raise _unsupported(node, f"grouped heads ({q_heads} query vs {k_heads} key heads)")

    base = node.name or f"attention_{position}"

    def name(suffix: str) -> str:
        return edit.unique(f"{base}/{suffix}")

    def const(suffix: str, value: np.ndarray) -> str:
        tensor_name = name(suffix)
        edit.add_initializer(numpy_helper.from_array(value, tensor_name))
        return tensor_name

    nodes: list[onnx.NodeProto] = []

    def add(op: str, ins: list[str], **kwargs) -> str:
        out = name(f"{op}_out")
        nodes.append(helper.make_node(op, ins, [out], name=name(op), **kwargs))
        return out

    # Constants and the mask are CastLike'd to Q (the scores' type): reading the scores for their
    # type would make the chain's tensors escape into side nodes, which fused_plugin refuses.
    k_t = add("Transpose", [k], perm=[0, 1, 3, 2])
    scores = add("MatMul", [q, k_t])
    if attrs.get("scale") is not None:
        factor = add("CastLike", [const("scale", np.array(attrs["scale"], np.float32)), q])
    else:
        shape = add("Shape", [q], start=-1)
        head = add("Cast", [shape], to=onnx.TensorProto.FLOAT)
        root = add("Sqrt", [head])
        inv = add("Reciprocal", [root])
        factor = add(
            "CastLike", [add("Squeeze", [inv, const("axis0", np.array([0], np.int64))]), q]
        )
    scores = add("Mul", [scores, factor])
    softcap = float(attrs.get("softcap") or 0.0)
    if softcap > 0:
        cap = add("CastLike", [const("softcap", np.array(softcap, np.float32)), q])
        scores = add("Mul", [add("Tanh", [add("Div", [scores, cap])]), cap])
    neg_inf = add("CastLike", [const("neg_inf", np.array(-np.inf, np.float32)), q])
    if mask:
        if index.elem_type(mask) == onnx.TensorProto.BOOL:
            scores = add("Where", [mask, scores, neg_inf])
        else:
            scores = add("Add", [scores, add("CastLike", [mask, q])])
    if attrs.get("is_causal"):
        q_len = add(
            "Slice",
            [
                add("Shape", [q]),
                const("s2", np.array([2], np.int64)),
                const("s3", np.array([3], np.int64)),
            ],
        )
        k_len = add(
            "Slice",
            [
                add("Shape", [k]),
                const("t2", np.array([2], np.int64)),
                const("t3", np.array([3], np.int64)),
            ],
        )
        square = add("Concat", [q_len, k_len], axis=0)
        ones = add("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([True])))
        tril = add("Trilu", [ones], upper=0)
        scores = add("Where", [tril, scores, neg_inf])
    probs = add("Softmax", [scores], axis=-1)
    nodes.append(helper.make_node("MatMul", [probs, v], [node.output[0]], name=name("MatMul_pv")))
    return nodes
