"""max_subtract: an explicit ReduceMax → Sub before the Softmax.

Same values (softmax is shift-invariant), different pattern: a heuristic users report breaking
Myelin's attention matcher.  It cannot be verified against Myelin without TensorRT.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.strategies.base import Outcome
from graphfix.graph.edit import GraphEdit


class MaxSubtractStrategy:
    name = "max_subtract"
    proven = False
    summary = "insert ReduceMax → Sub before each attention Softmax (heuristic)"

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        node = edit.node_at(match.softmax_node.position)
        x = node.input[0]
        base = node.name or f"graphfix_softmax_{match.index}"
        row_max = edit.unique(f"{base}/row_max")
        shifted = edit.unique(f"{base}/shifted")
        if edit.index.opset >= 18:
            axes = edit.unique(f"{base}/axes")
            edit.add_initializer(numpy_helper.from_array(np.array([-1], dtype=np.int64), axes))
            reduce = onnx.helper.make_node(
                "ReduceMax", [x, axes], [row_max], name=edit.unique(f"{base}/ReduceMax"), keepdims=1
            )
        else:
            reduce = onnx.helper.make_node(
                "ReduceMax",
                [x],
                [row_max],
                name=edit.unique(f"{base}/ReduceMax"),
                axes=[-1],
                keepdims=1,
            )
        sub = onnx.helper.make_node("Sub", [x, row_max], [shifted], name=edit.unique(f"{base}/Sub"))
        softmax = onnx.NodeProto()
        softmax.CopyFrom(node)
        softmax.input[0] = shifted
        edit.replace(match.softmax_node.position, [reduce, sub, softmax])
        return Outcome(True, "ReduceMax → Sub inserted before the Softmax")
