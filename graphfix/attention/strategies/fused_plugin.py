"""fused_plugin: the whole chain becomes one GraphfixAttention node (plugin_spec.ATTENTION).

Myelin cannot see inside a plugin, so the fusion is broken as surely as with the softmax plugin,
but the plugin is itself a fused kernel: no unfused MatMul→Softmax→MatMul chain at run time.
A chain with a feature the node cannot express (heads folded by a Reshape inside the chain, a
scale known only at run time, several masks, probabilities used elsewhere, ...) falls back to the
GraphfixSoftmax plugin, and the report says why.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from graphfix.attention.match_types import AttentionMatch
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

_SCALE_OPS = {"Mul", "Div"}
_TRANSPARENT_AFTER = {"Cast", "Dropout", "Identity"}


class _Unsupported(Exception):
    """Internal: why this chain cannot become one GraphfixAttention node."""


class FusedPluginStrategy:
    name = "fused_plugin"
    proven = True
    summary = (
        "replace the whole attention chain by one GraphfixAttention plugin node (a fused, "
        "float32-accumulating kernel); falls back to GraphfixSoftmax where the node cannot "
        "express the chain"
    )

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        try:
            plan = _plan(edit.index, match)
        except _Unsupported as reason:
            fallback = PluginStrategy().apply(edit, match)
            return Outcome(fallback.rewritten, f"fell back to {fallback.detail}: {reason}")
        base = match.softmax or f"graphfix_attention_{match.index}"
        nodes: list[onnx.NodeProto] = []
        inputs = [match.q, plan.k, match.v]
        if plan.mask is not None:
            mask = plan.mask
            for bias in plan.extra_biases:  # (s + m1) + m2 as s + (m1 + m2): same to rounding
                summed = edit.unique(f"{base}/bias_sum")
                nodes.append(
                    onnx.helper.make_node(
                        "Add", [mask, bias], [summed], name=edit.unique(f"{base}/Add")
                    )
                )
                mask = summed
            if plan.invert_mask:
                mask = edit.unique(f"{base}/keep")
                nodes.append(
                    onnx.helper.make_node(
                        "Not", [plan.mask], [mask], name=edit.unique(f"{base}/Not")
                    )
                )
            inputs.append(mask)
        pv = edit.node_at(match.chain_positions[-1])
        nodes.append(
            make_attention_node(
                inputs,
                pv.output[0],
                scale=plan.scale,
                k_transposed=plan.k_transposed,
                causal=plan.causal,
                softcap=plan.softcap,
                mask_fill=-math.inf if plan.mask_fill is None else plan.mask_fill,
                nan_to_zero=match.nan_guard is not None,
                name=edit.unique(f"{base}/GraphfixAttention"),
            )
        )
        for position in plan.removed:
            edit.replace(position, nodes if position == match.chain_positions[-1] else [])
        edit.drop_if_unused({i for p in plan.removed for i in edit.node_at(p).input})
        edit.annotate(pv.output[0])
        ensure_plugin_opset(edit.model)
        features = [f"scale {plan.scale:.6g}"]
        if plan.mask is not None:
            features.append("boolean mask" if plan.mask_fill is not None else "additive mask")
        features += [f for f, on in (("causal", plan.causal), ("softcap", plan.softcap)) if on]
        detail = f"chain → {ATTENTION.op_type} ({', '.join(features)})"
        if edit.index.elem_type(match.q) == onnx.TensorProto.FLOAT or plan.softcap:
            detail += "; note: float32 and softcap run on graphfix's own kernel, slower than the unfused chain"
        return Outcome(True, detail)


class _Plan:
    """What the node needs; built fresh for every match (no state kept on the strategy)."""

    def __init__(self) -> None:
        self.k = ""
        self.k_transposed = False
        self.scale = 1.0
        self.softcap = 0.0
        self.mask: str | None = None
        self.extra_biases: list[str] = []  # further additive masks/biases, summed into `mask`
        self.mask_fill: float | None = None
        self.invert_mask = False
        self.causal = False
        self.removed: list[int] = []


def _plan(index: GraphIndex, match: AttentionMatch) -> _Plan:
    plan = _Plan()
    graph = index.graph
    chain = [graph.node[p] for p in match.chain_positions]
    qk, pv = chain[0], chain[-1]
    softmax_at = match.chain_positions.index(match.softmax_position)
    _check_types(index, match, pv)
    _check_operands(index, match, qk, pv, plan)
    if match.scale.in_chain is None:
        raise _Unsupported("the scale is computed at run time (`graphfix inspect` shows how)")
    plan.scale = match.scale.in_chain
    _read_scores_chain(index, chain[1:softmax_at], qk, plan, match)
    for node in chain[softmax_at + 1 : -1]:
        if node.op_type not in _TRANSPARENT_AFTER and not (
            match.nan_guard is not None and node.op_type == "Where"
        ):
            raise _Unsupported(f"{node.op_type} '{node.name}' between the Softmax and P·V")
    if (
        match.causal
        and not plan.extra_biases
        and match.q_len is not None
        and match.q_len == match.kv_len
        and _is_pure_causal(index, plan)
    ):
        plan.mask, plan.mask_fill, plan.invert_mask, plan.causal = None, None, False, True
    removed = set(match.chain_positions)
    removed |= _guard_positions(index, match, chain)
    _check_nothing_escapes(index, match, removed, pv)
    keep = {match.q, plan.k, match.v, plan.mask, *plan.extra_biases}
    removed |= _dead_ancestors(index, removed, keep)
    plan.removed = sorted(removed)
    return plan


def _check_types(index: GraphIndex, match: AttentionMatch, pv: onnx.NodeProto) -> None:
    types = {name: index.elem_type(name) for name in (match.q, match.k, match.v)}
    if None in types.values():
        raise _Unsupported("element types of Q, K, V are unknown (run shape inference first)")
    if len(set(types.values())) != 1 or next(iter(types.values())) not in PLUGIN_ELEMENT_TYPES:
        raise _Unsupported(
            "Q, K and V must share one of float32/float16/bfloat16, got "
            + ", ".join(onnx.TensorProto.DataType.Name(t) for t in types.values())
        )
    out = index.elem_type(pv.output[0])
    if out is not None and out != types[match.q]:
        raise _Unsupported("P·V's element type differs from Q's")


def _check_operands(
    index: GraphIndex, match: AttentionMatch, qk: onnx.NodeProto, pv: onnx.NodeProto, plan: _Plan
) -> None:
    ranks = {index.rank(match.q), index.rank(match.v)}
    if not ranks <= {3, 4}:
        raise _Unsupported(f"Q/V ranks {sorted(r for r in ranks if r)} (the node takes 3-D or 4-D)")
    if qk.op_type == "Einsum":
        if not (_einsum_is(qk, "abid,abjd->abij") and _einsum_is(pv, "abij,abjd->abid")):
            raise _Unsupported("an Einsum other than bhid,bhjd->bhij / bhij,bhjd->bhid")
        plan.k, plan.k_transposed = match.k, False
    elif pv.op_type == "Einsum":
        raise _Unsupported("an Einsum P·V after a MatMul Q·Kᵀ")
    elif match.k_transposed_by == "transpose" and _swaps_last_two(index, match):
        plan.k, plan.k_transposed = match.k, False
    else:
        if index.rank(match.k_t) not in (3, 4):
            raise _Unsupported("Kᵀ is not 3-D or 4-D")
        plan.k, plan.k_transposed = match.k_t, True


def _swaps_last_two(index: GraphIndex, match: AttentionMatch) -> bool:
    """The Transpose between K and Q·Kᵀ swaps only the last two axes."""
    node = index.producer_of(match.k_t)
    k = match.k
    if node is None or node.op_type != "Transpose" or node.input[0] != k:
        return False
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    rank = len(perm) if perm else index.rank(k)
    if rank not in (3, 4):
        return False
    expected = list(range(rank - 2)) + [rank - 1, rank - 2]
    return perm == expected or (perm is None and rank == 2)


def _einsum_is(node: onnx.NodeProto, pattern: str) -> bool:
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    equation = equation.replace(" ", "")
    if len(equation) != len(pattern):
        return False
    mapping: dict[str, str] = {}
    for got, want in zip(equation, pattern, strict=True):
        if (got in ",->") != (want in ",->") or (got in ",->" and got != want):
            return False
        if want.isalpha():
            if mapping.setdefault(want, got) != got:
                return False
    return len(set(mapping.values())) == len(mapping)


def _read_scores_chain(
    index: GraphIndex,
    nodes: list[onnx.NodeProto],
    qk: onnx.NodeProto,
    plan: _Plan,
    match: AttentionMatch,
) -> None:
    """Walk Q·Kᵀ → Softmax in order: scale, then softcap, then one mask."""
    phase = 0  # 0 scale, 1 softcap, 2 mask
    main = qk.output[0]
    for node in nodes:
        op = node.op_type
        if op == "Cast":
            pass
        elif op == "Tanh":
            if phase > 1:
                raise _Unsupported("a Tanh softcap after the mask")
            if match.softcap is None or math.isnan(match.softcap):
                raise _Unsupported("a Tanh whose softcap value is not a constant")
            plan.softcap, phase = match.softcap, 1
        elif op in _SCALE_OPS:
            if phase == 2:
                raise _Unsupported(f"{op} '{node.name}' scales the scores after the mask")
            if phase == 1 and op == "Div":
                raise _Unsupported(f"Div '{node.name}' after the softcap's Tanh")
        elif op in ("Add", "Where"):
            if plan.mask is not None and (op == "Where" or plan.mask_fill is not None):
                raise _Unsupported("a Where mask combined with another mask or bias")
            if plan.mask is not None:
                plan.extra_biases.append(node.input[1] if node.input[0] == main else node.input[0])
            else:
                _read_mask(index, node, main, plan)
            phase = 2
        else:
            raise _Unsupported(f"{op} '{node.name}' between Q·Kᵀ and the Softmax")
        main = node.output[0]


def _read_mask(index: GraphIndex, node: onnx.NodeProto, main: str, plan: _Plan) -> None:
    if node.op_type == "Add":
        plan.mask = node.input[1] if node.input[0] == main else node.input[0]
        return
    cond, a, b = node.input
    fill_name = b if a == main else a
    fill = index.constant_value(fill_name)
    if fill is None or fill.size != 1:
        raise _Unsupported(f"Where '{node.name}' fills masked scores with a non-constant value")
    plan.mask = cond
    plan.mask_fill = float(np.asarray(fill, dtype=np.float64).reshape(()))
    plan.invert_mask = a != main  # Where(blocked, fill, scores)


def _is_pure_causal(index: GraphIndex, plan: _Plan) -> bool:
    """The mask is a constant that blocks exactly the future (so `causal` can replace it).

    Only then: a mask that also carries padding can block whole rows, and a finite fill such as
    finfo.min then gives a uniform row where -inf gives NaN, so dropping it would not be exact.
    """
    value = None if plan.mask is None else index.constant_value(plan.mask)
    if value is None or value.ndim < 2 or value.shape[-1] != value.shape[-2]:
        return False
    n = value.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    if value.dtype == bool:
        blocked = value if plan.invert_mask else ~value
        return bool((blocked == future).all())
    # A finite fill ≤ -1e4 is -inf in effect: the kept diagonal bounds each row's max, and
    # exp(fill - max) underflows to 0 in float32 for any realistic score.
    return bool((np.where(future, value <= -1e4, value == 0)).all())


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
