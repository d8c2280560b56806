"""Tiny Q/DQ graphs for the lint's rule tests, and edits that plant Q/DQ violations in any model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def value(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F32, list(shape))


def _unique(model_: onnx.ModelProto, base: str) -> str:
    used = {n.name for n in model_.graph.node}
    used |= {o for n in model_.graph.node for o in n.output}
    used |= {t.name for t in model_.graph.initializer}
    name, i = base, 1
    while name in used:
        name, i = f"{base}_{i}", i + 1
    return name


def add_pair(
    m: onnx.ModelProto,
    tensor: str,
    *,
    scale: float = 0.05,
    consumers: tuple[str, ...] | None = None,
    dtype: int = TensorProto.INT8,
) -> tuple[str, str]:
    """Insert Q → DQ on `tensor` for `consumers` (node names; all when None).  Returns (Q, DQ)."""
    g = m.graph
    q_name = _unique(m, f"{tensor}_Q")
    dq_name = _unique(m, f"{tensor}_DQ")
    s_name = _unique(m, f"{q_name}_scale")
    z_name = _unique(m, f"{q_name}_zp")
    zero = np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(dtype))
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(scale, np.float32), s_name),
            numpy_helper.from_array(zero, z_name),
        ]
    )
    q = helper.make_node("QuantizeLinear", [tensor, s_name, z_name], [f"{q_name}_out"], name=q_name)
    dq = helper.make_node(
        "DequantizeLinear", [f"{q_name}_out", s_name, z_name], [f"{dq_name}_out"], name=dq_name
    )
    nodes = list(g.node)
    first = len(nodes)
    for position, node in enumerate(nodes):
        if consumers is not None and node.name not in consumers:
            continue
        hit = False
        for i, name in enumerate(node.input):
            if name == tensor:
                node.input[i] = dq.output[0]
                hit = True
        if hit:
            first = min(first, position)
    nodes[first:first] = [q, dq]
    del g.node[:]
    g.node.extend(nodes)
    return q_name, dq_name


def quantize_weight(m: onnx.ModelProto, name: str, *, axis: int | None = 0) -> str:
    """Replace float initializer `name` by int8 data + DequantizeLinear (per channel on `axis`,
    per tensor when None).  Returns the DQ node's name."""
    g = m.graph
    (tensor,) = [t for t in g.initializer if t.name == name]
    w = numpy_helper.to_array(tensor).astype(np.float32)
    if axis is None:
        scale = np.array(max(np.abs(w).max(), 1e-8) / 127, np.float32)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        zp = np.zeros((), np.int8)
    else:
        reduce = tuple(i for i in range(w.ndim) if i != axis)
        scale = (np.maximum(np.abs(w).max(axis=reduce), 1e-8) / 127).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        zp = np.zeros(scale.shape, np.int8)
    g.initializer.remove(tensor)
    g.initializer.extend(
        [
            numpy_helper.from_array(q, f"{name}_q"),
            numpy_helper.from_array(scale, f"{name}_scale"),
            numpy_helper.from_array(zp, f"{name}_zp"),
        ]
    )
    attrs = {} if axis is None else {"axis": axis}
    dq = helper.make_node(
        "DequantizeLinear",
        [f"{name}_q", f"{name}_scale", f"{name}_zp"],
        [name],
        name=f"{name}_DQ",
        **attrs,
    )
    g.node.insert(0, dq)
    return dq.name


def twin_convs(rng: np.random.Generator, shape=(1, 32, 8, 8)) -> onnx.ModelProto:
    """Two 1×1 Convs `c1`, `c2` (weights W1, W2 drawn from `rng`) reading the one input `x`."""
    channels = shape[1]
    ws = [
        numpy_helper.from_array(
            rng.standard_normal((channels, channels, 1, 1)).astype(np.float32), f"W{i}"
        )
        for i in (1, 2)
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["y1"], name="c1"),
        helper.make_node("Conv", ["x", "W2"], ["y2"], name="c2"),
    ]
    return model(nodes, [value("x", shape)], [value("y1", shape), value("y2", shape)], ws)


def conv_block(
    *, channels: int = 32, quantize_input: bool = True, weight_axis: int | None = 0
) -> onnx.ModelProto:
    """x [1,C,8,8] → Conv(3×3, C→C) → y, weights quantized, input optionally Q/DQ'd."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(
        rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1, "W"
    )
    conv = helper.make_node("Conv", ["x", "W"], ["y"], name="conv", pads=[1, 1, 1, 1])
    m = model([conv], [value("x", (1, channels, 8, 8))], [value("y", (1, channels, 8, 8))], [w])
    quantize_weight(m, "W", axis=weight_axis)
    if quantize_input:
        add_pair(m, "x")
    return m


def residual_block(*, channels: int = 32, qdq_on_conv: bool, qdq_on_skip: bool) -> onnx.ModelProto:
    """x → Q/DQ → Conv → [Q/DQ] → Add(·, skip) → y, skip = x (through Q/DQ when asked)."""
    m = conv_block(channels=channels)
    g = m.graph
    (conv,) = [n for n in g.node if n.name == "conv"]
    conv.output[0] = "h"
    g.node.append(helper.make_node("Add", ["h", "skip"], ["y"], name="add"))
    g.node.insert(0, helper.make_node("Identity", ["x"], ["skip"], name="skip_id"))
    if qdq_on_conv:
        add_pair(m, "h", consumers=("add",))
    if qdq_on_skip:
        add_pair(m, "skip", consumers=("add",), scale=0.04)
    return m


def attention_block(*, quantize: tuple[str, ...] = ("q", "k", "p", "v"), scores_qdq: bool = False):
    """q, k, v [1,2,8,16] → MatMul(q, kᵀ) → Mul(scale) → Softmax → MatMul(·, v) → y.

    `quantize` picks which operands get a Q/DQ: q, k (the first MatMul), p (softmax output), v.
    """
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_mul"),
        helper.make_node("Softmax", ["scaled"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "scale")]
    shape = (1, 2, 8, 16)
    m = model(nodes, [value(n, shape) for n in "qkv"], [value("y", shape)], inits)
    targets = {"q": ("q", ("qk",)), "k": ("kt", ("qk",)), "p": ("p", ("pv",)), "v": ("v", ("pv",))}
    for operand in quantize:
        tensor, consumers = targets[operand]
        add_pair(m, tensor, consumers=consumers)
    if scores_qdq:
        add_pair(m, "scores", consumers=("scale_mul",))
    return m


def layernorm_model(*, qdq_inside: bool) -> onnx.ModelProto:
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
        helper.make_node("Mul", ["centred", "centred"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
        helper.make_node("Div", ["centred", "std"], ["y"], name="normalise"),
    ]
    inits = [numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    m = model(nodes, [value("x", (1, 8, 32))], [value("y", (1, 8, 32))], inits)
    if qdq_inside:
        add_pair(m, "centred", consumers=("normalise",))
    return m


def layernorm_model_for_fix() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(a LayerNorm with a Q/DQ pair on its centred input, the same LayerNorm without it)."""
    return layernorm_model(qdq_inside=True), layernorm_model(qdq_inside=False)
