"""Find attention chains around Softmax nodes.

Accepted layouts (what exporters emit; see notes/attention_patterns.md):

    scores = MatMul(Q, Kᵀ) | Einsum("...id,...jd->...ij", Q, K)
             Q and Kᵀ may each carry a scalar Mul/Div (PyTorch's √scale split)
             Kᵀ comes from a Transpose of K, or K is already laid out transposed
    scores → any of: Mul/Div by a scale, Add(mask or bias), Where(mask, scores, -inf),
             Cast, Reshape/Squeeze/Unsqueeze (heads folded into batch), Tanh softcap
           → Softmax over the last (key) axis
           → any of: Cast, Where(IsNaN(p), 0, p), Dropout, Identity, Reshape
           → MatMul(P, V) | Einsum(P, V)

A Softmax that does not sit in such a chain is left alone and reported with the reason: the
matcher refuses rather than guesses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from graphfix.attention.match_types import (
    AttentionKind,
    AttentionMatch,
    AttentionOpNode,
    AttentionScan,
    Scale,
    SkippedSoftmax,
)
from graphfix.errors import UnsupportedModelError
from graphfix.graph.index import GraphIndex, dtype_name
from graphfix.model_io import load_model

_MAX_SCORE_HOPS = 14
_MAX_PROB_HOPS = 8
_MAX_SOURCE_HOPS = 40
_MAX_MASK_SLICE = 200

_PASS_THROUGH_UP = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze"}
_PASS_THROUGH_DOWN = {"Cast", "Identity", "Dropout", "Reshape", "Squeeze", "Unsqueeze"}
_COMPARISONS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual"}


class _NoMatch(Exception):
    """Internal: the chain walk failed; `args[0]` is the user-facing reason."""


@dataclass
class _ScoreChain:
    """Mutable scratch state of one upstream walk (never stored on a match)."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)  # softmax input → QK, reversed
    mask_nodes: list[onnx.NodeProto] = field(default_factory=list)
    mask_inputs: list[str] = field(default_factory=list)
    scale_factors: list[tuple[str, str]] = field(default_factory=list)  # (scalar, "Mul"|"Div")
    tanh: onnx.NodeProto | None = None


def find_attention(model: onnx.ModelProto | str | Path) -> list[AttentionMatch]:
    """Every attention chain in `model` (a ModelProto or a path; weights are not loaded)."""
    return list(scan_attention(model).matches)


def scan_attention(model: onnx.ModelProto | str | Path) -> AttentionScan:
    """Attention chains, the Softmax nodes left alone (with reasons) and ONNX Attention ops."""
    loaded = load_model(model, load_weights=False, reference_embedded=True)
    return scan_graph(GraphIndex(loaded.model, base_dir=loaded.base_dir))


# onnxruntime's fused attention ops: the chain is already gone, so nothing can be rewritten.
_CONTRIB_ATTENTION = {
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
    "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention",
    "SparseAttention", "PagedAttention",
}  # fmt: skip
_MIN_OPSET = 7


def check_supported(index: GraphIndex) -> None:
    """Raise UnsupportedModelError for opsets and ops the matcher cannot reason about."""
    newest = onnx.defs.onnx_opset_version()
    if not _MIN_OPSET <= index.opset <= newest:
        raise UnsupportedModelError(
            f"the model imports ai.onnx opset {index.opset}; graphfix understands opsets "
            f"{_MIN_OPSET}..{newest} (onnx {onnx.__version__}); convert it with "
            "onnx.version_converter.convert_version(model, 17) or upgrade onnx"
        )
    for node in index.graph.node:
        if node.domain == "com.microsoft" and node.op_type in _CONTRIB_ATTENTION:
            raise UnsupportedModelError(
                f"node '{node.name}' is onnxruntime's fused com.microsoft::{node.op_type}: the "
                "attention chain was already fused by an onnxruntime optimizer, so graphfix cannot "
                "see or rewrite it; give graphfix the model as exported, before onnxruntime's "
                "transformer optimizations"
            )


