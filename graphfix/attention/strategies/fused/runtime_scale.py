"""A scale of the scores computed at run time (Swin v2's clamped, exponentiated logit scale, one
per head) moved onto Q: c·(Q·Kᵀ) = (c·Q)·Kᵀ when c is constant along the keys ([H, 1, 1],
[B, H, S, 1], a scalar).  The same product to rounding, as when a constant scale moves into
the node."""

from __future__ import annotations

import onnx

from graphfix.attention.match_types import ScaleOp, ScaleStep
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.unsupported import Unsupported, shape_text
from graphfix.graph.edit import GraphEdit


def scale_q_at_run_time(
    edit: GraphEdit, base: str, q: str, steps: list[ScaleStep]
) -> tuple[str, tuple[onnx.NodeProto, ...]]:
    """Q multiplied (or divided) by each run-time factor in `steps`; the Q the node reads."""
    index = edit.index
    nodes: list[onnx.NodeProto] = []
    add = node_adder(edit, base, nodes)
    q_rank, q_elem = index.rank(q), index.elem_type(q)
    for step in steps:
        shape = index.shape(step.scalar)
        per_row = (
            shape is not None
            and q_rank is not None
            and len(shape) <= q_rank
            and all(d == 1 for d in shape[-1:])
        )
        if not per_row:
            raise Unsupported(
                FallbackKind.SCALE,
                f"the scale on the scores is computed at run time ('{step.node}', shape "
                f"{shape_text(shape)}) and varies along the keys: it cannot move onto Q",
            )
        factor = step.scalar
        if index.elem_type(factor) != q_elem:
            factor = add("Cast", [factor], "scale_typed", to=q_elem)
        op = "Mul" if step.op is ScaleOp.MUL else "Div"
        q = add(op, [q, factor], "q_scaled")
    return q, tuple(nodes)
