"""Replace native attention nodes of a model (main graph and If/Loop/Scan bodies) by their
standard-op lowering, or, when asked, directly by what a strategy makes of them (one
GraphfixAttention node; an Attention node IAttention takes), in place."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import onnx

from graphfix.attention.native.forms import NATIVE_OPS, NativeForm, is_native, read_form
from graphfix.attention.native.lowering import lower
from graphfix.errors import UnsupportedModelError
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex, all_graphs
from graphfix.plugins.spec import PLUGIN_DOMAIN, ensure_plugin_opset


@dataclass(frozen=True)
class DirectRewrite:
    """What a strategy makes of a native node without decomposing it: `rewrite` returns the
    replacement nodes ([the node itself]: kept as it is), or why it cannot (the node is then
    lowered); `target` names the result in reports."""

    target: str
    rewrite: Callable[[GraphEdit, onnx.NodeProto, NativeForm], list[onnx.NodeProto] | str]


@dataclass(frozen=True)
class NativeRewrite:
    """What `rewrite_native_nodes` did: nodes lowered to the chain, nodes rewritten directly,
    and why each lowered one could not be (when a direct rewrite was asked)."""

    lowered: tuple[NativeForm, ...]
    direct: tuple[NativeForm, ...] = ()
    why_lowered: tuple[str, ...] = ()  # "node: reason", one per lowered node
    kept: tuple[NativeForm, ...] = ()  # nodes the direct rewrite keeps as they are


def rewrite_native_nodes(
    model: onnx.ModelProto,
    *,
    op_types: Collection[str] | None = None,
    direct: DirectRewrite | None = None,
) -> NativeRewrite:
    """Rewrite every native attention node of `model` whose op type is in `op_types` (None:
    Attention, TRT_Attention, TRT_QuantizedAttention), in the main graph and in every
    If/Loop/Scan body, in place: by `direct` where it can, else lowered.

    Nodes of a form graphfix cannot lower (forms.NativeForm.unsupported) are left as they are
    and not returned; `lower` raises for them when asked directly.
    """
    wanted = set(NATIVE_OPS[:3] if op_types is None else op_types)
    lowered, rewritten, why, kept = [], [], [], []
    # bodies first (reverse depth-first order), each written back into its parent before the
    # parent's edit copies the parent's nodes
    for target, index in reversed(_scopes(model)):
        edit = GraphEdit(index.model, index)
        for position, node in enumerate(index.graph.node):
            if not is_native(node) or node.op_type not in wanted:
                continue
            form = read_form(index, node)
            if form.unsupported is not None:
                continue
            nodes = direct.rewrite(edit, node, form) if direct is not None else None
            if nodes == [node]:
                kept.append(form)
                continue
            if isinstance(nodes, list):
                edit.replace(position, nodes)
                rewritten.append(form)
                continue
            edit.replace(position, lower(edit, node, form))
            lowered.append(form)
            if nodes is not None:
                why.append(f"{form.node}: {nodes}")
        edit.commit()
        if target is not None:
            target.CopyFrom(index.model.graph)
    if any(n.domain == PLUGIN_DOMAIN for g in all_graphs(model.graph) for n in g.node):
        ensure_plugin_opset(model)
    return NativeRewrite(tuple(lowered), tuple(rewritten), tuple(why), tuple(kept))


def lower_native_nodes(
    model: onnx.ModelProto, *, op_types: Collection[str] | None = None
) -> tuple[NativeForm, ...]:
    """`rewrite_native_nodes` without the plugin: every lowerable node lowered; their forms."""
    return rewrite_native_nodes(model, op_types=op_types).lowered


# TensorRT's attention custom ops, which onnxruntime has no kernel for (ONNX Attention it runs).
TRT_LOWERED = ("TRT_Attention", "TRT_QuantizedAttention")


def trt_node_count(model: onnx.ModelProto) -> int:
    """TensorRT attention custom ops in `model`, in every graph (what `lower_trt_ops` lowers)."""
    return sum(n.op_type in TRT_LOWERED for g in all_graphs(model.graph) for n in g.node)


def lower_trt_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with TensorRT's attention custom ops lowered to standard ops, so that
    onnxruntime runs it; an error naming the form graphfix cannot lower."""
    for form in native_forms(model):
        if form.op_type in TRT_LOWERED and form.unsupported:
            raise UnsupportedModelError(
                f"{form.op_type} node '{form.node}' uses {form.unsupported}; graphfix has no "
                "reference implementation of that form, so onnxruntime cannot run the model"
            )
    result = onnx.ModelProto()
    result.CopyFrom(model)
    lower_native_nodes(result, op_types=TRT_LOWERED)
    return result


def native_forms(model: onnx.ModelProto) -> tuple[NativeForm, ...]:
    """Every native attention node of `model`, main graph first, then If/Loop/Scan bodies."""
    return tuple(
        read_form(index, n) for _, index in _scopes(model) for n in index.graph.node if is_native(n)
    )


def _scopes(model: onnx.ModelProto) -> list[tuple[onnx.GraphProto | None, GraphIndex]]:
    main = GraphIndex(model)
    return [(None, main), *((target, index) for _, target, index in main.subgraph_scopes())]
