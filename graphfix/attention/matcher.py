"""Find attention chains around Softmax nodes.

Accepted layouts (what exporters emit; see notes/attention_patterns.md):

    scores = MatMul(Q, Kᵀ) | Einsum("...id,...jd->...ij", Q, K)
             Q and Kᵀ may each carry a scalar Mul/Div (PyTorch's √scale split)
             Kᵀ comes from a Transpose of K, or K is already laid out transposed
    scores → any of: Mul/Div by a scale, Add(mask or bias), Where(mask, scores, -inf),
             Cast/CastLike, Reshape/Squeeze/Unsqueeze (heads folded into batch), Tanh softcap,
             QuantizeLinear → DequantizeLinear, Concat(scores, sink) on the key axis,
             Transpose → MatMul(constant) [→ Add] → Transpose back (talking heads)
           → Softmax over the last (key) axis
           → any of: Cast, Where(IsNaN(p), 0, p), Dropout, Identity, Reshape,
             QuantizeLinear → DequantizeLinear, Slice (the sink column off, after a sink Concat),
             talking heads
           → MatMul(P, V) | Einsum(P, V)

The chain is described once, as typed steps (match_types.ChainStep), which every consumer reads.

A Softmax that does not sit in such a chain is left alone and reported with the reason: the
matcher refuses rather than guesses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from graphfix.attention.chain_steps import (
    LAYOUT_OPS,
    MAX_OPERAND_HOPS,
    Factor,
    NoMatch,
    OperandScale,
    after_steps,
    backward_slice,
    chain_steps,
    operand_qdq,
    operand_steps,
    sink_step,
)
from graphfix.attention.match_types import (
    AttentionKind,
    AttentionMatch,
    AttentionScan,
    KTransposedBy,
    Layout,
    QdqSite,
    SkippedSoftmax,
)
from graphfix.attention.native.forms import attention_op_node, is_native, read_form
from graphfix.errors import UnsupportedModelError
from graphfix.graph.index import GraphIndex, dtype_name
from graphfix.model_io import check_opset, load_model

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


@dataclass
class _ScoreChain:
    """Mutable scratch state of one upstream walk (never stored on a match)."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)  # softmax input → QK, reversed
    mask_inputs: list[str] = field(default_factory=list)
    sink_concat: onnx.NodeProto | None = None


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


def check_supported(index: GraphIndex) -> None:
    """Raise UnsupportedModelError for opsets and ops the matcher cannot reason about."""
    check_opset(index.opset)
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
        for node in scope.graph.node:
            if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
                continue
            try:
                match = _match_softmax(scope, node, len(matches))
            except NoMatch as reason:
                name = prefix + scope.bind(node).name
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
        attention_op_node(read_form(scope, node), location=location)
        for location, _, scope in scopes
        for node in scope.graph.node
        if is_native(node)
    )
    return AttentionScan(
        matches=tuple(matches),
        skipped=tuple(skipped),
        attention_ops=attention_ops,
        shape_inference_problem=index.shape_inference_problem,
    )