def scan_graph(index: GraphIndex) -> AttentionScan:
    check_supported(index)
    matches: list[AttentionMatch] = []
    skipped: list[SkippedSoftmax] = []
    for position, node in enumerate(index.graph.node):
        if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
            continue
        try:
            matches.append(_match_softmax(index, node, position, len(matches)))
        except _NoMatch as reason:
            skipped.append(SkippedSoftmax(softmax=_display(node, position), reason=str(reason)))
    for function in index.model.functions:
        for node in function.node:
            if node.op_type == "Softmax":
                skipped.append(
                    SkippedSoftmax(
                        softmax=f"{function.name}/{node.name or 'Softmax'}",
                        reason=(
                            f"inside model-local function {function.domain}::{function.name}; "
                            "inline it first (onnx.inliner.inline_local_functions) to rewrite it"
                        ),
                    )
                )
    attention_ops = tuple(
        _attention_op(index, node)
        for node in index.graph.node
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx")
    )
    return AttentionScan(
        matches=tuple(matches),
        skipped=tuple(skipped),
        attention_ops=attention_ops,
        shape_inference_problem=index.shape_inference_problem,
    )


def _display(node: onnx.NodeProto, position: int) -> str:
    return node.name or f"<{node.op_type} #{position}>"


# --- one Softmax ------------------------------------------------------------------------------
def _match_softmax(
    index: GraphIndex, softmax: onnx.NodeProto, position: int, match_index: int
) -> AttentionMatch:
    scores = softmax.input[0]
    rank = index.rank(scores)
    axis = _softmax_axis(index, softmax)
    if rank is not None:
        if rank < 2:
            raise _NoMatch(f"softmax input has rank {rank}; attention scores have rank ≥ 3")
        if axis < 0:
            axis += rank
        if axis != rank - 1:
            raise _NoMatch(
                f"softmax over axis {axis} of a rank-{rank} tensor; attention normalises the "
                "last (key) axis"
            )
    elif axis != -1:
        raise _NoMatch(f"softmax axis {axis} with unknown rank: cannot tell it is the key axis")

    pv, v, down_nodes, nan_guard = _trace_probabilities(index, softmax)
    chain = _ScoreChain()
    qk = _trace_scores(index, scores, chain, depth=0)
    q, k_t, q_scale, k_scale = _qk_operands(index, qk)
    k, k_transposed_by = _untranspose_k(index, qk, k_t)

    scale = _scale(index, chain, q_scale, k_scale, q)
    softcap = _softcap(index, chain)
    mask_nodes = tuple(sorted(chain.mask_nodes, key=index.position))
    mask_inputs = tuple(dict.fromkeys(chain.mask_inputs))
    causal = _is_causal(index, mask_inputs)
    same_source = _projection_source(index, q) == _projection_source(index, k)
    if causal:
        kind = AttentionKind.CAUSAL
    else:
        kind = AttentionKind.SELF if same_source else AttentionKind.CROSS

    shape = index.shape(scores) or ()
    heads = shape[1] if len(shape) == 4 else None
    q_len = shape[-2] if len(shape) >= 3 else None
    kv_len = shape[-1] if len(shape) >= 3 else None
    up_nodes = [qk, *reversed(chain.nodes)]
    ordered = (*up_nodes, softmax, *down_nodes, pv)
    chain_nodes = tuple(_display(n, index.position(n)) for n in ordered)
    chain_positions = tuple(index.position(n) for n in ordered)
    in_cast = index.producer_of(scores)
    cast_island = (
        in_cast is not None
        and in_cast.op_type == "Cast"
        and index.elem_type(in_cast.input[0])
        in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        and any(n.op_type == "Cast" for n in down_nodes)
    )
    elem = index.elem_type(scores)
    return AttentionMatch(
        index=match_index,
        softmax=softmax.name,
        softmax_position=position,
        axis=axis,
        qk_matmul=_display(qk, index.position(qk)),
        pv_matmul=_display(pv, index.position(pv)),
        q=q,
        k=k,
        v=v,
        k_t=k_t,
        k_transposed_by=k_transposed_by,
        scale=scale,
        mask_nodes=tuple(_display(n, index.position(n)) for n in mask_nodes),
        mask_inputs=mask_inputs,
        kind=kind,
        causal=causal,
        dtype=dtype_name(elem) if elem else "unknown",
        chain_nodes=chain_nodes,
        chain_positions=chain_positions,
        cast_island=cast_island,
        nan_guard=None if nan_guard is None else _display(nan_guard, index.position(nan_guard)),
        softcap=softcap,
        heads=heads,
        q_len=q_len,
        kv_len=kv_len,
    )


