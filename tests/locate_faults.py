"""Planted float16 faults for `graphfix locate`'s tests and benchmark.

`plant_overflow` scales the weight of one MatMul/Gemm/Conv in the middle of a real export so its
output peaks at `peak` on the given inputs: finite in float32, beyond float16's 65504.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.model_io import LoadedModel
from graphfix.precision.locate.reference import TensorStreamer, node_label

WEIGHTED = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True)
class PlantedFault:
    model: onnx.ModelProto
    node: str  # the planted node's label
    consumers: tuple[str, ...]  # its direct consumers' labels
    scale: float
    peak: float  # the planted node's output peak on the inputs (float32 reference)


def weighted_nodes(model: onnx.ModelProto) -> list[tuple[int, onnx.NodeProto, str]]:
    """(position, node, weight initializer) for MatMul/Gemm/Conv nodes reading a float weight."""
    inits = {t.name: t for t in model.graph.initializer}
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type not in WEIGHTED:
            continue
        for name in node.input[:2]:
            init = inits.get(name)
            if (
                init is not None
                and init.data_type == onnx.TensorProto.FLOAT
                and len(init.dims) >= 2
            ):
                found.append((i, node, name))
                break
    return found


def plant_overflow(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    peak: float = 3e5,
    where: float = 0.5,
) -> PlantedFault:
    """Scale the weight of the weighted node nearest `where` (fraction of graph depth)."""
    candidates = weighted_nodes(model)
    if not candidates:
        raise ValueError("no MatMul/Gemm/Conv with a float32 weight")
    n = len(model.graph.node)
    position, node, weight = min(candidates, key=lambda c: abs(c[0] / n - where))
    with TensorStreamer(LoadedModel(model, None, True), label="planting") as stream:
        out = stream.fetch([node.output[0]], feeds)[node.output[0]]
    current = float(np.abs(out).max())
    scale = peak / current
    planted = onnx.ModelProto()
    planted.CopyFrom(model)
    for init in planted.graph.initializer:
        if init.name == weight:
            init.CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(scale), weight)
            )
    consumers = tuple(
        node_label(m, j) for j, m in enumerate(model.graph.node) if node.output[0] in m.input
    )
    return PlantedFault(planted, node_label(node, position), consumers, scale, peak)
