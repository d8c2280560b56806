"""Reshapes of the scores and probabilities that only regroup batch and heads (BLOOM's and
Falcon's baddbmm exports, dynamo's `view`), read into the node's [B, H, S, D] layout.

- A Reshape whose input and output shapes are the same static shape does nothing: skipped.
- BLOOM: Q, K, V are [B·H, S, D]; the scores [B·H, S, T] are viewed as [B, H, S, T] for the
  padding/causal mask and the probabilities viewed back to [B·H, S, T] for P·V.  The node then
  takes Q, K, V reshaped to [B, H, ·, ·] (B and H from the scores' view), its output is reshaped
  back to [B·H, S, Dv], and a bias added before the view (ALiBi, [B·H | 1, 1 | S, T]) is
  reshaped like the scores.  Pure data movement: exact.
- dynamo: only one side may be viewed (folded scores with a 4-D V, or 4-D scores whose
  probabilities are folded for a 3-D V); only that side's operands are reshaped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch, BiasStep, ReshapeStep
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.operands import Operands
from graphfix.attention.strategies.fused.unsupported import Unsupported, shape_text
from graphfix.graph.edit import GraphEdit


def is_identity(step: ReshapeStep) -> bool:
    """The reshape keeps a static shape as it is."""
    shape = step.input_shape
    return (
        shape is not None
        and shape == step.output_shape
        and all(isinstance(d, int) and d > 0 for d in shape)
    )


def folds_heads(step: ReshapeStep) -> bool:
    """A view from or to a 3-D [B·H, S, T] tensor: find_regroup's to judge (any other view of
    the scores is Swin's window view, fused/mask.py's)."""
    return 3 in {len(s) for s in (step.input_shape, step.output_shape) if s is not None}


@dataclass(frozen=True)
class Regroup:
    """The scores' [B·H, S, T] → [B, H, S, T] view and the probabilities' view back; either
    may be missing (dynamo: a 4-D Q·Kᵀ with the probabilities folded for a 3-D V, or folded
    scores with a 4-D V)."""

    scores: ReshapeStep | None  # None: Q and K are 4-D already
    probs: ReshapeStep | None  # None: P·V reads the [B, H, S, T] view with a 4-D V
    batch_heads: tuple[int, int]  # (B, H) as the view's target gives them (-1 allowed once)
    before: frozenset[int]  # id() of the BiasSteps added before the view


def find_regroup(match: AttentionMatch) -> Regroup | None:
    """The regrouping views of the chain; None when there is none.  Raises Unsupported for any
    other reshape of the scores or probabilities."""
    scores = [
        s
        for s in match.steps
        if isinstance(s, ReshapeStep) and not is_identity(s) and folds_heads(s)
    ]
    probs = [s for s in match.after if isinstance(s, ReshapeStep) and not is_identity(s)]
    if not scores and not probs:
        return None
    if len(scores) > 1 or len(probs) > 1:
        step = (scores or probs)[1 if len(scores) > 1 else 0]
        raise Unsupported(
            FallbackKind.RESHAPE,
            f"{step.op} '{step.node}' reshapes the scores or probabilities "
            f"({shape_text(step.input_shape)} → {shape_text(step.output_shape)}) other than one "
            "view of batch·heads as batch, heads and back",
        )
    view = scores[0] if scores else None
    back = probs[0] if probs else None
    for step, folded, split in (
        (view, "input_shape", "output_shape"),
        (back, "output_shape", "input_shape"),
    ):
        if step is not None and not _splits(getattr(step, folded), getattr(step, split)):
            raise Unsupported(
                FallbackKind.RESHAPE,
                f"{step.op} '{step.node}' reshapes the scores inside the chain "
                f"({shape_text(step.input_shape)} → {shape_text(step.output_shape)}), not only "
                "regrouping batch and heads",
            )
    if view is not None:
        batch_heads = _batch_heads(view.output_shape, view.target, view.node)
        position = match.steps.index(view)
        before = frozenset(id(s) for s in match.steps[:position] if isinstance(s, BiasStep))
    else:
        batch_heads = _batch_heads(back.input_shape, None, back.node)
        before = frozenset()
    return Regroup(view, back, batch_heads, before)


def _splits(folded: tuple | None, split: tuple | None) -> bool:
    """[N, S, T] and [B, H, S, T] with the same S and T (and N = B·H where static)."""
    if folded is None or split is None or len(folded) != 3 or len(split) != 4:
        return False
    if folded[1:] != split[2:] or any(d is None for d in folded[1:]):
        return False
    dims = (folded[0], split[0], split[1])
    return not all(isinstance(d, int) for d in dims) or dims[0] == dims[1] * dims[2]


def _batch_heads(shape: tuple | None, target: tuple | None, node: str) -> tuple[int, int]:
    """(B, H) of a [B, H, S, T] view: static dims, else the Reshape's constant target."""
    shape, target = shape or (), target or ()
    pair = [
        shape[i] if isinstance(shape[i], int) else (target[i] if len(target) > i else 0)
        for i in (0, 1)
    ]
    if any(d == 0 or not isinstance(d, int) for d in pair) or pair.count(-1) > 1:
        raise Unsupported(
            FallbackKind.RESHAPE, f"the view '{node}' does not say batch and heads as constants"
        )
    return pair[0], pair[1]


