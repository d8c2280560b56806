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
)
from graphfix.attention.strategies.base import FallbackKind
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
    edit: GraphEdit, match: AttentionMatch, base: str, q: str, *, allow_causal: bool = True
) -> MaskPlan:
    """The node's one mask input from the chain's Where masks and additive biases; a pure
    causal mask becomes the node's `causal` flag when `allow_causal`."""
    index = edit.index
    wheres = [s for s in match.steps if isinstance(s, MaskStep)]
    windows = _windowed_biases(match)
    biases = [s for s in match.steps if isinstance(s, BiasStep)]
    if not wheres and not biases:
        return MaskPlan(None, None)
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

    def unwindow(source: str, windows_per_image: int) -> str:
        """bias [1|B, nW, h, n, m] as the node sees it: [B·nW, h, n, m] (B from Q's batch)."""
        shape = index.shape(source)
        if shape is None or len(shape) != 5 or not all(isinstance(d, int) for d in shape[2:]):
            raise Unsupported(
                FallbackKind.MASK, f"the windowed mask '{source}' has no static 5-D shape"
            )
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
            raise Unsupported(
                FallbackKind.MASK,
                "the additive masks/biases have different or unknown element types",
            )
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
        if fill != -math.inf and not _keeps_a_key_per_row(index, wheres, fill):
            raise Unsupported(
                FallbackKind.MASK,
                f"a Where mask with the finite fill {fill:g} combined with an additive bias: "
                "folding them into one mask would change rows whose every key is blocked",
            )
        elem = index.elem_type(bias)
        blocked = edit.unique(f"{base}/blocked_fill")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        inits.append(numpy_helper.from_array(np.array(fill, dtype=dtype), blocked))
        mask = add("Where", [keep, bias, blocked])
        plan = MaskPlan(mask, None, tuple(nodes), tuple(inits), describe="boolean mask with bias")
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


def _agrees(dims: tuple, target: tuple[int, ...]) -> bool:
    return all(not isinstance(d, int) or d == t for d, t in zip(dims, target, strict=True))


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