# --- one Softmax ------------------------------------------------------------------------------
def _match_softmax(index: GraphIndex, softmax: onnx.NodeProto, match_index: int) -> AttentionMatch:
    scores = softmax.input[0]
    rank = index.rank(scores)
    axis = _softmax_axis(index, softmax)
    if rank is not None:
        if rank < 2:
            raise NoMatch(f"softmax input has rank {rank}; attention scores have rank ≥ 3")
        if axis < 0:
            axis += rank
        if axis != rank - 1:
            raise NoMatch(
                f"softmax over axis {axis} of a rank-{rank} tensor; attention normalises the "
                "last (key) axis"
            )
    elif axis != -1:
        raise NoMatch(f"softmax axis {axis} with unknown rank: cannot tell it is the key axis")

    pv, v, down_nodes = _trace_probabilities(index, softmax)
    chain = _ScoreChain()
    qk = _trace_scores(index, scores, chain, depth=0)
    q, k_t, q_scale, k_scale = _qk_operands(index, qk)
    k, k_transposed_by, k_perm = _untranspose_k(index, qk, k_t)

    up_nodes = list(reversed(chain.nodes))
    in_chain, sink_concat = chain_steps(index, qk, up_nodes)
    after, sink_slice = after_steps(index, softmax, down_nodes)
    sink = sink_step(index, sink_concat, sink_slice, in_chain, qk)
    steps = (*operand_steps(index, q_scale, k_scale), *in_chain)
    mask_inputs = tuple(dict.fromkeys(chain.mask_inputs))
    shape = index.shape(scores) or ()
    causal = _is_causal(index, mask_inputs, index.shape(qk.output[0]) or ())
    q_source, k_source = _projection_source(index, q), _projection_source(index, k)
    if causal:
        kind = AttentionKind.CAUSAL
    elif q_source == k_source:
        kind = AttentionKind.SELF
    elif _reduced_from(index, k_source, q_source):
        kind = AttentionKind.SELF_REDUCED_KEYS
    else:
        kind = AttentionKind.CROSS

    heads = shape[1] if len(shape) == 4 else None
    q_len = shape[-2] if len(shape) >= 3 else None
    kv_len = shape[-1] if len(shape) >= 3 else None
    if sink is not None and isinstance(kv_len, int):
        kv_len -= 1  # the sink column is not a key
    in_cast = index.producer_of(scores)
    cast_island = (
        in_cast is not None
        and in_cast.op_type == "Cast"
        and index.elem_type(in_cast.input[0])
        in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        and any(n.op_type == "Cast" for n in down_nodes)
    )
    elem = index.elem_type(scores)
    operand_pairs = (
        operand_qdq(index, qk.input[0], QdqSite.Q),
        operand_qdq(index, qk.input[1], QdqSite.K),
        operand_qdq(index, v, QdqSite.V),
    )
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
        qk=index.bind(qk),
        softmax_node=index.bind(softmax),
        pv=index.bind(pv),
        axis=axis,
        q=q,
        k=k,
        v=v,
        k_t=k_t,
        mask_inputs=mask_inputs,
        kind=kind,
        causal=causal,
        dtype=dtype_name(elem) if elem else "unknown",
        cast_island=cast_island,
        layout=layout,
        steps=steps,
        after=tuple(after),
        sink=sink,
        operands_quantized=tuple(s for s in operand_pairs if s is not None),
        q_constant=index.is_constant(q),
        heads=heads,
        q_len=q_len,
        kv_len=kv_len,
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
) -> tuple[onnx.NodeProto, str, list[onnx.NodeProto]]:
    """P·V, V and the nodes between the Softmax and P·V, in order."""
    frontier = [softmax.output[0]]
    path: dict[str, list[onnx.NodeProto]] = {softmax.output[0]: []}
    seen_ops: list[str] = []
    for _ in range(_MAX_PROB_HOPS):
        next_frontier: list[str] = []
        for tensor in frontier:
            for consumer in index.consumers_of(tensor):
                op = consumer.op_type
                seen_ops.append(op)
                if op in ("MatMul", "Einsum") and len(consumer.input) == 2:
                    if consumer.input[0] != tensor:
                        raise NoMatch(
                            f"softmax output is the right-hand operand of {op} "
                            f"'{consumer.name}' (x·P), not P·V"
                        )
                    v = consumer.input[1]
                    if v in index.initializers or index.constant_value(v) is not None:
                        raise NoMatch(
                            f"softmax output is multiplied by a constant weight ('{v}'), "
                            "a linear layer, not by V"
                        )
                    return consumer, v, path[tensor]
                if op == "IsNaN":
                    continue
                if op == "Transpose":
                    mix = _head_mix_down(index, consumer)
                    if mix is not None:
                        out = mix[-1].output[0]
                        path[out] = [*path[tensor], *mix]
                        next_frontier.append(out)
                    continue
                if op not in _PASS_THROUGH_DOWN and not (
                    op == "Where" and _is_nan_guard(index, consumer, tensor)
                ):
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
        raise NoMatch(f"softmax output {where} (a probability head), not multiplied by V")
    consumers = ", ".join(dict.fromkeys(seen_ops))
    raise NoMatch(f"softmax output is not multiplied by V (consumers: {consumers})")


