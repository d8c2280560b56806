"""Scores also read by `Shape` (GPT-2-style exports slicing a causal buffer to the scores' own
length): the Shape nodes stay, recomputed from Q and K, since the node leaves no scores tensor.

Q·Kᵀ's shape for operands of one rank is max(Q, Kᵀ) over the batch axes (broadcasting), then
S from Q and T from K; the mask, scale, softcap and cast steps keep that shape.  A Shape of the
scores after a reshape or a sink Concat is not recomputed (falls back)."""

from __future__ import annotations

import onnx

from graphfix.attention.match_types import AttentionMatch, ReshapeStep, SinkStep
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.operands import Operands
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex


def shape_readers(index: GraphIndex, match: AttentionMatch) -> dict[int, str]:
    """Position of each Shape node that reads the scores before any reshape → the tensor read."""
    scores = [match.qk.node.output[0]]
    for step in match.score_steps:
        if isinstance(step, (ReshapeStep, SinkStep)):
            break
        scores.append(step.output)
    return {
        index.position(consumer): tensor
        for tensor in scores
        for consumer in index.consumers_of(tensor)
        if consumer.op_type == "Shape"
    }


def recompute_shapes(
    edit: GraphEdit, base: str, operands: Operands, readers: dict[int, str]
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
    for position, tensor in readers.items():
        reader = index.graph.node[position]
        if index.rank(tensor) not in (None, rank):
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
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in reader.attribute}
        nodes.append(_sliced(edit, base, full, reader.output[0], attrs, rank))
        replaced[position] = nodes
    return replaced


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