def _softmax_axis(index: GraphIndex, softmax: onnx.NodeProto) -> int:
    for attr in softmax.attribute:
        if attr.name == "axis":
            return attr.i
    return -1 if index.opset >= 13 else 1


# --- downstream: P → P·V ----------------------------------------------------------------------
def _trace_probabilities(
    index: GraphIndex, softmax: onnx.NodeProto
) -> tuple[onnx.NodeProto, str, list[onnx.NodeProto], onnx.NodeProto | None]:
    frontier = [softmax.output[0]]
    path: dict[str, list[onnx.NodeProto]] = {softmax.output[0]: []}
    nan_guard: onnx.NodeProto | None = None
    seen_ops: list[str] = []
    for _ in range(_MAX_PROB_HOPS):
        next_frontier: list[str] = []
        for tensor in frontier:
            for consumer in index.consumers_of(tensor):
                op = consumer.op_type
                seen_ops.append(op)
                if op in ("MatMul", "Einsum") and len(consumer.input) == 2:
                    if consumer.input[0] != tensor:
                        raise _NoMatch(
                            f"softmax output is the right-hand operand of {op} "
                            f"'{consumer.name}' (x·P), not P·V"
                        )
                    v = consumer.input[1]
                    if v in index.initializers or index.constant_value(v) is not None:
                        raise _NoMatch(
                            f"softmax output is multiplied by a constant weight ('{v}'), "
                            "a linear layer, not by V"
                        )
                    return consumer, v, path[tensor], nan_guard
                if op == "IsNaN":
                    continue
                if op == "Where" and _is_nan_guard(index, consumer, tensor):
                    nan_guard = consumer
                elif op not in _PASS_THROUGH_DOWN:
                    continue
                out = consumer.output[0]
                if out not in path:
                    path[out] = [*path[tensor], consumer]
                    next_frontier.append(out)
        frontier = next_frontier
        if not frontier:
            break
    if not seen_ops:
        where = (
            "is only a graph output"
            if softmax.output[0] in index.graph_outputs
            else "feeds nothing"
        )
        raise _NoMatch(f"softmax output {where} (a probability head), not multiplied by V")
    consumers = ", ".join(dict.fromkeys(seen_ops))
    raise _NoMatch(f"softmax output is not multiplied by V (consumers: {consumers})")


def _is_nan_guard(index: GraphIndex, where: onnx.NodeProto, tensor: str) -> bool:
    """Where(IsNaN(p), 0, p): PyTorch's guard for fully masked rows."""
    if len(where.input) != 3 or where.input[2] != tensor:
        return False
    cond = index.producer_of(where.input[0])
    return cond is not None and cond.op_type == "IsNaN" and cond.input[0] == tensor


# --- upstream: scores ← Q·Kᵀ -----------------------------------------------------------------
def _trace_scores(index: GraphIndex, tensor: str, chain: _ScoreChain, depth: int) -> onnx.NodeProto:
    if depth > _MAX_SCORE_HOPS:
        raise _NoMatch("no Q·Kᵀ MatMul within reach upstream of the softmax")
    node = index.producer_of(tensor)
    if node is None:
        what = "a graph input" if tensor in index.graph_inputs else "a constant"
        raise _NoMatch(f"softmax scores come from {what} ('{tensor}'), not from Q·Kᵀ")
    op = node.op_type
    if op in ("MatMul", "Einsum"):
        if len(node.input) != 2:
            raise _NoMatch(f"scores come from {op} with {len(node.input)} inputs, not Q·Kᵀ")
        b = node.input[1]
        if b in index.initializers or index.constant_value(b) is not None:
            raise _NoMatch(
                f"scores come from {op} '{node.name}' with a constant weight ('{b}'), "
                "a linear layer, not Q·Kᵀ"
            )
        return node
    if op in _PASS_THROUGH_UP:
        chain.nodes.append(node)
        return _trace_scores(index, node.input[0], chain, depth + 1)
    if op == "Tanh":
        chain.nodes.append(node)
        chain.tanh = node
        return _trace_scores(index, node.input[0], chain, depth + 1)
    if op in ("Add", "Sub", "Mul", "Div", "Where"):
        return _trace_binary(index, node, chain, depth)
    raise _NoMatch(f"softmax scores come from {op} '{node.name}', not from a Q·Kᵀ chain")