def _is_nan_guard(index: GraphIndex, where: onnx.NodeProto, tensor: str) -> bool:
    """Where(IsNaN(p), 0, p): PyTorch's guard for fully masked rows."""
    if len(where.input) != 3 or where.input[2] != tensor:
        return False
    cond = index.producer_of(where.input[0])
    return cond is not None and cond.op_type == "IsNaN" and cond.input[0] == tensor


# --- upstream: scores ← Q·Kᵀ -----------------------------------------------------------------
def _trace_scores(index: GraphIndex, tensor: str, chain: _ScoreChain, depth: int) -> onnx.NodeProto:
    if depth > _MAX_SCORE_HOPS:
        raise NoMatch("no Q·Kᵀ MatMul within reach upstream of the softmax")
    node = index.producer_of(tensor)
    if node is None:
        what = "a graph input" if tensor in index.graph_inputs else "a constant"
        raise NoMatch(f"softmax scores come from {what} ('{tensor}'), not from Q·Kᵀ")
    op = node.op_type
    if op in ("MatMul", "Einsum"):
        if len(node.input) != 2:
            raise NoMatch(f"scores come from {op} with {len(node.input)} inputs, not Q·Kᵀ")
        b = node.input[1]
        if b in index.initializers or index.constant_value(b) is not None:
            raise NoMatch(
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
            raise NoMatch(
                f"softmax scores come from DequantizeLinear '{node.name}' of a stored integer "
                "tensor, not from Q·Kᵀ"
            )
        chain.nodes.extend((node, quantize))
        return _trace_scores(index, quantize.input[0], chain, depth + 1)
    if op == "Concat" and len(node.input) == 2 and chain.sink_concat is None:
        return _trace_sink_concat(index, node, chain, depth)
    if op == "Transpose" and (mix := _head_mix_up(index, node)) is not None:
        chain.nodes.extend(reversed(mix))
        return _trace_scores(index, mix[0].input[0], chain, depth + 1)
    if op == "Tanh":
        chain.nodes.append(node)
        return _trace_scores(index, node.input[0], chain, depth + 1)
    if op in ("Add", "Sub", "Mul", "Div", "Where"):
        return _trace_binary(index, node, chain, depth)
    raise NoMatch(f"softmax scores come from {op} '{node.name}', not from a Q·Kᵀ chain")


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
    main, trial, qk = _trace_operand(index, node, candidates, depth, f"{op} '{node.name}'")
    chain.nodes.append(node)
    others = [t for i, t in enumerate(node.input) if i != main and t]
    if op in ("Add", "Where"):
        chain.mask_inputs.extend(
            t for t in others if not (op == "Where" and _is_scalar_constant(index, t))
        )
    elif op == "Sub":
        _require_max_subtract(index, node)
    _merge(chain, trial)
    return qk


def _trace_sink_concat(
    index: GraphIndex, node: onnx.NodeProto, chain: _ScoreChain, depth: int
) -> onnx.NodeProto:
    """Concat(scores, sink) on the key axis: attention sinks (GPT-OSS, StreamingLLM)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    rank = index.rank(node.output[0])
    if axis is None or not (axis == -1 or (rank is not None and axis == rank - 1)):
        raise NoMatch(f"Concat '{node.name}' before the softmax joins scores off the key axis")
    _, trial, qk = _trace_operand(index, node, (0, 1), depth, f"Concat '{node.name}'")
    chain.nodes.append(node)
    chain.sink_concat = node
    _merge(chain, trial)
    return qk


def _trace_operand(
    index: GraphIndex,
    node: onnx.NodeProto,
    candidates: tuple[int, ...],
    depth: int,
    what: str,
) -> tuple[int, _ScoreChain, onnx.NodeProto]:
    """The first non-constant input of `node` among `candidates` that traces back to a Q·Kᵀ
    MatMul: (its position, the chain traced from it, the MatMul). Raises the first trace's
    NoMatch, or one naming `what` when every candidate input is constant."""
    failure: NoMatch | None = None
    for main in candidates:
        if index.is_constant(node.input[main]):
            continue
        trial = _ScoreChain()
        try:
            return main, trial, _trace_scores(index, node.input[main], trial, depth + 1)
        except NoMatch as exc:
            failure = failure or exc
    raise failure or NoMatch(f"{what} upstream of the softmax has no Q·Kᵀ input")


def _merge(chain: _ScoreChain, trial: _ScoreChain) -> None:
    chain.nodes.extend(trial.nodes)
    chain.mask_inputs.extend(trial.mask_inputs)
    chain.sink_concat = chain.sink_concat or trial.sink_concat


# --- talking heads: Transpose → MatMul(constant [H, H]) [→ Add(constant)] → Transpose back ---------
def _head_mix_down(index: GraphIndex, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The talking-heads nodes from their first Transpose, or None."""
    nodes = [first]
    while len(nodes) < 4:
        consumers = index.consumers_of(nodes[-1].output[0])
        if len(consumers) != 1:
            return None
        nodes.append(consumers[0])
        if nodes[-1].op_type == "Transpose":
            break
    return nodes if _is_head_mix(index, nodes) else None


def _head_mix_up(index: GraphIndex, last: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The talking-heads nodes ending at the Transpose `last`, in graph order, or None."""
    nodes = [last]
    while len(nodes) < 4:
        producer = index.producer_of(_data_input(index, nodes[0]))
        if producer is None:
            return None
        nodes.insert(0, producer)
        if producer.op_type == "Transpose":
            break
    return nodes if _is_head_mix(index, nodes) else None


def _data_input(index: GraphIndex, node: onnx.NodeProto) -> str:
    return next((i for i in node.input if i and not index.is_constant(i)), node.input[0])


def _is_head_mix(index: GraphIndex, nodes: list[onnx.NodeProto]) -> bool:
    ops = [n.op_type for n in nodes]
    if ops not in (
        ["Transpose", "MatMul", "Transpose"],
        ["Transpose", "MatMul", "Add", "Transpose"],
    ):
        return False
    matmul = nodes[1]
    if matmul.input[0] != nodes[0].output[0] or not index.is_constant(matmul.input[1]):
        return False
    if ops[2] == "Add" and not any(index.is_constant(i) for i in nodes[2].input):
        return False
    perms = [next((list(a.ints) for a in n.attribute if a.name == "perm"), None) for n in nodes]
    there, back = perms[0], perms[-1]
    # the heads axis (1) moved last, where the MatMul mixes it, then moved back
    return (
        there is not None
        and back is not None
        and len(there) == len(back)
        and there[-1] == 1
        and [there[p] for p in back] == list(range(len(there)))
    )


def _require_max_subtract(index: GraphIndex, sub: onnx.NodeProto) -> None:
    reduce = index.producer_of(sub.input[1])
    if reduce is None or reduce.op_type != "ReduceMax":
        raise NoMatch(f"Sub '{sub.name}' before the softmax is not a max subtraction")


def _is_scalar_constant(index: GraphIndex, tensor: str) -> bool:
    value = index.constant_value(tensor)
    return value is not None and value.size == 1


def _qk_operands(
    index: GraphIndex, qk: onnx.NodeProto
) -> tuple[str, str, OperandScale, OperandScale]:
    """Q and Kᵀ with any scalar Mul/Div peeled off each (PyTorch's √scale split)."""
    q, q_scale = _operand_scale(index, qk.input[0])
    k_t, k_scale = _operand_scale(index, qk.input[1])
    return q, k_t, q_scale, k_scale


def _operand_scale(index: GraphIndex, tensor: str) -> tuple[str, OperandScale]:
    peeled: list[Factor] = []
    while (found := _scalar_factor(index, tensor)) is not None:
        tensor, factor = found
        peeled.append(factor)
    baked: list[Factor] = []
    current = tensor
    for _ in range(MAX_OPERAND_HOPS):  # e.g. Whisper: q_proj(x) * scale, then split into heads
        found = _scalar_factor(index, current)
        if found is not None:
            current, factor = found
            baked.append(factor)
            continue
        node = index.producer_of(current)
        if node is None or node.op_type not in LAYOUT_OPS:
            break
        current = node.input[0]
    return tensor, OperandScale(peeled=tuple(peeled), baked=tuple(baked))


def _scalar_factor(index: GraphIndex, tensor: str) -> tuple[str, Factor] | None:
    """(input, factor) when `tensor` is input·scalar or input/scalar."""
    node = index.producer_of(tensor)
    if node is None or node.op_type not in ("Mul", "Div"):
        return None
    for main in (0, 1) if node.op_type == "Mul" else (0,):
        other = node.input[1 - main]
        if not index.is_constant(node.input[main]) and _is_scalar(index, other):
            return node.input[main], Factor(other, node.op_type, node)
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


def _is_causal(index: GraphIndex, mask_inputs: tuple[str, ...], scores: tuple) -> bool:
    """A causal mask: built by Trilu, by comparing two run-time position ranges, by comparing
    constant position indices, or a constant whose strict upper triangle is blocked (banded
    windows included).
    Only constants shaped like a mask of the `scores` shape decide (a weight in the mask's
    slice, such as Swin v2's position MLP, is not a mask)."""
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
    if "Trilu" in ops or any(_compares_positions(index, node) for node in comparisons):
        return True
    for node in comparisons:  # transformers' masking_utils: kv_idx <= q_idx on constant aranges
        if all(index.constant_value(i) is not None for i in node.input):
            value = index.constant_value(node.output[0])
            if _is_mask_shaped(value, scores) and _is_causal_pattern(value, either_polarity=True):
                return True
    values = (index.constant_value(name) for name in constants)
    return any(
        _is_mask_shaped(v, scores) and _is_causal_pattern(v, either_polarity=True) for v in values
    )


def _compares_positions(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """`node` compares two run-time position ranges (kv_idx <= q_idx, both from Range).  A
    comparison with a constant side is not causal: T5's relative-position buckets (|i - j| <
    max_exact) and transformers' padding masks (kv_idx >= 0) compare aranges that way."""
    return len(node.input) == 2 and all(
        not index.is_constant(side)
        and any(n.op_type == "Range" for n in backward_slice(index, side, limit=_MAX_SOURCE_HOPS))
        for side in node.input
    )


def _is_mask_shaped(value: np.ndarray | None, scores: tuple) -> bool:
    """Its two trailing dims are the scores' S and T (a square buffer of at least S rows where
    the lengths are not static: the causal buffer sliced to them).  `scores` is Q·Kᵀ's shape,
    () when shape inference could not tell it."""
    if value is None or value.ndim < 2:
        return False
    s, t = scores[-2:] if len(scores) >= 2 else (None, None)
    rows, columns = value.shape[-2:]
    if isinstance(s, int) and isinstance(t, int):
        return (rows, columns) == (s, t)
    return rows == columns and all(not isinstance(n, int) or rows >= n for n in (s, t))


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
                return _activation(index, node.input[0])
            if node.op_type == "MatMul" and index.is_constant(node.input[0]):
                return _activation(index, node.input[1])  # weight on the left: Kᵀ = W·xᵀ
        if node.op_type in ("MatMul", "Einsum") and len(node.input) == 2:
            return f"<{index.bind(node).name}>"
        data = [i for i in node.input if i and not index.is_constant(i)]
        if not data:
            return f"<const {current}>"
        current = data[0]
    return current


_REDUCTIONS = {"Conv", "AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"}


def _reduced_from(index: GraphIndex, k_source: str, q_source: str) -> bool:
    """K's activation is a strided conv or pooling of Q's activation (spatial reduction)."""
    current, reduced = k_source, False
    for _ in range(_MAX_SOURCE_HOPS):
        if current == q_source:
            return reduced
        node = index.producer_of(current)
        if node is None:
            return False
        if node.op_type in _REDUCTIONS:
            strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
            reduced = reduced or node.op_type != "Conv" or any(s > 1 for s in strides)
        data = [i for i in node.input if i and not index.is_constant(i)]
        if not data:
            return False
        current = data[0]
    return False


def _activation(index: GraphIndex, tensor: str) -> str:
    """The activation a projection reads, through layout ops and fake quantization: a
    quantized export gives each projection its own Reshape and Q/DQ pair of the same input
    (onnxruntime's quantize_static after its MatMul → Gemm pre-processing)."""
    for _ in range(MAX_OPERAND_HOPS):
        node = index.producer_of(tensor)
        if node is None:
            break
        if node.op_type == "DequantizeLinear":
            quantize = index.producer_of(node.input[0])
            if quantize is None or quantize.op_type != "QuantizeLinear":
                break
            node = quantize
        elif node.op_type not in LAYOUT_OPS:
            break
        tensor = node.input[0]
    return tensor
