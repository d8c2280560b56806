"""Which ops stay in float32 by default, and how every other op relates to its neighbours' types.

The default float32 list is deliberately conservative. It joins what the established converters
keep (onnxconverter-common's `DEFAULT_OP_BLOCK_LIST`: Resize, Upsample, Range, CumSum, TopK,
RoiAlign, NonMaxSuppression, the ai.onnx.ml ops; ModelOpt AutoCast keeps ops with float32-only
inputs and nodes whose values exceed `data_max`) with the ops whose float16 results are known to
go wrong on TensorRT: range-sensitive reductions and exponentials (sums of squares overflow at
65504, Exp overflows above 11.1), normalisations without a float32 `stash_type`, and
trigonometry on large angles (rotary and timestep embeddings: float16 spacing is 1 rad above
1024).  Decomposed LayerNorm/RMSNorm statistics are found by pattern (`find_norm_statistics` in
islands.py), not by op type, because ReduceMean alone is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import onnx
from onnx import defs


class Reason(str, Enum):
    """Why a node stays in float32 (every island carries at least one)."""

    KEEP = "keep"  # the user's `keep` selectors
    OP_DEFAULT = "op_default"  # the op is on the default float32 list below
    OUT_OF_RANGE = "out_of_range"  # reads a constant the target type cannot hold
    NORM = "norm"  # a decomposed or unfused normalisation's statistics
    ANGLE = "angle"  # computes the argument of a Sin/Cos/Exp from positions or timesteps
    ATTENTION = "attention"  # an attention chain kept whole because part of it is float32
    CONTROL_FLOW = "control_flow"  # If/Loop/Scan: kept with their subgraphs in float32
    CUSTOM_OP = "custom_op"  # an op outside the ONNX domain whose float16 support is unknown
    TYPE = "type"  # the op's schema at the model's opset does not accept the target type
    MERGED = "merged"  # data movement between float32 nodes, kept to avoid Cast pairs


# op type → why it stays float32 by default.
FLOAT32_OPS: dict[str, str] = {
    **dict.fromkeys(
        ("ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceProd"),
        "range-sensitive reduction: sums overflow float16's 65504",
    ),
    "ReduceLogSumExp": "exponential sum: overflows float16",
    "CumSum": "running sum: overflows float16 and loses low bits",
    "Pow": "powers overflow float16 (x**2 above 256, x**3 above 40)",
    "Exp": "overflows float16 above 11.1",
    "Log": "needs the small arguments float16 flushes to zero",
    "LogSoftmax": "log of probabilities float16 flushes to zero",
    "Sin": "large angles: float16 spacing is >= 1 rad above 1024",
    "Cos": "large angles: float16 spacing is >= 1 rad above 1024",
    "InstanceNormalization": "no stash_type: TensorRT computes its statistics in the I/O type",
    "MeanVarianceNormalization": "variance in float16 overflows",
    "LpNormalization": "sum of squares overflows float16",
    "Resize": "scales/roi inputs are float32-only; onnxruntime CPU has no float16 Resize",
    "Upsample": "scales input is float32-only",
    "Range": "float start/limit/delta: float16 rounding changes the length",
    "EyeLike": "onnxruntime has no float16 EyeLike kernel",
    "TopK": "float16 rounding creates ties that change the indices",
    "RoiAlign": "onnxruntime CPU has no float16 kernel",
    "NonMaxSuppression": "box coordinates and scores are float32-only",
}

# Ops that only move, select or reshape data: between float32 nodes (or float32 graph I/O) they
# stay float32 too, so two islands joined by a Reshape merge and no Cast pair is created.
MOVEMENT_OPS = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Concat", "Split", "Pad", "Tile", "Dropout",
    "DepthToSpace", "SpaceToDepth", "ReverseSequence", "Compress", "Where", "ScatterND",
    "ScatterElements", "Trilu", "Cast",
})  # fmt: skip

# Ops whose outputs are not float (Shape, comparisons, ArgMax …): they read either precision.
# Those with one float input read it as is; those comparing several cast to the wider one.
NON_FLOAT_OUTPUT_OPS = frozenset({
    "Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN",
    "IsInf", "ArgMax", "ArgMin", "NonZero",
})  # fmt: skip

# Ops that make float tensors from non-float inputs or attributes: their output type follows
# their consumers (a float32 consumer gets them in float32, so no Cast is ever needed upward).
SOURCE_OPS = frozenset({
    "Constant", "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform",
    "RandomNormalLike", "RandomUniformLike", "Bernoulli",
})  # fmt: skip

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

# Nodes that never count as compute: moving data, making constants, casting, comparing.
NOT_COMPUTE = MOVEMENT_OPS - {
    "Neg",
    "Abs",
    "Relu",
    "Max",
    "Min",
    "ReduceMax",
    "ReduceMin",
    "MaxPool",
}
NOT_COMPUTE = NOT_COMPUTE | NON_FLOAT_OUTPUT_OPS | SOURCE_OPS | {"CastLike", "Range"}

# Outputs of these slots keep float32 whatever the node's precision (stash-type statistics).
FLOAT32_OUTPUT_SLOTS: dict[str, frozenset[int]] = {
    "LayerNormalization": frozenset({1, 2}),
}

# Plugin domains whose ops accept float16/bfloat16 I/O and compute in float32 internally.
PLUGIN_DOMAINS = frozenset({"trt.plugins"})


def is_compute(op_type: str) -> bool:
    """A node that does arithmetic on float values (what the ≥ 80 % float16 target counts)."""
    return op_type not in NOT_COMPUTE


def untyped_in(
    node: onnx.NodeProto, opset: int, to: str, is_float: Callable[[str], bool]
) -> str | None:
    """Why `node` (default domain) cannot take its float tensors (`is_float`) in `to` at
    `opset`, by its ONNX schema's type constraints (Conv has bfloat16 only from opset 22,
    Where from 16): the model would fail ONNX's checker.  None when it can."""
    if node.domain not in ("", "ai.onnx") or not defs.has(node.op_type, opset):
        return None
    schema = defs.get_schema(node.op_type, opset)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    wanted = f"tensor({to})"
    for names, formals in ((node.input, schema.inputs), (node.output, schema.outputs)):
        for slot, name in enumerate(names):
            if not formals or not name or not is_float(name):
                continue
            types = allowed.get(formals[min(slot, len(formals) - 1)].type_str)
            if types is not None and "tensor(float)" in types and wanted not in types:
                since = _first_opset_with(node.op_type, wanted, opset)
                return f"{node.op_type} has no {to} at opset {opset}" + (
                    f" (ONNX accepts it from opset {since})" if since else ""
                )
    return None


def _first_opset_with(op_type: str, wanted: str, opset: int) -> int | None:
    for version in range(opset + 1, defs.onnx_opset_version() + 1):
        schema = defs.get_schema(op_type, version)
        if any(wanted in c.allowed_type_strs for c in schema.type_constraints):
            return schema.since_version
    return None