def _trace_binary(
    index: GraphIndex, node: onnx.NodeProto, chain: _ScoreChain, depth: int
) -> onnx.NodeProto:
    op = node.op_type
    if op == "Where":
        candidates = (1, 2)
    elif op in ("Sub", "Div"):
        candidates = (0,)
    else:
        candidates = (0, 1)
    failure: _NoMatch | None = None
    for main in candidates:
        if index.is_constant(node.input[main]):
            continue
        trial = _ScoreChain()
        try:
            qk = _trace_scores(index, node.input[main], trial, depth + 1)
        except _NoMatch as exc:
            failure = failure or exc
            continue
        chain.nodes.append(node)
        others = [t for i, t in enumerate(node.input) if i != main and t]
        if op in ("Add", "Where"):
            chain.mask_nodes.append(node)
            chain.mask_inputs.extend(
                t for t in others if not (op == "Where" and _is_scalar_constant(index, t))
            )
        elif op in ("Mul", "Div"):
            chain.scale_factors.append((others[0], op))
        elif op == "Sub":
            _require_max_subtract(index, node)
        chain.nodes.extend(trial.nodes)
        chain.mask_nodes.extend(trial.mask_nodes)
        chain.mask_inputs.extend(trial.mask_inputs)
        chain.scale_factors.extend(trial.scale_factors)
        chain.tanh = chain.tanh or trial.tanh
        return qk
    raise failure or _NoMatch(f"{op} '{node.name}' upstream of the softmax has no Q·Kᵀ input")


def _require_max_subtract(index: GraphIndex, sub: onnx.NodeProto) -> None:
    reduce = index.producer_of(sub.input[1])
    if reduce is None or reduce.op_type != "ReduceMax":
        raise _NoMatch(f"Sub '{sub.name}' before the softmax is not a max subtraction")


def _is_scalar_constant(index: GraphIndex, tensor: str) -> bool:
    value = index.constant_value(tensor)
    return value is not None and value.size == 1


@dataclass(frozen=True)
class _OperandScale:
    """Scalar factors found on one Q·Kᵀ operand: peeled at the MatMul, or baked in upstream."""

    peeled: tuple[tuple[str, str], ...] = ()  # (scalar tensor, "Mul"|"Div") right at the MatMul
    baked: tuple[tuple[str, str], ...] = ()  # before a Reshape/Transpose: part of the operand


_LAYOUT_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast"}
_MAX_OPERAND_HOPS = 6


def _qk_operands(
    index: GraphIndex, qk: onnx.NodeProto
) -> tuple[str, str, _OperandScale, _OperandScale]:
    """Q and Kᵀ with any scalar Mul/Div peeled off each (PyTorch's √scale split)."""
    q, q_scale = _operand_scale(index, qk.input[0])
    k_t, k_scale = _operand_scale(index, qk.input[1])
    return q, k_t, q_scale, k_scale


def _operand_scale(index: GraphIndex, tensor: str) -> tuple[str, _OperandScale]:
    peeled: list[tuple[str, str]] = []
    while (factor := _scalar_factor(index, tensor)) is not None:
        tensor, scalar, op = factor
        peeled.append((scalar, op))
    baked: list[tuple[str, str]] = []
    current = tensor
    for _ in range(_MAX_OPERAND_HOPS):  # e.g. Whisper: q_proj(x) * scale, then split into heads
        factor = _scalar_factor(index, current)
        if factor is not None:
            current, scalar, op = factor
            baked.append((scalar, op))
            continue
        node = index.producer_of(current)
        if node is None or node.op_type not in _LAYOUT_OPS:
            break
        current = node.input[0]
    return tensor, _OperandScale(peeled=tuple(peeled), baked=tuple(baked))


