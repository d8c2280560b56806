"""The node's one mask input, built from a match's Where masks and additive biases with
standard ONNX ops where that is exact (sums, And, Where(keep, bias, fill), Swin's window tiling)."""

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
    MaskKind,
    MaskStep,
    PassStep,
    ReshapeStep,
    ScaleSide,
    ScaleStep,
)
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.finite_fill import finite_fill_mask
from graphfix.attention.strategies.fused.regroup import Regroup, folds_heads, is_identity, view_bias
from graphfix.attention.strategies.fused.unsupported import Unsupported, node_of, shape_text
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex


@dataclass(frozen=True)
class MaskPlan:
    """The node's mask input, and the standard ops that build it from the chain's masks."""

    tensor: str | None
    fill: float | None  # BOOL mask: the fill; additive or no mask: None
    nodes: tuple[onnx.NodeProto, ...] = ()
    initializers: tuple[onnx.TensorProto, ...] = ()
    causal: bool = False
    describe: str = ""


def plan_mask(
    edit: GraphEdit,
    match: AttentionMatch,
    base: str,
    q: str,
    *,
    allow_causal: bool = True,
    regroup: Regroup | None = None,
) -> MaskPlan:
    """The node's one mask input from the chain's Where masks and additive biases; a pure
    causal mask becomes the node's `causal` flag when `allow_causal`.  A bias before a scale of
    the scores is scaled by it; one added before a batch·heads view (`regroup`) is viewed too."""
    index = edit.index
    wheres = [s for s in match.steps if isinstance(s, MaskStep)]
    windows = _windowed_biases(match)
    biases = [s for s in match.steps if isinstance(s, BiasStep)]
    if not wheres and not biases:
        return MaskPlan(None, None)
    for step in (*wheres, *biases):
        _refuse_widening(index, step)
    if windows and wheres:
        raise Unsupported(
            FallbackKind.MASK, "a Where mask in a chain with Swin's window view of the scores"
        )
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

    def _scaled(source: str, factor: float, elem: int) -> str:
        name = edit.unique(f"{base}/bias_scale")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        inits.append(numpy_helper.from_array(np.array(factor, dtype=dtype), name))
        return add("Mul", [source, name])

    def unwindow(source: str, windows_per_image: int) -> str:
        """bias [1|B, nW, h, n, m] as the node sees it: [B·nW, h, n, m] (B from Q's batch;
        nW read from the bias at run time when the view does not say it)."""
        shape = index.shape(source)
        if shape is None or len(shape) != 5 or not all(isinstance(d, int) for d in shape[2:]):
            raise Unsupported(
                FallbackKind.MASK, f"the windowed mask '{source}' has no static 5-D shape"
            )
        if windows_per_image == FROM_MASK:
            windows = add("Shape", [source], start=1, end=2)
        else:
            windows = const([windows_per_image])
        images = add("Div", [add("Gather", [add("Shape", [q]), const([0])], axis=0), windows])
        target = add("Concat", [images, windows, const([1, 1, 1])], axis=0)
        return add("Reshape", [add("Expand", [source, target]), const([-1, *shape[2:]])])

    bias = None
    bias_elem = None  # the biases' one element type (the tensors built from them have it too)
    if biases:
        types = {index.elem_type(b.source) for b in biases}
        if len(types) != 1 or None in types:
            raise Unsupported(
                FallbackKind.MASK,
                "the additive masks/biases have different or unknown element types",
            )
        (bias_elem,) = types
        sources = [
            unwindow(b.source, windows[id(b)]) if id(b) in windows else b.source for b in biases
        ]
        if regroup is not None:
            sources = [
                view_bias(edit, base, regroup, t, match.q, nodes, inits)
                if id(b) in regroup.before
                else t
                for b, t in zip(biases, sources, strict=True)
            ]
        factors = _later_scales(match)
        sources = [
            _scaled(t, factors[id(b)], bias_elem) if id(b) in factors else t
            for b, t in zip(biases, sources, strict=True)
        ]
        bias = sources[0]
        for extra in sources[1:]:  # (s + m1) + m2 as s + (m1 + m2): same to rounding
            bias = add("Add", [bias, extra])
    keep = None
    fill = None
    if wheres:
        fills = {w.fill for w in wheres}
        if None in fills:
            raise Unsupported(
                FallbackKind.MASK,
                f"Where '{wheres[0].node}' fills masked scores with a non-constant value",
            )
        if len(fills) != 1:
            raise Unsupported(
                FallbackKind.MASK, f"Where masks with different fills ({sorted(fills)})"
            )
        (fill,) = fills
        for where in wheres:
            this = where.source
            if where.kind is MaskKind.BLOCKED:
                this = add("Not", [this])
            keep = this if keep is None else add("And", [keep, this])
    if keep is None:
        what = "additive mask, per-window mask tiled over images" if windows else "additive mask"
        plan = MaskPlan(bias, None, tuple(nodes), tuple(inits), describe=what)
    elif bias is None:
        plan = MaskPlan(keep, fill, tuple(nodes), tuple(inits), describe="boolean mask")
    else:
        if fill == -math.inf:
            blocked = edit.unique(f"{base}/blocked_fill")
            dtype = onnx.helper.tensor_dtype_to_np_dtype(bias_elem)
            inits.append(numpy_helper.from_array(np.array(fill, dtype=dtype), blocked))
            mask = add("Where", [keep, bias, blocked])
            describe = "boolean mask with bias"
        else:
            mask = finite_fill_mask(edit, match, base, keep, bias, bias_elem, fill, nodes, inits)
            describe = f"boolean mask (fill {fill:g}) with bias"
        plan = MaskPlan(mask, None, tuple(nodes), tuple(inits), describe=describe)
    single = wheres[0] if len(wheres) == 1 and not biases else None
    source = (
        single.source if single else (biases[0].source if len(biases) == 1 and not wheres else None)
    )
    if (
        allow_causal
        and source is not None
        and not windows
        and match.causal
        and match.q_len is not None
        and match.q_len == match.kv_len
        and _is_pure_causal(index, source, single)
    ):
        return MaskPlan(None, None, causal=True)
    return plan


