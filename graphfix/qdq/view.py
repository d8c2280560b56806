"""A read-only Q/DQ view of a model: quantizers, where each compute node's operands come from.

Built on GraphIndex (producers, consumers, constants, inferred shapes), the one graph view the
package shares; a 5,000-node quantized UNet indexes in well under a second.

Terms: a *quantizer* is a QuantizeLinear or DequantizeLinear node; a *pair* is Q → DQ on an
activation; a *compute node* is Conv, ConvTranspose, MatMul or Gemm.  TensorRT moves DQ forward
and Q backward across ops that commute with quantization ("Q/DQ propagation", TensorRT Developer
Guide, Explicit Quantization), so an operand counts as quantized when a DQ reaches it through them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx

from graphfix.errors import EnvironmentProblem
from graphfix.graph.index import GraphIndex, node_label

_ONNX_DOMAINS = ("", "ai.onnx", "com.microsoft")
COMPUTE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")

# Ops a DQ propagates through unchanged (data movement; max-pooling commutes with a monotonic
# per-tensor scale).  Concat is handled apart: it commutes only when every input is quantized.
COMMUTING_OPS = frozenset(
    {
        "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather",
        "Identity", "MaxPool", "Expand", "Pad", "Tile", "DepthToSpace", "SpaceToDepth",
    }
)  # fmt: skip

_WEIGHT_PASSTHROUGH = frozenset(
    {"Identity", "Cast", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten"}
)

_UNET_BLOCK = re.compile(r"^(down_blocks\.\d+|up_blocks\.\d+|mid_block)$")


def block_of(node_name: str) -> str:
    """The block a node belongs to, from its scope path.

    UNet-style names (`/unet/down_blocks.0/resnets.0/conv1/Conv`) give the path up to the UNet
    block (`unet/down_blocks.0`); other names give their first two components (`unet/conv_in`).
    """
    parts = [p for p in node_name.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if _UNET_BLOCK.match(part):
            return "/".join(parts[: i + 1])
    if len(parts) > 2:
        return "/".join(parts[:2])
    if len(parts) == 2:
        return parts[0]
    return "(unscoped)"


def _with_static_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with freshly inferred value_info, for FLOPs.

    Quantizers keep the float model's stale symbolic `unk__` dims, and a UNet's batch dimension
    reaches the convs through the timestep's Expand, which onnx's inference leaves symbolic;
    onnxruntime's symbolic shape inference merges such dims.  Where it fails (an op it does not
    know), onnx's inference with data propagation is used; unknown shapes give unknown FLOPs.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.value_info[:]
    try:  # onnxruntime >= 1.20 no longer installs sympy, which this tool imports
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:
        raise EnvironmentProblem(
            f"the Q/DQ lint needs onnxruntime's symbolic shape inference ({exc}); "
            "pip install sympy (a dependency of graphfix)"
        ) from exc
    try:
        inferred = SymbolicShapeInference.infer_shapes(copy, auto_merge=True)
        if inferred is not None:
            return inferred
    except Exception:  # its failures come as any type (assertions included): use onnx's below
        pass
    try:
        return onnx.shape_inference.infer_shapes(copy, strict_mode=False, data_prop=True)
    except (
        onnx.shape_inference.InferenceError,
        onnx.checker.ValidationError,
        ValueError,
        MemoryError,  # sizes an attribute declares that no memory holds: FLOPs unknown
    ):
        return copy


@dataclass(frozen=True)
class Quantizer:
    """The parameters of one Q or DQ node."""

    node: str
    op_type: str  # QuantizeLinear / DequantizeLinear
    scale: np.ndarray | None  # None when not constant
    zero_point: np.ndarray | None
    axis: int  # as written (default 1), meaningful when the scale is per channel
    dtype: str  # the quantized type: int8, uint8, float8e4m3fn, ...

    @property
    def per_channel(self) -> bool:
        return self.scale is not None and self.scale.size > 1

    def same_params(self, other: Quantizer) -> bool:
        if self.scale is None or other.scale is None or self.dtype != other.dtype:
            return False
        if self.scale.shape != other.scale.shape or not np.array_equal(self.scale, other.scale):
            return False
        if self.per_channel and self.axis != other.axis:
            return False
        return _zero(self.zero_point) == _zero(other.zero_point)

    def describe(self) -> str:
        if self.scale is None:
            return f"{self.dtype}, scale not constant"
        if self.per_channel:
            return f"{self.dtype}, per channel on axis {self.axis} ({self.scale.size} scales)"
        return f"{self.dtype}, scale {float(self.scale.reshape(-1)[0]):.6g}"


def _zero(zp: np.ndarray | None) -> tuple:
    if zp is None:
        return (0,)
    flat = zp.reshape(-1)
    return tuple(float(v) for v in flat.astype(np.float64)) if flat.size else (0,)


@dataclass(frozen=True)
class Operand:
    """Where a compute node's input comes from."""

    tensor: str  # as the compute node reads it
    constant: bool  # a weight (initializer, Constant, or DQ of one)
    dq: str | None  # the DQ that reaches it (through commuting ops), if any
    quantizer: Quantizer | None
    path: tuple[str, ...] = ()  # op types between the DQ and the compute node


