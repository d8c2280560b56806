"""fused_plugin on the chain forms of issue 21, on minimal graphs written next to each test:
each rewritten graph computes what the original did (graphfix's reference ops in
onnxruntime), and each form that cannot be expressed exactly falls back with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import parser

import graphfix
from graphfix.attention.match_types import HeadMixStep, ReshapeStep
from graphfix.plugins.spec import ATTENTION

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
FLOAT32_MIN = "-3.4028234663852886e38"


def _model(signature: str, body: str) -> onnx.ModelProto:
    inputs, outputs = signature.split(" => ")
    model = parser.parse_model(f"{HEADER}\ng ({inputs}) => {outputs} {{\n{body}\n}}")
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(model: onnx.ModelProto, **given: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = dict(given)
    for value in model.graph.input:
        if value.name in feeds:
            continue
        t = value.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _fused(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, tolerance: float = 1e-6):
    """The fused_plugin rewrite of `model`: one GraphfixAttention node, same outputs."""
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert not block.detail.startswith("fell back"), block.detail
    assert [n.op_type for n in result.model.graph.node].count(ATTENTION.op_type) == 1
    assert "Softmax" not in [n.op_type for n in result.model.graph.node]
    onnx.checker.check_model(result.model, full_check=True)
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(None, feeds)  # noqa: E731
    for want, got in zip(run(model), run(graphfix.with_reference_ops(result.model)), strict=True):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    return block


def _fell_back(model: onnx.ModelProto) -> str:
    (block,) = graphfix.fix_attention(model, strategy="fused_plugin").report.blocks
    assert block.rewritten and block.detail.startswith("fell back"), block.detail
    return block.detail


# --- a Where mask with a finite fill and an additive bias ---------------------------------------
QKV = "float[2,2,4,8] q, float[2,2,4,8] k, float[2,2,4,8] v"
PRODUCT = """
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  c = Constant<value=float {0.35}>()
  ss = Mul(s, c)