def _refuse_widening(index: GraphIndex, step: MaskStep | BiasStep) -> None:
    """The node's output takes its batch axes from Q and K: a mask or bias that broadcasts the
    scores wider (a [3, 1, S, T] mask on scores of batch 1) has no place in it.  Refused where
    the inferred shapes show it; unknown dims are taken to match, as exports' masks do."""
    node = step.node.node
    operands = {step.source, *((step.fill_tensor,) if isinstance(step, MaskStep) else ())}
    scores = next((t for t in node.input if t not in operands), None)
    before, after = index.shape(scores) if scores else None, index.shape(step.output)
    if before is None or after is None:
        return
    wider = len(after) > len(before) or any(
        isinstance(a, int) and isinstance(b, int) and a != b
        for a, b in zip(after[::-1], before[::-1], strict=False)
    )
    if wider:
        raise Unsupported(
            FallbackKind.MASK,
            f"'{step.node}' broadcasts the scores {list(before)} to {list(after)}: the node's "
            "output takes its batch and heads from Q and K",
        )


def _later_scales(match: AttentionMatch) -> dict[int, float]:
    """id(BiasStep) → the product of the score scales that follow it: (s + b)·c is c·s + c·b,
    the node's scale on s and a scaled bias (fused_plugin lets a scale follow biases only)."""
    factors: dict[int, float] = {}
    after = 1.0
    for step in reversed(match.steps):
        if isinstance(step, ScaleStep) and step.side is ScaleSide.SCORES and step.factor:
            after *= step.factor
        elif isinstance(step, BiasStep) and after != 1.0:
            factors[id(step)] = after
    return factors


def _windowed_biases(match: AttentionMatch) -> dict[int, int]:
    """Swin's shifted-window mask: scores [B·nW, H, N, N] viewed as [B, nW, H, N, N], a bias
    added, viewed back.  Returns id(BiasStep) → nW for the biases inside such a view; any other
    Reshape of the scores is unsupported."""
    windowed: dict[int, int] = {}
    windows: int | None = None
    outer: tuple[int, ...] | None = None
    for step in match.steps:
        if isinstance(step, ReshapeStep) and (is_identity(step) or folds_heads(step)):
            continue  # identity or batch·heads views: find_regroup reads them
        if isinstance(step, ReshapeStep):
            target = step.target
            view = target if target is not None else step.output_shape
            if windows is None and view is not None and len(view) == 5:
                outer = _window_dims(step, view)
                # the view's window count; where the exporter computes it at run time, the
                # windowed mask's (the original's Add broadcasts only with that many windows)
                windows = view[1] if isinstance(view[1], int) and view[1] > 0 else FROM_MASK
                continue
            if windows is not None and target is not None and len(target) == 4:
                if target[0] != -1 or tuple(target[1:]) != tuple(outer):
                    raise _reshape_unsupported(step)
                windows = None
                continue
            raise _reshape_unsupported(step)
        if windows is not None:
            if not isinstance(step, (BiasStep, CastStep, PassStep)):
                raise Unsupported(
                    FallbackKind.RESHAPE,
                    f"'{node_of(step)}' inside Swin's window view of the scores",
                )
            if isinstance(step, BiasStep):
                windowed[id(step)] = windows
    if windows is not None:
        raise Unsupported(
            FallbackKind.RESHAPE, "the scores stay in a window view up to the Softmax"
        )
    return windowed


FROM_MASK = 0  # _windowed_biases: the window count is the windowed mask's dim 1


def _window_dims(step: ReshapeStep, view: tuple) -> tuple[int, ...]:
    """H, N, N of a [B·nW, H, N, N] → [B, nW, H, N, N] view: static, and the same on both
    sides where both say them."""
    inner = step.input_shape
    if inner is None or len(inner) != 4:
        raise _reshape_unsupported(step)
    dims = []
    for a, b in zip(inner[1:], view[2:], strict=True):
        known = {d for d in (a, b) if isinstance(d, int) and d > 0}
        if len(known) != 1:
            raise _reshape_unsupported(step)
        dims.append(known.pop())
    return tuple(dims)


def _reshape_unsupported(step: ReshapeStep) -> Unsupported:
    return Unsupported(
        FallbackKind.RESHAPE,
        f"{step.op} '{step.node}' reshapes the scores inside the chain "
        f"({shape_text(step.input_shape)} → {shape_text(step.output_shape)})",
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
