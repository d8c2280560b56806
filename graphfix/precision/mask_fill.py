"""Mask fills: float32-lowest constants that an attention chain adds to its scores.

Exporters write a masked score as scores + finfo(float32).min (-3.4e38), beyond float16's
range.  A masked score only has to be very negative: torch itself fills with
finfo(float16).min in float16.  Kept as it is, the constant forces its reader, and so the
whole attention chain, into float32.  A constant qualifies for lowering to the target type's
lowest finite value when:

- its values are each within the target's range or below its lowest value (no large positive
  values, no NaN): a mask, not a weight;
- every reader, directly or through data movement (Reshape, Unsqueeze, Expand, Slice, Where's
  value inputs …), is the Add of an attention chain that adds it to the scores (`BiasStep`);
- read directly by the chain's Add, each row of the constant along the softmax axis (the
  last) keeps a key at least lowest / 2: the row's largest score is then a real score, and
  exp(lowest − it) is 0 in float16 as exp(-3.4e38 − it) is in float32.  A row masked whole
  would turn softmax's uniform row into a different one (or NaN once the Add overflows to
  -inf), so such a constant is kept float32.  Read through data movement, the constant has
  been saturated to the same lowest value where it is cast down (`PlanApplier._saturate`), so
  lowering it changes no value the chain sees.

Every lowered constant is reported (`MaskFill`); every other out-of-range constant keeps its
consumers in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import AttentionMatch, BiasStep
from graphfix.graph.index import GraphIndex
from graphfix.precision import weights

# Ops that carry a value through unchanged (element by element): a mask read through them is
# still the mask.  Where only through its value inputs (slot 1 and 2).
_CARRY = {"Reshape", "Unsqueeze", "Squeeze", "Expand", "Slice", "Transpose", "Identity", "Where"}
_MAX_ELEMENTS = 1 << 24  # a mask larger than 64 MB of float32 is left as it is


@dataclass(frozen=True)
class MaskFill:
    """A mask constant whose fill value was lowered to the target type's lowest value."""

    tensor: str
    fill: float  # the most negative finite value it held (float32 lowest)
    lowered_to: float  # the target type's lowest finite value
    blocks: tuple[int, ...]  # attention blocks (as `graphfix inspect` numbers them) reading it
    readers: tuple[str, ...]  # the chains' mask Add nodes


def find_mask_fills(
    index: GraphIndex,
    matches: Sequence[AttentionMatch],
    out_of_range: dict[str, float],
    to: str,
) -> dict[str, MaskFill]:
    """The out-of-range constants that qualify as mask fills (see the module docstring)."""
    limit = weights.LIMITS[to]
    adds = {
        step.node.position: (match, step)
        for match in matches
        if not match.location  # positions of the top-level graph
        for step in match.steps
        if isinstance(step, BiasStep)
    }
    found: dict[str, MaskFill] = {}
    for name in out_of_range:
        if name in index.graph_inputs:
            continue  # an initializer the caller may feed: its default is not ours to change
        readers = _readers(index, name, adds)
        if not readers:
            continue
        values = _values(index, name)
        if values is None or not _is_mask(values, limit):
            continue
        direct = [adds[add] for add, arrives in readers if arrives == name]
        if direct and not all(_softmax_over_last(index, m, s) for m, s in direct):
            continue
        if direct and not _rows_keep_a_key(values, limit):
            continue
        blocks = sorted({adds[add][0].index for add, _ in readers})
        found[name] = MaskFill(
            tensor=name,
            fill=float(np.min(values[np.isfinite(values)])),
            lowered_to=-limit,
            blocks=tuple(blocks),
            readers=tuple(sorted({adds[add][1].node.name for add, _ in readers})),
        )
    return found