def _scalar_factor(index: GraphIndex, tensor: str) -> tuple[str, str, str] | None:
    """(input, scalar, op) when `tensor` is input·scalar or input/scalar."""
    node = index.producer_of(tensor)
    if node is None or node.op_type not in ("Mul", "Div"):
        return None
    for main in (0, 1) if node.op_type == "Mul" else (0,):
        other = node.input[1 - main]
        if not index.is_constant(node.input[main]) and _is_scalar(index, other):
            return node.input[main], other, node.op_type
    return None


def _is_scalar(index: GraphIndex, tensor: str) -> bool:
    value = index.constant_value(tensor)
    if value is not None:
        return value.size == 1
    shape = index.shape(tensor)
    return shape is not None and all(d == 1 for d in shape)


def _untranspose_k(index: GraphIndex, qk: onnx.NodeProto, k_t: str) -> tuple[str, str]:
    if qk.op_type == "Einsum":
        return k_t, "einsum"
    node = index.producer_of(k_t)
    if node is not None and node.op_type == "Transpose":
        return node.input[0], "transpose"
    return k_t, "layout"


# --- scale, softcap, mask, kind ---------------------------------------------------------------
def _scale(
    index: GraphIndex,
    chain: _ScoreChain,
    q_scale: _OperandScale,
    k_scale: _OperandScale,
    q: str,
) -> Scale:
    # A softcap's Div/Mul around its Tanh is the cap, not the scale (see _softcap).
    factors = [
        (t, op)
        for t, op in chain.scale_factors
        if chain.tanh is None or not _touches(index, chain.tanh, t)
    ]
    forms = [op.lower() for _, op in factors]
    q_factors = q_scale.peeled + q_scale.baked
    k_factors = k_scale.peeled + k_scale.baked
    if q_factors and k_factors:
        forms.insert(0, "sqrt_qk")
    elif q_factors or k_factors:
        forms.insert(0, "q_scale" if q_factors else "k_scale")
    in_chain, computed = _product(index, [*factors, *q_scale.peeled, *k_scale.peeled])
    baked, baked_nodes = _product(index, [*q_scale.baked, *k_scale.baked])
    value = None if in_chain is None or baked is None else in_chain * baked
    if index.is_constant(q):  # a learned probe query with its scale folded in (SigLIP MAP head)
        value = None
        forms.append("folded_into_constant_q")
    return Scale(
        value=value,
        form="+".join(dict.fromkeys(forms)) or "none",
        nodes=tuple(dict.fromkeys(computed + baked_nodes)),
        in_chain=in_chain,
    )


def _product(index: GraphIndex, factors: list[tuple[str, str]]) -> tuple[float | None, list[str]]:
    value: float | None = 1.0
    computed: list[str] = []
    for tensor, op in factors:
        const = index.constant_value(tensor)
        if const is None or const.size != 1:
            value = None
            computed.extend(_backward_slice(index, tensor, limit=24))
            continue
        factor = float(np.asarray(const, dtype=np.float64).reshape(()))
        if value is not None:
            value = value / factor if op == "Div" else value * factor
    return value, computed


def _touches(index: GraphIndex, tanh: onnx.NodeProto, scale_tensor: str) -> bool:
    """Whether the Mul/Div consuming `scale_tensor` is directly before or after the Tanh."""
    before = index.producer_of(tanh.input[0])
    after = index.consumers_of(tanh.output[0])
    near = [n for n in (before, *after) if n is not None and n.op_type in ("Mul", "Div")]
    return any(scale_tensor in n.input for n in near)


def _softcap(index: GraphIndex, chain: _ScoreChain) -> float | None:
    if chain.tanh is None:
        return None
    for consumer in index.consumers_of(chain.tanh.output[0]):
        if consumer.op_type == "Mul":
            other = (
                consumer.input[1]
                if consumer.input[0] == chain.tanh.output[0]
                else consumer.input[0]
            )
            value = index.constant_value(other)
            if value is not None and value.size == 1:
                return float(np.asarray(value, dtype=np.float64).reshape(()))
    return math.nan


def _backward_slice(index: GraphIndex, tensor: str, *, limit: int) -> list[str]:
    names: list[str] = []
    stack = [tensor]
    seen: set[str] = set()
    while stack and len(names) < limit:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = index.producer_of(name)
        if node is None:
            continue
        names.append(_display(node, index.position(node)))
        if node.op_type not in ("Shape", "Size"):  # the slice ends where it reads a shape
            stack.extend(i for i in node.input if i)
    return names


