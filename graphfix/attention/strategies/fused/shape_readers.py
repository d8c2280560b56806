"""Scores also read by `Shape` (GPT-2-style exports slicing a causal buffer to the scores' own
length): the Shape nodes stay, recomputed from Q and K, since the node leaves no scores tensor.

Q·Kᵀ's shape for operands of one rank is max(Q, Kᵀ) over the batch axes (broadcasting), then
S from Q and T from K; the scale, softcap and cast steps keep that shape, and each mask or bias
added before the Shape's tensor may widen it (a [B, 1, S, T] mask on scores of batch 1): its
shape, right-aligned, joins the max.  A Shape of the scores after a reshape or a sink Concat is
not recomputed (falls back)."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from graphfix.attention.match_types import (
    AttentionMatch,
    BiasStep,
    MaskStep,
    ReshapeStep,
    SinkStep,
)
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.operands import Operands
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex


@dataclass(frozen=True)
class ShapeReader:
    """A Shape node's view of the scores: the tensor it reads, and the masks and biases
    broadcast into the scores before that tensor (they may widen its batch axes)."""

    tensor: str
    widened_by: tuple[str, ...]


def shape_readers(index: GraphIndex, match: AttentionMatch) -> dict[int, ShapeReader]:
    """Position of each Shape node that reads the scores before any reshape → what it reads."""
    scores = [(match.qk.node.output[0], ())]
    widened_by: tuple[str, ...] = ()
    for step in match.score_steps:
        if isinstance(step, (ReshapeStep, SinkStep)):
            break
        if isinstance(step, MaskStep):
            widened_by += (step.source, step.fill_tensor)
        elif isinstance(step, BiasStep):
            widened_by += (step.source,)
        scores.append((step.output, widened_by))
    return {
        index.position(consumer): ShapeReader(tensor, widened)
        for tensor, widened in scores
        for consumer in index.consumers_of(tensor)
        if consumer.op_type == "Shape"
    }


def recompute_shapes(
    edit: GraphEdit, base: str, operands: Operands, readers: dict[int, ShapeReader]
) -> dict[int, list[onnx.NodeProto]]:
    """Position of each Shape reader → the nodes computing its output from Q and K."""
    if not readers:
        return {}
    index = edit.index
    made = {o for n in operands.nodes for o in n.output}
    rank = index.rank(operands.q)
    if operands.q in made or operands.k in made or operands.output_perm is not None:
        raise Unsupported(
            FallbackKind.ESCAPES,
            "the scores are also read by Shape, and Q or K is rebuilt for the node (a layout, "
            "a sink key or a view): the shape cannot be recomputed before it",
        )
    if rank is None or index.rank(operands.k) != rank or rank < 3:
        raise Unsupported(
            FallbackKind.ESCAPES, "the scores are also read by Shape, and Q's and K's ranks differ"
        )
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for position, read in readers.items():
        reader = index.graph.node[position]
        if index.rank(read.tensor) not in (None, rank):
            raise Unsupported(
                FallbackKind.ESCAPES,
                f"Shape '{reader.name}' reads scores of another rank than Q's (a broadcast mask)",
            )
        nodes: list[onnx.NodeProto] = []
        add = node_adder(edit, base, nodes)
        keys = (-1, None) if operands.k_transposed else (-2, -1)
        batch = add(
            "Max",
            [
                add("Shape", [operands.q], "q_batch_shape", end=-2),
                add("Shape", [operands.k], "k_batch_shape", end=-2),
            ],
            "scores_batch_shape",
        )
        t_attrs = {"start": keys[0]} | ({} if keys[1] is None else {"end": keys[1]})
        full = add(
            "Concat",
            [
                batch,
                add("Shape", [operands.q], "q_rows", start=-2, end=-1),
                add("Shape", [operands.k], "k_keys", **t_attrs),
            ],
            "scores_shape",
            axis=0,
        )
        for tensor in read.widened_by:
            full = _widened(edit, add, full, tensor, rank, reader.name)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in reader.attribute}
        nodes.append(_sliced(edit, base, full, reader.output[0], attrs, rank))
        replaced[position] = nodes
    return replaced


def _widened(edit: GraphEdit, add, full: str, tensor: str, rank: int, reader: str) -> str:
    """The scores' shape after broadcasting `tensor` (a mask, a fill, a bias) into it: the
    elementwise max with its shape, right-aligned (valid broadcasting: each dim 1 or equal)."""
    tensor_rank = edit.index.rank(tensor)
    if tensor_rank == 0:
        return full
    if tensor_rank is None or tensor_rank > rank:
        what = "unknown" if tensor_rank is None else "above the scores' rank"
        raise Unsupported(
            FallbackKind.ESCAPES,
            f"Shape '{reader}' reads scores widened by '{tensor}', whose rank is {what}",
        )
    shape = add("Shape", [tensor], "mask_shape")
    if tensor_rank < rank:
        ones = edit.unique(f"{full}_leading_ones")
        edit.add_initializer(
            onnx.helper.make_tensor(
                ones, onnx.TensorProto.INT64, [rank - tensor_rank], [1] * (rank - tensor_rank)
            )
        )
        shape = add("Concat", [ones, shape], "mask_shape_aligned", axis=0)
    return add("Max", [full, shape], "scores_shape_widened")


def _sliced(
    edit: GraphEdit, base: str, full: str, output: str, attrs: dict, rank: int
) -> onnx.NodeProto:
    """Shape's start/end on the full shape (Shape-15 clamps as Slice does)."""
    if not attrs:
        return onnx.helper.make_node("Identity", [full], [output], name=edit.unique(f"{base}/Id"))
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    names = []
    for value, what in ((start, "shape_start"), (end, "shape_end")):
        name = edit.unique(f"{base}/{what}")
        edit.add_initializer(onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value]))
        names.append(name)
    return onnx.helper.make_node(
        "Slice", [full, *names], [output], name=edit.unique(f"{base}/Slice")
    )
