"""A native node as the ONNX Attention node TensorRT's parser maps onto IAttention (the
native_attention strategy without decomposing): an Attention node the parser takes is kept, with
float32 Casts around it for `accumulate`; anything else (TRT_ ops, extra outputs, a cache,
softcap, softmax_precision, nonpad_kv_seqlen) is lowered, and the strategy rebuilds its chain.
"""

from __future__ import annotations

import onnx

from graphfix.attention.native.decompose import DirectRewrite
from graphfix.attention.native.forms import NativeForm
from graphfix.graph.edit import GraphEdit

_LOW_PRECISION = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def to_iattention(*, accumulate: bool) -> DirectRewrite:
    """The direct rewrite for native_attention; `accumulate`: Q, K, V (and a float mask) cast to
    float32 around a float16/bfloat16 node, its output cast back (TensorRT ≥ 11.3)."""

    def rewrite(edit: GraphEdit, node: onnx.NodeProto, form: NativeForm):
        reason = _refused(form)
        if reason is not None:
            return f"not an Attention node IAttention takes: {reason}"
        elem = edit.index.elem_type(form.q)
        if not accumulate or elem not in _LOW_PRECISION:
            return [node]
        return _widened(edit, node, form, elem)

    target = "kept as Attention nodes IAttention takes" + (
        " (float32 Casts around float16/bfloat16 ones)" if accumulate else ""
    )
    return DirectRewrite(target, rewrite)


def _refused(form: NativeForm) -> str | None:
    """Why TensorRT's Attention importer (or IAttention) refuses the node; None: it takes it."""
    checks = (
        (form.op_type != "Attention", f"{form.op_type} (TensorRT 11 only); rebuilt from its chain"),
        (form.past_key is not None, "past_key/past_value, which the importer refuses"),
        (
            any((form.present_key, form.present_value, form.qk_output)),
            "extra outputs (the importer takes one)",
        ),
        (form.softcap > 0, "a softcap, which the importer refuses"),
        (form.softmax_precision is not None, "softmax_precision, which the importer refuses"),
        (form.kv_lengths is not None, "nonpad_kv_seqlen (the importer does not read it)"),
    )
    return next((reason for failed, reason in checks if failed), None)


def _widened(
    edit: GraphEdit, node: onnx.NodeProto, form: NativeForm, elem: int
) -> list[onnx.NodeProto]:
    base = node.name or form.y
    nodes = []

    def cast(tensor: str, to: int, output: str | None = None) -> str:
        out = output or edit.unique(f"{base}/{tensor}_fp32")
        nodes.append(
            onnx.helper.make_node(
                "Cast", [tensor], [out], name=edit.unique(f"{base}/to_fp32"), to=to
            )
        )
        return out

    inputs = [cast(t, onnx.TensorProto.FLOAT) for t in (form.q, form.k, form.v)]
    if form.mask:
        boolean = edit.index.elem_type(form.mask) == onnx.TensorProto.BOOL
        inputs.append(form.mask if boolean else cast(form.mask, onnx.TensorProto.FLOAT))
    widened = onnx.NodeProto()
    widened.CopyFrom(node)
    del widened.input[:]
    widened.input.extend(inputs)
    widened.output[0] = edit.unique(f"{base}/y_fp32")
    nodes.append(widened)
    cast(widened.output[0], elem, output=form.y)
    return nodes