class QdqView:
    """Quantizers, operands and shapes of one model's top-level graph."""

    def __init__(self, model: onnx.ModelProto, *, base_dir=None, infer_shapes: bool = True) -> None:
        """`infer_shapes=False` indexes `model` itself (no copy), trusting its value_info: for
        re-indexing a model this view's inference already annotated."""
        self.model = model
        indexed = _with_static_shapes(model) if infer_shapes else model
        self.index = GraphIndex(indexed, base_dir=base_dir)
        self._quantizers: dict[str, Quantizer] = {}
        self._constant: dict[str, bool] = {}

    # --- nodes -------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.index.graph.node)

    def producer(self, tensor: str) -> onnx.NodeProto | None:
        return self.index.producer_of(tensor)

    def consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return self.index.consumers_of(tensor)

    def label(self, node: onnx.NodeProto) -> str:
        return node_label(node, self.index.position(node))

    @staticmethod
    def is_q(node: onnx.NodeProto | None) -> bool:
        return (
            node is not None and node.op_type == "QuantizeLinear" and node.domain in _ONNX_DOMAINS
        )

    @staticmethod
    def is_dq(node: onnx.NodeProto | None) -> bool:
        return (
            node is not None and node.op_type == "DequantizeLinear" and node.domain in _ONNX_DOMAINS
        )

    def quantizer(self, node: onnx.NodeProto) -> Quantizer:
        key = self.label(node)
        if key not in self._quantizers:
            self._quantizers[key] = self._read_quantizer(node)
        return self._quantizers[key]

    def _read_quantizer(self, node: onnx.NodeProto) -> Quantizer:
        scale = self.index.constant_value(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zero_point = self.index.constant_value(zp_name) if zp_name else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return Quantizer(
            node=self.label(node),
            op_type=node.op_type,
            scale=None if scale is None else np.asarray(scale),
            zero_point=None if zero_point is None else np.asarray(zero_point),
            axis=axis,
            dtype=self._quantized_dtype(node),
        )

    def _quantized_dtype(self, node: onnx.NodeProto) -> str:
        if self.is_dq(node):
            elem = self.index.elem_type(node.input[0])
        else:
            zp = node.input[2] if len(node.input) > 2 else ""
            attr = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
            elem = (self.index.elem_type(zp) if zp else None) or attr or onnx.TensorProto.UINT8
        if not elem:
            return "unknown"
        return onnx.TensorProto.DataType.Name(elem).lower()

    # --- operands ----------------------------------------------------------------------------
    def is_constant(self, tensor: str) -> bool:
        """A weight: an initializer or Constant, possibly through Identity, Cast, Q/DQ and
        reshaping ops (the legacy exporter shares weights through Identity nodes)."""
        if tensor not in self._constant:
            self._constant[tensor] = False  # cycle guard
            self._constant[tensor] = self._compute_constant(tensor)
        return self._constant[tensor]

    def _compute_constant(self, tensor: str) -> bool:
        if not tensor or tensor in self.index.initializers:
            return True
        node = self.producer(tensor)
        if node is None:
            return False
        if node.op_type in ("Constant", "ConstantOfShape"):
            return True
        if node.op_type in _WEIGHT_PASSTHROUGH or self.is_q(node) or self.is_dq(node):
            return self.is_constant(node.input[0]) and all(
                self.index._is_structurally_constant(i, 0) for i in node.input[1:] if i
            )
        return self.index._is_structurally_constant(tensor, 0)

    def operand(self, tensor: str) -> Operand:
        """Where `tensor` (a compute node input) comes from: a DQ through commuting ops, or not."""
        path: list[str] = []
        current = tensor
        for _ in range(16):
            node = self.producer(current)
            if node is None:
                break
            if self.is_dq(node):
                source = node.input[0]
                q = self.producer(source)
                constant = self.is_constant(source) or (
                    self.is_q(q) and self.is_constant(q.input[0])
                )
                return Operand(
                    tensor, constant, self.label(node), self.quantizer(node), tuple(path)
                )
            if node.op_type == "Concat" and node.input:
                parts = [self.operand(i) for i in node.input if i]
                if parts and all(p.dq for p in parts):
                    first = parts[0]
                    return Operand(tensor, False, first.dq, first.quantizer, (*path, "Concat"))
                break
            if self.commutes(node):
                path.append(node.op_type)
                scalar_first = node.op_type == "Mul" and self.is_scalar(node.input[0])
                current = node.input[1] if scalar_first else node.input[0]
                continue
            break
        return Operand(tensor, self.is_constant(tensor), None, None, tuple(path))

    def commutes(self, node: onnx.NodeProto) -> bool:
        """A per-tensor DQ moves across `node`: data movement, max-pooling, nearest Resize, and a
        Mul/Div by a scalar (it folds into the DQ's scale; ModelOpt places attention Q/DQ before
        the √scale Muls of exported SDPA for this reason)."""
        if node.op_type in ("Mul", "Div") and len(node.input) == 2:
            return self.is_scalar(node.input[1]) or (
                node.op_type == "Mul" and self.is_scalar(node.input[0])
            )
        if node.op_type == "Resize":
            mode = self.attribute(node, "mode", b"nearest")
            return (mode.decode() if isinstance(mode, bytes) else mode) == "nearest"
        return node.op_type in COMMUTING_OPS

    def is_scalar(self, tensor: str) -> bool:
        shape = self.shape(tensor)
        return shape is not None and all(d == 1 for d in shape)

    def pair_source(self, dq: onnx.NodeProto) -> onnx.NodeProto | None:
        """The Q feeding `dq` (an activation pair), else None."""
        q = self.producer(dq.input[0])
        return q if self.is_q(q) else None

    # --- shapes ------------------------------------------------------------------------------
    def shape(self, tensor: str) -> tuple | None:
        shape = self.index.shape(tensor)
        if shape is None:
            node = self.producer(tensor)
            if self.is_dq(node):  # a weight DQ: the quantized initializer's dims
                return self.index.shape(node.input[0])
        return shape

    def static_shape(self, tensor: str) -> tuple[int, ...] | None:
        shape = self.shape(tensor)
        if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
            return None
        return tuple(int(d) for d in shape)

    def attribute(self, node: onnx.NodeProto, name: str, default=None):
        for attr in node.attribute:
            if attr.name == name:
                return onnx.helper.get_attribute_value(attr)
        return default
