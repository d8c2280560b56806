"""What the attention matcher finds: frozen records, no graph objects inside.

A match describes its chain once, typed and in order (`AttentionMatch.steps` from Q·Kᵀ to the
Softmax, `AttentionMatch.after` from the Softmax to P·V, `AttentionMatch.layout` for the two
products); strategies, the drawing and the report read these records and never walk the graph
again to find out what the chain does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class AttentionKind(str, Enum):
    SELF = "self"
    # keys and values from a strided conv or pooling of the query's own tokens (PVT v2,
    # SegFormer's spatial-reduction attention): self-attention over fewer keys, not cross
    SELF_REDUCED_KEYS = "self (reduced keys)"
    CROSS = "cross"
    CAUSAL = "causal"
    UNKNOWN = "unknown"


class KTransposedBy(str, Enum):
    """How Kᵀ reaches the Q·Kᵀ product."""

    TRANSPOSE = "transpose"  # a Transpose node of K (its `perm` is in Layout.k_perm)
    LAYOUT = "layout"  # the MatMul's right operand is already Kᵀ (a reshape chain, a projection)
    EINSUM = "einsum"  # an Einsum reads K as it is; its equation says the rest


class ScaleOp(str, Enum):
    MUL = "mul"
    DIV = "div"


class ScaleSide(str, Enum):
    """Where a scalar factor sits."""

    SCORES = "scores"  # on Q·Kᵀ, between the product and the Softmax
    Q = "q"  # on the Q operand, right at the product
    K = "k"  # on the Kᵀ operand, right at the product
    Q_BAKED = "q_baked"  # on Q before a Reshape/Transpose (part of the Q tensor the match names)
    K_BAKED = "k_baked"


class MaskKind(str, Enum):
    """The polarity of a boolean mask applied by `Where`."""

    KEEP = "keep"  # Where(mask, scores, fill): True keeps the score
    BLOCKED = "blocked"  # Where(mask, fill, scores): True replaces the score by the fill


class QdqSite(str, Enum):
    """Where a QuantizeLinear → DequantizeLinear pair sits in an attention chain."""

    Q = "q"
    K = "k"
    V = "v"
    SCORES = "scores"
    PROBS = "probs"


@dataclass(frozen=True)
class ScaleStep:
    """A scalar factor: `factor` is the multiplier (Div by d is op DIV, factor 1/d); None when
    it is computed at run time.  `output` is the scaled tensor the Mul/Div writes."""

    factor: float | None
    op: ScaleOp
    side: ScaleSide
    scalar: str  # the tensor holding the factor (or the divisor)
    node: str
    output: str
    step: str = field(default="scale", init=False)  # names the step in JSON


@dataclass(frozen=True)
class MaskStep:
    """Where(mask, scores, fill) or Where(mask, fill, scores); `fill` None when not constant."""

    kind: MaskKind
    source: str  # the boolean condition tensor
    fill: float | None
    fill_tensor: str
    node: str
    output: str
    step: str = field(default="mask", init=False)  # names the step in JSON


@dataclass(frozen=True)
class BiasStep:
    """scores + source: an additive mask or a position bias (the same arithmetic)."""

    source: str
    node: str
    output: str
    step: str = field(default="bias", init=False)  # names the step in JSON


@dataclass(frozen=True)
class SoftcapStep:
    """cap · tanh(scores / cap); `cap` None when the chain's constants do not say it."""

    cap: float | None
    nodes: tuple[str, ...]  # the Div (or Mul by 1/cap), Tanh and Mul, as present
    output: str
    step: str = field(default="softcap", init=False)  # names the step in JSON


@dataclass(frozen=True)
class CastStep:
    to: str  # element type name, e.g. "float32"
    node: str
    output: str
    step: str = field(default="cast", init=False)  # names the step in JSON


@dataclass(frozen=True)
class PassStep:
    """Identity or Dropout: no effect at inference."""

    op: str
    node: str
    output: str
    step: str = field(default="pass", init=False)  # names the step in JSON


@dataclass(frozen=True)
class ReshapeStep:
    """A Reshape/Squeeze/Unsqueeze on the scores or probabilities."""

    op: str
    node: str
    output: str
    input_shape: tuple[int | str | None, ...] | None
    output_shape: tuple[int | str | None, ...] | None
    target: tuple[int, ...] | None = None  # a Reshape's constant shape input (-1 and 0 as given)
    step: str = field(default="reshape", init=False)  # names the step in JSON


@dataclass(frozen=True)
class QdqStep:
    """A QuantizeLinear → DequantizeLinear pair (fake quantization) on one tensor."""

    site: QdqSite
    quantize: str
    dequantize: str
    scale: str
    zero_point: str | None
    input: str  # the tensor quantized
    output: str  # the DequantizeLinear's output
    quant_type: str  # element type of the quantized tensor ("int8", "uint8", "float8e4m3fn", ...)
    step: str = field(default="qdq", init=False)  # names the step in JSON


@dataclass(frozen=True)
class SinkStep:
    """Attention sinks: a per-head logit concatenated to the scores' key axis before the
    Softmax (`concat`), and its column sliced off the probabilities after it (`slice`)."""

    sink: str  # the tensor concatenated to the scores (the sink logits, broadcast)
    concat: str
    slice: str
    scores_first: bool  # True when the scores come before the sink column in the row
    output: str  # the sliced probabilities
    step: str = field(default="sink", init=False)  # names the step in JSON


