"""What one native attention node asks for, read once from its attributes and inputs.

Native attention nodes are the fused forms TensorRT-era exports contain:
- ONNX `Attention` (opset 23, 24): Q [B, Hq, S, D] or 3-D [B, S, Hq·D] with `q_num_heads` /
  `kv_num_heads`; K/V with Hkv heads (grouped when Hq > Hkv); `scale` (default 1/√D) applied
  as √scale to Q and to K; `softcap` before the mask; a boolean (True keeps) or additive
  `attn_mask`; `is_causal` aligned bottom-right by the cache offset (past_key's length, 0
  without a cache); `past_key`/`past_value` concatenated before K/V; extra outputs
  present_key, present_value and qk_matmul_output (`qk_matmul_output_mode` 0–3); a row with
  every key masked gives zeros (onnx 1.23's errata).
- `TRT_Attention` (TensorRT 11, onnx-tensorrt docs/TRT_custom_ops.md): IAttention as it is.
  Q, K, V used as given (no scale, no reshape); `causal_kind` none/upper_left/lower_right;
  `attn_mask` as for Attention; `kv_lengths` (padded form) per-batch key counts;
  `TRT_normalization_op` "softmax" or "none".
- `TRT_QuantizedAttention` (TensorRT 11): Attention-23's attributes on 4-D inputs, plus the
  softmax output quantized (`normalization_quantize_to_type`: FLOAT8E4M3FN, the default, or
  INT8) with the scalar `normalization_quantize_scale` input and dequantized before P·V.
- `TRT_KVCacheUpdate`: a cache write, not attention; listed and left alone.

Attention-24's `nonpad_kv_seqlen` (an external cache) gives per-batch key counts and causal
offsets.  A form graphfix cannot lower (packed `packed_nhd` tensors, a cache update) is read with the reason in `NativeForm.unsupported`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import onnx

from graphfix.attention.match_types import AttentionOpNode
from graphfix.graph.index import GraphIndex

NATIVE_OPS = ("Attention", "TRT_Attention", "TRT_QuantizedAttention", "TRT_KVCacheUpdate")
TRT_OPS = NATIVE_OPS[1:]


class Causal(str, Enum):
    NONE = "none"
    UPPER_LEFT = "upper_left"  # key j ≤ query i
    LOWER_RIGHT = "lower_right"  # key j ≤ i + (T − S)
    PAST = "past"  # key j ≤ i + past_key's length (Attention with a cache; 0 without)
    LENGTHS = "lengths"  # key j ≤ i + nonpad_kv_seqlen[b] − S (Attention-24's external cache)


@dataclass(frozen=True)
class NativeForm:
    """One native attention node's semantics, typed."""

    node: str
    op_type: str
    q: str
    k: str
    v: str
    mask: str | None
    rank: int | None  # of Q, K and V: 4, or 3 for Attention's [B, S, H·D] form
    q_heads: int | None  # Attention's q_num_heads / kv_num_heads (3-D inputs)
    kv_heads: int | None
    scale: float | None  # None: 1/√D; TRT_Attention applies none (1.0)
    causal: Causal
    softcap: float
    past_key: str | None = None
    past_value: str | None = None
    kv_lengths: str | None = None  # keys per batch entry: TRT_Attention's padded kv_lengths,
    # Attention-24's nonpad_kv_seqlen
    softmax: bool = True  # False: TRT_normalization_op "none"
    softmax_precision: int | None = None
    quantize_scale: str | None = None  # TRT_QuantizedAttention's normalization scale
    quantize_to: int | None = None  # its element type (FLOAT8E4M3FN or INT8)
    zero_empty_rows: bool = True  # a row with every key masked gives 0 (Attention's errata)
    y: str = ""
    present_key: str | None = None
    present_value: str | None = None
    qk_output: str | None = None
    qk_mode: int = 0
    attributes: tuple[tuple[str, object], ...] = ()  # as written, for reports
    unsupported: str | None = None  # why graphfix leaves the node as it is; None: it lowers it


def is_native(node: onnx.NodeProto) -> bool:
    """An ONNX Attention node (default domain), or a TensorRT custom op of any domain."""
    if node.op_type == "Attention":
        return node.domain in ("", "ai.onnx")
    return node.op_type in TRT_OPS


def read_form(index: GraphIndex, node: onnx.NodeProto) -> NativeForm:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    inputs = [*node.input, *[""] * 8]
    outputs = [*node.output, *[""] * 4]
    name = index.bind(node).name
    written = tuple(sorted(attrs.items()))
    rank = index.rank(inputs[0])
    common = {
        "node": name,
        "op_type": node.op_type,
        "q": inputs[0],
        "k": inputs[1],
        "v": inputs[2],
        "mask": inputs[3] or None,
        "rank": rank,
        "y": outputs[0],
        "attributes": written,
    }
    if node.op_type == "TRT_KVCacheUpdate":
        return NativeForm(
            **{**common, "mask": None},
            q_heads=None,
            kv_heads=None,
            scale=None,
            causal=Causal.NONE,
            softcap=0.0,
            unsupported="a KV-cache update (TensorRT's IKVCacheUpdateLayer) writes state; it is "
            "not attention, so graphfix leaves it as it is and validate cannot run it",
        )
    if node.op_type == "TRT_Attention":
        return _trt_attention(common, attrs, inputs)
    return _onnx_attention(common, attrs, inputs, outputs, quantized=node.op_type != "Attention")


