"""Native attention nodes (forms.py) as the explicit chain of standard ONNX ops.

The lowering is the reference graphfix validates with (onnxruntime cannot run TensorRT's custom
ops) and the chain `fix --decompose-attention` hands to the strategies.  It follows the
published semantics step by step: Q and K scaled by √scale (in Q's type), Q·Kᵀ, softcap, the
mask (Where for booleans, Add otherwise), the causal frontier (Trilu, offset by past_key's length
or T − S), Softmax (in `softmax_precision` when given), the fully-masked-row guard
Where(IsNaN(p), 0, p), P·V.  Grouped heads repeat each key/value head contiguously (query head h
reads h // (Hq / Hkv)).  The guard zeroes any NaN probability, which differs from the spec only
for non-finite inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix.attention.native.forms import Causal, NativeForm
from graphfix.errors import UnsupportedModelError
from graphfix.graph.edit import GraphEdit

_BOOL = onnx.TensorProto.BOOL


class _Builder:
    """Nodes and initializers for one lowering, named under the node's name."""

    def __init__(self, edit: GraphEdit, base: str) -> None:
        self.edit, self.base = edit, base
        self.nodes: list[onnx.NodeProto] = []

    def add(self, op: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        out = output or self.edit.unique(f"{self.base}/{op}_out")
        self.nodes.append(
            helper.make_node(op, inputs, [out], name=self.edit.unique(f"{self.base}/{op}"), **attrs)
        )
        return out

    def const(self, suffix: str, value: np.ndarray) -> str:
        name = self.edit.unique(f"{self.base}/{suffix}")
        self.edit.add_initializer(numpy_helper.from_array(value, name))
        return name

    def like(self, suffix: str, value: float, reference: str) -> str:
        return self.add("CastLike", [self.const(suffix, np.array(value, np.float32)), reference])

    def ints(self, suffix: str, values: int | list[int]) -> str:
        return self.const(suffix, np.array(values, np.int64))

    def dim(self, tensor: str, axis: int) -> str:
        """Size of `tensor` along `axis`, as a 1-element int64 tensor."""
        end = {"end": axis + 1} if axis != -1 else {}
        return self.add("Shape", [tensor], start=axis, **end)


def lower(edit: GraphEdit, node: onnx.NodeProto, form: NativeForm) -> list[onnx.NodeProto]:
    """The standard-op nodes computing `node` (its output names kept)."""
    if form.unsupported:
        raise UnsupportedModelError(
            f"{form.op_type} node '{form.node}' uses {form.unsupported}; graphfix cannot lower it"
        )
    if edit.index.opset < 15 or (form.quantize_to is not None and edit.index.opset < 19):
        need = 19 if form.quantize_to is not None else 15
        raise UnsupportedModelError(
            f"{form.op_type} node '{form.node}' sits in an opset-{edit.index.opset} model; its "
            f"lowering needs opset {need} (convert with onnx.version_converter)"
        )
    b = _Builder(edit, node.name or form.y)
    q, k, v = form.q, form.k, form.v
    if form.rank == 3:
        q = _heads_first(b, q, form.q_heads)
        k, v = (_heads_first(b, t, form.kv_heads) for t in (k, v))
    if form.past_key:
        k = b.add("Concat", [form.past_key, k], axis=2)
        v = b.add("Concat", [form.past_value, v], axis=2)
    for cache, out in ((k, form.present_key), (v, form.present_value)):
        if out:
            b.add("Identity", [cache], out)
    k, v = (_repeat_heads(b, t, q) for t in (k, v))
    # shapes, types and masks read Q and K before the √scale Muls, which belong to the chain
    q_scaled, k_scaled = q, k
    if form.scale != 1.0:
        root = _root_scale(b, form, q)
        q_scaled, k_scaled = b.add("Mul", [q, root]), b.add("Mul", [k, root])
    raw = b.add("MatMul", [q_scaled, b.add("Transpose", [k_scaled], perm=[0, 1, 3, 2])])
    capped = raw
    if form.softcap > 0:
        cap = b.like("softcap", form.softcap, q)
        capped = b.add("Mul", [b.add("Tanh", [b.add("Div", [raw, cap])]), cap])
    masked = _mask(b, form, capped, q, k)
    probs = _normalise(b, form, masked, q)
    if form.qk_output:  # qk_matmul_output_mode 0–3: which stage the extra output shows
        b.add("Identity", [(raw, capped, masked, probs)[form.qk_mode]], form.qk_output)
    if form.quantize_to is not None:
        probs = _quantize(b, form, probs)
    if form.rank == 3:
        out = b.add("Transpose", [b.add("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        b.add("Reshape", [out, b.ints("hidden", [0, 0, -1])], form.y)
    else:
        b.add("MatMul", [probs, v], form.y)
    return b.nodes


def _heads_first(b: _Builder, tensor: str, heads: int | None) -> str:
    """[B, S, H·D] → [B, H, S, D]."""
    split = b.add("Reshape", [tensor, b.ints("split_heads", [0, 0, int(heads or 0), -1])])
    return b.add("Transpose", [split], perm=[0, 2, 1, 3])


def _repeat_heads(b: _Builder, tensor: str, q: str) -> str:
    """K or V with each of its Hkv heads repeated Hq / Hkv times in a row; as is when the head
    counts are known equal."""
    index = b.edit.index
    q_heads = (index.shape(q) or (None,) * 4)[1]
    kv_heads = (index.shape(tensor) or (None,) * 4)[1]
    if isinstance(q_heads, int) and q_heads == kv_heads:
        return tensor
    group = b.add("Div", [b.dim(q, 1), b.dim(tensor, 1)])
    ones = b.ints("one", [1])
    expanded = b.add(
        "Expand",
        [
            b.add("Unsqueeze", [tensor, b.ints("group_axis", [2])]),
            b.add("Concat", [ones, ones, group, ones, ones], axis=0),
        ],
    )
    target = b.add(
        "Mul", [b.add("Shape", [tensor]), b.add("Concat", [ones, group, ones, ones], axis=0)]
    )
    return b.add("Reshape", [expanded, target])


def _root_scale(b: _Builder, form: NativeForm, q: str) -> str:
    """√scale in Q's type: a constant when the scale or the head size is known."""
    head = (b.edit.index.shape(form.q) or (None,))[-1]
    if form.scale is None and form.rank == 3 and isinstance(head, int) and form.q_heads:
        head //= form.q_heads
    if form.scale is not None:
        return b.like("sqrt_scale", float(np.sqrt(form.scale)), q)
    if isinstance(head, int) and form.rank in (3, 4):
        return b.like("sqrt_scale", float(head**-0.25), q)
    size = b.add("Cast", [b.dim(q, -1)], to=onnx.TensorProto.FLOAT)
    root = b.add("Pow", [size, b.const("minus_quarter", np.array(-0.25, np.float32))])
    return b.add("CastLike", [b.add("Squeeze", [root, b.ints("axis0", [0])]), q])


def _mask(b: _Builder, form: NativeForm, scores: str, q: str, k: str) -> str:
    """The attention mask, the key-length padding mask and the causal frontier."""
    if form.mask or form.causal is not Causal.NONE or form.kv_lengths:
        neg_inf = b.like("neg_inf", -np.inf, q)
    if form.mask:
        elem = b.edit.index.elem_type(form.mask)
        if elem is None:
            raise UnsupportedModelError(
                f"{form.op_type} node '{form.node}': the element type of attn_mask "
                f"'{form.mask}' is unknown, so graphfix cannot tell a boolean mask from an "
                "additive one; run onnx.shape_inference.infer_shapes on the model first"
            )
        boolean = elem == _BOOL
        mask = _pad_keys(b, form.mask, k, boolean)
        if boolean:
            scores = b.add("Where", [mask, scores, neg_inf])
        else:
            scores = b.add("Add", [scores, b.add("CastLike", [mask, q])])
    if form.kv_lengths:
        keys = _range(b, k)
        lengths = b.add(
            "Unsqueeze",
            [b.add("Cast", [form.kv_lengths], to=onnx.TensorProto.INT64), b.ints("bhs", [1, 2, 3])],
        )
        scores = b.add("Where", [b.add("Less", [keys, lengths]), scores, neg_inf])
    if form.causal is Causal.LENGTHS:
        scores = b.add("Where", [_frontier_per_batch(b, form, q, k), scores, neg_inf])
    elif form.causal is not Causal.NONE:
        square = b.add("Concat", [b.dim(q, 2), b.dim(k, 2)], axis=0)
        ones = b.add("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([True])))
        offset = _causal_offset(b, form, q, k)
        tril = b.add("Trilu", [ones] if offset is None else [ones, offset], upper=0)
        scores = b.add("Where", [tril, scores, neg_inf])
    return scores


def _pad_keys(b: _Builder, mask: str, k: str, boolean: bool) -> str:
    """The mask padded along its last axis to K's length (blocked: False or -inf), as the spec
    reads a shorter mask; as is where the lengths are known equal."""
    index = b.edit.index
    mask_keys, keys = (index.shape(mask) or (None,))[-1], (index.shape(k) or (None,) * 4)[2]
    rank = index.rank(mask)
    if (isinstance(keys, int) and mask_keys == keys) or rank is None:
        return mask
    missing = b.add("Sub", [b.dim(k, 2), b.dim(mask, -1)])
    pads = b.add("Concat", [b.ints("no_pad", [0] * (2 * rank - 1)), missing], axis=0)
    if boolean:
        fill = b.const("blocked", np.array(False))
    else:
        fill = b.add("CastLike", [b.const("blocked", np.array(-np.inf, np.float32)), mask])
    return b.add("Pad", [mask, pads, fill])


def _frontier_per_batch(b: _Builder, form: NativeForm, q: str, k: str) -> str:
    """[B, 1, S, T] booleans: key j ≤ i + nonpad_kv_seqlen[b] − S (the spec's external cache)."""
    queries = b.add("Unsqueeze", [_range(b, q), b.ints("query_axis", [1])])  # [S, 1]
    ahead = b.add("Sub", [_range(b, k), queries])  # j − i, [S, T]
    lengths = b.add("Cast", [form.kv_lengths], to=onnx.TensorProto.INT64)
    offset = b.add("Sub", [lengths, b.dim(q, 2)])  # [B]
    offset = b.add("Unsqueeze", [offset, b.ints("bhs", [1, 2, 3])])
    return b.add("LessOrEqual", [ahead, offset])


def _range(b: _Builder, tensor: str) -> str:
    """0, 1, … along `tensor`'s sequence axis (2)."""
    return b.add(
        "Range", [b.ints("zero", 0), b.add("Squeeze", [b.dim(tensor, 2)]), b.ints("step", 1)]
    )


def _causal_offset(b: _Builder, form: NativeForm, q: str, k: str) -> str | None:
    """The diagonal's offset as Trilu's scalar `k`; None when it is 0."""
    if form.causal is Causal.LOWER_RIGHT:
        return b.add("Squeeze", [b.add("Sub", [b.dim(k, 2), b.dim(q, 2)])])
    if form.causal is Causal.PAST and form.past_key:
        return b.add("Squeeze", [b.dim(form.past_key, 2)])
    return None


def _normalise(b: _Builder, form: NativeForm, scores: str, q: str) -> str:
    if not form.softmax:
        return scores
    if form.softmax_precision is not None:
        wide = b.add("Cast", [scores], to=int(form.softmax_precision))
        probs = b.add("CastLike", [b.add("Softmax", [wide], axis=-1), q])
    else:
        probs = b.add("Softmax", [scores], axis=-1)
    if form.zero_empty_rows and (form.mask or form.causal is not Causal.NONE or form.kv_lengths):
        probs = b.add("Where", [b.add("IsNaN", [probs]), b.like("zero", 0.0, q), probs])
    return probs


def _quantize(b: _Builder, form: NativeForm, probs: str) -> str:
    """TRT_QuantizedAttention's Q/DQ of the probabilities, with its scalar scale."""
    zero = b.edit.unique(f"{b.base}/quantize_zero")
    b.edit.add_initializer(helper.make_tensor(zero, form.quantize_to, [], [0]))
    scale = b.add("CastLike", [form.quantize_scale, probs])
    quantized = b.add("QuantizeLinear", [probs, scale, zero])
    return b.add("DequantizeLinear", [quantized, scale, zero])
