"""Q, K, V, the scale and the layout ops around the node, read from a match's layout and
scale steps (Einsum layouts, run-time √scale on Q and Kᵀ, float16 V promoted by the exporter)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import (
    AttentionMatch,
    KTransposedBy,
    Layout,
    ScaleSide,
    ScaleStep,
)
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.runtime_scale import scale_q_at_run_time
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import PLUGIN_ELEMENT_TYPES


@dataclass(frozen=True)
class Operands:
    q: str
    k: str
    v: str
    k_transposed: bool
    scale: float
    cast_output_to: int | None  # Cast the node's output to this type (float16 V promoted)
    nodes: tuple[onnx.NodeProto, ...] = ()  # Transposes/Unsqueezes into the node's layout
    initializers: tuple[onnx.TensorProto, ...] = ()
    output_perm: tuple[int, ...] | None = None  # Transpose the node's output into the graph's
    describe: str = ""
    v_widened: bool = False  # V (float16/bfloat16) Cast to Q's float32 by the rewrite
    unfold_like: str | None = None  # 5-D Q whose two leading axes the output is split back to

    def read_through(
        self,
        q: str,
        k: str,
        v: str,
        nodes: list[onnx.NodeProto],
        initializers: list[onnx.TensorProto],
        note: str,
    ) -> Operands:
        """These operands as the node reads them after `nodes` (appended), `note` said."""
        return dataclasses.replace(
            self,
            q=q,
            k=k,
            v=v,
            nodes=(*self.nodes, *nodes),
            initializers=(*self.initializers, *initializers),
            describe=", ".join(filter(None, [self.describe, note])),
        )


def plan_operands(edit: GraphEdit, match: AttentionMatch, base: str) -> Operands:
    index = edit.index
    layout = match.layout
    assert layout is not None
    qk = match.qk.node
    scores_factors = [
        s for s in match.steps if isinstance(s, ScaleStep) and s.side is ScaleSide.SCORES
    ]
    operand_factors = [
        s for s in match.steps if isinstance(s, ScaleStep) and s.side in (ScaleSide.Q, ScaleSide.K)
    ]
    at_run_time = [s for s in scores_factors if s.factor is None]
    scale = math.prod(s.factor for s in scores_factors if s.factor is not None)
    if any(s.factor is None for s in operand_factors):
        # √scale computed at run time on Q and Kᵀ (the legacy SDPA decomposition): keep those
        # Muls outside the node and read the operands as the product reads them.
        q, k_operand = qk.input[0], qk.input[1]
        k_at_product = True
    else:
        scale *= math.prod(s.factor for s in operand_factors)
        q, k_operand = match.q, match.k_t
        k_at_product = False
    ranks = {index.rank(q), index.rank(match.v)}
    if not (ranks <= {3, 4} or (ranks == {5} and layout.qk_op == "MatMul")):
        raise Unsupported(
            FallbackKind.OPERANDS,
            f"Q/V ranks {sorted(r for r in ranks if r)} (the node takes 3-D or 4-D, 5-D windows "
            "of MatMuls merged)",
        )
    if layout.qk_op == "Einsum":
        if at_run_time:
            raise Unsupported(
                FallbackKind.SCALE,
                "the scale on the scores is computed at run time in an Einsum layout "
                "(`graphfix inspect` shows how)",
            )
        if layout.pv_op != "Einsum":
            raise Unsupported(FallbackKind.OPERANDS, "a MatMul P·V after an Einsum Q·Kᵀ")
        q, k, v, cast_to = _types(index, match, q, k_operand)
        if index.elem_type(v) != index.elem_type(q):
            raise Unsupported(
                FallbackKind.TYPES, "Q and K float32 with V float16 in an Einsum layout"
            )
        return _einsum_operands(edit, base, layout, q, k, v, scale, cast_to)
    elif layout.pv_op == "Einsum":
        raise Unsupported(FallbackKind.OPERANDS, "an Einsum P·V after a MatMul Q·Kᵀ")
    elif (
        not k_at_product
        and layout.k_transposed_by is KTransposedBy.TRANSPOSE
        and _swaps_last_two(layout.k_perm, layout.k_rank)
    ):
        k, k_transposed = match.k, False
    else:
        if index.rank(k_operand) not in (3, 4, 5):
            raise Unsupported(FallbackKind.OPERANDS, "Kᵀ is not 3-D, 4-D or 5-D")
        k, k_transposed = k_operand, True
    q, k, v, cast_to = _types(index, match, q, k)
    nodes: tuple[onnx.NodeProto, ...] = ()
    notes = []
    widened = index.elem_type(v) != index.elem_type(q)
    if widened:
        wide = edit.unique(f"{base}/v_float32")
        cast = onnx.helper.make_node(
            "Cast", [v], [wide], name=edit.unique(f"{base}/widen_v"), to=onnx.TensorProto.FLOAT
        )
        v, nodes = wide, (cast,)
        notes.append("Q and K float32, V widened to float32 and the output Cast back")
    if at_run_time:
        q, scaled = scale_q_at_run_time(edit, base, q, at_run_time)
        nodes += scaled
        notes.append("a scale computed at run time, moved onto Q")
    return Operands(
        q, k, v, k_transposed, scale, cast_to, nodes, describe=", ".join(notes), v_widened=widened
    )


def _types(
    index: GraphIndex, match: AttentionMatch, q: str, k: str
) -> tuple[str, str, str, int | None]:
    """Q, K and V of one element type; a float16 V the legacy exporter Cast to float32 (with
    everything after it) is read before the Cast, and the node's output is Cast to float32.
    Q and K in float32 with V in float16/bfloat16 (P Cast down for P·V): V is returned as it is
    with cast_to its type; the caller widens it to float32 (exact) and the node's output is Cast
    back to P·V's type, so the node's P keeps float32 where the original rounded it."""
    v = match.v
    pv = match.pv.node
    types = {name: index.elem_type(name) for name in (q, k, v)}
    if None in types.values():
        raise Unsupported(
            FallbackKind.TYPES, "element types of Q, K, V are unknown (run shape inference first)"
        )
    cast_to = None
    if types[v] != types[q] and types[q] == types[k]:
        producer = index.producer_of(v)
        if (
            producer is not None
            and producer.op_type == "Cast"
            and index.elem_type(producer.input[0]) == types[q]
            and len(index.consumers_of(v)) == 1
        ):
            cast_to, v = types[v], producer.input[0]
        elif types[q] == onnx.TensorProto.FLOAT and types[v] in _NARROW:
            cast_to = types[v]  # V is widened by the caller
    v_type = types[q] if cast_to is not None else types[v]
    if len({types[q], types[k], v_type}) != 1 or types[q] not in PLUGIN_ELEMENT_TYPES:
        raise Unsupported(
            FallbackKind.TYPES,
            "Q, K and V must share one of float32/float16/bfloat16, got "
            + ", ".join(onnx.TensorProto.DataType.Name(index.elem_type(t)) for t in (q, k, v)),
        )
    out = index.elem_type(pv.output[0])
    if out is not None and out != (cast_to or types[q]):
        raise Unsupported(FallbackKind.TYPES, "P·V's element type differs from Q's")
    return q, k, v, cast_to


_NARROW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _swaps_last_two(perm: tuple[int, ...] | None, rank: int | None) -> bool:
    """The Transpose between K and Q·Kᵀ swaps only the last two axes."""
    if perm is None or len(perm) not in (3, 4, 5) or (rank is not None and rank != len(perm)):
        return False
    n = len(perm)
    return list(perm) == [*range(n - 2), n - 1, n - 2]


def _einsum_operands(
    edit: GraphEdit,
    base: str,
    layout: Layout,
    q: str,
    k: str,
    v: str,
    scale: float,
    cast_to: int | None,
) -> Operands:
    """Einsum Q·Kᵀ and P·V in any letters and axis orders, with K/V heads optional
    (multi-query `bhid,bjd->bhij`): Transposes and Unsqueezes bring Q, K, V into the node's
    [B, H, S, D] layout (pure data movement, exact) and one Transpose takes the output back."""
    reason = (
        f"Einsum {layout.qk_equation} / {layout.pv_equation}: the node takes products over the "
        "last axis of Q and K with the same batch and head axes"
    )
    try:
        (q_sub, k_sub), s_sub = _split_equation(layout.qk_equation)
        (p_sub, v_sub), o_sub = _split_equation(layout.pv_equation)
    except ValueError:
        raise Unsupported(FallbackKind.OPERANDS, reason) from None
    if len(s_sub) not in (3, 4) or len(p_sub) != len(s_sub):
        raise Unsupported(FallbackKind.OPERANDS, reason)
    batch, i, j = s_sub[:-2], s_sub[-2], s_sub[-1]
    contracted = set(q_sub) - set(s_sub)
    if len(contracted) != 1:
        raise Unsupported(FallbackKind.OPERANDS, reason)
    (d,) = contracted
    if set(q_sub) != {*batch, i, d} or not set(k_sub) <= {*batch, j, d}:
        raise Unsupported(FallbackKind.OPERANDS, reason)
    # P·V: P's letters name the axes of the scores by position
    rename = dict(zip(p_sub, s_sub, strict=True))
    extra = [c for c in v_sub if c not in rename]
    if len(extra) != 1:
        raise Unsupported(FallbackKind.OPERANDS, reason)
    (e,) = extra
    rename[e] = e if e not in s_sub and e != d else "\0"
    v_named = "".join(rename[c] for c in v_sub)
    o_named = "".join(rename.get(c, "?") for c in o_sub)
    want_out = (*batch, i, rename[e])
    if sorted(o_named) != sorted(want_out) or not set(v_named) <= {*batch, j, rename[e]}:
        raise Unsupported(FallbackKind.OPERANDS, reason)
    for sub in (k_sub, v_named):
        if batch[0] not in sub or j not in sub:
            raise Unsupported(FallbackKind.OPERANDS, reason)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    notes: list[str] = []

    def to_layout(tensor: str, sub: str, want: tuple[str, ...], what: str) -> str:
        present = [c for c in want if c in sub]
        perm = [sub.index(c) for c in present]
        if perm != list(range(len(sub))):
            out = edit.unique(f"{base}/{what}_bhsd")
            nodes.append(
                onnx.helper.make_node(
                    "Transpose",
                    [tensor],
                    [out],
                    name=edit.unique(f"{base}/{what}_Transpose"),
                    perm=perm,
                )
            )
            tensor = out
            notes.append(f"{what} transposed")
        missing = [want.index(c) for c in want if c not in sub]
        if missing:
            axes = edit.unique(f"{base}/{what}_axes")
            inits.append(numpy_helper.from_array(np.array(missing, dtype=np.int64), axes))
            out = edit.unique(f"{base}/{what}_one_head")
            nodes.append(
                onnx.helper.make_node(
                    "Unsqueeze", [tensor, axes], [out], name=edit.unique(f"{base}/{what}_Unsqueeze")
                )
            )
            tensor = out
            notes.append(f"{what} shared by all heads")
        return tensor

    q = to_layout(q, q_sub, (*batch, i, d), "q")
    k = to_layout(k, k_sub, (*batch, j, d), "k")
    v = to_layout(v, v_named, (*batch, j, rename[e]), "v")
    output_perm = tuple(want_out.index(c) for c in o_named)
    if output_perm == tuple(range(len(output_perm))):
        output_perm = None
    else:
        notes.append("output transposed")
    return Operands(
        q,
        k,
        v,
        False,
        scale,
        cast_to,
        tuple(nodes),
        tuple(inits),
        output_perm,
        f"Einsum layout: {', '.join(notes)}" if notes else "",
    )


def _split_equation(equation: str | None) -> tuple[tuple[str, str], str]:
    """ "ab,cd->ef" → (("ab", "cd"), "ef"); ValueError for anything else (ellipses, repeats)."""
    if equation is None or "..." in equation or "->" not in equation:
        raise ValueError(equation)
    inputs, output = equation.split("->")
    operands = inputs.split(",")
    if len(operands) != 2 or any(len(set(t)) != len(t) for t in (*operands, output)):
        raise ValueError(equation)
    if not all(t.isalpha() for t in (*operands, output)):
        raise ValueError(equation)
    return (operands[0], operands[1]), output
