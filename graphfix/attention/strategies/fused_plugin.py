"""fused_plugin: the whole chain becomes one GraphfixAttention node (plugin_spec.ATTENTION).

Myelin cannot see inside a plugin, so the fusion is broken as surely as with the softmax plugin,
but the plugin is itself a fused kernel: no unfused MatMul→Softmax→MatMul chain at run time.
The node is built from the match's typed steps (match_types.ChainStep), read in order; a chain
with a step the node cannot express (a Reshape of the scores, Q/DQ on the scores or
probabilities, an attention sink, a scale computed at run time on the scores, probabilities used
elsewhere, ...) falls back to the GraphfixSoftmax plugin, and the report says why.

Masks and biases combine outside the node into its one mask input, with standard ONNX ops, where
that is exact: several biases are summed; several boolean masks with one fill are And-ed;
boolean masks with fill -inf and biases become Where(keep, Σ bias, -inf) (a finite fill would
change rows whose every key is blocked, so that falls back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import (
    AttentionMatch,
    BiasStep,
    CastStep,
    KTransposedBy,
    MaskKind,
    MaskStep,
    NanGuardStep,
    PassStep,
    QdqStep,
    ReshapeStep,
    ScaleSide,
    ScaleStep,
    ShiftStep,
    SinkStep,
    SoftcapStep,
)
from graphfix.attention.strategies.base import Outcome
from graphfix.attention.strategies.plugin import PluginStrategy
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import (
    ATTENTION,
    PLUGIN_ELEMENT_TYPES,
    ensure_plugin_opset,
    make_attention_node,
)


class _Unsupported(Exception):
    """Internal: why this chain cannot become one GraphfixAttention node."""


@dataclass(frozen=True)
class _MaskPlan:
    """The node's mask input, and the standard ops that build it from the chain's masks."""

    tensor: str | None
    fill: float | None  # BOOL mask: the fill; additive or no mask: None
    nodes: tuple[onnx.NodeProto, ...] = ()
    initializers: tuple[onnx.TensorProto, ...] = ()
    causal: bool = False
    describe: str = ""


@dataclass(frozen=True)
class _Operands:
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


class FusedPluginStrategy:
    name = "fused_plugin"
    proven = True
    summary = (
        "replace the whole attention chain by one GraphfixAttention plugin node (a fused, "
        "float32-accumulating kernel); falls back to GraphfixSoftmax where the node cannot "
        "express the chain"
    )

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        index = edit.index
        base = match.softmax or f"graphfix_attention_{match.index}"
        try:
            softcap = _read_steps(match)
            operands = _operands(edit, match, base)
            mask = _mask_plan(edit, match, base, operands.q)
            removed = _removed_positions(index, match, operands, mask)
        except _Unsupported as reason:
            fallback = PluginStrategy().apply(edit, match)
            return Outcome(fallback.rewritten, f"fell back to {fallback.detail}: {reason}")
        pv = edit.node_at(match.chain_positions[-1])
        nodes = [*operands.nodes, *mask.nodes]
        for tensor in (*operands.initializers, *mask.initializers):
            edit.add_initializer(tensor)
        inputs = [operands.q, operands.k, operands.v]
        if mask.tensor is not None:
            inputs.append(mask.tensor)
        output = pv.output[0]
        node_output = output
        if operands.cast_output_to is not None or operands.output_perm is not None:
            node_output = edit.unique(f"{base}/out")
        if operands.output_perm is not None:
            transposed = output if operands.cast_output_to is None else edit.unique(f"{base}/out_t")
        nodes.append(
            make_attention_node(
                inputs,
                node_output,
                scale=operands.scale,
                k_transposed=operands.k_transposed,
                causal=mask.causal,
                softcap=softcap,
                mask_fill=-math.inf if mask.fill is None else mask.fill,
                nan_to_zero=match.nan_guard is not None,
                name=edit.unique(f"{base}/GraphfixAttention"),
            )
        )
        if operands.output_perm is not None:
            nodes.append(
                onnx.helper.make_node(
                    "Transpose",
                    [node_output],
                    [transposed],
                    name=edit.unique(f"{base}/to_graph_layout"),
                    perm=list(operands.output_perm),
                )
            )
            node_output = transposed
        if operands.cast_output_to is not None:
            nodes.append(
                onnx.helper.make_node(
                    "Cast",
                    [node_output],
                    [output],
                    name=edit.unique(f"{base}/to_graph_type"),
                    to=operands.cast_output_to,
                )
            )
        for position in removed:
            edit.replace(position, nodes if position == match.chain_positions[-1] else [])
        edit.drop_if_unused({i for p in removed for i in edit.node_at(p).input})
        edit.annotate(output)
        ensure_plugin_opset(edit.model)
        features = [f"scale {operands.scale:.6g}"]
        if mask.describe:
            features.append(mask.describe)
        features += [f for f, on in (("causal", mask.causal), ("softcap", softcap)) if on]
        if operands.cast_output_to is not None:
            features.append("float16 V read before the exporter's float32 promotion")
        if operands.describe:
            features.append(operands.describe)
        detail = f"chain → {ATTENTION.op_type} ({', '.join(features)})"
        if index.elem_type(match.q) == onnx.TensorProto.FLOAT or softcap:
            detail += (
                "; note: float32 and softcap run on graphfix's own kernel, slower than the "
                "unfused chain"
            )
        return Outcome(True, detail)


# The node computes scale → softcap → mask, in this order.
_STAGE = {ScaleStep: 0, SoftcapStep: 1, MaskStep: 2, BiasStep: 2}


def _read_steps(match: AttentionMatch) -> float:
    """Check that the steps fit the node's order and features; return the softcap (0: none)."""
    stage, softcap = 0, 0.0
    for step in match.steps:
        if isinstance(step, ScaleStep) and step.side is not ScaleSide.SCORES:
            continue  # on Q or K: read by _operands
        if isinstance(step, (CastStep, PassStep, ShiftStep)):
            continue
        if isinstance(step, ReshapeStep):
            continue  # only Swin's window view is expressible; _mask_plan reads it
        if isinstance(step, QdqStep):
            raise _Unsupported(
                f"the scores are quantized ({step.quantize} → {step.dequantize}); the node has "
                "no Q/DQ inside"
            )
        if isinstance(step, SinkStep):  # not a score step today; kept for completeness
            raise _Unsupported("an attention sink")
        order = _STAGE[type(step)]
        if order < stage:
            what = "scales" if order == 0 else "soft-caps"
            raise _Unsupported(f"'{_node_of(step)}' {what} the scores after the mask")
        stage = order
        if isinstance(step, SoftcapStep):
            if step.cap is None:
                raise _Unsupported("a Tanh whose softcap value is not a constant")
            if softcap:
                raise _Unsupported("two softcaps")
            softcap = step.cap
    if match.sink is not None:
        raise _Unsupported(
            f"an attention sink ('{match.sink.sink}' concatenated to the scores); the "
            f"{ATTENTION.op_type} node has no sink input in version {ATTENTION.version}"
        )
    for step in match.after:
        if isinstance(step, (CastStep, PassStep, NanGuardStep)):
            continue
        if isinstance(step, QdqStep):
            raise _Unsupported(
                f"the probabilities are quantized ({step.quantize} → {step.dequantize}) before "
                "P·V; the node has no Q/DQ inside"
            )
        raise _Unsupported(f"{step.op} '{step.node}' between the Softmax and P·V")
    return softcap