def _is_causal(index: GraphIndex, mask_inputs: tuple[str, ...]) -> bool:
    """A causal mask: built by Trilu, by Range + comparison, by comparing constant position
    indices, or a constant whose strict upper triangle is blocked (banded windows included)."""
    ops: set[str] = set()
    constants: list[str] = []
    comparisons: list[onnx.NodeProto] = []
    stack = list(mask_inputs)
    seen: set[str] = set()
    while stack and len(seen) < _MAX_MASK_SLICE:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in index.initializers:
            constants.append(name)
            continue
        node = index.producer_of(name)
        if node is None:
            continue
        ops.add(node.op_type)
        if node.op_type == "Constant":
            constants.append(name)
            continue
        if node.op_type in _COMPARISONS:
            comparisons.append(node)
        stack.extend(i for i in node.input if i)
    if "Trilu" in ops or ("Range" in ops and ops & _COMPARISONS):
        return True
    for node in comparisons:  # transformers' masking_utils: kv_idx <= q_idx on constant aranges
        if all(index.constant_value(i) is not None for i in node.input):
            if _is_causal_pattern(index.constant_value(node.output[0]), either_polarity=True):
                return True
    return any(
        _is_causal_pattern(index.constant_value(name), either_polarity=True) for name in constants
    )


def _is_causal_pattern(value: np.ndarray | None, *, either_polarity: bool) -> bool:
    """The last two axes keep the diagonal and block every position above it.

    Booleans may mean keep or block (Where picks the polarity), so both are tried; for additive
    float masks, blocked positions are the ones at the minimum when that minimum is negative.
    """
    if value is None or value.ndim < 2 or value.shape[-1] < 2 or value.shape[-2] < 2:
        return False
    square = np.asarray(value).reshape(-1, *value.shape[-2:])[0]
    n = min(square.shape)
    square = square[:n, :n]
    if square.dtype == bool:
        candidates = [square, ~square] if either_polarity else [square]
    else:
        low = square.min()
        if not low < 0:
            return False
        candidates = [square > low]
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    return any(not keep[upper].any() and bool(np.diagonal(keep).all()) for keep in candidates)


def _projection_source(index: GraphIndex, tensor: str) -> str:
    """The activation that feeds the projection producing `tensor` (its Linear/Conv input).

    Walks up through the first non-constant input of each node until a MatMul/Gemm/Conv with a
    constant weight; self-attention projects Q and K from the same activation.
    """
    current = tensor
    for _ in range(_MAX_SOURCE_HOPS):
        node = index.producer_of(current)
        if node is None:
            return current
        if node.op_type in ("MatMul", "Gemm", "Conv") and len(node.input) >= 2:
            weight = node.input[1]
            if weight in index.initializers or index.is_constant(weight):
                return node.input[0]
            if node.op_type == "MatMul" and index.is_constant(node.input[0]):
                return _strip_layout(index, node.input[1])  # weight on the left: Kᵀ = W·xᵀ
        if node.op_type in ("MatMul", "Einsum") and len(node.input) == 2:
            return f"<{_display(node, index.position(node))}>"
        data = [i for i in node.input if i and not index.is_constant(i)]
        if not data:
            return f"<const {current}>"
        current = data[0]
    return current


def _strip_layout(index: GraphIndex, tensor: str) -> str:
    for _ in range(_MAX_OPERAND_HOPS):
        node = index.producer_of(tensor)
        if node is None or node.op_type not in _LAYOUT_OPS:
            break
        tensor = node.input[0]
    return tensor


# --- ONNX Attention ops -----------------------------------------------------------------------
def _attention_op(index: GraphIndex, node: onnx.NodeProto) -> AttentionOpNode:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (4 - len(node.input))
    return AttentionOpNode(
        node=_display(node, index.position(node)),
        q=inputs[0],
        k=inputs[1],
        v=inputs[2],
        mask=inputs[3] or None,
        is_causal=bool(attrs.get("is_causal", 0)),
        scale=attrs.get("scale"),
        softcap=attrs.get("softcap") or None,
    )
