"""The matcher on minimal graphs: every accepted layout, and every Softmax it must leave alone."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from graphs import B, D, S, T, Variant, attention_model, non_attention_models

import graphfix
from graphfix import AttentionKind, FallbackKind
from graphfix.attention.match_types import (
    KTransposedBy,
    MaskKind,
    MaskStep,
    ScaleSide,
    SoftcapStep,
)

SCALE = 1 / math.sqrt(D)


@pytest.mark.parametrize(
    ("variant", "form"),
    [
        (Variant(scale="div_after"), "div"),
        (Variant(scale="mul_after"), "mul"),
        (Variant(scale="mul_before_q"), "q_scale"),
        (Variant(scale="sqrt_qk"), "sqrt_qk"),
    ],
)
def test_scale_forms_fold_to_one_value(variant, form):
    (match,) = graphfix.find_attention(attention_model(variant))
    assert match.scale.form == form
    assert match.scale.value == pytest.approx(SCALE, rel=1e-6)


def test_no_scale():
    (match,) = graphfix.find_attention(attention_model(Variant(scale="none")))
    assert match.scale.form == "none" and match.scale.value == 1.0


def test_self_attention_fields():
    (match,) = graphfix.find_attention(attention_model(Variant()))
    assert match.softmax == "softmax" and match.axis == 3
    assert (match.qk_matmul, match.pv_matmul) == ("qk", "pv")
    assert (match.q, match.k, match.v) == ("q_bhsd", "k_bhsd", "v_bhsd")
    assert match.k_transposed_by == "transpose"
    assert match.kind is AttentionKind.SELF and not match.causal
    assert match.dtype == "float32" and not match.cast_island and match.nan_guard is None
    assert (match.heads, match.q_len, match.kv_len) == (3, S, S)
    assert match.mask_nodes == () and match.mask_inputs == ()
    assert match.chain_nodes == ("qk", "scale_div", "softmax", "pv")


def test_k_by_layout_and_einsum():
    (layout,) = graphfix.find_attention(attention_model(Variant(k_layout="layout")))
    assert layout.k_transposed_by == "layout" and layout.k == "k_t_layout"
    (einsum,) = graphfix.find_attention(attention_model(Variant(einsum=True)))
    assert einsum.k_transposed_by == "einsum"
    assert (einsum.qk_matmul, einsum.pv_matmul) == ("qk", "pv")


def test_cross_attention():
    (match,) = graphfix.find_attention(attention_model(Variant(cross=True, mask="add")))
    assert match.kind is AttentionKind.CROSS
    assert (match.q_len, match.kv_len) == (S, T)


@pytest.mark.parametrize("mask", ["add", "where"])
def test_padding_masks_are_not_causal(mask):
    (match,) = graphfix.find_attention(attention_model(Variant(mask=mask)))
    assert [n.name for n in match.mask_nodes] == [f"mask_{mask}"]
    assert "mask" in match.mask_inputs
    assert match.kind is AttentionKind.SELF and not match.causal


@pytest.mark.parametrize("mask", ["causal_trilu", "causal_const"])
def test_causal_masks(mask):
    (match,) = graphfix.find_attention(attention_model(Variant(mask=mask)))
    assert match.causal and match.kind is AttentionKind.CAUSAL


def test_fp16_cast_island_and_nan_guard():
    model = attention_model(
        Variant(dtype=onnx.TensorProto.FLOAT16, cast_island=True, nan_guard=True, mask="add")
    )
    (match,) = graphfix.find_attention(model)
    assert match.cast_island and match.dtype == "float32"
    assert match.nan_guard.node.name == "nan_guard" and match.nan_guard.is_nan.op_type == "IsNaN"
    assert match.chain_nodes[-3:] == ("nan_guard", "from_f32", "pv")


def test_fp16_without_island():
    (match,) = graphfix.find_attention(attention_model(Variant(dtype=onnx.TensorProto.FLOAT16)))
    assert match.dtype == "float16" and not match.cast_island


def test_softcap_is_not_the_scale():
    (match,) = graphfix.find_attention(attention_model(Variant(scale="mul_after", softcap=30.0)))
    assert match.softcap == pytest.approx(30.0)
    assert match.scale.value == pytest.approx(SCALE, rel=1e-6)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("classifier", "not multiplied by V"),
        ("channels", "axis 1"),
        ("moe_router", "TopK"),
        ("times_constant", "constant weight"),
        ("right_operand", "right-hand operand"),
        ("not_last_axis", "axis 1"),
    ],
)
def test_non_attention_softmax_is_left_alone(name, reason):
    scan = graphfix.scan_attention(non_attention_models()[name])
    assert scan.matches == ()
    (skipped,) = scan.skipped
    assert skipped.softmax == "softmax"
    assert reason in skipped.reason


def test_scores_from_a_linear_layer_are_not_attention():
    model = attention_model(Variant())
    qk = next(n for n in model.graph.node if n.name == "qk")
    qk.input[1] = "Wq"  # q · W instead of q · kᵀ
    scan = graphfix.scan_attention(model)
    assert scan.matches == ()
    assert "constant weight" in scan.skipped[0].reason


def test_path_input_does_not_load_weights(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(attention_model(Variant()), path, save_as_external_data=True, size_threshold=0)
    (match,) = graphfix.find_attention(path)
    assert match.scale.value == pytest.approx(SCALE, rel=1e-6)  # read from the data file


def _insert_after(model, producer_output, op, extra_inputs, name, **attrs):
    """Route `producer_output` through a new node `op` (its other inputs `extra_inputs`)."""
    new_out = f"{name}_out"
    for node in model.graph.node:
        node.input[:] = [new_out if i == producer_output else i for i in node.input]
    position = next(i for i, n in enumerate(model.graph.node) if producer_output in n.output)
    node = onnx.helper.make_node(
        op, [producer_output, *extra_inputs], [new_out], name=name, **attrs
    )
    model.graph.node.insert(position + 1, node)
    return model


def _with_sink_concat(model):
    """`model` with a zero sink logit per head concatenated to the scores' key axis."""
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.zeros((B, 3, S, 1), np.float32), "sink")
    )
    _insert_after(model, "scaled", "Concat", ["sink"], "with_sink", axis=-1)
    return model


