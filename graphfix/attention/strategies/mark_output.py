"""mark_output: the softmax output also becomes a graph output.

A heuristic users report working: TensorRT must materialise a marked tensor, which keeps Myelin
from fusing across it.  It cannot be verified against Myelin on machines without TensorRT.
The extra output costs a device-to-host copy per inference.
"""

from __future__ import annotations

import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.strategies.base import Outcome
from graphfix.graph.edit import GraphEdit


class MarkOutputStrategy:
    name = "mark_output"
    proven = False
    summary = "also expose each attention probability tensor as a graph output (heuristic)"

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        node = edit.node_at(match.softmax_node.position)
        out = node.output[0]
        if out in edit.index.graph_outputs:
            return Outcome(False, f"'{out}' is already a graph output")
        elem = edit.index.elem_type(out) or edit.index.elem_type(node.input[0])
        shape = edit.index.shape(out) or edit.index.shape(node.input[0])
        if elem is None:
            return Outcome(False, f"element type of '{out}' is unknown; run shape inference first")
        edit.add_output(onnx.helper.make_tensor_value_info(out, elem, shape))
        return Outcome(True, f"'{out}' marked as a graph output")
