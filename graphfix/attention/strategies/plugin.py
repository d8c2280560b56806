"""plugin: the Softmax becomes a GraphfixSoftmax node (DESIGN.md), opaque to Myelin."""

from __future__ import annotations

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.strategies.base import Outcome
from graphfix.graph.edit import GraphEdit
from graphfix.plugins.spec import (
    PLUGIN_ELEMENT_TYPES,
    SOFTMAX,
    ensure_plugin_opset,
    make_softmax_node,
)


class PluginStrategy:
    name = "plugin"
    proven = True
    summary = (
        "replace the attention Softmax by the GraphfixSoftmax TensorRT plugin; Myelin cannot "
        "look inside a plugin, so the chain cannot be fused (needs the graphfix plugin library)"
    )

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        node = edit.node_at(match.softmax_node.position)
        elem = edit.index.elem_type(node.input[0])
        if elem is not None and elem not in PLUGIN_ELEMENT_TYPES:
            return Outcome(
                False, f"softmax computes in {match.dtype}; the plugin takes float32/16, bf16"
            )
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if edit.index.opset < 13:
            axis = -1  # Softmax-1/11 coerce to 2-D; the matcher proved the axis is the last one
        name = node.name or edit.unique(f"graphfix_softmax_{match.index}")
        edit.replace(
            match.softmax_node.position,
            [make_softmax_node(node.input[0], node.output[0], axis=axis, name=name)],
        )
        edit.annotate(node.output[0])
        ensure_plugin_opset(edit.model)
        return Outcome(True, f"Softmax → {SOFTMAX.op_type} (axis {axis})")
