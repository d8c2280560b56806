"""Decomposed LayerNorm and RMSNorm, as exporters write them.

Accepted chains (x: the normalised tensor; every op in the default domain):

    LayerNorm  m = ReduceMean(x, A);  d = Sub(x, m);  [d = Cast(d, float32)]
    RMSNorm    d = x
    both       v = ReduceMean(Pow(d, 2) | Mul(d, d), A);  ve = Add(v, ε)
               n = Div(d, Sqrt(ve)) | Mul(d, Reciprocal(Sqrt(ve))) | Mul(d, Div(1, Sqrt(ve)))
                   | Mul(d, Pow(ve, -0.5))                       (either operand order for Mul/Add)
               [n = Cast(n, T) when x = Cast(x₀: T, float32), or d was Cast from T: then the
                fused node reads x₀ and computes in float32, as the ONNX ops' stash_type does]
               [n = Mul(n, γ)]  [n = Add(n, β), LayerNorm only]

A is given as the `axes` attribute (opset < 18) or as a constant second input (opset ≥ 18) and
must name the last axes of x.  γ and β must be constants that broadcast over those axes only;
a Mul or Add that does not qualify is left in the graph after the fused node.  The chain is
found from its variance ReduceMean; a chain that is shaped like a norm but fails a check is
returned with `problem` set, so the report can say why it was kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from graphfix.graph.index import GraphIndex, dtype_name
from graphfix.precision.norm_chain import (
    check_private,
    int_attr,
    other_input,
    scalar_constant,
    sole_consumer,
)
from graphfix.precision.norm_types import Affine, NormCandidate, NormKind

_FLOAT = onnx.TensorProto.FLOAT
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}
_WIDE = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
_DEFAULT_DOMAINS = ("", "ai.onnx")


def find_reduce_norms(index: GraphIndex) -> list[NormCandidate]:
    """Every LayerNorm/RMSNorm chain of the top-level graph, in graph order."""
    found = []
    for node in index.graph.node:
        if node.op_type == "ReduceMean" and node.domain in _DEFAULT_DOMAINS:
            candidate = _match(index, node)
            if candidate is not None:
                found.append(candidate)
    return found


@dataclass
class _Chain:
    """A chain being matched, grown outward from its variance ReduceMean."""

    nodes: list[onnx.NodeProto]
    end: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def grow(self, node: onnx.NodeProto) -> None:
        self.nodes.append(node)
        self.end = node.output[0]


def _match(index: GraphIndex, variance: onnx.NodeProto) -> NormCandidate | None:
    square = index.producer_of(variance.input[0])
    if square is None or square.domain not in _DEFAULT_DOMAINS:
        return None
    if square.op_type == "Pow":
        centred, exponent = square.input[0], scalar_constant(index, square.input[1])
    elif square.op_type == "Mul" and square.input[0] == square.input[1]:
        centred, exponent = square.input[0], 2.0
    else:
        return None
    adds = [u for u in index.consumers_of(variance.output[0]) if u.op_type == "Add"]
    tail = _normalising_tail(index, adds[0].output[0], centred) if len(adds) == 1 else None
    if tail is None:
        return None

    add_eps = adds[0]
    core = [square, variance, add_eps, *tail]
    chain = _Chain(nodes=list(core), end=tail[-1].output[0])
    if exponent != 2.0:
        chain.problems.append(f"{square.name or square.op_type} raises to {exponent}, not 2")
    eps_input = next(i for i in add_eps.input if i != variance.output[0])
    epsilon = scalar_constant(index, eps_input)
    if epsilon is None or not np.isfinite(epsilon):
        chain.problems.append(f"ε ({eps_input}) is not a finite scalar constant")
        epsilon = 0.0
    kind, x, centring, cast_d = _centring(index, centred, chain.problems)
    chain.nodes[:0] = centring
    reductions = [variance, *centring[:1]] if kind is NormKind.LAYER_NORM else [variance]
    axis = _check_axes(index, reductions, x, chain.problems)
    _check_constant_ranks(index, core, x, chain.problems)
    x_type = index.elem_type(x) or 0
    if not x_type:
        chain.problems.append(f"the element type of {x} is unknown")
    elif x_type not in _FLOAT_TYPES:
        chain.problems.append(f"{x} is {dtype_name(x_type)}, not a float type")

    fused_input, x_type = _absorb_casts(index, chain, x, x_type, cast_d)
    shape = index.shape(fused_input) or index.shape(x)
    normalized = _normalized_shape(shape, axis)
    statistics = tuple(n.name for n in chain.nodes)
    overflow = statistics
    if kind is NormKind.RMS_NORM:  # x², its mean, + ε and the root; the Div/Mul after are in range
        overflow = tuple(n.name for n in (square, variance, add_eps, tail[0]))
    scale, bias = _absorb_affine(index, chain, kind, shape, axis)
    if scale is None and normalized is None and not chain.problems:
        chain.problems.append(
            f"the normalised dims of {fused_input} are not static, and "
            f"{kind.op_type} needs a scale of that shape"
        )
    check_private(index, chain.nodes, chain.end, chain.problems)
    return NormCandidate(
        kind=kind,
        input=fused_input,
        output=chain.end,
        positions=tuple(index.position(n) for n in chain.nodes),
        node_names=tuple(n.name for n in chain.nodes),
        statistics=statistics,
        overflow=overflow,
        epsilon=float(epsilon),
        axis=axis,
        scale=scale,
        bias=bias,
        dtype=x_type,
        normalized_shape=normalized,
        problem=chain.problems[0] if chain.problems else None,
        notes=tuple(chain.notes),
    )


def _absorb_casts(
    index: GraphIndex, chain: _Chain, x: str, x_type: int, cast_d: onnx.NodeProto | None
) -> tuple[str, int]:
    """Take in the Cast back after the normalisation when the chain computes in a wider type
    than its input: the fused op (stash_type float32) does the same.  Returns the fused node's
    input and its element type."""
    cast_back = sole_consumer(index, chain.end, "Cast")
    back_to = int_attr(cast_back, "to") if cast_back is not None else None
    up_cast = _up_cast(index, x)
    if cast_d is not None:  # torch's legacy float16 LayerNorm: x − mean Cast to a wider type
        if back_to != x_type or int_attr(cast_d, "to") not in _WIDE:
            chain.problems.append(
                f"x − mean is Cast to float32 and the result is not Cast back to {dtype_name(x_type)}"
            )
            return x, x_type
        chain.grow(cast_back)
        if x_type != _FLOAT:
            chain.notes.append(
                f"the mean and x − mean are computed in float32 (were {dtype_name(x_type)}), "
                f"the variance in float32 (was {dtype_name(int_attr(cast_d, 'to'))})"
            )
        return x, x_type
    if up_cast is not None and back_to is not None and back_to == index.elem_type(up_cast.input[0]):
        chain.grow(cast_back)
        inside = {id(n) for n in chain.nodes}
        if x not in index.graph_outputs and all(id(c) in inside for c in index.consumers_of(x)):
            chain.nodes.insert(0, up_cast)
        return up_cast.input[0], back_to
    computes_in = index.elem_type(chain.end)
    if computes_in in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        chain.notes.append(f"computes in float32 (was {dtype_name(computes_in)})")
    return x, x_type


def _absorb_affine(
    index: GraphIndex,
    chain: _Chain,
    kind: NormKind,
    shape: tuple[int | str | None, ...] | None,
    axis: int | None,
) -> tuple[Affine | None, Affine | None]:
    """Take in the Mul by γ and (LayerNorm) the Add of β that follow, when they qualify."""
    mul = sole_consumer(index, chain.end, "Mul")
    scale = None if mul is None else _affine(index, other_input(mul, chain.end), shape, axis)
    if scale is None:
        return None, None
    chain.grow(mul)
    add = sole_consumer(index, chain.end, "Add") if kind is NormKind.LAYER_NORM else None
    bias = None if add is None else _affine(index, other_input(add, chain.end), shape, axis)
    if bias is not None:
        chain.grow(add)
    return scale, bias


def _normalising_tail(
    index: GraphIndex, with_eps: str, centred: str
) -> list[onnx.NodeProto] | None:
    """The nodes from `with_eps` (variance + ε) to `centred` divided by its square root."""
    for node in index.consumers_of(with_eps):
        if node.op_type == "Pow" and scalar_constant(index, node.input[1]) == -0.5:
            mul = _mul_of(index, node.output[0], centred)
            if mul is not None:
                return [node, mul]
        if node.op_type != "Sqrt":
            continue
        root = node.output[0]
        for user in index.consumers_of(root):
            if user.op_type == "Div" and list(user.input) == [centred, root]:
                return [node, user]
            inverse = user.op_type == "Reciprocal" or (
                user.op_type == "Div"
                and user.input[1] == root
                and scalar_constant(index, user.input[0]) == 1.0
            )
            if inverse:
                mul = _mul_of(index, user.output[0], centred)
                if mul is not None:
                    return [node, user, mul]
    return None


def _centring(
    index: GraphIndex, centred: str, problems: list[str]
) -> tuple[NormKind, str, list[onnx.NodeProto], onnx.NodeProto | None]:
    """LayerNorm when `centred` is x − ReduceMean(x) (perhaps Cast to float32), else RMSNorm of
    `centred`.  Returns the kind, x, the centring nodes (mean first) and the Cast of x − mean."""
    producer = index.producer_of(centred)
    cast_d = None
    if producer is not None and producer.op_type == "Cast":
        inner = index.producer_of(producer.input[0])
        if inner is not None and inner.op_type == "Sub":
            cast_d, producer = producer, inner
    if producer is None or producer.op_type != "Sub":
        return NormKind.RMS_NORM, centred, [], None
    a, b = producer.input
    mean = index.producer_of(b)
    if mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == a:
        return NormKind.LAYER_NORM, a, [mean, producer, *([cast_d] if cast_d else [])], cast_d
    mean = index.producer_of(a)
    if mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == b:
        problems.append(f"{producer.name or 'Sub'} computes mean − x, not x − mean")
        return NormKind.LAYER_NORM, b, [mean, producer, *([cast_d] if cast_d else [])], cast_d
    return NormKind.RMS_NORM, centred, [], None


def _check_axes(
    index: GraphIndex, reductions: list[onnx.NodeProto], x: str, problems: list[str]
) -> int | None:
    """The first normalised axis (negative) when every ReduceMean keeps dims and reduces the
    same last axes of x; else None with the reason appended to `problems`."""
    rank = index.rank(x)
    found = []
    for node in reductions:
        if int_attr(node, "keepdims", 1) != 1:
            problems.append(f"{node.name or 'ReduceMean'} drops the reduced axes (keepdims=0)")
            return None
        axes = _reduce_axes(index, node)
        if axes is None:
            problems.append(f"{node.name or 'ReduceMean'} reduces over axes that are not constant")
            return None
        if not axes:
            problems.append(f"{node.name or 'ReduceMean'} has empty axes")
            return None
        if any(a >= 0 for a in axes) and rank is None:
            problems.append(f"the rank of {x} is unknown, so axes {list(axes)} cannot be placed")
            return None
        found.append(sorted(a - rank if a >= 0 else a for a in axes))
    if any(f != found[0] for f in found):
        problems.append(f"the two ReduceMeans reduce different axes ({found[1]} and {found[0]})")
        return None
    axes = found[0]
    if axes != list(range(-len(axes), 0)):
        problems.append(f"normalises axes {axes}, not the last {len(axes)} axes of {x}")
        return None
    return axes[0]


def _check_constant_ranks(
    index: GraphIndex, core: list[onnx.NodeProto], x: str, problems: list[str]
) -> None:
    """ε, the exponent and the 1 of 1/√· must not have more dims than x: they would broadcast
    the chain's result to a higher rank than the fused node's."""
    rank = index.rank(x)
    limit = 1 if rank is None else rank
    for node in core:
        for name in node.input[1:] if node.op_type != "Div" else node.input:
            value = index.constant_value(name) if name else None
            if value is not None and value.size == 1 and value.ndim > limit:
                problems.append(f"constant {name} has {value.ndim} dims, more than {x}")
                return


def _reduce_axes(index: GraphIndex, node: onnx.NodeProto) -> tuple[int, ...] | None:
    for attr in node.attribute:
        if attr.name == "axes":
            return tuple(attr.ints)
    if len(node.input) > 1 and node.input[1]:
        value = index.constant_value(node.input[1])
        return None if value is None else tuple(int(a) for a in value.reshape(-1))
    return ()


def _up_cast(index: GraphIndex, x: str) -> onnx.NodeProto | None:
    """The Cast that widens x to float32 from a float type, if x is made by one."""
    cast = index.producer_of(x)
    if cast is None or cast.op_type != "Cast" or int_attr(cast, "to") != _FLOAT:
        return None
    source = index.elem_type(cast.input[0])
    return cast if source in (_FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) else None


def _normalized_shape(
    shape: tuple[int | str | None, ...] | None, axis: int | None
) -> tuple[int, ...] | None:
    if shape is None or axis is None or -axis > len(shape):
        return None
    dims = shape[axis:]
    return tuple(dims) if all(isinstance(d, int) and d > 0 for d in dims) else None  # type: ignore[arg-type]


def _affine(
    index: GraphIndex, tensor: str, x_shape: tuple[int | str | None, ...] | None, axis: int | None
) -> Affine | None:
    """`tensor` as a scale/bias of the normalised dims, or None when it is not a constant or
    broadcasts over other axes (then its Mul/Add stays after the fused node)."""
    normalized = _normalized_shape(x_shape, axis)
    if normalized is None or x_shape is None or axis is None or not index.is_constant(tensor):
        return None
    shape = index.shape(tensor)
    value = None
    if shape is None:
        value = index.constant_value(tensor)
        if value is None:
            return None
        shape = value.shape
    rank = len(x_shape)
    if len(shape) > rank or not all(isinstance(d, int) for d in shape):
        return None
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    if any(d != 1 for d in padded[: rank + axis]):
        return None
    if any(d not in (1, n) for d, n in zip(padded[rank + axis :], normalized, strict=True)):
        return None
    if tensor in index.initializers and tuple(shape) == normalized:
        return Affine(tensor=tensor)
    value = index.constant_value(tensor) if value is None else value
    if value is None:
        return None
    kept = value.reshape(padded[rank + axis :])
    return Affine(value=np.ascontiguousarray(np.broadcast_to(kept, normalized)))


def _mul_of(index: GraphIndex, factor: str, centred: str) -> onnx.NodeProto | None:
    for user in index.consumers_of(factor):
        if user.op_type == "Mul" and sorted(user.input) == sorted([factor, centred]):
            return user
    return None
