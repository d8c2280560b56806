"""What the attention matcher finds: frozen records, no graph objects inside."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class AttentionKind(str, Enum):
    SELF = "self"
    CROSS = "cross"
    CAUSAL = "causal"
    UNKNOWN = "unknown"


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
    # "transpose" (a Transpose node), "layout" (MatMul input already Kᵀ), "einsum"
    k_transposed_by: str
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
    softcap: float | None = None
    heads: int | str | None = None
    q_len: int | str | None = None
    kv_len: int | str | None = None


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
