"""Replace native attention nodes of a model (main graph and If/Loop/Scan bodies) by their
standard-op lowering, or, when asked, by one GraphfixAttention node where its contract expresses
them, in place."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import onnx

from graphfix.attention.native.forms import NATIVE_OPS, NativeForm, is_native, read_form
from graphfix.attention.native.lowering import lower
from graphfix.attention.native.to_plugin import plugin_node
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import ensure_plugin_opset


@dataclass(frozen=True)
class NativeRewrite:
    """What `rewrite_native_nodes` did: nodes lowered to the chain, nodes that became one
    GraphfixAttention node, and why each lowered one could not (when that was asked)."""

    lowered: tuple[NativeForm, ...]
    fused: tuple[NativeForm, ...] = ()
    why_not_fused: tuple[str, ...] = ()  # "node: reason", one per lowered node


def rewrite_native_nodes(
    model: onnx.ModelProto,
    *,
    op_types: Collection[str] | None = None,
    to_plugin: bool | None = None,
) -> NativeRewrite:
    """Rewrite every native attention node of `model` whose op type is in `op_types` (None:
    Attention, TRT_Attention, TRT_QuantizedAttention), in the main graph and in every
    If/Loop/Scan body, in place: as one GraphfixAttention node when `to_plugin` and its contract
    expresses the node, else lowered.

    Nodes of a form graphfix cannot lower (forms.NativeForm.unsupported) are left as they are
    and not returned; `lower` raises for them when asked directly.
    """
    wanted = set(NATIVE_OPS[:3] if op_types is None else op_types)
    lowered, fused, why = [], [], []
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
            direct = None
            if to_plugin:
                direct = plugin_node(index, form, edit.unique(f"{node.name or form.y}/plugin"))
            if isinstance(direct, onnx.NodeProto):
                edit.replace(position, [direct])
                fused.append(form)
                continue
            edit.replace(position, lower(edit, node, form))
            lowered.append(form)
            if direct is not None:
                why.append(f"{form.node}: {direct}")
        edit.commit()
        if target is not None:
            target.CopyFrom(index.model.graph)
    if fused:
        ensure_plugin_opset(model)
    return NativeRewrite(tuple(lowered), tuple(fused), tuple(why))


def lower_native_nodes(
    model: onnx.ModelProto, *, op_types: Collection[str] | None = None
) -> tuple[NativeForm, ...]:
    """`rewrite_native_nodes` without the plugin: every lowerable node lowered; their forms."""
    return rewrite_native_nodes(model, op_types=op_types).lowered


def native_forms(model: onnx.ModelProto) -> tuple[NativeForm, ...]:
    """Every native attention node of `model`, main graph first, then If/Loop/Scan bodies."""
    return tuple(
        read_form(index, n) for _, index in _scopes(model) for n in index.graph.node if is_native(n)
    )


def _scopes(model: onnx.ModelProto) -> list[tuple[onnx.GraphProto | None, GraphIndex]]:
    main = GraphIndex(model)
    return [(None, main), *((target, index) for _, target, index in main.subgraph_scopes())]
