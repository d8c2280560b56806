"""What the norm matchers find: one decomposed norm, described once, typed, for the rewrite and
the report to read."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np


class NormKind(str, Enum):
    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"
    GROUP_NORM = "GroupNorm"

    @property
    def op_type(self) -> str:
        """The standard ONNX op the norm fuses into."""
        return _OP_TYPES[self]

    @property
    def min_opset(self) -> int:
        """The first default-domain opset that has `op_type` with the semantics used here
        (GroupNormalization-18 scaled per group; -21 scales per channel, as torch does)."""
        return _MIN_OPSETS[self]


_OP_TYPES = {
    NormKind.LAYER_NORM: "LayerNormalization",
    NormKind.RMS_NORM: "RMSNormalization",
    NormKind.GROUP_NORM: "GroupNormalization",
}
_MIN_OPSETS = {NormKind.LAYER_NORM: 17, NormKind.RMS_NORM: 23, NormKind.GROUP_NORM: 21}


@dataclass(frozen=True)
class Affine:
    """The scale or bias a fused node takes: an existing tensor whose shape already fits
    (`tensor`), or a value to store as a new initializer (`value`, reshaped to fit)."""

    tensor: str | None = None
    value: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class NormCandidate:
    """A decomposed norm found in the graph.

    `positions` index the nodes that form it in the graph as indexed; the fused node replaces
    them and writes `output` (the chain's last tensor, so nothing downstream changes).
    `statistics` names the nodes up to the normalisation, without the scale and bias: the part
    the fused op computes in float32 whatever its input type (stash_type), so the part to keep
    in float32 when the norm stays unfused.  `overflow` names the smallest such part for an
    RMSNorm: x², its mean, + ε and the root (Sqrt or Pow −0.5), whose input is Cast up at the
    island's border.  x² overflows float16 from |x| = 256; the root of the mean of squares is
    back in x's range, so the normalising Reciprocal/Div/Mul can run in 16 bits when ε keeps
    the root a normal 16-bit number.
    `problem` says why it cannot be fused whatever the opset (None: it can); `notes` say how the
    fused node's arithmetic differs from the chain's (e.g. it computes in float32).
    """

    kind: NormKind
    input: str
    output: str
    positions: tuple[int, ...]
    node_names: tuple[str, ...]
    statistics: tuple[str, ...]  # the nodes the fused op computes in float32 (its stash_type)
    epsilon: float
    axis: int | None = None  # LayerNorm/RMSNorm: the first normalised axis (negative)
    num_groups: int | None = None  # GroupNorm
    channels: int | None = None  # GroupNorm: the scale/bias length
    scale: Affine | None = None
    bias: Affine | None = None
    dtype: int = 0  # element type of `input` (TensorProto enum; 0 unknown)
    normalized_shape: tuple[int, ...] | None = None  # static dims from `axis` on, when known
    reshape_to: str | None = None  # GroupNorm: a shape tensor to Reshape `input` to first
    problem: str | None = None
    notes: tuple[str, ...] = ()
    overflow: tuple[str, ...] = ()  # of `statistics`, those whose values overflow 16 bits (() all)
