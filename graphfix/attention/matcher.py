"""Find attention chains around Softmax nodes.

Accepted layouts (what exporters emit; see notes/attention_patterns.md):

    scores = MatMul(Q, Kᵀ) | Einsum("...id,...jd->...ij", Q, K)
             Q and Kᵀ may each carry a scalar Mul/Div (PyTorch's √scale split)
             Kᵀ comes from a Transpose of K, or K is already laid out transposed
    scores → any of: Mul/Div by a scale, Add(mask or bias), Where(mask, scores, -inf),
             Cast/CastLike, Reshape/Squeeze/Unsqueeze (heads folded into batch), Tanh softcap,
             QuantizeLinear → DequantizeLinear, Concat(scores, sink) on the key axis
           → Softmax over the last (key) axis
           → any of: Cast, Where(IsNaN(p), 0, p), Dropout, Identity, Reshape,
             QuantizeLinear → DequantizeLinear, Slice (the sink column off, after a sink Concat)
           → MatMul(P, V) | Einsum(P, V)

The chain is described once, as typed steps (match_types.ChainStep), which every consumer reads.

A Softmax that does not sit in such a chain is left alone and reported with the reason: the
matcher refuses rather than guesses.
"""

from __future__ import annotations

import dataclasses
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
    BiasStep,
    CastStep,
    ChainStep,
    KTransposedBy,
    Layout,
    MaskKind,
    MaskStep,
    NanGuardStep,
    PassStep,
    QdqSite,
    QdqStep,
    ReshapeStep,
    Scale,
    ScaleOp,
    ScaleSide,
    ScaleStep,
    ShiftStep,
    SinkStep,
    SkippedSoftmax,
    SoftcapStep,
)
from graphfix.errors import UnsupportedModelError
from graphfix.graph.index import GraphIndex, dtype_name
from graphfix.model_io import load_model

_MAX_SCORE_HOPS = 14
_MAX_PROB_HOPS = 8
_MAX_SOURCE_HOPS = 40
_MAX_MASK_SLICE = 200

_PASS_THROUGH_UP = {"Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze"}
_PASS_THROUGH_DOWN = {
    "Cast", "Identity", "Dropout", "Reshape", "Squeeze", "Unsqueeze", "QuantizeLinear",
    "DequantizeLinear", "Slice",
}  # fmt: skip
_QDQ = ("QuantizeLinear", "DequantizeLinear")
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
    sink_concat: onnx.NodeProto | None = None


def find_attention(model: onnx.ModelProto | str | Path) -> list[AttentionMatch]:
    """Every attention chain in `model` (a ModelProto or a path; weights are not loaded)."""
    return list(scan_attention(model).matches)


def scan_attention(model: onnx.ModelProto | str | Path) -> AttentionScan:
    """Attention chains, the Softmax nodes left alone (with reasons) and ONNX Attention ops."""
    loaded = load_model(model, load_weights=False)
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


Scope = tuple[str, onnx.GraphProto | None, GraphIndex]  # (location, stored graph, its index)


def graph_scopes(index: GraphIndex) -> list[Scope]:
    """The main graph ("", None, index), then every If/Loop/Scan body inside it, depth first."""
    return [("", None, index), *index.subgraph_scopes()]


def scan_graph(index: GraphIndex, *, scopes: list[Scope] | None = None) -> AttentionScan:
    """Scan the main graph and every subgraph; matches are numbered in that order, and a match
    in a subgraph names it in `location`."""
    scopes = graph_scopes(index) if scopes is None else scopes
    matches: list[AttentionMatch] = []
    skipped: list[SkippedSoftmax] = []
    for location, _, scope in scopes:
        check_supported(scope)
        prefix = f"{location}/" if location else ""
        for position, node in enumerate(scope.graph.node):
            if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
                continue
            try:
                match = _match_softmax(scope, node, position, len(matches))
            except _NoMatch as reason:
                name = prefix + _display(node, position)
                skipped.append(SkippedSoftmax(softmax=name, reason=str(reason)))
                continue
            matches.append(dataclasses.replace(match, location=location) if location else match)
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
        matches=tuple(matches), skipped=tuple(skipped), attention_ops=attention_ops
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
    k, k_transposed_by, k_perm = _untranspose_k(index, qk, k_t)

    up_nodes = list(reversed(chain.nodes))
    in_chain, sink_concat = _chain_steps(index, qk, up_nodes)
    after, sink_slice = _after_steps(index, softmax, down_nodes)
    sink = _sink_step(index, sink_concat, sink_slice, in_chain, qk)
    steps = (*_operand_steps(index, q_scale, k_scale), *in_chain)
    scale = _scale(index, steps, q)
    softcap = next((s.cap for s in steps if isinstance(s, SoftcapStep)), None)
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
    if sink is not None and isinstance(kv_len, int):
        kv_len -= 1  # the sink column is not a key
    ordered = (qk, *up_nodes, softmax, *down_nodes, pv)
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
    operand_qdq = (
        _operand_qdq(index, qk.input[0], QdqSite.Q),
        _operand_qdq(index, qk.input[1], QdqSite.K),
        _operand_qdq(index, v, QdqSite.V),
    )
    quantized = tuple(s for s in (*operand_qdq, *in_chain, *after) if isinstance(s, QdqStep))
    layout = Layout(
        qk_op=qk.op_type,
        pv_op=pv.op_type,
        k_transposed_by=k_transposed_by,
        k_perm=k_perm,
        qk_equation=_equation(qk),
        pv_equation=_equation(pv),
        q_rank=index.rank(q),
        k_rank=index.rank(k),
        v_rank=index.rank(v),
    )
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
        layout=layout,
        steps=steps,
        after=tuple(after),
        sink=sink,
        quantized=quantized,
    )