def _packed(attrs: dict) -> str | None:
    forms = {attrs.get("query_form", "padded_bhnd"), attrs.get("kv_form", "padded_bhnd")}
    if forms != {"padded_bhnd"}:
        return (
            "packed (packed_nhd) Q or K/V: ragged sequences whose lengths are run-time inputs; "
            "graphfix lowers the padded form only"
        )
    return None


def _trt_attention(common: dict, attrs: dict, inputs: list[str]) -> NativeForm:
    kind = attrs.get("causal_kind", "none")
    causal = {"none": Causal.NONE, "upper_left": Causal.UPPER_LEFT}.get(kind, Causal.LOWER_RIGHT)
    unsupported = _packed(attrs)
    if kind not in ("none", "upper_left", "lower_right"):
        unsupported = f"causal_kind {kind!r} (TensorRT knows none, upper_left, lower_right)"
    elif attrs.get("nb_rank", 1) != 1:
        unsupported = f"nb_rank {attrs['nb_rank']} (multi-device attention)"
    elif common["mask"] and causal is not Causal.NONE:
        unsupported = "attn_mask with a causal_kind, which TRT_Attention does not allow"
    return NativeForm(
        **common,
        q_heads=None,
        kv_heads=None,
        scale=1.0,
        causal=causal,
        softcap=0.0,
        kv_lengths=inputs[5] or None,
        softmax=attrs.get("TRT_normalization_op", "softmax") == "softmax",
        zero_empty_rows=False,
        unsupported=unsupported,
    )


def _onnx_attention(
    common: dict, attrs: dict, inputs: list[str], outputs: list[str], *, quantized: bool
) -> NativeForm:
    unsupported = None
    quantize_scale = quantize_to = None
    past_key = past_value = None
    if quantized:
        unsupported = _packed(attrs)
        quantize_scale = inputs[4] or None
        quantize_to = attrs.get("normalization_quantize_to_type", onnx.TensorProto.FLOAT8E4M3FN)
        if quantize_scale is None:
            unsupported = "no normalization_quantize_scale input (TensorRT requires 5 inputs)"
        elif quantize_to not in (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.INT8):
            unsupported = f"normalization_quantize_to_type {quantize_to} (FP8 or INT8 only)"
    else:
        past_key, past_value = inputs[4] or None, inputs[5] or None
        if inputs[6] and past_key:
            unsupported = "nonpad_kv_seqlen with past_key/past_value, which the spec forbids"
        elif (past_key is None) != (past_value is None):
            unsupported = "only one of past_key and past_value, which the spec forbids"
    if common["rank"] == 3 and not (attrs.get("q_num_heads") and attrs.get("kv_num_heads")):
        unsupported = "3-D Q/K/V without q_num_heads and kv_num_heads"
    if attrs.get("left_window_size", -1) != -1 or attrs.get("right_window_size", -1) != -1:
        unsupported = "a sliding window (left/right_window_size)"
    return NativeForm(
        **common,
        q_heads=attrs.get("q_num_heads"),
        kv_heads=attrs.get("kv_num_heads"),
        scale=attrs.get("scale"),
        causal=(Causal.LENGTHS if inputs[6] else Causal.PAST)
        if attrs.get("is_causal", 0)
        else Causal.NONE,
        softcap=float(attrs.get("softcap", 0.0)),
        past_key=past_key,
        past_value=past_value,
        kv_lengths=None if quantized else inputs[6] or None,
        softmax_precision=attrs.get("softmax_precision"),
        quantize_scale=quantize_scale,
        quantize_to=quantize_to,
        present_key=None if quantized else outputs[1] or None,
        present_value=None if quantized else outputs[2] or None,
        qk_output=None if quantized else outputs[3] or None,
        qk_mode=int(attrs.get("qk_matmul_output_mode", 0)),
        unsupported=unsupported,
    )


def attention_op_node(form: NativeForm, *, location: str = "") -> AttentionOpNode:
    """The scan's record of a native node (what `inspect` lists); `location` names the If/Loop/
    Scan body it sits in ("" for the main graph)."""
    return AttentionOpNode(
        node=f"{location}/{form.node}" if location else form.node,
        q=form.q,
        k=form.k,
        v=form.v,
        mask=form.mask,
        is_causal=form.causal is not Causal.NONE,
        scale=form.scale,
        softcap=form.softcap or None,
        op_type=form.op_type,
        attributes=form.attributes,
        unsupported=form.unsupported,
        extra_outputs=tuple(
            f"{role} {name}"
            for role, name in (
                ("present_key", form.present_key),
                ("present_value", form.present_value),
                ("qk_matmul_output", form.qk_output),
            )
            if name
        ),
    )
