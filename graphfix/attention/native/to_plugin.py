"""A native attention node as one GraphfixAttention node, where the node contract
(plugins/spec.py ATTENTION) expresses it: no decomposition, no matching.

The contract computes scale · Q·Kᵀ → softcap → mask → causal (top-left) → softmax with float32
statistics → P·V on 4-D Q/K/V with grouped heads, a boolean (True keeps, `mask_fill`) or
additive mask, and `nan_to_zero` for rows with every key masked — Attention-23's order.  What it
cannot express (3-D inputs, a KV cache, extra outputs, quantized probabilities, per-batch key
lengths, no normalization, a causal frontier off the diagonal, a head size known only at run
time) is decomposed instead, and the reason reported.
"""

from __future__ import annotations

import math

import onnx

from graphfix.attention.native.decompose import DirectRewrite
from graphfix.attention.native.forms import Causal, NativeForm
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import ATTENTION, PLUGIN_ELEMENT_TYPES, make_attention_node


def plugin_nodes(
    edit: GraphEdit, node: onnx.NodeProto, form: NativeForm
) -> list[onnx.NodeProto] | str:
    """[the GraphfixAttention node computing `node`], or why the contract cannot."""
    reason = _unexpressible(edit.index, form)
    if reason is not None:
        return f"not one {ATTENTION.op_type} node: {reason}"
    name = edit.unique(f"{node.name or form.y}/plugin")
    return [_plugin_node(edit.index, form, name)]


TO_PLUGIN = DirectRewrite(f"as one {ATTENTION.op_type} node each", plugin_nodes)


def _plugin_node(index: GraphIndex, form: NativeForm, name: str) -> onnx.NodeProto:
    head = index.shape(form.q)[-1]  # known: checked above when the scale needs it
    scale = 1 / math.sqrt(head) if form.scale is None else form.scale
    inputs = [form.q, form.k, form.v] + ([form.mask] if form.mask else [])
    return make_attention_node(
        inputs,
        form.y,
        scale=scale,
        k_transposed=False,
        causal=form.causal is not Causal.NONE,
        softcap=form.softcap,
        mask_fill=-math.inf,
        nan_to_zero=form.zero_empty_rows,
        name=name,
    )


def _unexpressible(index: GraphIndex, form: NativeForm) -> str | None:
    if form.unsupported:
        return form.unsupported
    checks = (
        (form.quantize_to is not None, "the probabilities are quantized (no Q/DQ inside)"),
        (form.rank != 4, f"rank-{form.rank} Q/K/V (the node takes 4-D [B, H, S, D] here)"),
        (form.past_key is not None, "a KV cache (past_key/past_value)"),
        (
            any((form.present_key, form.present_value, form.qk_output)),
            "extra outputs (present_key/present_value/qk_matmul_output)",
        ),
        (form.kv_lengths is not None, "per-batch key lengths (kv_lengths, nonpad_kv_seqlen)"),
        (not form.softmax, "no normalization (TRT_normalization_op none)"),
        (
            form.softmax_precision not in (None, onnx.TensorProto.FLOAT),
            "a softmax precision other than float32",
        ),
    )
    for failed, reason in checks:
        if failed:
            return reason
    types = {index.elem_type(t) for t in (form.q, form.k, form.v)}
    if len(types) != 1 or not types <= set(PLUGIN_ELEMENT_TYPES):
        return "Q, K and V of different or unknown element types"
    q_shape, k_shape = index.shape(form.q), index.shape(form.k)
    if form.scale is None and not isinstance((q_shape or (None,))[-1], int):
        return "the default scale 1/√D with a head size known only at run time"
    if form.causal is not Causal.NONE:
        s, t = (q_shape or (None,) * 4)[2], (k_shape or (None,) * 4)[2]
        if not (isinstance(s, int) and s == t):
            return "a causal mask with query and key lengths not known equal"
    if form.mask:
        mask_keys = (index.shape(form.mask) or (None,))[-1]
        keys = (k_shape or (None,) * 4)[2]
        if not isinstance(keys, int) or mask_keys != keys:
            return "a mask whose key length is not known to match K's (the spec pads a shorter one)"
    return None