@dataclass(frozen=True)
class NanGuardStep:
    """Where(IsNaN(p), 0, p) after the Softmax (PyTorch's guard for rows with every key masked)."""

    node: str
    is_nan: str
    output: str
    step: str = field(default="nan_guard", init=False)  # names the step in JSON


@dataclass(frozen=True)
class ShiftStep:
    """scores - ReduceMax(scores): a max subtraction (softmax is shift-invariant)."""

    node: str
    output: str
    step: str = field(default="shift", init=False)  # names the step in JSON


@dataclass(frozen=True)
class HeadMixStep:
    """Talking heads (CaiT): Transpose → MatMul by a constant [H, H] weight (→ Add a constant
    bias) → Transpose back, a linear map across the heads of the scores or probabilities."""

    nodes: tuple[str, ...]  # the Transpose, MatMul, Add (if any) and Transpose
    weight: str
    output: str
    step: str = field(default="head_mix", init=False)  # names the step in JSON


ChainStep = (
    ScaleStep
    | MaskStep
    | BiasStep
    | SoftcapStep
    | CastStep
    | PassStep
    | ReshapeStep
    | QdqStep
    | SinkStep
    | NanGuardStep
    | ShiftStep
    | HeadMixStep
)


@dataclass(frozen=True)
class Layout:
    """How the two products are written."""

    qk_op: str  # "MatMul" or "Einsum"
    pv_op: str
    k_transposed_by: KTransposedBy
    k_perm: tuple[int, ...] | None = None  # the Transpose's perm when k_transposed_by is TRANSPOSE
    qk_equation: str | None = None  # the Einsums' equations, spaces removed
    pv_equation: str | None = None
    q_rank: int | None = None
    k_rank: int | None = None
    v_rank: int | None = None


@dataclass(frozen=True)
class Scale:
    """The factor applied to Q·Kᵀ before the softmax.

    `value` is the effective multiplier (Div by d becomes 1/d; √s on Q and on K becomes s) when it
    is constant in the graph; otherwise None and `nodes` names the nodes that compute it.
    `form` says how it was written: "mul", "div", "sqrt_qk" (split on Q and K), "none", or a
    combination joined by "+".
    """

    value: float | None
    form: str
    nodes: tuple[str, ...] = ()
    # The factors between the tensors `q`/`k` name and the Softmax (a fused kernel applies these;
    # the rest of `value` was applied to Q or K before a Reshape/Transpose); None when unknown.
    in_chain: float | None = 1.0


@dataclass(frozen=True)
class AttentionMatch:
    """One attention chain MatMul(Q,Kᵀ) → scale → mask → Softmax → MatMul(·,V)."""

    index: int
    softmax: str  # Softmax node name ("" when the exporter left it unnamed)
    softmax_position: int  # index of the Softmax in graph.node; identifies unnamed nodes
    axis: int  # normalised, non-negative when the rank is known; else as written
    qk_matmul: str  # MatMul or Einsum node computing Q·Kᵀ
    pv_matmul: str  # MatMul or Einsum node computing P·V
    q: str  # tensor names as seen at the Q·Kᵀ node (after any √scale)
    k: str  # K before its transpose when a Transpose feeds the MatMul, else Kᵀ itself
    v: str
    k_t: str  # Kᵀ as the Q·Kᵀ node reads it, less any scalar factor (the Einsum's K as is)
    k_transposed_by: KTransposedBy
    scale: Scale
    mask_nodes: tuple[str, ...]  # Add / Where nodes that apply the mask, in graph order
    mask_inputs: tuple[str, ...]  # tensors carrying the mask (bias or boolean condition)
    kind: AttentionKind
    causal: bool
    dtype: str  # element type at the Softmax input: "float32", "float16", "bfloat16"
    chain_nodes: tuple[str, ...]  # every node between Q·Kᵀ and P·V, inclusive, in order
    chain_positions: tuple[int, ...]  # the same nodes' indices in graph.node
    cast_island: bool  # the Softmax sits between Casts (float16 export computing in float32)
    nan_guard: str | None  # Where(IsNaN) node after the Softmax, if any
    softcap: float | None = None  # the cap when known; a Tanh with an unknown cap is in `steps`
    heads: int | str | None = None
    q_len: int | str | None = None
    kv_len: int | str | None = None
    layout: Layout | None = None
    steps: tuple[ChainStep, ...] = ()  # Q-side/K-side factors first, then Q·Kᵀ → Softmax in order
    after: tuple[ChainStep, ...] = ()  # Softmax → P·V in order
    sink: SinkStep | None = None
    quantized: tuple[QdqStep, ...] = ()  # every Q/DQ pair of the chain (also in steps/after)
    location: str = ""  # "" for the main graph; else the subgraph or function it sits in


@dataclass(frozen=True)
class SkippedSoftmax:
    """A Softmax the matcher left alone, and why."""

    softmax: str
    reason: str


@dataclass(frozen=True)
class AttentionOpNode:
    """An ONNX `Attention` op (opset 23+): already fused; decompose it to rewrite it."""

    node: str
    q: str
    k: str
    v: str
    mask: str | None
    is_causal: bool
    scale: float | None
    softcap: float | None


@dataclass(frozen=True)
class AttentionScan:
    """Everything `scan_attention` found in a model."""

    matches: tuple[AttentionMatch, ...]
    skipped: tuple[SkippedSoftmax, ...]
    attention_ops: tuple[AttentionOpNode, ...] = field(default=())
    # why onnx's shape inference failed (heads and lengths are then unknown), None when it ran
    shape_inference_problem: str | None = None
