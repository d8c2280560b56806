"""fp32_island: Cast to float32 around the Softmax in float16/bfloat16 graphs.

Computes the softmax in float32, which fixes the float16 overflow/underflow part of the problem
and changes the pattern Myelin sees.  A heuristic: it cannot be verified against Myelin without
TensorRT, and it does nothing for float32 graphs (reported as skipped).
"""

from __future__ import annotations

import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.strategies.base import Outcome
from graphfix.graph.edit import GraphEdit

_LOW_PRECISION = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


class Fp32IslandStrategy:
    name = "fp32_island"
    proven = False
    summary = "compute each float16/bfloat16 attention Softmax in float32 between Casts (heuristic)"

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        node = edit.node_at(match.softmax_node.position)
        elem = edit.index.elem_type(node.input[0])
        if match.cast_island:
            return Outcome(False, "softmax already computes in float32 between Casts")
        if elem not in _LOW_PRECISION:
            return Outcome(False, f"softmax computes in {match.dtype}; nothing to widen")
        base = node.name or f"graphfix_softmax_{match.index}"
        x32 = edit.unique(f"{base}/x_fp32")
        y32 = edit.unique(f"{base}/y_fp32")
        softmax = onnx.NodeProto()
        softmax.CopyFrom(node)
        softmax.input[0] = x32
        softmax.output[0] = y32
        edit.replace(
            match.softmax_node.position,
            [
                onnx.helper.make_node(
                    "Cast",
                    [node.input[0]],
                    [x32],
                    name=edit.unique(f"{base}/to_fp32"),
                    to=onnx.TensorProto.FLOAT,
                ),
                softmax,
                onnx.helper.make_node(
                    "Cast", [y32], [node.output[0]], name=edit.unique(f"{base}/from_fp32"), to=elem
                ),
            ],
        )
        return Outcome(True, f"Softmax computed in float32 between Casts ({match.dtype} I/O)")