def _node_of(step: object) -> str:
    return getattr(step, "node", "") or "/".join(getattr(step, "nodes", ()))


def _shape(shape: tuple | None) -> str:
    return (
        "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    )


def _operands(edit: GraphEdit, match: AttentionMatch, base: str) -> _Operands:
    index = edit.index
    layout = match.layout
    assert layout is not None
    qk = index.graph.node[match.chain_positions[0]]
    scores_factors = [
        s for s in match.steps if isinstance(s, ScaleStep) and s.side is ScaleSide.SCORES
    ]
    operand_factors = [
        s for s in match.steps if isinstance(s, ScaleStep) and s.side in (ScaleSide.Q, ScaleSide.K)
    ]
    if any(s.factor is None for s in scores_factors):
        raise _Unsupported(
            "the scale on the scores is computed at run time (`graphfix inspect` shows how)"
        )
    scale = math.prod(s.factor for s in scores_factors)
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
    if not ranks <= {3, 4}:
        raise _Unsupported(f"Q/V ranks {sorted(r for r in ranks if r)} (the node takes 3-D or 4-D)")
    if layout.qk_op == "Einsum":
        if layout.pv_op != "Einsum":
            raise _Unsupported("a MatMul P·V after an Einsum Q·Kᵀ")
        q, k, v, cast_to = _types(index, match, q, k_operand)
        return _einsum_operands(edit, base, layout, q, k, v, scale, cast_to)
    elif layout.pv_op == "Einsum":
        raise _Unsupported("an Einsum P·V after a MatMul Q·Kᵀ")
    elif (
        not k_at_product
        and layout.k_transposed_by is KTransposedBy.TRANSPOSE
        and _swaps_last_two(layout.k_perm, layout.k_rank)
    ):
        k, k_transposed = match.k, False
    else:
        if index.rank(k_operand) not in (3, 4):
            raise _Unsupported("Kᵀ is not 3-D or 4-D")
        k, k_transposed = k_operand, True
    q, k, v, cast_to = _types(index, match, q, k)
    return _Operands(q, k, v, k_transposed, scale, cast_to)


def _types(
    index: GraphIndex, match: AttentionMatch, q: str, k: str
) -> tuple[str, str, str, int | None]:
    """Q, K and V of one element type; a float16 V the legacy exporter Cast to float32 (with
    everything after it) is read before the Cast, and the node's output is Cast to float32."""
    v = match.v
    pv = index.graph.node[match.chain_positions[-1]]
    types = {name: index.elem_type(name) for name in (q, k, v)}
    if None in types.values():
        raise _Unsupported("element types of Q, K, V are unknown (run shape inference first)")
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
            types[v] = types[q]
    if len({types[q], types[k], types[v]}) != 1 or types[q] not in PLUGIN_ELEMENT_TYPES:
        raise _Unsupported(
            "Q, K and V must share one of float32/float16/bfloat16, got "
            + ", ".join(onnx.TensorProto.DataType.Name(types[t]) for t in (q, k, v))
        )
    out = index.elem_type(pv.output[0])
    if out is not None and out != (cast_to or types[q]):
        raise _Unsupported("P·V's element type differs from Q's")
    return q, k, v, cast_to


def _swaps_last_two(perm: tuple[int, ...] | None, rank: int | None) -> bool:
    """The Transpose between K and Q·Kᵀ swaps only the last two axes."""
    if perm is None or len(perm) not in (3, 4) or (rank is not None and rank != len(perm)):
        return False
    n = len(perm)
    return list(perm) == [*range(n - 2), n - 1, n - 2]


def _einsum_operands(
    edit: GraphEdit,
    base: str,
    layout,
    q: str,
    k: str,
    v: str,
    scale: float,
    cast_to: int | None,
) -> _Operands:
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
        raise _Unsupported(reason) from None
    if len(s_sub) not in (3, 4) or len(p_sub) != len(s_sub):
        raise _Unsupported(reason)
    batch, i, j = s_sub[:-2], s_sub[-2], s_sub[-1]
    contracted = set(q_sub) - set(s_sub)
    if len(contracted) != 1:
        raise _Unsupported(reason)
    (d,) = contracted
    if set(q_sub) != {*batch, i, d} or not set(k_sub) <= {*batch, j, d}:
        raise _Unsupported(reason)
    # P·V: P's letters name the axes of the scores by position
    rename = dict(zip(p_sub, s_sub, strict=True))
    extra = [c for c in v_sub if c not in rename]
    if len(extra) != 1:
        raise _Unsupported(reason)
    (e,) = extra
    rename[e] = e if e not in s_sub and e != d else "\0"
    v_named = "".join(rename[c] for c in v_sub)
    o_named = "".join(rename.get(c, "?") for c in o_sub)
    want_out = (*batch, i, rename[e])
    if sorted(o_named) != sorted(want_out) or not set(v_named) <= {*batch, j, rename[e]}:
        raise _Unsupported(reason)
    for sub in (k_sub, v_named):
        if batch[0] not in sub or j not in sub:
            raise _Unsupported(reason)
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
    return _Operands(
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


def _mask_plan(edit: GraphEdit, match: AttentionMatch, base: str, q: str) -> _MaskPlan:
    """The node's one mask input from the chain's Where masks and additive biases."""
    index = edit.index
    wheres = [s for s in match.steps if isinstance(s, MaskStep)]
    windows = _windowed_biases(match)
    biases = [s for s in match.steps if isinstance(s, BiasStep)]
    if not wheres and not biases:
        return _MaskPlan(None, None)
    if windows and wheres:
        raise _Unsupported("a Where mask in a chain with Swin's window view of the scores")
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def add(op: str, inputs: list[str], **attrs) -> str:
        out = edit.unique(f"{base}/{op.lower()}_mask")
        nodes.append(
            onnx.helper.make_node(op, inputs, [out], name=edit.unique(f"{base}/{op}"), **attrs)
        )
        return out

    def const(value: list[int]) -> str:
        name = edit.unique(f"{base}/mask_shape")
        inits.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
        return name

    def unwindow(source: str, windows_per_image: int) -> str:
        """bias [1|B, nW, h, n, m] as the node sees it: [B·nW, h, n, m] (B from Q's batch)."""
        shape = index.shape(source)
        if shape is None or len(shape) != 5 or not all(isinstance(d, int) for d in shape[2:]):
            raise _Unsupported(f"the windowed mask '{source}' has no static 5-D shape")
        images = add(
            "Div",
            [add("Gather", [add("Shape", [q]), const([0])], axis=0), const([windows_per_image])],
        )
        target = add("Concat", [images, const([windows_per_image, 1, 1, 1])], axis=0)
        return add("Reshape", [add("Expand", [source, target]), const([-1, *shape[2:]])])

    bias = None
    if biases:
        types = {index.elem_type(b.source) for b in biases}
        if len(types) != 1 or None in types:
            raise _Unsupported("the additive masks/biases have different or unknown element types")
        sources = [
            unwindow(b.source, windows[id(b)]) if id(b) in windows else b.source for b in biases
        ]
        bias = sources[0]
        for extra in sources[1:]:  # (s + m1) + m2 as s + (m1 + m2): same to rounding
            bias = add("Add", [bias, extra])
    keep = None
    fill = None
    if wheres:
        fills = {w.fill for w in wheres}
        if None in fills:
            raise _Unsupported(
                f"Where '{wheres[0].node}' fills masked scores with a non-constant value"
            )
        if len(fills) != 1:
            raise _Unsupported(f"Where masks with different fills ({sorted(fills)})")
        (fill,) = fills
        for where in wheres:
            this = where.source
            if where.kind is MaskKind.BLOCKED:
                this = add("Not", [this])
            keep = this if keep is None else add("And", [keep, this])
    if keep is None:
        what = "additive mask, per-window mask tiled over images" if windows else "additive mask"
        plan = _MaskPlan(bias, None, tuple(nodes), tuple(inits), describe=what)
    elif bias is None:
        plan = _MaskPlan(keep, fill, tuple(nodes), tuple(inits), describe="boolean mask")
    else:
        if fill != -math.inf and not _keeps_a_key_per_row(index, wheres, fill):
            raise _Unsupported(
                f"a Where mask with the finite fill {fill:g} combined with an additive bias: "
                "folding them into one mask would change rows whose every key is blocked"
            )
        elem = index.elem_type(bias)
        blocked = edit.unique(f"{base}/blocked_fill")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        inits.append(numpy_helper.from_array(np.array(fill, dtype=dtype), blocked))
        mask = add("Where", [keep, bias, blocked])
        plan = _MaskPlan(mask, None, tuple(nodes), tuple(inits), describe="boolean mask with bias")
    single = wheres[0] if len(wheres) == 1 and not biases else None
    source = (
        single.source if single else (biases[0].source if len(biases) == 1 and not wheres else None)
    )
    if (
        source is not None
        and not windows
        and match.causal
        and match.q_len is not None
        and match.q_len == match.kv_len
        and _is_pure_causal(index, source, single)
    ):
        return _MaskPlan(None, None, causal=True)
    return plan


def _keeps_a_key_per_row(index: GraphIndex, wheres: list[MaskStep], fill: float) -> bool:
    """Constant Where masks that leave every row a kept key, with a fill that is -inf in effect.

    Then where(keep, s, fill) + b and s + where(keep, b, fill) give the same probabilities: a
    blocked score is fill (+ a bias that rounds away) on both sides, exp(fill - row max)
    underflows to 0 because the row max is a kept, finite score, and no row is all blocked.
    """
    if fill > -1e4:
        return False
    keep = None
    for where in wheres:
        value = index.constant_value(where.source)
        if value is None or value.dtype != bool:
            return False
        this = ~value if where.kind is MaskKind.BLOCKED else value
        keep = this if keep is None else keep & this
    return keep is not None and keep.ndim >= 1 and bool(keep.any(axis=-1).all())


def _windowed_biases(match: AttentionMatch) -> dict[int, int]:
    """Swin's shifted-window mask: scores [B·nW, H, N, N] viewed as [B, nW, H, N, N], a bias
    added, viewed back.  Returns id(BiasStep) → nW for the biases inside such a view; any other
    Reshape of the scores is unsupported."""
    windowed: dict[int, int] = {}
    windows: int | None = None
    outer: tuple[int, ...] | None = None
    for step in match.steps:
        if isinstance(step, ReshapeStep):
            target = step.target
            if windows is None and target is not None and len(target) == 5 and target[1] > 0:
                inner = step.input_shape
                if inner is None or len(inner) != 4 or not _agrees(inner[1:], target[2:]):
                    raise _reshape_unsupported(step)
                windows, outer = target[1], target[2:]
                continue
            if windows is not None and target is not None and len(target) == 4:
                if target[0] != -1 or tuple(target[1:]) != tuple(outer):
                    raise _reshape_unsupported(step)
                windows = None
                continue
            raise _reshape_unsupported(step)
        if windows is not None:
            if not isinstance(step, (BiasStep, CastStep, PassStep)):
                raise _Unsupported(f"'{_node_of(step)}' inside Swin's window view of the scores")
            if isinstance(step, BiasStep):
                windowed[id(step)] = windows
    if windows is not None:
        raise _Unsupported("the scores stay in a window view up to the Softmax")
    return windowed


def _agrees(dims: tuple, target: tuple[int, ...]) -> bool:
    return all(not isinstance(d, int) or d == t for d, t in zip(dims, target, strict=True))


def _reshape_unsupported(step: ReshapeStep) -> _Unsupported:
    return _Unsupported(
        f"{step.op} '{step.node}' reshapes the scores inside the chain "
        f"({_shape(step.input_shape)} → {_shape(step.output_shape)})"
    )


def _is_pure_causal(index: GraphIndex, source: str, where: MaskStep | None) -> bool:
    """The mask is a constant that blocks exactly the future (so `causal` can replace it).

    Only then: a mask that also carries padding can block whole rows, and a finite fill such as
    finfo.min then gives a uniform row where -inf gives NaN, so dropping it would not be exact.
    """
    value = index.constant_value(source)
    if value is None or value.ndim < 2 or value.shape[-1] != value.shape[-2]:
        return False
    n = value.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    if value.dtype == bool:
        blocked = value if where is not None and where.kind is MaskKind.BLOCKED else ~value
        return bool((blocked == future).all())
    # A finite fill ≤ -1e4 is -inf in effect: the kept diagonal bounds each row's max, and
    # exp(fill - max) underflows to 0 in float32 for any realistic score.
    return bool((np.where(future, value <= -1e4, value == 0)).all())


def _removed_positions(
    index: GraphIndex, match: AttentionMatch, operands: _Operands, mask: _MaskPlan
) -> list[int]:
    """The chain, its NaN guard's IsNaN, and what fed only the chain; nothing else may read
    a tensor inside the chain."""
    chain = [index.graph.node[p] for p in match.chain_positions]
    pv = chain[-1]
    removed = set(match.chain_positions)
    removed |= _guard_positions(index, match, chain)
    _check_nothing_escapes(index, match, removed, pv)
    sources = (s.source for s in match.steps if isinstance(s, (MaskStep, BiasStep)))
    added = (i for n in (*operands.nodes, *mask.nodes) for i in n.input)
    keep = {operands.q, operands.k, operands.v, mask.tensor, *sources, *added}
    removed |= _dead_ancestors(index, removed, keep)
    return sorted(removed)


def _guard_positions(
    index: GraphIndex, match: AttentionMatch, chain: list[onnx.NodeProto]
) -> set[int]:
    """The IsNaN of a Where(IsNaN(p), 0, p) guard, which the chain list does not name."""
    positions: set[int] = set()
    for node in chain:
        if node.op_type == "Where" and match.nan_guard is not None:
            producer = index.producer_of(node.input[0])
            if producer is not None and producer.op_type == "IsNaN":
                positions.add(index.position(producer))
    return positions


def _check_nothing_escapes(
    index: GraphIndex, match: AttentionMatch, removed: set[int], pv: onnx.NodeProto
) -> None:
    for position in removed:
        node = index.graph.node[position]
        if node is pv:
            continue
        for out in node.output:
            if out in index.graph_outputs:
                raise _Unsupported(f"'{out}' inside the chain is a graph output")
            for consumer in index.consumers_of(out):
                if index.position(consumer) not in removed:
                    raise _Unsupported(
                        f"'{out}' inside the chain is also used by {consumer.op_type} "
                        f"'{consumer.name}' (e.g. returned attention probabilities)"
                    )


def _dead_ancestors(index: GraphIndex, removed: set[int], keep: set[str | None]) -> set[int]:
    """Nodes feeding only the removed chain (K's Transpose, √scale Muls, in-graph scale math)."""
    dead: set[int] = set()
    gone = set(removed)
    frontier = [i for p in removed for i in index.graph.node[p].input if i]
    while frontier:
        tensor = frontier.pop()
        producer = index.producer_of(tensor)
        if producer is None:
            continue
        position = index.position(producer)
        if position in gone or keep.intersection(producer.output):
            continue
        outputs_dead = all(
            out not in index.graph_outputs
            and all(index.position(c) in gone for c in index.consumers_of(out))
            for out in producer.output
            if out
        )
        if outputs_dead:
            gone.add(position)
            dead.add(position)
            frontier.extend(i for i in producer.input if i)
    return dead
