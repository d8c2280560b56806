"""FLOPs of Conv, ConvTranspose, MatMul and Gemm from inferred shapes (a multiply-add is 2 FLOPs).

Conv           2 · N · Cout · ∏(output spatial) · Cin/groups · ∏(kernel)
ConvTranspose  2 · N · Cin  · ∏(input spatial)  · Cout/groups · ∏(kernel)
MatMul         2 · ∏(output dims) · K
Gemm           2 · M · N · K
"""

from __future__ import annotations

import math

import onnx

from graphfix.qdq.view import QdqView


def node_flops(view: QdqView, node: onnx.NodeProto) -> int | None:
    """FLOPs of one compute node, or None when a shape it needs is unknown."""
    if node.op_type == "Conv":
        return _conv(view, node)
    if node.op_type == "ConvTranspose":
        return _conv_transpose(view, node)
    if node.op_type == "MatMul":
        return _matmul(view, node)
    if node.op_type == "Gemm":
        return _gemm(view, node)
    return None


def _conv(view: QdqView, node: onnx.NodeProto) -> int | None:
    return _conv_over(view, node, node.output[0])  # every output pixel: C_in/group × kernel MACs


def _conv_transpose(view: QdqView, node: onnx.NodeProto) -> int | None:
    return _conv_over(view, node, node.input[0])  # every input pixel: C_out/group × kernel MACs


def _conv_over(view: QdqView, node: onnx.NodeProto, tensor: str) -> int | None:
    """2 · N · C · ∏spatial of `tensor` · W[1] · ∏kernel: a convolution's FLOPs counted over the
    side whose every pixel meets the whole kernel (the output of a Conv, the input of a
    ConvTranspose)."""
    weight = view.static_shape(node.input[1])
    shape = view.static_shape(tensor)
    if weight is None or shape is None or len(shape) < 3:
        return None
    n, channels, spatial = shape[0], shape[1], shape[2:]
    return 2 * n * channels * math.prod(spatial) * weight[1] * math.prod(weight[2:])


def _matmul(view: QdqView, node: onnx.NodeProto) -> int | None:
    a = view.static_shape(node.input[0])
    out = view.static_shape(node.output[0])
    if a is None or out is None or not a:
        return None
    return 2 * math.prod(out) * a[-1]


def _gemm(view: QdqView, node: onnx.NodeProto) -> int | None:
    a = view.static_shape(node.input[0])
    out = view.static_shape(node.output[0])
    if a is None or out is None or len(a) != 2:
        return None
    k = a[0] if view.attribute(node, "transA", 0) else a[1]
    return 2 * math.prod(out) * k
