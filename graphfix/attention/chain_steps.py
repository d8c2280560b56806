"""The typed description of a matched chain: ScaleStep, MaskStep, BiasStep, SoftcapStep,
CastStep, ReshapeStep, QdqStep, SinkStep, NanGuardStep, ShiftStep (match_types), built once by
the matcher from the nodes its walk found, in chain order, each bound to its nodes.  Consumers
read these records and never walk the graph again."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from graphfix.attention.match_types import (
    BiasStep,
    CastStep,
    ChainStep,
    HeadMixStep,
    MaskKind,
    MaskStep,
    NanGuardStep,
    PassStep,
    QdqSite,
    QdqStep,
    ReshapeStep,
    ScaleOp,
    ScaleSide,
    ScaleStep,
    ShiftStep,
    SinkStep,
    SoftcapStep,
)
from graphfix.graph.index import BoundNode, GraphIndex, dtype_name


class NoMatch(Exception):
    """Internal: the chain walk failed; `args[0]` is the user-facing reason."""


@dataclass(frozen=True)
class Factor:
    scalar: str
    op: str  # "Mul" | "Div"
    node: onnx.NodeProto


@dataclass(frozen=True)
class OperandScale:
    """Scalar factors found on one Q·Kᵀ operand: peeled at the MatMul, or baked in upstream."""

    peeled: tuple[Factor, ...] = ()  # right at the MatMul, nearest first
    baked: tuple[Factor, ...] = ()  # before a Reshape/Transpose: part of the operand


LAYOUT_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast"}
MAX_OPERAND_HOPS = 6


# --- the typed description: scale, softcap, mask, casts, Q/DQ, sink ---------------------------
def operand_steps(
    index: GraphIndex, q_scale: OperandScale, k_scale: OperandScale
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


def _scale_step(index: GraphIndex, factor: Factor, side: ScaleSide) -> ScaleStep:
    value = uniform_value(index, factor.scalar)
    if value is not None and factor.op == "Div":
        value = None if value == 0 else 1.0 / value
    return ScaleStep(
        factor=value,
        op=ScaleOp(factor.op.lower()),
        side=side,
        scalar=factor.scalar,
        node=index.bind(factor.node),
        output=factor.node.output[0],
        computed_by=() if value is not None else backward_slice(index, factor.scalar, limit=24),
    )


def uniform_value(index: GraphIndex, tensor: str) -> float | None:
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
        quantize=index.bind(quantize),
        dequantize=index.bind(dequantize),
        scale=quantize.input[1],
        zero_point=zero_point,
        input=quantize.input[0],
        output=dequantize.output[0],
        quant_type=dtype_name(quant) if quant else "uint8",  # QuantizeLinear's default
    )


def operand_qdq(index: GraphIndex, tensor: str, site: QdqSite) -> QdqStep | None:
    """A QuantizeLinear → DequantizeLinear pair producing `tensor` (seen through layout ops)."""
    current = tensor
    for _ in range(MAX_OPERAND_HOPS):
        node = index.producer_of(current)
        if node is None:
            return None
        if node.op_type == "DequantizeLinear":
            quantize = index.producer_of(node.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                return _qdq_step(index, quantize, node, site)
            return None
        if node.op_type not in LAYOUT_OPS:
            return None
        current = node.input[0]
    return None


def chain_steps(
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
        op, bound, out = node.op_type, index.bind(node), node.output[0]
        if op in ("Mul", "Div"):
            steps.append(
                _scale_step(index, Factor(_other_input(node, main), op, node), ScaleSide.SCORES)
            )
        elif op == "Tanh":
            steps.append(node)
        elif op == "Add":
            steps.append(BiasStep(source=_other_input(node, main), node=bound, output=out))
        elif op == "Where":
            kind = MaskKind.KEEP if node.input[1] == main else MaskKind.BLOCKED
            fill = node.input[2] if kind is MaskKind.KEEP else node.input[1]
            steps.append(
                MaskStep(
                    kind=kind,
                    source=node.input[0],
                    fill=uniform_value(index, fill),
                    fill_tensor=fill,
                    node=bound,
                    output=out,
                )
            )
        elif op == "Sub":
            reduce_max = index.bind(index.producer_of(node.input[1]))  # the matcher checked it
            steps.append(ShiftStep(node=bound, reduce_max=reduce_max, output=out))
        elif op in ("Cast", "CastLike"):
            steps.append(CastStep(to=_cast_target(index, node), node=bound, output=out))
        elif op == "Identity":
            steps.append(PassStep(op=op, node=bound, output=out))
        elif op in ("Reshape", "Squeeze", "Unsqueeze"):
            steps.append(
                ReshapeStep(
                    op=op,
                    node=bound,
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
        elif op == "Transpose":
            step, position = _head_mix_step(index, nodes, position - 1)
            steps.append(step)
            out = step.output
        main = out
    return _merge_softcaps(index, steps), sink_concat


def _head_mix_step(
    index: GraphIndex, nodes: list[onnx.NodeProto], first: int
) -> tuple[HeadMixStep, int]:
    """The talking-heads nodes starting at nodes[first] (the matcher checked their form); the
    step and the position after it."""
    end = first + (4 if nodes[first + 2].op_type == "Add" else 3)
    mix = nodes[first:end]
    return (
        HeadMixStep(
            nodes=tuple(index.bind(n) for n in mix),
            weight=mix[1].input[1],
            output=mix[-1].output[0],
        ),
        end,
    )


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
        after = steps[position] if position < len(steps) else None
        cap: float | None = None
        nodes = [index.bind(step)]
        output = step.output[0]
        if _is_scores_scale(after) and after.op is ScaleOp.MUL:
            cap, output = after.factor, after.output
            nodes.append(after.node)
            position += 1
        before = merged[-1] if merged else None
        if (
            cap is not None
            and _is_scores_scale(before)
            and before.factor is not None
            and math.isclose(before.factor * cap, 1.0, rel_tol=1e-3)
        ):
            nodes.insert(0, before.node)
            merged.pop()
        else:
            cap = None
        merged.append(SoftcapStep(cap=cap, nodes=tuple(nodes), output=output))
    return merged


def _is_scores_scale(step: object) -> bool:
    return isinstance(step, ScaleStep) and step.side is ScaleSide.SCORES


def after_steps(
    index: GraphIndex, softmax: onnx.NodeProto, nodes: list[onnx.NodeProto]
) -> tuple[list[ChainStep], onnx.NodeProto | None]:
    """Softmax → P·V as steps, in order; also the Slice that drops a sink column, if any."""
    steps: list[ChainStep] = []
    sink_slice: onnx.NodeProto | None = None
    position = 0
    while position < len(nodes):
        node = nodes[position]
        position += 1
        op, bound, out = node.op_type, index.bind(node), node.output[0]
        if op == "Cast":
            steps.append(CastStep(to=_cast_target(index, node), node=bound, output=out))
        elif op in ("Identity", "Dropout"):
            steps.append(PassStep(op=op, node=bound, output=out))
        elif op in ("Reshape", "Squeeze", "Unsqueeze"):
            steps.append(ReshapeStep(op, bound, out, index.shape(node.input[0]), index.shape(out)))
        elif op == "Where":  # the matcher checked it is Where(IsNaN(p), 0, p)
            is_nan = index.bind(index.producer_of(node.input[0]))
            steps.append(NanGuardStep(node=bound, is_nan=is_nan, output=out))
        elif op == "QuantizeLinear":
            if position >= len(nodes) or nodes[position].op_type != "DequantizeLinear":
                raise NoMatch(
                    f"QuantizeLinear '{node.name}' after the softmax is not followed by a "
                    "DequantizeLinear before P·V"
                )
            steps.append(_qdq_step(index, node, nodes[position], QdqSite.PROBS))
            position += 1
        elif op == "DequantizeLinear":
            raise NoMatch(f"DequantizeLinear '{node.name}' after the softmax has no QuantizeLinear")
        elif op == "Transpose":
            step, position = _head_mix_step(index, nodes, position - 1)
            steps.append(step)
        elif op == "Slice":
            if sink_slice is not None:
                raise NoMatch("two Slices between the softmax and P·V")
            sink_slice = node
    return steps, sink_slice


def sink_step(
    index: GraphIndex,
    concat: onnx.NodeProto | None,
    slice_node: onnx.NodeProto | None,
    steps: list[ChainStep],
    qk: onnx.NodeProto,
) -> SinkStep | None:
    if concat is None and slice_node is None:
        return None
    if concat is None:
        raise NoMatch(f"Slice '{slice_node.name}' cuts the probabilities before P·V, not a sink")
    if slice_node is None:
        raise NoMatch(
            f"Concat '{concat.name}' extends the scores, but no Slice drops the extra column "
            "before P·V"
        )
    chain_outputs = {qk.output[0], *(getattr(s, "output", "") for s in steps)}
    scores_first = concat.input[0] in chain_outputs
    sink = concat.input[1] if scores_first else concat.input[0]
    return SinkStep(
        sink=sink,
        concat=index.bind(concat),
        slice=index.bind(slice_node),
        scores_first=scores_first,
        output=slice_node.output[0],
    )


def backward_slice(index: GraphIndex, tensor: str, *, limit: int) -> tuple[BoundNode, ...]:
    """The nodes computing `tensor` (up to `limit`), back to where it reads a shape."""
    nodes: list[BoundNode] = []
    stack = [tensor]
    seen: set[str] = set()
    while stack and len(nodes) < limit:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = index.producer_of(name)
        if node is None:
            continue
        nodes.append(index.bind(node))
        if node.op_type not in ("Shape", "Size"):  # the slice ends where it reads a shape
            stack.extend(i for i in node.input if i)
    return tuple(nodes)