"""


def _keep_with_a_blocked_row() -> np.ndarray:
    keep = np.random.default_rng(3).random((2, 1, 4, 4)) > 0.4
    keep[1, 0, 2, :] = False  # every key of one row blocked: the original gives a uniform row
    keep[0, 0, 1, :] = True
    return keep


def _bias() -> np.ndarray:
    """A bias with finfo.min on every kept key of some rows (padding on the left, GPT-Neo)."""
    bias = (np.random.default_rng(4).standard_normal((2, 1, 4, 4)) * 3).astype(np.float32)
    bias[0, 0, :2, :] = np.finfo(np.float32).min
    return bias


def _fill_and_bias(fill: str, *, mask_first: bool) -> onnx.ModelProto:
    steps = (
        f"""
  fill = Constant<value=float {{{fill}}}>()
  m = Where(keep, ss, fill)
  a = Add(m, bias)
  p = Softmax<axis=-1>(a)"""
        if mask_first
        else f"""
  a = Add(ss, bias)
  fill = Constant<value=float {{{fill}}}>()
  m = Where(keep, a, fill)
  p = Softmax<axis=-1>(m)"""
    )
    return _model(
        f"{QKV}, bool[2,1,4,4] keep, float[2,1,4,4] bias => (float[2,2,4,8] y)",
        PRODUCT + steps + "\n  y = MatMul(p, v)",
    )


@pytest.mark.parametrize("mask_first", [False, True], ids=["bias_first", "mask_first"])
def test_finfo_min_fill_and_a_bias_are_one_mask(mask_first: bool) -> None:
    model = _fill_and_bias(FLOAT32_MIN, mask_first=mask_first)
    block = _fused(model, _feeds(model, keep=_keep_with_a_blocked_row(), bias=_bias()))
    assert "boolean mask (fill -3.40282e+38) with bias" in block.detail


def test_a_constant_causal_keep_with_a_padding_bias_keeps_the_original_rows() -> None:
    """GPT-Neo (legacy): Where(causal, s, finfo.min) + padding bias.  Rows whose causal keys are
    all padded are uniform over those keys in the original, not over every key."""
    causal = np.tril(np.ones((4, 4), bool))[None, None]
    model = _model(
        f"{QKV}, float[2,1,4,4] bias => (float[2,2,4,8] y)",
        PRODUCT
        + f"""
  keep = Constant<value=bool[1,1,4,4] {{{", ".join(str(int(v)) for v in causal.reshape(-1))}}}>()
  fill = Constant<value=float {{{FLOAT32_MIN}}}>()
  m = Where(keep, ss, fill)
  a = Add(m, bias)
  p = Softmax<axis=-1>(a)
  y = MatMul(p, v)""",
    )
    bias = np.zeros((2, 1, 4, 4), np.float32)
    bias[0, ..., :2] = np.finfo(np.float32).min  # left padding: rows 0 and 1 see only padding
    _fused(model, _feeds(model, bias=bias))


@pytest.mark.parametrize("mask_first", [False, True], ids=["bias_first", "mask_first"])
def test_a_small_finite_fill_with_a_bias_falls_back(mask_first: bool) -> None:
    """-1e4 (or float16's -65504): where the bias pushes kept keys below the fill, the node
    would let the scores show through it."""
    model = _fill_and_bias("-10000.0", mask_first=mask_first)
    assert "or a constant bias above fill / 2 applied before the mask" in _fell_back(model)


def _constant_bias_then_fill(low: float) -> onnx.ModelProto:
    """MPT: ALiBi (a constant bias, lowest value `low`) added, then masked_fill(-65504)."""
    alibi = np.linspace(low, 0.0, 4, dtype=np.float32)
    return _model(
        f"{QKV}, bool[2,1,4,4] keep => (float[2,2,4,8] y)",
        PRODUCT
        + f"""
  alibi = Constant<value=float[1,1,1,4] {{{", ".join(f"{v:.9g}" for v in alibi)}}}>()
  a = Add(ss, alibi)
  fill = Constant<value=float {{-65504.0}}>()
  m = Where(keep, a, fill)
  p = Softmax<axis=-1>(m)
  y = MatMul(p, v)""",
    )


def test_a_constant_bias_far_above_a_small_fill_is_folded() -> None:
    model = _constant_bias_then_fill(-0.4375)
    block = _fused(model, _feeds(model, keep=_keep_with_a_blocked_row()))
    assert "boolean mask (fill -65504) with bias" in block.detail


def test_a_constant_bias_reaching_the_fill_falls_back() -> None:
    assert "constant bias above fill / 2" in _fell_back(_constant_bias_then_fill(-40000.0))


# --- a scale after the bias (Falcon: (s + alibi)·c + mask) ---------------------------------------
def test_scale_after_a_bias_scales_the_bias() -> None:
    model = _model(
        f"{QKV}, float[2,1,4,4] alibi, float[2,1,4,4] mask => (float[2,2,4,8] y)",
        """
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  a = Add(s, alibi)
  c = Constant<value=float {0.35}>()
  ss = Mul(a, c)
  m = Add(ss, mask)
  p = Softmax<axis=-1>(m)
  y = MatMul(p, v)""",
    )
    block = _fused(model, _feeds(model))
    assert "scale 0.35" in block.detail


def test_scale_after_a_where_mask_falls_back() -> None:
    model = _model(
        f"{QKV}, bool[2,1,4,4] keep => (float[2,2,4,8] y)",
        """
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  fill = Constant<value=float {-10000.0}>()
  m = Where(keep, s, fill)
  c = Constant<value=float {0.35}>()
  ss = Mul(m, c)
  p = Softmax<axis=-1>(ss)
  y = MatMul(p, v)""",
    )
    assert "scales the scores after the mask" in _fell_back(model)


# --- views of batch·heads (BLOOM's baddbmm export) -----------------------------------------------
BLOOM = """
  kt = Transpose<perm=[0,2,1]>(k)
  s = MatMul(q, kt)
  c = Constant<value=float {0.25}>()
  ss = Mul(s, c)
  b = Add(ss, alibi)
  split = Constant<value=int64[4] {2,2,4,-1}>()
  s4 = Reshape(b, split)
  m = Add(s4, mask)
  p = Softmax<axis=-1>(m)
"""


def _bloom(alibi_rows: str) -> onnx.ModelProto:
    """Q, K, V [B·H, S, D]; scores viewed as [B, H, S, T] for the mask and back for P·V."""
    return _model(
        f"float[4,4,8] q, float[4,4,8] k, float[4,4,8] v, float[{alibi_rows},1,4] alibi, "
        "float[2,1,4,4] mask => (float[4,4,8] y)",
        BLOOM
        + """
  fold = Constant<value=int64[3] {4,4,4}>()
  p3 = Reshape(p, fold)
  y = MatMul(p3, v)""",
    )


def test_bloom_views_of_batch_heads() -> None:
    model = _bloom("4")
    block = _fused(model, _feeds(model))
    assert "batch·heads viewed" in block.detail


def test_view_of_batch_heads_with_a_4d_v() -> None:
    """dynamo: the probabilities stay [B, H, S, T] and V is [B, H, T, D]."""
    model = _model(
        "float[4,4,8] q, float[4,4,8] k, float[2,2,4,8] v, float[1,1,4] alibi, "
        "float[2,1,4,4] mask => (float[2,2,4,8] y)",
        BLOOM + "  y = MatMul(p, v)",
    )
    _fused(model, _feeds(model))


def test_a_view_that_moves_the_keys_falls_back() -> None:
    model = _model(
        "float[4,4,8] q, float[4,4,8] k, float[4,4,8] v => (float[4,4,8] y)",
        """
  kt = Transpose<perm=[0,2,1]>(k)
  s = MatMul(q, kt)
  split = Constant<value=int64[4] {2,2,2,8}>()
  s4 = Reshape(s, split)
  p = Softmax<axis=-1>(s4)
  fold = Constant<value=int64[3] {4,4,4}>()
  p3 = Reshape(p, fold)
  y = MatMul(p3, v)""",
    )
    assert "not only regrouping batch and heads" in _fell_back(model)


def test_identity_views_are_skipped() -> None:
    model = _model(
        f"{QKV} => (float[2,2,4,8] y)",
        PRODUCT
        + """
  same = Constant<value=int64[4] {2,2,4,4}>()
  s4 = Reshape(ss, same)
  p = Softmax<axis=-1>(s4)
  p4 = Reshape(p, same)
  y = MatMul(p4, v)""",
    )
    _fused(model, _feeds(model))


# --- a softcap before the sink Concat (the sink logit is not capped) -----------------------------
def test_a_run_time_sink_after_a_softcap_falls_back() -> None:
    """cap·atanh(sink / cap) undoes the node's softcap only for |sink| < cap, unknown here."""
    model = _model(
        f"{QKV}, float[2,2,4,1] sink => (float[2,2,4,8] y)",
        PRODUCT
        + """
  cap = Constant<value=float {5.0}>()
  d = Div(ss, cap)
  t = Tanh(d)
  capped = Mul(t, cap)
  row = Concat<axis=-1>(capped, sink)
  p5 = Softmax<axis=-1>(row)
  starts = Constant<value=int64[1] {0}>()
  ends = Constant<value=int64[1] {4}>()
  axes = Constant<value=int64[1] {3}>()
  p = Slice(p5, starts, ends, axes)
  y = MatMul(p, v)""",
    )
    assert "computed at run time after a softcap" in _fell_back(model)


# --- a scale computed at run time (Swin v2's logit scale) ----------------------------------------
def _logit_scaled(scale_shape: str, values: str) -> onnx.ModelProto:
    return _model(
        f"{QKV} => (float[2,2,4,8] y)",
        f"""
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  logit = Constant<value=float{scale_shape} {{{values}}}>()
  top = Constant<value=float {{4.6}}>()
  clipped = Clip(logit, , top)
  c = Exp(clipped)
  ss = Mul(s, c)
  p = Softmax<axis=-1>(ss)
  y = MatMul(p, v)""",
    )


def test_a_run_time_scale_per_head_moves_onto_q() -> None:
    model = _logit_scaled("[2,1,1]", "0.5, 1.5")
    block = _fused(model, _feeds(model), tolerance=1e-5)
    assert "computed at run time, moved onto Q" in block.detail


def test_a_run_time_scale_along_the_keys_falls_back() -> None:
    model = _logit_scaled("[1,4]", "0.5, 1.5, 1.0, 2.0")
    assert "varies along the keys" in _fell_back(model)


# --- the scores also read by Shape -----------------------------------------------------------------
def test_shape_of_the_scores_is_recomputed_from_q_and_k() -> None:
    """A causal buffer sliced to the scores' own last two dims (GPT-2 in transformers 4)."""
    model = _model(
        "float[2,2,4,8] q, float[2,2,8,4] kt, float[2,2,4,8] v => (float[2,2,4,8] y)",
        """
  s = MatMul(q, kt)
  c = Constant<value=float {0.35}>()
  ss = Mul(s, c)
  dims = Shape<start=-2>(ss)
  buffer = Constant<value=bool[6,6] {1,0,0,0,0,0, 1,1,0,0,0,0, 1,1,1,0,0,0,
                                     1,1,1,1,0,0, 1,1,1,1,1,0, 1,1,1,1,1,1}>()
  zeros = Constant<value=int64[2] {0,0}>()
  keep = Slice(buffer, zeros, dims)
  fill = Constant<value=float {-10000.0}>()
  m = Where(keep, ss, fill)
  p = Softmax<axis=-1>(m)
  y = MatMul(p, v)""",
    )
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    assert not any(n.input[:1] == ["ss"] for n in result.model.graph.node)
    _fused(model, _feeds(model))


WIDENING = """
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  c = Constant<value=float {0.35}>()
  ss = Mul(s, c)
  sm = Add(ss, mask)
  dims = Shape(sm)
  p = Softmax<axis=-1>(sm)
  y = MatMul(p, v)"""


def test_a_mask_that_widens_the_batch_falls_back() -> None:
    """A [3, 1, 4, 6] mask on scores of batch 1: the chain's output has batch 3, the node's
    would have Q's (and its Shape reader, recomputed from Q and K, said 1)."""
    model = _model(
        "float[1,2,4,8] q, float[1,2,6,8] k, float[1,2,6,8] v, float[3,1,4,6] mask"
        " => (float[3,2,4,8] y, int64[4] dims)",
        WIDENING,
    )
    assert "broadcasts the scores [1, 2, 4, 6] to [3, 2, 4, 6]" in _fell_back(model)
    (block,) = graphfix.fix_attention(model, strategy="native_attention").report.blocks
    assert not block.rewritten and "broadcasts the scores" in block.detail


def test_a_shape_reader_after_a_mask_sees_the_mask_broadcast() -> None:
    """Run-time dims hide whether the mask widens the scores, so the rewrite goes ahead; the
    recomputed Shape then takes the mask's dims into account as the chain's Add did."""
    model = _model(
        "float[B,2,4,8] q, float[B,2,6,8] k, float[B,2,6,8] v, float[M,1,4,6] mask"
        " => (float[M,2,4,8] y, int64[4] dims)",
        WIDENING,
    )
    given = {
        "q": np.ones((1, 2, 4, 8), np.float32),
        "k": np.ones((1, 2, 6, 8), np.float32),
        "v": np.ones((1, 2, 6, 8), np.float32),
        "mask": np.zeros((3, 1, 4, 6), np.float32),
    }
    _fused(model, _feeds(model, **given))


# --- Q and K in float32, V in float16 -------------------------------------------------------------
def test_float16_v_after_float32_scores_is_widened_for_the_node() -> None:
    """The original rounds P to float16 for P·V; the node keeps it in float32."""
    model = _model(
        "float[2,2,4,8] q, float[2,2,4,8] k, float16[2,2,4,8] v => (float16[2,2,4,8] y)",
        PRODUCT
        + """
  p = Softmax<axis=-1>(ss)
  p16 = Cast<to=10>(p)
  y = MatMul(p16, v)""",
    )
    block = _fused(model, _feeds(model), tolerance=2e-3)
    assert "V widened to float32" in block.detail


def test_float32_v_after_float16_scores_falls_back() -> None:
    model = _model(
        "float16[2,2,4,8] q, float16[2,2,4,8] k, float[2,2,4,8] v => (float[2,2,4,8] y)",
        """
  kt = Transpose<perm=[0,1,3,2]>(k)
  s = MatMul(q, kt)
  p = Softmax<axis=-1>(s)
  p32 = Cast<to=1>(p)
  y = MatMul(p32, v)""",
    )
    assert "must share one of float32/float16/bfloat16" in _fell_back(model)


# --- talking heads (CaiT): a projection across the heads around the Softmax ----------------------
def _talking_heads(back: str) -> onnx.ModelProto:
    return _model(
        f"{QKV} => (float[2,2,4,8] y)",
        PRODUCT
        + f"""
  wl = Constant<value=float[2,2] {{0.9, 0.2, -0.3, 1.1}}>()
  bl = Constant<value=float[2] {{0.1, -0.2}}>()
  sl = Transpose<perm=[0,2,3,1]>(ss)
  ml = MatMul(sl, wl)
  al = Add(ml, bl)
  mixed = Transpose<perm=[0,3,1,2]>(al)
  p = Softmax<axis=-1>(mixed)
  ww = Constant<value=float[2,2] {{1.2, -0.1, 0.4, 0.8}}>()
  pl = Transpose<perm=[0,2,3,1]>(p)
  mw = MatMul(pl, ww)
  pm = Transpose<perm={back}>(mw)
  y = MatMul(pm, v)""",
    )


def test_talking_heads_is_matched_and_left_to_graphfix_softmax() -> None:
    model = _talking_heads("[0,3,1,2]")
    (match,) = graphfix.find_attention(model)
    assert [type(s) for s in match.after] == [HeadMixStep]
    assert HeadMixStep in [type(s) for s in match.steps]
    assert "a head-mixing projection (talking heads" in _fell_back(model)
    fixed = graphfix.fix_attention(model, strategy="plugin").model
    feeds = _feeds(model)
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(None, feeds)  # noqa: E731
    np.testing.assert_allclose(
        run(graphfix.with_reference_ops(fixed))[0], run(model)[0], rtol=1e-6, atol=1e-6
    )


def test_a_transpose_that_does_not_move_the_heads_back_is_not_talking_heads() -> None:
    model = _talking_heads("[0,3,2,1]")
    assert graphfix.find_attention(model) == []


def test_probabilities_folded_for_a_3d_v() -> None:
    """dynamo `view`: 4-D Q·Kᵀ, the probabilities folded to [B·H, S, T] for a 3-D V."""
    model = _model(
        f"{QKV.replace('float[2,2,4,8] v', 'float[4,4,8] v')} => (float[4,4,8] y)",
        PRODUCT
        + """
  p = Softmax<axis=-1>(ss)
  fold = Constant<value=int64[3] {4,4,4}>()
  p3 = Reshape(p, fold)
  y = MatMul(p3, v)""",
    )
    _fused(model, _feeds(model))


# --- Swin's window view with a run-time shape (transformers Swin v2, legacy export) --------------
def test_window_view_with_a_run_time_window_count() -> None:
    """scores [B·nW, H, N, N] viewed as [B, nW, H, N, N] by a shape computed at run time from
    the window mask's; the node gets the mask tiled over the images, nW read at run time."""
    model = _model(
        f"{QKV}, float[1,W,1,4,4] windows => (float[2,2,4,8] y)",
        PRODUCT
        + """
  zero = Constant<value=int64[1] {0}>()
  one = Constant<value=int64[1] {1}>()
  rest = Constant<value=int64[3] {2,4,4}>()
  rows = Gather<axis=0>(scores_shape, zero)
  scores_shape = Shape(ss)
  mask_shape = Shape(windows)
  count = Gather<axis=0>(mask_shape, one)
  images = Div(rows, count)
  view = Concat<axis=0>(images, count, rest)
  s5 = Reshape(ss, view)
  b5 = Add(s5, windows)
  back = Constant<value=int64[4] {-1,2,4,4}>()
  s4 = Reshape(b5, back)
  p = Softmax<axis=-1>(s4)
  y = MatMul(p, v)""".replace(
            "  rows = Gather<axis=0>(scores_shape, zero)\n  scores_shape = Shape(ss)\n",
            "  scores_shape = Shape(ss)\n  rows = Gather<axis=0>(scores_shape, zero)\n",
        ),
    )
    (match,) = graphfix.find_attention(model)
    view = next(s for s in match.steps if isinstance(s, ReshapeStep))
    assert view.target is None and not isinstance(view.output_shape[1], int)  # nW at run time
    windows = np.random.default_rng(5).standard_normal((1, 2, 1, 4, 4)).astype(np.float32)
    block = _fused(model, _feeds(model, windows=windows))
    assert "per-window mask tiled over images" in block.detail


def test_a_where_mask_with_two_biases() -> None:
    """The summed biases are a new tensor: its element type comes from the biases."""
    model = _model(
        f"{QKV}, bool[2,1,4,4] keep, float[2,1,4,4] bias, float[1,2,4,4] position "
        "=> (float[2,2,4,8] y)",
        PRODUCT
        + """
  a = Add(ss, bias)
  b = Add(a, position)
  fill = Constant<value=float {-inf}>()
  m = Where(keep, b, fill)
  p = Softmax<axis=-1>(m)
  y = MatMul(p, v)""",
    )
    keep = _keep_with_a_blocked_row()
    keep[1, 0, 2, 0] = True  # no row all blocked: -inf would give NaN in both
    _fused(model, _feeds(model, keep=keep))


@pytest.mark.parametrize("rows", [4, 1])
def test_a_bias_of_run_time_rows_before_the_view(rows: int) -> None:
    """DeBERTa: the relative-attention bias is [B·H, S, T] with B·H unknown to shape inference
    (1 or B·H at run time): expanded to B·H rows, then viewed like the scores."""
    model = _bloom("R")
    alibi = np.random.default_rng(6).standard_normal((rows, 1, 4)).astype(np.float32)
    _fused(model, _feeds(model, alibi=alibi))


def test_returned_probabilities_fall_back_by_name() -> None:
    """output_attentions: the node has one output, GraphfixSoftmax keeps the probabilities."""
    model = _model(
        f"{QKV} => (float[2,2,4,8] y, float[2,2,4,4] p)",
        PRODUCT
        + """
  p = Softmax<axis=-1>(ss)
  y = MatMul(p, v)""",
    )
    assert "are also a graph output (returned attention weights)" in _fell_back(model)


# --- 5-D windows (NesT, Twins' locally-grouped attention) ----------------------------------------
def _windows_5d(bias_shape: str) -> onnx.ModelProto:
    qkv = ", ".join(f"float[2,3,2,4,8] {n}" for n in "qkv")
    return _model(
        f"{qkv}, float{bias_shape} bias => (float[2,3,2,4,8] y)",
        """
  kt = Transpose<perm=[0,1,2,4,3]>(k)
  s = MatMul(q, kt)
  c = Constant<value=float {0.35}>()
  ss = Mul(s, c)
  b = Add(ss, bias)
  p = Softmax<axis=-1>(b)
  y = MatMul(p, v)""",
    )


def test_5d_windows_are_merged_into_the_batch() -> None:
    model = _windows_5d("[4,4]")
    block = _fused(model, _feeds(model))
    assert "5-D windows merged into the batch and split back" in block.detail


def test_a_per_window_bias_on_5d_scores_falls_back() -> None:
    assert "of rank 4 on 5-D attention scores" in _fell_back(_windows_5d("[3,2,4,4]"))