def lower_mask_fills(
    model: onnx.ModelProto, fills: dict[str, MaskFill], base_dir: Path | None
) -> None:
    """Replace each fill's values below its `lowered_to` by it, in `model` (the caller's copy):
    an initializer (read into memory when it was external) or a Constant node's value.  A -inf
    in it becomes the lowest value too, as `PlanApplier._saturate`'s Clip makes it: read through
    data movement, the chain then sees what it saw before; read directly, every row keeps a key,
    and exp(-inf) and exp(lowest − a score) are both 0."""
    graph = model.graph
    for tensor in graph.initializer:
        fill = fills.get(tensor.name)
        if fill is not None:
            values = numpy_helper.to_array(tensor, str(base_dir) if base_dir else "")
            tensor.CopyFrom(numpy_helper.from_array(_lowered(values, fill), tensor.name))
    for node in graph.node:
        fill = fills.get(node.output[0]) if node.op_type == "Constant" and node.output else None
        if fill is None:
            continue
        for attr in node.attribute:
            if attr.name == "value":
                attr.t.CopyFrom(
                    numpy_helper.from_array(_lowered(numpy_helper.to_array(attr.t), fill))
                )
            elif attr.name == "value_float":
                attr.f = float(_lowered(np.array(attr.f, np.float32), fill))
            elif attr.name == "value_floats":
                attr.floats[:] = _lowered(np.array(attr.floats, np.float32), fill).tolist()


def _lowered(values: np.ndarray, fill: MaskFill) -> np.ndarray:
    return np.maximum(values, np.float32(fill.lowered_to)).astype(np.float32)


def _readers(
    index: GraphIndex, name: str, adds: dict[int, tuple[AttentionMatch, BiasStep]]
) -> list[tuple[int, str]]:
    """(chain Add node's position, the tensor it reads) for every path from `name` through
    value-carrying ops; [] when any path ends elsewhere (a graph output, another op, Where's
    condition)."""
    found: list[tuple[int, str]] = []
    stack, seen = [name], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in index.graph_outputs:
            return []
        consumers = index.consumers_of(tensor)
        if not consumers:
            return []
        for node in consumers:
            position = index.position(node)
            hit = adds.get(position)
            if hit is not None and hit[1].source == tensor:
                found.append((position, tensor))
            elif node.op_type in _CARRY and node.domain in ("", "ai.onnx"):
                carried = [s for s, i in enumerate(node.input) if i == tensor]
                if node.op_type == "Where" and 0 in carried:
                    return []
                if node.op_type != "Where" and carried != [0]:
                    return []  # a shape, axes or index operand: not a value carried
                stack.append(node.output[0])
            else:
                return []
    return found


def _values(index: GraphIndex, name: str) -> np.ndarray | None:
    """`name`'s float32 values when it is an initializer or a Constant of a mask's size."""
    tensor = index.initializers.get(name)
    if tensor is not None:
        if tensor.data_type != onnx.TensorProto.FLOAT or math.prod(tensor.dims) > _MAX_ELEMENTS:
            return None
        if weights.is_external(tensor) and index.base_dir is None:
            return None
        return numpy_helper.to_array(tensor, str(index.base_dir or ""))
    producer = index.producer_of(name)
    if producer is None or producer.op_type != "Constant":
        return None
    value = index.constant_value(name)
    return None if value is None or value.dtype != np.float32 else value


def _softmax_over_last(index: GraphIndex, match: AttentionMatch, add: BiasStep) -> bool:
    rank = index.rank(add.output)
    return rank is not None and match.axis in (rank - 1, -1)


def _is_mask(values: np.ndarray, limit: float) -> bool:
    """Only values in range or below -limit (no NaN, nothing above +limit)."""
    return bool(values.size) and not np.isnan(values).any() and float(values.max()) <= limit


def _rows_keep_a_key(values: np.ndarray, limit: float) -> bool:
    """Every row along the last axis holds a value ≥ -limit / 2 (a key not masked)."""
    if values.ndim == 0:
        return float(values) >= -limit / 2
    return bool(np.all(np.any(values >= -limit / 2, axis=-1)))
