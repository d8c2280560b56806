"""5-D attention (NesT's and Twins' locally-grouped windows: Q, K, V as [B, W, H, N, D]) read
as the node's 4-D layout: the two leading axes merged ([B·W, H, N, D]) and the output split
back to Q's leading axes.  Pure data movement: exact.  A mask or bias of rank 4 or more would
broadcast against the split axes, so only lower ranks (the same for every window) are read."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch, BiasStep, MaskStep
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.operands import Operands
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit


def fold_leading(edit: GraphEdit, match: AttentionMatch, base: str, operands: Operands) -> Operands:
    """Q, K (or Kᵀ) and V [A, W, ·, ·, ·] as [A·W, ·, ·, ·]; `unfold_like` names the Q whose
    leading axes the output takes back."""
    index = edit.index
    if match.sink is not None or operands.output_perm is not None:
        raise Unsupported(
            FallbackKind.OPERANDS, "5-D attention with an attention sink or an Einsum layout"
        )
    for step in match.steps:
        if isinstance(step, (MaskStep, BiasStep)):
            rank = index.rank(step.source)
            if rank is None or rank > 3:
                raise Unsupported(
                    FallbackKind.MASK,
                    f"a mask or bias '{step.source}' of rank {rank} on 5-D attention scores",
                )
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    add = node_adder(edit, base, nodes)
    minus_one = edit.unique(f"{base}/merged_axis")
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), minus_one))

    def merged(tensor: str, what: str) -> str:
        tail = add("Shape", [tensor], f"{what}_inner_shape", start=2)
        target = add("Concat", [minus_one, tail], f"{what}_4d_shape", axis=0)
        return add("Reshape", [tensor, target], f"{what}_4d")

    folded = operands.read_through(
        merged(operands.q, "q"),
        merged(operands.k, "k"),
        merged(operands.v, "v"),
        nodes,
        inits,
        "5-D windows merged into the batch and split back",
    )
    return dataclasses.replace(folded, unfold_like=operands.q)


def unfold(edit: GraphEdit, base: str, output: str, like: str, result: str) -> list:
    """Reshape the node's [A·W, H, S, Dv] `output` to [A, W, H, S, Dv] (A, W from `like`)."""
    nodes: list[onnx.NodeProto] = []
    add = node_adder(edit, base, nodes)
    outer = add("Shape", [like], "window_axes", end=2)
    inner = add("Shape", [output], "out_inner", start=1)
    target = add("Concat", [outer, inner], "out_5d_shape", axis=0)
    nodes.append(
        onnx.helper.make_node(
            "Reshape", [output, target], [result], name=edit.unique(f"{base}/split_windows")
        )
    )
    return nodes
