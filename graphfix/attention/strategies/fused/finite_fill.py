"""A Where mask with a finite fill (finfo.min, -65504, -1e4) combined with an additive bias, as
the node's one float32 additive mask, exactly.

What the original does with a blocked key depends on the order:
- bias first, `where(keep, s + b, fill)`: every blocked score is `fill`, so a row whose every key
  is blocked is uniform and elsewhere a blocked key's probability underflows to 0 (fill ≤ -1e4).
  The mask `where(keep, b, -3.4e38)` in float32 gives the node the same: s - 3.4e38 rounds to
  -3.4e38 for any score, so a fully blocked row is uniform too.
- mask first, `where(keep, s, fill) + b`: a blocked score is `fill + b`.  With a float32 fill of
  at least 1e30 in magnitude (finfo(float32).min), `where(keep, b, fill + b)` computed in float32
  gives the node `s + fill + b`, where s rounds away as it does in the original; a smaller fill
  (float16's -65504) would let the scores show through a fully blocked row, so that falls back.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch, BiasStep, MaskStep
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit

FLOAT32_MIN = float(np.finfo(np.float32).min)
_HUGE = 1e30  # |s| below ulp(fill)/2 for any realistic score: s + fill == fill in float32


def finite_fill_mask(
    edit: GraphEdit,
    match: AttentionMatch,
    base: str,
    keep: str,
    bias: str,
    fill: float,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> str:
    """The float32 additive mask equal in effect to the chain's Where(keep, ·, fill) and its bias
    `bias`; appends the ops that build it to `nodes`/`inits`."""
    if fill > -1e4:
        raise Unsupported(
            f"a Where mask with the finite fill {fill:g} combined with an additive bias: a "
            "blocked key's probability does not underflow to 0"
        )
    order = [type(s) for s in match.steps if isinstance(s, (MaskStep, BiasStep))]
    bias_first = order == sorted(order, key=lambda t: t is MaskStep)
    mask_first = order == sorted(order, key=lambda t: t is BiasStep)

    add = node_adder(edit, base, nodes)

    def const(value: float, what: str) -> str:
        name = edit.unique(f"{base}/{what}")
        inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    index = edit.index
    bias32 = bias
    if index.elem_type(bias) != onnx.TensorProto.FLOAT:
        bias32 = add("Cast", [bias], "bias_f32", to=onnx.TensorProto.FLOAT)
    if bias_first:
        return add("Where", [keep, bias32, const(FLOAT32_MIN, "blocked_fill")], "mask_bias")
    if not mask_first or fill > -_HUGE or index.elem_type(bias) != onnx.TensorProto.FLOAT:
        raise Unsupported(
            f"a Where mask with the finite fill {fill:g} before an additive bias: the blocked "
            "scores are fill + bias, which the node reproduces only for a float32 fill of "
            "finfo(float32).min and a float32 bias"
        )
    blocked = add("Add", [const(fill, "blocked_fill"), bias32], "blocked_plus_bias")
    return add("Where", [keep, bias32, blocked], "mask_bias")
