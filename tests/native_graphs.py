"""Minimal native attention graphs (ONNX Attention, TRT_Attention, TRT_QuantizedAttention) and
an independent NumPy float64 reference of their published semantics.

The reference is written from the specs (onnx's Attention-23/24 text with the 1.23 errata,
onnx-tensorrt's docs/TRT_custom_ops.md), not from onnx's reference implementation, so the two
and onnxruntime's own Attention kernel are three witnesses.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

B, HQ, S, T, D = 2, 4, 5, 7, 8
TRT_DOMAIN = "trt"


def attention_model(
    op_type: str = "Attention",
    *,
    hq: int = HQ,
    hkv: int = HQ,
    s: int = S,
    t: int = T,
    rank: int = 4,
    mask: str | None = None,
    mask_keys: int | None = None,
    past: int = 0,
    outputs: int = 1,
    elem: int = TensorProto.FLOAT,
    opset: int = 23,
    **attrs,
) -> onnx.ModelProto:
    """One native attention node over graph inputs q, k, v (and mask, past_key/past_value,
    kv_lengths, quantize_scale as the op takes them)."""

    def shape(heads: int, length: int) -> list[int]:
        return [B, length, heads * D] if rank == 3 else [B, heads, length, D]

    inputs = [
        helper.make_tensor_value_info("q", elem, shape(hq, s)),
        helper.make_tensor_value_info("k", elem, shape(hkv, t)),
        helper.make_tensor_value_info("v", elem, shape(hkv, t)),
    ]
    names = ["q", "k", "v"]
    if mask:
        inputs.append(
            helper.make_tensor_value_info(
                "mask",
                TensorProto.BOOL if mask == "bool" else elem,
                [B, 1, s, t + past if mask_keys is None else mask_keys],
            )
        )
    names.append("mask" if mask else "")
    if past:
        for name in ("past_key", "past_value"):
            inputs.append(helper.make_tensor_value_info(name, elem, [B, hkv, past, D]))
        names += ["past_key", "past_value"]
    if op_type == "TRT_QuantizedAttention":
        inputs.append(helper.make_tensor_value_info("quantize_scale", TensorProto.FLOAT, []))
        names.append("quantize_scale")
    if attrs.pop("nonpad", False):
        inputs.append(helper.make_tensor_value_info("nonpad_kv_seqlen", TensorProto.INT64, [B]))
        names += [""] * (6 - len(names)) + ["nonpad_kv_seqlen"]
    if attrs.pop("kv_lengths", False):
        inputs.append(helper.make_tensor_value_info("kv_lengths", TensorProto.INT32, [B]))
        names += ["", "kv_lengths"]
    while names and not names[-1]:
        names.pop()
    out_names = ["y", "present_key", "present_value", "qk"][:outputs]
    domain = "" if op_type == "Attention" else TRT_DOMAIN
    node = helper.make_node(op_type, names, out_names, name="attn", domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [
            helper.make_tensor_value_info(
                n, elem, [f"{n}_{i}" for i in range(rank if n == "y" else 4)]
            )
            for n in out_names
        ],
    )
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def feeds(model: onnx.ModelProto, seed: int = 0, *, logits: float = 1.0) -> dict[str, np.ndarray]:
    """Normal Q/K/V (times `logits` for Q), masks keeping most keys and every row's first."""
    rng = np.random.default_rng(seed)
    out = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if value.name in ("kv_lengths", "nonpad_kv_seqlen"):
            out[value.name] = np.array([T, T - 3], dtype)[:B]
        elif value.name == "quantize_scale":
            out[value.name] = np.array(1 / 448, np.float32)
        elif dtype == np.bool_:
            keep = rng.random(shape) > 0.3
            keep[..., 0] = True
            out[value.name] = keep
        else:
            scale = logits if value.name == "q" else 1.0
            out[value.name] = (scale * rng.standard_normal(shape)).astype(dtype)
    return out


def reference(model: onnx.ModelProto, data: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The node's outputs in float64, from the published semantics."""
    (node,) = model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    x = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in data.items()}
    q, k, v = x["q"], x["k"], x["v"]
    three_d = q.ndim == 3
    if three_d:
        q, k, v = (
            a.reshape(B, a.shape[1], heads, -1).transpose(0, 2, 1, 3)
            for a, heads in (
                (q, attrs["q_num_heads"]),
                (k, attrs["kv_num_heads"]),
                (v, attrs["kv_num_heads"]),
            )
        )
    past = 0
    if "past_key" in x:
        past = x["past_key"].shape[2]
        k = np.concatenate([x["past_key"], k], axis=2)
        v = np.concatenate([x["past_value"], v], axis=2)
    present = (k, v)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s, t = q.shape[2], k.shape[2]
    if node.op_type == "TRT_Attention":
        scale = 1.0
    else:
        scale = attrs.get("scale", 1 / np.sqrt(q.shape[-1]))
    logits = scale * q @ k.swapaxes(-1, -2)
    raw = logits
    cap = attrs.get("softcap", 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    capped = logits
    bias = np.zeros(logits.shape)
    if "mask" in x:
        m = x["mask"]
        m = np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m
        shorter = t - m.shape[-1]  # the spec pads a shorter mask with blocked keys
        bias = bias + np.pad(m, [(0, 0)] * (m.ndim - 1) + [(0, shorter)], constant_values=-np.inf)
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    kind = attrs.get("causal_kind", "none")
    lengths = x.get("kv_lengths", x.get("nonpad_kv_seqlen"))
    if attrs.get("is_causal") and "nonpad_kv_seqlen" in x:  # offset nonpad[b] − S per batch
        offset = (lengths - s)[:, None, None, None]
        bias = bias + np.where(j <= i + offset, 0.0, -np.inf)
    elif attrs.get("is_causal"):
        bias = bias + np.where(j <= i + past, 0.0, -np.inf)
    elif kind != "none":
        offset = 0 if kind == "upper_left" else t - s
        bias = bias + np.where(j <= i + offset, 0.0, -np.inf)
    if lengths is not None:
        keep = j[None] < lengths[:, None, None]
        bias = bias + np.where(keep, 0.0, -np.inf)[:, None]
    logits = logits + bias
    if attrs.get("TRT_normalization_op", "softmax") == "none":
        probs = logits
    else:
        empty = np.isneginf(bias).all(axis=-1, keepdims=True)
        shifted = np.exp(logits - np.where(empty, 0.0, logits.max(axis=-1, keepdims=True)))
        probs = shifted / np.where(empty, 1.0, shifted.sum(axis=-1, keepdims=True))
        if node.op_type != "TRT_Attention":
            probs = np.where(empty, 0.0, probs)
    if node.op_type == "TRT_QuantizedAttention":
        probs = _fake_quantize(probs, float(x["quantize_scale"]), attrs)
    y = probs @ v
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(B, s, -1)
    mode = attrs.get("qk_matmul_output_mode", 0)
    qk = (raw, capped, logits, probs)[mode]
    return [y, *present, qk][: len(node.output)]


def _fake_quantize(probs: np.ndarray, scale: float, attrs: dict) -> np.ndarray:
    if attrs.get("normalization_quantize_to_type", TensorProto.FLOAT8E4M3FN) == TensorProto.INT8:
        return np.clip(np.round(probs / scale), -128, 127) * scale
    import ml_dtypes

    return (probs / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale
