"""Tiny hand-built ONNX graphs for matcher and rewrite tests: one attention chain each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, H, S, T, D = 2, 3, 5, 6, 4
F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class Variant:
    scale: str = "div_after"  # div_after | mul_after | mul_before_q | sqrt_qk | none
    mask: str | None = None  # None | add | where | causal_trilu | causal_const
    k_layout: str = "transpose"  # transpose | layout
    einsum: bool = False
    dtype: int = F32
    cast_island: bool = False  # float16 graph with Cast→float32 around the softmax
    nan_guard: bool = False
    cross: bool = False  # K/V projected from a second input
    softcap: float | None = None
    opset: int = 17


def _init(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(value, name)


def attention_model(v: Variant = Variant(), *, seed: int = 0) -> onnx.ModelProto:
    """x [B,S,H*D] (and ctx [B,T,H*D] when cross) → projections → attention → [B,S,H*D]."""
    rng = np.random.default_rng(seed)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(v.dtype)
    hd = H * D
    kv_len = T if v.cross else S
    inits = [_init(f"W{n}", (rng.standard_normal((hd, hd)) * 0.4).astype(np_dtype)) for n in "qkvo"]
    inits += [
        _init("shape_heads", np.array([B, -1, H, D], np.int64)),
        _init("shape_out", np.array([B, -1, hd], np.int64)),
    ]
    nodes = []

    def node(op, ins, outs, name, **kw):
        nodes.append(helper.make_node(op, ins, outs, name=name, **kw))
        return outs[0]

    ctx = "ctx" if v.cross else "x"
    for n, src in (("q", "x"), ("k", ctx), ("v", ctx)):
        node("MatMul", [src, f"W{n}"], [f"{n}_lin"], f"{n}_proj")
        node("Reshape", [f"{n}_lin", "shape_heads"], [f"{n}_4d"], f"{n}_reshape")
        node("Transpose", [f"{n}_4d"], [f"{n}_bhsd"], f"{n}_heads", perm=[0, 2, 1, 3])
    q, k = "q_bhsd", "k_bhsd"
    scale = 1.0 / np.sqrt(D)
    if v.scale == "mul_before_q":
        inits.append(_init("scale", np.array(scale, np_dtype)))
        q = node("Mul", [q, "scale"], ["q_scaled"], "q_scale")
    if v.einsum:
        scores = node("Einsum", [q, k], ["scores"], "qk", equation="bhid,bhjd->bhij")
    else:
        if v.k_layout == "transpose":
            k_t = node("Transpose", [k], ["k_t"], "k_transpose", perm=[0, 1, 3, 2])
        else:  # K laid out as [B,H,D,T] upstream; a Reshape, not a Transpose, feeds the MatMul
            node("Transpose", ["k_4d"], ["k_bhds"], "k_heads_t", perm=[0, 2, 3, 1])
            inits.append(_init("shape_kt", np.array([B, H, D, -1], np.int64)))
            k_t = node("Reshape", ["k_bhds", "shape_kt"], ["k_t_layout"], "k_layout")
        if v.scale == "sqrt_qk":
            inits.append(_init("sqrt_scale", np.array(np.sqrt(scale), np_dtype)))
            q = node("Mul", [q, "sqrt_scale"], ["q_s"], "q_sqrt_scale")
            k_t = node("Mul", [k_t, "sqrt_scale"], ["k_s"], "k_sqrt_scale")
        scores = node("MatMul", [q, k_t], ["scores"], "qk")
    if v.scale == "div_after":
        inits.append(_init("denom", np.array(np.sqrt(D), np_dtype)))
        scores = node("Div", [scores, "denom"], ["scaled"], "scale_div")
    elif v.scale == "mul_after":
        inits.append(_init("scale", np.array(scale, np_dtype)))
        scores = node("Mul", [scores, "scale"], ["scaled"], "scale_mul")
    if v.softcap:
        inits.append(_init("cap", np.array(v.softcap, np_dtype)))
        scores = node("Div", [scores, "cap"], ["capped_in"], "cap_div")
        scores = node("Tanh", [scores], ["capped_tanh"], "cap_tanh")
        scores = node("Mul", [scores, "cap"], ["capped"], "cap_mul")
    inputs = [helper.make_tensor_value_info("x", v.dtype, [B, S, hd])]
    if v.cross:
        inputs.append(helper.make_tensor_value_info("ctx", v.dtype, [B, T, hd]))
    neg = np.array(-1e4 if v.dtype == TensorProto.FLOAT16 else -1e9, np_dtype)
    if v.mask == "add":
        inputs.append(helper.make_tensor_value_info("mask", v.dtype, [B, 1, 1, kv_len]))
        scores = node("Add", [scores, "mask"], ["masked"], "mask_add")
    elif v.mask == "where":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [B, 1, 1, kv_len]))
        inits.append(_init("neg", neg))
        scores = node("Where", ["mask", scores, "neg"], ["masked"], "mask_where")
    elif v.mask == "causal_trilu":
        inits += [_init("ones", np.ones((S, kv_len), np.int64)), _init("neg", neg)]
        node("Trilu", ["ones"], ["tril"], "causal_trilu", upper=0)
        node("Cast", ["tril"], ["tril_b"], "causal_cast", to=TensorProto.BOOL)
        scores = node("Where", ["tril_b", scores, "neg"], ["masked"], "mask_where")
    elif v.mask == "causal_const":
        bias = np.triu(np.full((S, kv_len), neg, np_dtype), k=1)
        inits.append(_init("causal_bias", bias))
        scores = node("Add", [scores, "causal_bias"], ["masked"], "mask_add")
    if v.cast_island:
        scores = node("Cast", [scores], ["scores_f32"], "to_f32", to=F32)
    node("Softmax", [scores], ["probs"], "softmax", axis=-1)
    probs = "probs"
    if v.nan_guard:
        inits.append(_init("zero", np.array(0, np.float32 if v.cast_island else np_dtype)))
        node("IsNaN", [probs], ["isnan"], "isnan")
        probs = node("Where", ["isnan", "zero", probs], ["probs_safe"], "nan_guard")
    if v.cast_island:
        probs = node("Cast", [probs], ["probs_lp"], "from_f32", to=v.dtype)
    if v.einsum:
        node("Einsum", [probs, "v_bhsd"], ["ctx_bhsd"], "pv", equation="bhij,bhjd->bhid")
    else:
        node("MatMul", [probs, "v_bhsd"], ["ctx_bhsd"], "pv")
    node("Transpose", ["ctx_bhsd"], ["ctx_bshd"], "merge_t", perm=[0, 2, 1, 3])
    node("Reshape", ["ctx_bshd", "shape_out"], ["ctx_flat"], "merge")
    node("MatMul", ["ctx_flat", "Wo"], ["y"], "o_proj")
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info("y", v.dtype, [B, S, hd])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", v.opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds_for(model: onnx.ModelProto, *, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        t = inp.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TensorProto.BOOL:
            value = rng.random(shape) > 0.3
            value[..., 0] = True
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            value = rng.standard_normal(shape).astype(dtype)
            if inp.name == "mask":
                value = np.where(rng.random(shape) > 0.3, 0, -1e4).astype(dtype)
        feeds[inp.name] = value
    return feeds


def simple_model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def non_attention_models() -> dict[str, onnx.ModelProto]:
    """Softmax nodes that are not attention, each with its reason keyword."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    vi = helper.make_tensor_value_info
    models = {}
    models["classifier"] = simple_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["logits"], name="head"),
            helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=-1),
        ],
        [vi("x", F32, [2, 8])],
        [vi("p", F32, [2, 10])],
        [_init("W", f(8, 10))],
    )
    models["channels"] = simple_model(
        [
            helper.make_node("Conv", ["x", "W"], ["feat"], name="conv"),
            helper.make_node("Softmax", ["feat"], ["p"], name="softmax", axis=1),
            helper.make_node("Mul", ["p", "feat"], ["y"], name="weigh"),
        ],
        [vi("x", F32, [1, 3, 8, 8])],
        [vi("y", F32, [1, 4, 8, 8])],
        [_init("W", f(4, 3, 1, 1))],
    )
    models["moe_router"] = simple_model(
        [
            helper.make_node("MatMul", ["x", "Wr"], ["router_logits"], name="router"),
            helper.make_node("Softmax", ["router_logits"], ["p"], name="softmax", axis=-1),
            helper.make_node("TopK", ["p", "k"], ["w", "idx"], name="topk", axis=-1),
        ],
        [vi("x", F32, [4, 8])],
        [vi("w", F32, [4, 2]), vi("idx", TensorProto.INT64, [4, 2])],
        [_init("Wr", f(8, 6)), _init("k", np.array([2], np.int64))],
    )
    models["times_constant"] = simple_model(
        [
            helper.make_node("MatMul", ["x", "y_t"], ["scores"], name="xy"),
            helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
            helper.make_node("MatMul", ["p", "W"], ["out"], name="linear"),
        ],
        [vi("x", F32, [2, 5, 4]), vi("y_t", F32, [2, 4, 5])],
        [vi("out", F32, [2, 5, 3])],
        [_init("W", f(5, 3))],
    )
    models["right_operand"] = simple_model(
        [
            helper.make_node("MatMul", ["x", "y_t"], ["scores"], name="xy"),
            helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
            helper.make_node("MatMul", ["z", "p"], ["out"], name="zp"),
        ],
        [vi("x", F32, [2, 5, 4]), vi("y_t", F32, [2, 4, 5]), vi("z", F32, [2, 3, 5])],
        [vi("out", F32, [2, 3, 5])],
    )
    models["not_last_axis"] = simple_model(
        [
            helper.make_node("MatMul", ["x", "y_t"], ["scores"], name="xy"),
            helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=1),
            helper.make_node("MatMul", ["p", "v"], ["out"], name="pv"),
        ],
        [vi("x", F32, [2, 5, 4]), vi("y_t", F32, [2, 4, 5]), vi("v", F32, [2, 5, 3])],
        [vi("out", F32, [2, 5, 3])],
    )
    return models


def with_output_named(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """A copy of a one-output `model` whose output is called `name`, as a legacy export numbers
    its outputs (`591` in one export, `600` in another)."""
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    (output,) = renamed.graph.output
    producer = next(n for n in renamed.graph.node if output.name in n.output)
    producer.output[list(producer.output).index(output.name)] = name
    output.name = name
    return renamed
