"""Adding the nodes a rewrite owns: fresh names under the block's base name."""

from __future__ import annotations

import onnx

from graphfix.graph.edit import GraphEdit


def node_adder(edit: GraphEdit, base: str, nodes: list[onnx.NodeProto]):
    """add(op, inputs, what, **attrs): appends a node named under `base` to `nodes` and returns
    its one output, a fresh name ending in `what`."""

    def add(op: str, inputs: list[str], what: str, **attrs) -> str:
        out = edit.unique(f"{base}/{what}")
        nodes.append(
            onnx.helper.make_node(op, inputs, [out], name=edit.unique(f"{base}/{op}"), **attrs)
        )
        return out

    return add