def _equation(node: onnx.NodeProto) -> str | None:
    if node.op_type != "Einsum":
        return None
    text = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    return text.replace(" ", "")


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
    if op == "DequantizeLinear":
        quantize = index.producer_of(node.input[0])
        if quantize is None or quantize.op_type != "QuantizeLinear":
            raise _NoMatch(
                f"softmax scores come from DequantizeLinear '{node.name}' of a stored integer "
                "tensor, not from Q·Kᵀ"
            )
        chain.nodes.extend((node, quantize))
        return _trace_scores(index, quantize.input[0], chain, depth + 1)
    if op == "Concat" and len(node.input) == 2 and chain.sink_concat is None:
        return _trace_sink_concat(index, node, chain, depth)
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
        _merge(chain, trial)
        return qk
    raise failure or _NoMatch(f"{op} '{node.name}' upstream of the softmax has no Q·Kᵀ input")


def _trace_sink_concat(
    index: GraphIndex, node: onnx.NodeProto, chain: _ScoreChain, depth: int
) -> onnx.NodeProto:
    """Concat(scores, sink) on the key axis: attention sinks (GPT-OSS, StreamingLLM)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    rank = index.rank(node.output[0])
    if axis is None or not (axis == -1 or (rank is not None and axis == rank - 1)):
        raise _NoMatch(f"Concat '{node.name}' before the softmax joins scores off the key axis")
    failure: _NoMatch | None = None
    for main in (0, 1):
        if index.is_constant(node.input[main]):
            continue
        trial = _ScoreChain()
        try:
            qk = _trace_scores(index, node.input[main], trial, depth + 1)
        except _NoMatch as exc:
            failure = failure or exc
            continue
        chain.nodes.append(node)
        chain.sink_concat = node
        _merge(chain, trial)
        return qk
    raise failure or _NoMatch(f"Concat '{node.name}' upstream of the softmax has no Q·Kᵀ input")


def _merge(chain: _ScoreChain, trial: _ScoreChain) -> None:
    chain.nodes.extend(trial.nodes)
    chain.mask_nodes.extend(trial.mask_nodes)
    chain.mask_inputs.extend(trial.mask_inputs)
    chain.scale_factors.extend(trial.scale_factors)
    chain.tanh = chain.tanh or trial.tanh
    chain.sink_concat = chain.sink_concat or trial.sink_concat


def _require_max_subtract(index: GraphIndex, sub: onnx.NodeProto) -> None:
    reduce = index.producer_of(sub.input[1])
    if reduce is None or reduce.op_type != "ReduceMax":
        raise _NoMatch(f"Sub '{sub.name}' before the softmax is not a max subtraction")


def _is_scalar_constant(index: GraphIndex, tensor: str) -> bool:
    value = index.constant_value(tensor)
    return value is not None and value.size == 1


@dataclass(frozen=True)
class _Factor:
    scalar: str
    op: str  # "Mul" | "Div"
    node: onnx.NodeProto


@dataclass(frozen=True)
class _OperandScale:
    """Scalar factors found on one Q·Kᵀ operand: peeled at the MatMul, or baked in upstream."""

    peeled: tuple[_Factor, ...] = ()  # right at the MatMul, nearest first
    baked: tuple[_Factor, ...] = ()  # before a Reshape/Transpose: part of the operand


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
    peeled: list[_Factor] = []
    while (found := _scalar_factor(index, tensor)) is not None:
        tensor, factor = found
        peeled.append(factor)
    baked: list[_Factor] = []
    current = tensor
    for _ in range(_MAX_OPERAND_HOPS):  # e.g. Whisper: q_proj(x) * scale, then split into heads
        found = _scalar_factor(index, current)
        if found is not None:
            current, factor = found
            baked.append(factor)
            continue
        node = index.producer_of(current)
        if node is None or node.op_type not in _LAYOUT_OPS:
            break
        current = node.input[0]
    return tensor, _OperandScale(peeled=tuple(peeled), baked=tuple(baked))


def _scalar_factor(index: GraphIndex, tensor: str) -> tuple[str, _Factor] | None:
    """(input, factor) when `tensor` is input·scalar or input/scalar."""
    node = index.producer_of(tensor)
    if node is None or node.op_type not in ("Mul", "Div"):
        return None
    for main in (0, 1) if node.op_type == "Mul" else (0,):
        other = node.input[1 - main]
        if not index.is_constant(node.input[main]) and _is_scalar(index, other):
            return node.input[main], _Factor(other, node.op_type, node)
    return None


def _is_scalar(index: GraphIndex, tensor: str) -> bool:
    value = index.constant_value(tensor)
    if value is not None:
        return value.size == 1
    shape = index.shape(tensor)
    return shape is not None and all(d == 1 for d in shape)


def _untranspose_k(
    index: GraphIndex, qk: onnx.NodeProto, k_t: str
) -> tuple[str, KTransposedBy, tuple[int, ...] | None]:
    if qk.op_type == "Einsum":
        return k_t, KTransposedBy.EINSUM, None
    node = index.producer_of(k_t)
    if node is not None and node.op_type == "Transpose":
        perm = next((tuple(a.ints) for a in node.attribute if a.name == "perm"), None)
        return node.input[0], KTransposedBy.TRANSPOSE, perm
    return k_t, KTransposedBy.LAYOUT, None


# --- the typed description: scale, softcap, mask, casts, Q/DQ, sink ---------------------------
def _operand_steps(
    index: GraphIndex, q_scale: _OperandScale, k_scale: _OperandScale
) -> list[ChainStep]:
    steps: list[ChainStep] = []
    for factors, side in (
        (q_scale.baked, ScaleSide.Q_BAKED),
        (k_scale.baked, ScaleSide.K_BAKED),
        (q_scale.peeled, ScaleSide.Q),
        (k_scale.peeled, ScaleSide.K),
    ):
        steps.extend(_scale_step(index, f, side) for f in reversed(factors))  # upstream first
    return steps


def _scale_step(index: GraphIndex, factor: _Factor, side: ScaleSide) -> ScaleStep:
    value = _uniform_value(index, factor.scalar)
    if value is not None and factor.op == "Div":
        value = None if value == 0 else 1.0 / value
    return ScaleStep(
        factor=value,
        op=ScaleOp(factor.op.lower()),
        side=side,
        scalar=factor.scalar,
        node=_display(factor.node, index.position(factor.node)),
        output=factor.node.output[0],
    )


def _uniform_value(index: GraphIndex, tensor: str) -> float | None:
    """The one value of a constant whose elements are all equal (a scalar, or a filled tensor)."""
    value = index.constant_value(tensor)
    if value is None or value.size == 0:
        return None
    flat = np.asarray(value, dtype=np.float64).reshape(-1)
    first = flat[0]
    if not (np.all(flat == first) or (np.isnan(first) and np.all(np.isnan(flat)))):
        return None
    return float(first)


def _other_input(node: onnx.NodeProto, main: str) -> str:
    return node.input[1] if node.input[0] == main else node.input[0]


def _cast_target(index: GraphIndex, node: onnx.NodeProto) -> str:
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), 0)
        return dtype_name(to) if to else "unknown"
    like = index.elem_type(node.input[1])  # CastLike
    return dtype_name(like) if like else "unknown"


def _qdq_step(
    index: GraphIndex, quantize: onnx.NodeProto, dequantize: onnx.NodeProto, site: QdqSite
) -> QdqStep:
    zero_point = quantize.input[2] if len(quantize.input) > 2 and quantize.input[2] else None
    quant = index.elem_type(quantize.output[0])
    if quant is None and zero_point is not None:
        quant = index.elem_type(zero_point)
    return QdqStep(
        site=site,
        quantize=_display(quantize, index.position(quantize)),
        dequantize=_display(dequantize, index.position(dequantize)),
        scale=quantize.input[1],
        zero_point=zero_point,
        input=quantize.input[0],
        output=dequantize.output[0],
        quant_type=dtype_name(quant) if quant else "uint8",  # QuantizeLinear's default
    )


def _operand_qdq(index: GraphIndex, tensor: str, site: QdqSite) -> QdqStep | None:
    """A QuantizeLinear → DequantizeLinear pair producing `tensor` (seen through layout ops)."""
    current = tensor
    for _ in range(_MAX_OPERAND_HOPS):
        node = index.producer_of(current)
        if node is None:
            return None
        if node.op_type == "DequantizeLinear":
            quantize = index.producer_of(node.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                return _qdq_step(index, quantize, node, site)
            return None
        if node.op_type not in _LAYOUT_OPS:
            return None
        current = node.input[0]
    return None


def _chain_steps(
    index: GraphIndex, qk: onnx.NodeProto, nodes: list[onnx.NodeProto]
) -> tuple[list[ChainStep], onnx.NodeProto | None]:
    """Q·Kᵀ → Softmax as steps, in order; also the sink Concat, if any (its step needs the
    Slice after the Softmax)."""
    steps: list[ChainStep | onnx.NodeProto] = []  # a Tanh stays a node until the softcap merge
    sink_concat: onnx.NodeProto | None = None
    main = qk.output[0]
    position = 0
    while position < len(nodes):
        node = nodes[position]
        position += 1
        op, name, out = node.op_type, _display(node, index.position(node)), node.output[0]
        if op in ("Mul", "Div"):
            steps.append(
                _scale_step(index, _Factor(_other_input(node, main), op, node), ScaleSide.SCORES)
            )
        elif op == "Tanh":
            steps.append(node)
        elif op == "Add":
            steps.append(BiasStep(source=_other_input(node, main), node=name, output=out))
        elif op == "Where":
            kind = MaskKind.KEEP if node.input[1] == main else MaskKind.BLOCKED
            fill = node.input[2] if kind is MaskKind.KEEP else node.input[1]
            steps.append(
                MaskStep(
                    kind=kind,
                    source=node.input[0],
                    fill=_uniform_value(index, fill),
                    fill_tensor=fill,
                    node=name,
                    output=out,
                )
            )
        elif op == "Sub":
            steps.append(ShiftStep(node=name, output=out))
        elif op in ("Cast", "CastLike"):
            steps.append(CastStep(to=_cast_target(index, node), node=name, output=out))
        elif op == "Identity":
            steps.append(PassStep(op=op, node=name, output=out))
        elif op in ("Reshape", "Squeeze", "Unsqueeze"):
            steps.append(
                ReshapeStep(
                    op=op,
                    node=name,
                    output=out,
                    input_shape=index.shape(node.input[0]),
                    output_shape=index.shape(out),
                    target=_reshape_target(index, node),
                )
            )
        elif op == "QuantizeLinear":
            dequantize = nodes[position]
            position += 1
            steps.append(_qdq_step(index, node, dequantize, QdqSite.SCORES))
            out = dequantize.output[0]
        elif op == "Concat":
            sink_concat = node
        main = out
    return _merge_softcaps(index, steps), sink_concat


def _reshape_target(index: GraphIndex, node: onnx.NodeProto) -> tuple[int, ...] | None:
    if node.op_type != "Reshape" or len(node.input) < 2:
        return None
    value = index.constant_value(node.input[1])
    return None if value is None else tuple(int(d) for d in np.asarray(value).reshape(-1))


def _merge_softcaps(index: GraphIndex, steps: list[ChainStep | onnx.NodeProto]) -> list[ChainStep]:
    """Div(cap) → Tanh → Mul(cap) becomes one SoftcapStep; a Tanh whose neighbours do not
    agree on the cap becomes a SoftcapStep with cap None."""
    merged: list[ChainStep] = []
    position = 0
    while position < len(steps):
        step = steps[position]
        position += 1
        if not isinstance(step, onnx.NodeProto):
            merged.append(step)
            continue
        tanh_name = _display(step, index.position(step))
        after = steps[position] if position < len(steps) else None
        cap: float | None = None
        names = [tanh_name]
        output = step.output[0]
        if _is_scores_scale(after) and after.op is ScaleOp.MUL:
            cap, output = after.factor, after.output
            names.append(after.node)
            position += 1
        before = merged[-1] if merged else None
        if (
            cap is not None
            and _is_scores_scale(before)
            and before.factor is not None
            and math.isclose(before.factor * cap, 1.0, rel_tol=1e-3)
        ):
            names.insert(0, before.node)
            merged.pop()
        else:
            cap = None
        merged.append(SoftcapStep(cap=cap, nodes=tuple(names), output=output))
    return merged


def _is_scores_scale(step: object) -> bool:
    return isinstance(step, ScaleStep) and step.side is ScaleSide.SCORES


def _after_steps(
    index: GraphIndex, softmax: onnx.NodeProto, nodes: list[onnx.NodeProto]
) -> tuple[list[ChainStep], onnx.NodeProto | None]:
    """Softmax → P·V as steps, in order; also the Slice that drops a sink column, if any."""
    steps: list[ChainStep] = []
    sink_slice: onnx.NodeProto | None = None
    position = 0
    while position < len(nodes):
        node = nodes[position]
        position += 1
        op, name, out = node.op_type, _display(node, index.position(node)), node.output[0]
        if op == "Cast":
            steps.append(CastStep(to=_cast_target(index, node), node=name, output=out))
        elif op in ("Identity", "Dropout"):
            steps.append(PassStep(op=op, node=name, output=out))
        elif op in ("Reshape", "Squeeze", "Unsqueeze"):
            steps.append(ReshapeStep(op, name, out, index.shape(node.input[0]), index.shape(out)))
        elif op == "Where":
            is_nan = index.producer_of(node.input[0])
            steps.append(
                NanGuardStep(node=name, is_nan=_display(is_nan, index.position(is_nan)), output=out)
            )
        elif op == "QuantizeLinear":
            if position >= len(nodes) or nodes[position].op_type != "DequantizeLinear":
                raise _NoMatch(
                    f"QuantizeLinear '{node.name}' after the softmax is not followed by a "
                    "DequantizeLinear before P·V"
                )
            steps.append(_qdq_step(index, node, nodes[position], QdqSite.PROBS))
            position += 1
        elif op == "DequantizeLinear":
            raise _NoMatch(
                f"DequantizeLinear '{node.name}' after the softmax has no QuantizeLinear"
            )
        elif op == "Slice":
            if sink_slice is not None:
                raise _NoMatch("two Slices between the softmax and P·V")
            sink_slice = node
    return steps, sink_slice


def _sink_step(
    index: GraphIndex,
    concat: onnx.NodeProto | None,
    slice_node: onnx.NodeProto | None,
    steps: list[ChainStep],
    qk: onnx.NodeProto,
) -> SinkStep | None:
    if concat is None and slice_node is None:
        return None
    if concat is None:
        raise _NoMatch(f"Slice '{slice_node.name}' cuts the probabilities before P·V, not a sink")
    if slice_node is None:
        raise _NoMatch(
            f"Concat '{concat.name}' extends the scores, but no Slice drops the extra column "
            "before P·V"
        )
    chain_outputs = {qk.output[0], *(getattr(s, "output", "") for s in steps)}
    scores_first = concat.input[0] in chain_outputs
    sink = concat.input[1] if scores_first else concat.input[0]
    return SinkStep(
        sink=sink,
        concat=_display(concat, index.position(concat)),
        slice=_display(slice_node, index.position(slice_node)),
        scores_first=scores_first,
        output=slice_node.output[0],
    )


def _scale(index: GraphIndex, steps: tuple[ChainStep, ...], q: str) -> Scale:
    """The factors of `steps` folded into one summary (the table's and the JSON's view)."""
    factors = [s for s in steps if isinstance(s, ScaleStep)]
    sides = {s.side for s in factors}
    forms = [s.op.value for s in factors if s.side is ScaleSide.SCORES]
    q_side = sides & {ScaleSide.Q, ScaleSide.Q_BAKED}
    k_side = sides & {ScaleSide.K, ScaleSide.K_BAKED}
    if q_side and k_side:
        forms.insert(0, "sqrt_qk")
    elif q_side or k_side:
        forms.insert(0, "q_scale" if q_side else "k_scale")
    baked_sides = (ScaleSide.Q_BAKED, ScaleSide.K_BAKED)
    in_chain = _product(f for f in factors if f.side not in baked_sides)
    baked = _product(f for f in factors if f.side in baked_sides)
    value = None if in_chain is None or baked is None else in_chain * baked
    computed: list[str] = []
    for f in factors:
        if f.factor is None:
            computed.extend(_backward_slice(index, f.scalar, limit=24))
    if index.is_constant(q):  # a learned probe query with its scale folded in (SigLIP MAP head)
        value = None
        forms.append("folded_into_constant_q")
    return Scale(
        value=value,
        form="+".join(dict.fromkeys(forms)) or "none",
        nodes=tuple(dict.fromkeys(computed)),
        in_chain=in_chain,
    )


def _product(factors) -> float | None:
    value = 1.0
    for f in factors:
        if f.factor is None:
            return None
        value *= f.factor
    return value


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
