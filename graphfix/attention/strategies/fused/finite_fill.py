"""A Where mask with a finite fill combined with an additive bias, as the node's one float32
additive mask, exactly.

What the original gives a blocked key depends on the order:
- bias first, `where(keep, s + b, fill)`: `fill`.  The mask `where(keep, b, fill)` gives the
  node `s + fill`, which is `fill` when |fill| ≥ 1e30 in float32 (s rounds away).
- mask first, `where(keep, s, fill) + b`: `fill + b` (-inf where b overflows it).  The mask
  `where(keep, b, fill + b)`, computed in float32 as the original does, gives the node
  `s + (fill + b)`, the same value for the same reason.
Nothing is assumed about the bias: a padding bias of finfo.min on every kept key of a row (GPT-Neo
with left padding) gives what the original gives.  A smaller fill (-1e4, float16's -65504)
would let the scores show through where the bias pushes the kept keys below it; it is folded
only with the bias first and constant, staying above fill / 2 (MPT's ALiBi before its
-65504 `masked_fill`): the mask is then `where(keep, b, finfo(float32).min)`.  The rest falls
back, as do the two orders mixed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch, BiasStep, MaskStep
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit

_HUGE = 1e30  # above ulp(fill)/2 of any realistic score: s + fill == fill in float32


def finite_fill_mask(
    edit: GraphEdit,
    match: AttentionMatch,
    base: str,
    keep: str,
    bias: str,
    bias_elem: int,
    fill: float,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> str:
    """The additive mask equal to the chain's Where(keep, ·, fill) and its bias `bias` (of
    element type `bias_elem`); appends the ops that build it to `nodes`/`inits`."""
    order = [type(s) for s in match.steps if isinstance(s, (MaskStep, BiasStep))]
    bias_first = order == sorted(order, key=lambda t: t is MaskStep)
    mask_first = order == sorted(order, key=lambda t: t is BiasStep)
    if not (bias_first or mask_first):
        raise Unsupported(
            FallbackKind.MASK,
            f"Where masks with the finite fill {fill:g} both before and after additive biases",
        )
    if bias_elem != onnx.TensorProto.FLOAT:
        raise Unsupported(
            FallbackKind.MASK,
            f"a Where mask with the finite fill {fill:g} combined with a bias that is not "
            "float32: the node would let the scores show through the fill",
        )
    if fill <= -_HUGE:  # exact whatever the bias
        blocked = fill
    elif bias_first and _bias_far_above(edit, match, fill):
        blocked = float(np.finfo(np.float32).min)
    else:
        raise Unsupported(
            FallbackKind.MASK,
            f"a Where mask with the finite fill {fill:g} combined with an additive bias: the "
            "node would let the scores show through the fill; exact for a float32 fill of "
            "finfo(float32).min, or a constant bias above fill / 2 applied before the mask",
        )
    add = node_adder(edit, base, nodes)
    fill_tensor = edit.unique(f"{base}/blocked_fill")
    inits.append(numpy_helper.from_array(np.array(blocked, np.float32), fill_tensor))
    if mask_first:
        fill_tensor = add("Add", [fill_tensor, bias], "blocked_plus_bias")
    return add("Where", [keep, bias, fill_tensor], "mask_bias")


def _bias_far_above(edit: GraphEdit, match: AttentionMatch, fill: float) -> bool:
    """Constant biases whose sum stays above fill / 2 (ALiBi in MPT): a kept score keeps far
    above the fill, so where(keep, s + b, fill) blocks as -inf does except in rows whose every
    key is blocked, which are uniform in the original, as the node makes them with
    finfo(float32).min."""
    floor = 0.0
    for step in match.steps:
        if isinstance(step, BiasStep):
            value = edit.index.constant_value(step.source)
            if value is None or value.size == 0 or not np.isfinite(value).all():
                return False
            floor += float(np.min(value))
    return fill <= -1e4 and floor > fill / 2
