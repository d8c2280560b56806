"""What the attention matcher finds: frozen records bound to the graph they were found in.

A match describes its chain once, typed and in order, the way a rewrite pattern binds its
variables: `AttentionMatch.qk`, `softmax_node` and `pv` are the three anchor nodes,
`AttentionMatch.steps` run from Q·Kᵀ to the Softmax, `AttentionMatch.after` from the Softmax
to P·V, and every step holds the node(s) it stands for (graph.index.BoundNode: the NodeProto and
its position).  The summaries reports print (`scale`, `mask_nodes`, `softcap`, `nan_guard`,
`quantized`, `path`) are properties derived from the steps.  Strategies, the drawing, the
reports, precision islands, locate, selectors and the Q/DQ lint read these records and never
walk the graph again to find a chain node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

from graphfix.graph.index import BoundNode
from graphfix.jsonable import plain


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
    it is computed at run time, and then `computed_by` holds the nodes that compute it.
    `output` is the scaled tensor the Mul/Div writes."""

    factor: float | None
    op: ScaleOp
    side: ScaleSide
    scalar: str  # the tensor holding the factor (or the divisor)
    node: BoundNode
    output: str
    computed_by: tuple[BoundNode, ...] = ()
    step: str = field(default="scale", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class MaskStep:
    """Where(mask, scores, fill) or Where(mask, fill, scores); `fill` None when not constant."""

    kind: MaskKind
    source: str  # the boolean condition tensor
    fill: float | None
    fill_tensor: str
    node: BoundNode
    output: str
    step: str = field(default="mask", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class BiasStep:
    """scores + source: an additive mask or a position bias (the same arithmetic)."""

    source: str
    node: BoundNode
    output: str
    step: str = field(default="bias", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class SoftcapStep:
    """cap · tanh(scores / cap); `cap` None when the chain's constants do not say it."""

    cap: float | None
    nodes: tuple[BoundNode, ...]  # the Div (or Mul by 1/cap), Tanh and Mul, as present
    output: str
    step: str = field(default="softcap", init=False)  # names the step in JSON


@dataclass(frozen=True)
class CastStep:
    to: str  # element type name, e.g. "float32"
    node: BoundNode
    output: str
    step: str = field(default="cast", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class PassStep:
    """Identity or Dropout: no effect at inference."""

    op: str
    node: BoundNode
    output: str
    step: str = field(default="pass", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class ReshapeStep:
    """A Reshape/Squeeze/Unsqueeze on the scores or probabilities."""

    op: str
    node: BoundNode
    output: str
    input_shape: tuple[int | str | None, ...] | None
    output_shape: tuple[int | str | None, ...] | None
    target: tuple[int, ...] | None = None  # a Reshape's constant shape input (-1 and 0 as given)
    step: str = field(default="reshape", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class QdqStep:
    """A QuantizeLinear → DequantizeLinear pair (fake quantization) on one tensor."""

    site: QdqSite
    quantize: BoundNode
    dequantize: BoundNode
    scale: str
    zero_point: str | None
    input: str  # the tensor quantized
    output: str  # the DequantizeLinear's output
    quant_type: str  # element type of the quantized tensor ("int8", "uint8", "float8e4m3fn", ...)
    step: str = field(default="qdq", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.quantize, self.dequantize)


@dataclass(frozen=True)
class SinkStep:
    """Attention sinks: a per-head logit concatenated to the scores' key axis before the
    Softmax (`concat`), and its column sliced off the probabilities after it (`slice`)."""

    sink: str  # the tensor concatenated to the scores (the sink logits, broadcast)
    concat: BoundNode
    slice: BoundNode
    scores_first: bool  # True when the scores come before the sink column in the row
    output: str  # the sliced probabilities
    step: str = field(default="sink", init=False)  # names the step in JSON

    @property
    def scores_input(self) -> str:
        """The Concat's input that carries the scores."""
        return self.concat.node.input[0 if self.scores_first else 1]

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.concat, self.slice)


@dataclass(frozen=True)
class NanGuardStep:
    """Where(IsNaN(p), 0, p) after the Softmax (PyTorch's guard for rows with every key masked);
    `is_nan` reads the probabilities beside the chain, so it is not one of `nodes`."""

    node: BoundNode
    is_nan: BoundNode
    output: str
    step: str = field(default="nan_guard", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class ShiftStep:
    """scores - ReduceMax(scores): a max subtraction (softmax is shift-invariant); `reduce_max`
    reads the scores beside the chain, so it is not one of `nodes`."""

    node: BoundNode
    reduce_max: BoundNode
    output: str
    step: str = field(default="shift", init=False)  # names the step in JSON

    @property
    def nodes(self) -> tuple[BoundNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class HeadMixStep:
    """Talking heads (CaiT): Transpose → MatMul by a constant [H, H] weight (→ Add a constant
    bias) → Transpose back, a linear map across the heads of the scores or probabilities."""

    nodes: tuple[BoundNode, ...]  # the Transpose, MatMul, Add (if any) and Transpose
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
    """The factor applied to Q·Kᵀ before the softmax, summed up from a match's ScaleSteps.

    `value` is the effective multiplier (Div by d becomes 1/d; √s on Q and on K becomes s) when it
    is constant in the graph; otherwise None and `nodes` names the nodes that compute it.
    `form` says how it was written: "mul", "div", "sqrt_qk" (split on Q and K), "none", or a
    combination joined by "+" (display text: read the steps to act on it).
    """

    value: float | None
    form: str
    nodes: tuple[BoundNode, ...] = ()
    # The factors between the tensors `q`/`k` name and the Softmax (a fused kernel applies these;
    # the rest of `value` was applied to Q or K before a Reshape/Transpose); None when unknown.
    in_chain: float | None = 1.0


_BAKED = (ScaleSide.Q_BAKED, ScaleSide.K_BAKED)


def scale_of(steps: tuple[ChainStep, ...], *, q_constant: bool) -> Scale:
    """The ScaleSteps of `steps` folded into one summary (the table's and the JSON's view)."""
    factors = [s for s in steps if isinstance(s, ScaleStep)]
    sides = {s.side for s in factors}
    forms = [s.op.value for s in factors if s.side is ScaleSide.SCORES]
    q_side = sides & {ScaleSide.Q, ScaleSide.Q_BAKED}
    k_side = sides & {ScaleSide.K, ScaleSide.K_BAKED}
    if q_side and k_side:
        forms.insert(0, "sqrt_qk")
    elif q_side or k_side:
        forms.insert(0, "q_scale" if q_side else "k_scale")
    in_chain = _product(f for f in factors if f.side not in _BAKED)
    baked = _product(f for f in factors if f.side in _BAKED)
    value = None if in_chain is None or baked is None else in_chain * baked
    if q_constant:  # a learned probe query with its scale folded in (SigLIP MAP head)
        value = None
        forms.append("folded_into_constant_q")
    return Scale(
        value=value,
        form="+".join(dict.fromkeys(forms)) or "none",
        nodes=tuple(dict.fromkeys(n for f in factors for n in f.computed_by)),
        in_chain=in_chain,
    )


def _product(factors) -> float | None:
    value = 1.0
    for f in factors:
        if f.factor is None:
            return None
        value *= f.factor
    return value


@dataclass(frozen=True)
class AttentionMatch:
    """One attention chain MatMul(Q,Kᵀ) → scale → mask → Softmax → MatMul(·,V), bound to the
    graph it was found in (positions and NodeProtos are that graph's)."""

    index: int
    qk: BoundNode  # the MatMul or Einsum computing Q·Kᵀ
    softmax_node: BoundNode
    pv: BoundNode  # the MatMul or Einsum computing P·V
    axis: int  # normalised, non-negative when the rank is known; else as written
    q: str  # tensor names as seen at the Q·Kᵀ node (after any √scale)
    k: str  # K before its transpose when a Transpose feeds the MatMul, else Kᵀ itself
    v: str
    k_t: str  # Kᵀ as the Q·Kᵀ node reads it, less any scalar factor (the Einsum's K as is)
    mask_inputs: tuple[str, ...]  # tensors carrying the mask (bias or boolean condition)
    kind: AttentionKind
    causal: bool
    dtype: str  # element type at the Softmax input: "float32", "float16", "bfloat16"
    cast_island: bool  # the Softmax sits between Casts (float16 export computing in float32)
    layout: Layout
    steps: tuple[ChainStep, ...] = ()  # Q-side/K-side factors first, then Q·Kᵀ → Softmax in order
    after: tuple[ChainStep, ...] = ()  # Softmax → P·V in order
    sink: SinkStep | None = None
    operands_quantized: tuple[QdqStep, ...] = ()  # Q/DQ pairs producing Q, K or V
    q_constant: bool = False  # Q is a constant (a learned probe query, its scale folded in)
    heads: int | str | None = None
    q_len: int | str | None = None
    kv_len: int | str | None = None
    location: str = ""  # "" for the main graph; else the subgraph or function it sits in

    # --- summaries, derived from the steps ----------------------------------------------------
    @property
    def softmax(self) -> str:
        """The Softmax node's name ("" when the exporter left it unnamed)."""
        return self.softmax_node.node.name

    # softmax_position, qk_matmul, pv_matmul, chain_nodes, chain_positions: the JSON's names
    # (scripts read them); code reads the bound nodes (`softmax_node`, `qk`, `pv`, `path`).
    @property
    def softmax_position(self) -> int:
        return self.softmax_node.position

    @property
    def qk_matmul(self) -> str:
        return self.qk.name

    @property
    def pv_matmul(self) -> str:
        return self.pv.name

    @property
    def k_transposed_by(self) -> KTransposedBy:
        return self.layout.k_transposed_by

    @property
    def score_steps(self) -> tuple[ChainStep, ...]:
        """The steps on the scores, Q·Kᵀ → Softmax (`steps` less the factors on Q and Kᵀ)."""
        return tuple(
            s
            for s in self.steps
            if not (isinstance(s, ScaleStep) and s.side is not ScaleSide.SCORES)
        )

    @property
    def scale(self) -> Scale:
        return scale_of(self.steps, q_constant=self.q_constant)

    @property
    def softcap(self) -> float | None:
        """The cap when known; a Tanh with an unknown cap is a SoftcapStep with cap None."""
        return next((s.cap for s in self.steps if isinstance(s, SoftcapStep)), None)

    @property
    def nan_guard(self) -> NanGuardStep | None:
        return next((s for s in self.after if isinstance(s, NanGuardStep)), None)

    @property
    def mask_nodes(self) -> tuple[BoundNode, ...]:
        """The Add / Where nodes that apply masks and biases, in chain order."""
        return tuple(s.node for s in self.steps if isinstance(s, (MaskStep, BiasStep)))

    @property
    def quantized(self) -> tuple[QdqStep, ...]:
        """Every Q/DQ pair of the chain: on Q, K, V, the scores and the probabilities."""
        chain = (*self.steps, *self.after)
        return (*self.operands_quantized, *(s for s in chain if isinstance(s, QdqStep)))

    @property
    def path(self) -> tuple[BoundNode, ...]:
        """Every node the scores and probabilities flow through, Q·Kᵀ to P·V inclusive, in
        graph order (not the factors on Q and Kᵀ, nor a guard's IsNaN or a shift's ReduceMax)."""
        inside = (*self.score_steps, *self.after, *((self.sink,) if self.sink else ()))
        nodes = {self.qk, self.softmax_node, self.pv, *(n for s in inside for n in s.nodes)}
        return tuple(sorted(nodes, key=lambda n: n.position))

    @property
    def score_path(self) -> tuple[BoundNode, ...]:
        """`path` from Q·Kᵀ to the Softmax inclusive."""
        return tuple(n for n in self.path if n.position <= self.softmax_node.position)

    @property
    def chain_nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.path)

    @property
    def chain_positions(self) -> tuple[int, ...]:
        return tuple(n.position for n in self.path)

    def to_dict(self) -> dict:
        """The JSON of `inspect --json` and `fix --json`: the fields, and the summaries under
        their documented names (scripts read them)."""
        data = {f.name: plain(getattr(self, f.name)) for f in fields(self)}
        for name in _SUMMARIES:
            data[name] = plain(getattr(self, name))
        guard = self.nan_guard
        data["nan_guard"] = None if guard is None else guard.node.name  # the guard's Where
        return data


_SUMMARIES = (
    "softmax",
    "softmax_position",
    "qk_matmul",
    "pv_matmul",
    "k_transposed_by",
    "scale",
    "softcap",
    "mask_nodes",
    "quantized",
    "chain_nodes",
    "chain_positions",
)


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