def regroup_operands(edit: GraphEdit, base: str, regroup: Regroup, operands: Operands) -> Operands:
    """Q, K (or Kᵀ) and V viewed as [B, H, ·, ·]; the output is viewed back by `view_back`
    when the probabilities were (a 4-D V is read as it is)."""
    index = edit.index
    if operands.output_perm is not None:
        raise Unsupported(FallbackKind.RESHAPE, "a view of batch·heads with an Einsum layout")
    qk_rank = 3 if regroup.scores is not None else 4
    v_rank = 3 if regroup.probs is not None else 4
    for name, rank in ((operands.q, qk_rank), (operands.k, qk_rank), (operands.v, v_rank)):
        if index.rank(name) != rank:
            raise Unsupported(
                FallbackKind.RESHAPE,
                f"'{name}' is not {rank}-D under a view of batch·heads as batch, heads",
            )
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    split = _adder(edit, base, nodes, inits)
    q, k, v = operands.q, operands.k, operands.v
    if regroup.scores is not None:
        q = split.heads(q, regroup.batch_heads, "q")
        k = split.heads(k, regroup.batch_heads, "k")
    if regroup.probs is not None:
        v = split.heads(v, regroup.batch_heads, "v")
    return operands.read_through(
        q, k, v, nodes, inits, "batch·heads viewed as batch, heads and back"
    )


def view_bias(
    edit: GraphEdit,
    base: str,
    regroup: Regroup,
    source: str,
    folded_q: str,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> str:
    """A bias added to the [B·H, S, T] scores, as the [B, H, S, T] view sees it; `folded_q` is
    Q as [B·H, S, D]."""
    shape = edit.index.shape(source)
    if shape is None:
        raise Unsupported(
            FallbackKind.RESHAPE,
            f"the bias '{source}' before the view of batch·heads has no known shape",
        )
    if len(shape) < 3:
        return source  # broadcast over batch·heads: the same over batch and heads
    if len(shape) != 3:
        raise Unsupported(
            FallbackKind.RESHAPE, f"the bias '{source}' before the view of batch·heads is not 3-D"
        )
    add = _adder(edit, base, nodes, inits)
    if not isinstance(shape[0], int):  # 1 or B·H at run time (DeBERTa's relative attention)
        rows = add.node("Shape", [folded_q], "q_rows", end=1)
        target = add.node("Concat", [rows, add.const([1, 1])], "bias_rows", axis=0)
        expanded = add.node("Expand", [source, target], "bias_expanded")
        return add.heads(expanded, regroup.batch_heads, "bias")
    if shape[0] == 1:
        return add.node("Unsqueeze", [source, add.const([0])], "bias_heads")
    batch, heads = regroup.batch_heads
    if batch > 0 and heads > 0 and shape[0] != batch * heads:
        raise Unsupported(
            FallbackKind.RESHAPE,
            f"the bias '{source}' before the view of batch·heads has {shape[0]} rows, not "
            f"batch·heads = {batch * heads}",
        )
    return add.heads(source, regroup.batch_heads, "bias")


def view_back(edit: GraphEdit, base: str, output: str, result: str) -> list[onnx.NodeProto]:
    """Reshape the node's [B, H, S, Dv] `output` to [B·H, S, Dv] as `result`."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    add = _adder(edit, base, nodes, inits)
    tail = add.node("Shape", [output], "out_shape", start=2)
    target = add.node("Concat", [add.const([-1]), tail], "out_folded_shape", axis=0)
    nodes.append(
        onnx.helper.make_node(
            "Reshape", [output, target], [result], name=edit.unique(f"{base}/fold_heads")
        )
    )
    for tensor in inits:
        edit.add_initializer(tensor)
    return nodes


class _adder:
    """Nodes and int64 constants named under `base`, appended to the given lists."""

    def __init__(self, edit: GraphEdit, base: str, nodes: list, inits: list) -> None:
        self.edit, self.base, self.inits = edit, base, inits
        self.node = node_adder(edit, base, nodes)

    def const(self, value: list[int]) -> str:
        name = self.edit.unique(f"{self.base}/view_dims")
        self.inits.append(numpy_helper.from_array(np.array(value, np.int64), name))
        return name

    def heads(self, tensor: str, batch_heads: tuple[int, int], what: str) -> str:
        """[B·H, a, b] → [B, H, a, b]."""
        tail = self.node("Shape", [tensor], f"{what}_shape", start=1)
        target = self.node("Concat", [self.const(list(batch_heads)), tail], f"{what}_4d", axis=0)
        return self.node("Reshape", [tensor, target], f"{what}_heads")