def _int64(model, name, values):
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))


def test_a_slice_of_the_probabilities_without_a_sink_is_not_attention():
    model = attention_model(Variant())
    for name, value in (("starts", [0]), ("ends", [S - 1]), ("axes", [-1])):
        _int64(model, name, value)
    _insert_after(model, "probs", "Slice", ["starts", "ends", "axes"], "cut")
    scan = graphfix.scan_attention(model)
    assert scan.matches == () and "not a sink" in scan.skipped[0].reason


def test_a_sink_concat_without_its_slice_is_not_attention():
    model = _with_sink_concat(attention_model(Variant()))
    scan = graphfix.scan_attention(model)
    assert scan.matches == () and "no Slice drops the extra column" in scan.skipped[0].reason


def test_a_sink_is_described_and_fused_plugin_fuses_it():
    model = _with_sink_concat(attention_model(Variant()))
    for name, value in (("starts", [0]), ("ends", [S]), ("axes", [-1])):
        _int64(model, name, value)
    _insert_after(model, "probs", "Slice", ["starts", "ends", "axes"], "drop_sink")
    (match,) = graphfix.find_attention(model)
    assert match.sink is not None and match.sink.sink == "sink" and match.sink.scores_first
    assert (match.sink.concat.name, match.sink.slice.name) == ("with_sink", "drop_sink")
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.fallback is None and "attention sink" in block.detail


def test_a_tanh_whose_cap_disagrees_has_an_unknown_cap():
    model = attention_model(Variant(scale="mul_after", softcap=30.0))
    cap_mul = next(n for n in model.graph.node if n.name == "cap_mul")
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.array(20.0, np.float32), "other_cap")
    )
    cap_mul.input[1] = "other_cap"  # 20·tanh(s/30) is not a softcap the node can express
    (match,) = graphfix.find_attention(model)
    (softcap,) = [s for s in match.steps if isinstance(s, SoftcapStep)]
    assert softcap.cap is None and match.softcap is None
    (block,) = graphfix.fix_attention(model, strategy="fused_plugin").report.blocks
    assert block.fallback.kind is FallbackKind.SOFTCAP
    assert "softcap value is not a constant" in block.fallback.reason


def test_steps_are_ordered_and_typed():
    (match,) = graphfix.find_attention(attention_model(Variant(scale="sqrt_qk", mask="where")))
    kinds = [(type(s).__name__, getattr(s, "side", None)) for s in match.steps]
    assert kinds == [
        ("ScaleStep", ScaleSide.Q),
        ("ScaleStep", ScaleSide.K),
        ("MaskStep", None),
    ]
    (mask,) = [s for s in match.steps if isinstance(s, MaskStep)]
    assert mask.kind is MaskKind.KEEP and mask.source == "mask" and mask.fill == -1e9
    assert match.layout.k_transposed_by is KTransposedBy.TRANSPOSE
    assert match.layout.k_perm == (0, 1, 3, 2)


def _positions_model(mask_body: str, mask_out: str, extra_signature: str = "") -> onnx.ModelProto:
    """Attention over run-time length S whose mask or bias is built from Range positions."""
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[1,2,S,8] q, float[1,2,S,8] k, float[1,2,S,8] v{extra_signature}) => (float[1,2,S,8] y) {{
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  c = Constant<value=float {{0.35}}>()
  ss = Mul(s, c)
  shp = Shape(q)
  two = Constant<value=int64 {{2}}>()
  n = Gather<axis=0>(shp, two)
  zero = Constant<value=int64 {{0}}>()
  one = Constant<value=int64 {{1}}>()
  r = Range(zero, n, one)
  ax1 = Constant<value=int64[1] {{1}}>()
  ax0 = Constant<value=int64[1] {{0}}>()
  rq = Unsqueeze(r, ax1)
  rk = Unsqueeze(r, ax0)
{mask_body}
  p = Softmax<axis=-1>({mask_out})
  y = MatMul(p, v)
}}"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_comparing_two_position_ranges_is_causal():
    model = _positions_model(
        """  keep = LessOrEqual(rk, rq)
  fill = Constant<value=float {-10000.0}>()
  m = Where(keep, ss, fill)""",
        "m",
    )
    (match,) = graphfix.find_attention(model)
    assert match.causal and match.kind is AttentionKind.CAUSAL


def test_relative_position_buckets_are_not_causal():
    """T5's encoder: |j - i| compared with a constant picks a bucket of a learned bias; the
    comparison of positions with a constant is no causal mask (it was labelled causal)."""
    model = _positions_model(
        """  rel = Sub(rk, rq)
  dist = Abs(rel)
  exact = Constant<value=int64 {4}>()
  near = Less(dist, exact)
  bucket = Where(near, dist, exact)
  bias_sss = Gather<axis=0>(table, bucket)
  bias_hss = Transpose<perm=[2,0,1]>(bias_sss)
  bias = Unsqueeze(bias_hss, ax0)
  m = Add(ss, bias)""",
        "m",
        ", float[5,2] table",
    )
    (match,) = graphfix.find_attention(model)
    assert not match.causal and match.kind is not AttentionKind.CAUSAL
