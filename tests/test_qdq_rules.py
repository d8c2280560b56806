"""Each Q/DQ rule on hand-built graphs: one case that must fire, one that must not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from qdq_graphs import (
    add_pair,
    attention_block,
    conv_block,
    layernorm_model,
    model,
    quantize_weight,
    residual_block,
    twin_convs,
    value,
)

from graphfix.qdq import RULES, inspect_qdq
from graphfix.qdq.rules import RULES_BY_ID


def rules_at(report, node: str) -> set[str]:
    return {f.rule for f in report.findings if f.node == node}


def test_every_rule_cites_a_source_and_has_a_severity():
    assert len({r.id for r in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.source.startswith("["), rule.id
        assert rule.summary


# --- operands ---------------------------------------------------------------------------------


def test_quantized_conv_is_covered_with_conv_flops():
    report = inspect_qdq(conv_block())
    (node,) = report.nodes
    assert node.quantized and node.precision == "int8"
    assert node.flops == 2 * 1 * 32 * 8 * 8 * 32 * 3 * 3
    assert report.coverage.fraction == 1.0
    assert report.findings == ()


def test_float_input_keeps_conv_in_float():
    report = inspect_qdq(conv_block(quantize_input=False))
    assert rules_at(report, "conv") == {"input-not-quantized"}
    assert report.coverage.flops_quantized == 0
    assert report.nodes[0].blocking_rules == ("input-not-quantized",)


def test_float_weights_keep_conv_in_float():
    m = conv_block()
    g = m.graph
    dq = next(n for n in g.node if n.name == "W_DQ")
    q_data = next(t for t in g.initializer if t.name == "W_q")
    g.initializer.append(
        numpy_helper.from_array(numpy_helper.to_array(q_data).astype(np.float32), "W_float")
    )
    next(n for n in g.node if n.name == "conv").input[1] = "W_float"
    g.node.remove(dq)
    report = inspect_qdq(m)
    assert rules_at(report, "conv") == {"weight-not-quantized"}
    assert not report.nodes[0].quantized


def test_float_weights_through_q_dq_count_as_quantized():
    """TensorRT quantizes high-precision weights with the Q's scale (Explicit Quantization)."""
    m = conv_block()
    g = m.graph
    g.node.remove(next(n for n in g.node if n.name == "W_DQ"))
    rng = np.random.default_rng(1)
    g.initializer.append(
        numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32), "W")
    )
    add_pair(m, "W", consumers=("conv",))
    report = inspect_qdq(m)
    assert report.nodes[0].quantized
    assert "weight-not-quantized" not in rules_at(report, "conv")


def test_per_tensor_weights_are_flagged_but_still_quantized():
    report = inspect_qdq(conv_block(weight_axis=None))
    assert rules_at(report, "conv") == {"weight-per-tensor"}
    assert report.nodes[0].quantized
    assert RULES_BY_ID["weight-per-tensor"].severity.value == "accuracy"


@pytest.mark.parametrize(
    ("op", "axis", "bad"),
    [
        ("Conv", 0, False),
        ("Conv", 1, True),
        ("ConvTranspose", 1, False),
        ("ConvTranspose", 0, True),
    ],
)
def test_weight_axis_must_be_the_output_channel_axis(op, axis, bad):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 48, 3, 3)).astype(
        np.float32
    )  # Conv: [Cout, Cin]; ConvT: [Cin, Cout]
    cin = 48 if op == "Conv" else 32
    cout = 32 if op == "Conv" else 48
    node = helper.make_node(op, ["x", "W"], ["y"], name="node", pads=[1, 1, 1, 1])
    m = model(
        [node],
        [value("x", (1, cin, 8, 8))],
        [value("y", (1, cout, 8, 8))],
        [numpy_helper.from_array(w, "W")],
    )
    quantize_weight(m, "W", axis=axis)
    add_pair(m, "x")
    report = inspect_qdq(m)
    assert ("weight-axis" in rules_at(report, "node")) is bad
    assert report.nodes[0].quantized is not bad


@pytest.mark.parametrize(("axis", "bad"), [(1, False), (0, True)])
def test_matmul_weight_scales_belong_on_n(axis, bad):
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    m = model(
        [node],
        [value("x", (1, 8, 32))],
        [value("y", (1, 8, 64))],
        [numpy_helper.from_array(w, "W")],
    )
    quantize_weight(m, "W", axis=axis)
    add_pair(m, "x")
    report = inspect_qdq(m)
    assert ("weight-axis" in rules_at(report, "mm")) is bad
    assert report.nodes[0].flops == 2 * 8 * 64 * 32


def test_dq_reaches_conv_through_data_movement_ops():
    m = conv_block(quantize_input=False)
    g = m.graph
    conv = next(n for n in g.node if n.name == "conv")
    conv.input[0] = "x_r"
    g.node.insert(0, helper.make_node("Reshape", ["x", "shape"], ["x_r"], name="reshape"))
    g.initializer.append(numpy_helper.from_array(np.array([1, 32, 8, 8], np.int64), "shape"))
    add_pair(m, "x")
    assert inspect_qdq(m).nodes[0].quantized


# --- residual -------------------------------------------------------------------------------


def test_qdq_between_conv_and_residual_add_is_reported():
    report = inspect_qdq(residual_block(qdq_on_conv=True, qdq_on_skip=True))
    (finding,) = [f for f in report.findings if f.rule == "residual-qdq-on-conv-branch"]
    assert finding.node == "add" and finding.fixable
    assert "h_Q" in finding.detail


def test_skip_branch_placement_is_clean():
    report = inspect_qdq(residual_block(qdq_on_conv=False, qdq_on_skip=True))
    assert rules_at(report, "add") == set()


def test_unquantized_skip_is_reported():
    report = inspect_qdq(residual_block(qdq_on_conv=False, qdq_on_skip=False))
    assert rules_at(report, "add") == {"residual-skip-not-quantized"}


# --- channels -------------------------------------------------------------------------------


@pytest.mark.parametrize(("channels", "bad"), [(8, True), (24, True), (32, False), (48, False)])
def test_channel_alignment(channels, bad):
    report = inspect_qdq(conv_block(channels=channels))
    assert ("channels-not-aligned" in rules_at(report, "conv")) is bad


def test_alignment_is_not_asked_of_float_nodes():
    report = inspect_qdq(conv_block(channels=8, quantize_input=False))
    assert "channels-not-aligned" not in rules_at(report, "conv")


# --- concat ---------------------------------------------------------------------------------


def concat_model(scales: tuple[float, float], *, output_q: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], name="concat", axis=1)]
    m = model(
        nodes, [value("a", (1, 4, 8, 8)), value("b", (1, 4, 8, 8))], [value("y", (1, 8, 8, 8))]
    )
    add_pair(m, "a", scale=scales[0])
    add_pair(m, "b", scale=scales[1])
    m.graph.node.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    if output_q:
        add_pair(m, "c", scale=0.1, consumers=("relu",))
    return m


def test_concat_of_different_scales_is_reported_and_fixable_under_a_q():
    report = inspect_qdq(concat_model((0.05, 0.08), output_q=True))
    (finding,) = [f for f in report.findings if f.rule == "concat-scale-mismatch"]
    assert finding.node == "concat" and finding.fixable


def test_concat_mismatch_without_an_output_q_is_not_fixable():
    report = inspect_qdq(concat_model((0.05, 0.08), output_q=False))
    (finding,) = [f for f in report.findings if f.rule == "concat-scale-mismatch"]
    assert not finding.fixable and "not fixable" in finding.detail


def test_concat_of_equal_scales_is_clean():
    report = inspect_qdq(concat_model((0.05, 0.05), output_q=True))
    assert "concat-scale-mismatch" not in rules_at(report, "concat")


# --- reformat-only pairs ---------------------------------------------------------------------


def norm_then(op: str, *, mode: str = "nearest") -> onnx.ModelProto:
    """x → Q/DQ → `op` → y: InstanceNormalization, or Resize then Conv."""
    if op == "InstanceNormalization":
        nodes = [helper.make_node(op, ["x", "s", "b"], ["y"], name="norm")]
        inits = [numpy_helper.from_array(np.ones(32, np.float32), n) for n in ("s", "b")]
        m = model(nodes, [value("x", (1, 32, 8, 8))], [value("y", (1, 32, 8, 8))], inits)
    else:
        nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode=mode)]
        inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
        m = model(nodes, [value("x", (1, 32, 8, 8))], [value("y", (1, 32, 16, 16))], inits)
    add_pair(m, "x")
    return m


def test_pair_feeding_only_a_norm_is_a_reformat():
    report = inspect_qdq(norm_then("InstanceNormalization"))
    (finding,) = [f for f in report.findings if f.rule == "qdq-reformat"]
    assert "InstanceNormalization" in finding.detail and finding.fixable


def test_pair_feeding_a_linear_resize_is_a_reformat_and_a_requantized_nearest_one_is_not():
    assert "qdq-reformat" in {
        f.rule for f in inspect_qdq(norm_then("Resize", mode="linear")).findings
    }
    m = norm_then("Resize", mode="nearest")
    g = m.graph
    g.node[-1].output[0] = "up"
    g.node.append(helper.make_node("Identity", ["up"], ["y"], name="out"))
    add_pair(m, "up", consumers=("out",))
    rules = {f.rule for f in inspect_qdq(m).findings if f.node == "x_Q"}
    assert "qdq-reformat" not in rules


def test_pair_feeding_a_conv_is_not_a_reformat():
    assert "qdq-reformat" not in {f.rule for f in inspect_qdq(conv_block()).findings}


# --- Myelin regions and attention ------------------------------------------------------------


def test_qdq_inside_a_normalization_splits_it():
    report = inspect_qdq(layernorm_model(qdq_inside=True))
    (finding,) = [f for f in report.findings if f.rule == "myelin-split"]
    assert "normalization" in finding.detail


def test_plain_normalization_is_clean():
    assert inspect_qdq(layernorm_model(qdq_inside=False)).findings == ()


def test_fully_quantized_attention_is_clean():
    report = inspect_qdq(attention_block())
    assert report.attention_blocks == 1
    assert {f.rule for f in report.findings} <= {"channels-not-aligned"}
    assert report.coverage.fraction == 1.0


def test_attention_without_q_dq_on_v_is_reported_on_the_second_matmul():
    report = inspect_qdq(attention_block(quantize=("q", "k", "p")))
    (finding,) = [f for f in report.findings if f.rule == "attention-placement"]
    assert finding.node == "pv" and "V" in finding.detail
    assert not next(n for n in report.nodes if n.node == "pv").quantized


def test_qdq_on_attention_scores_splits_the_fused_attention():
    report = inspect_qdq(attention_block(scores_qdq=True))
    (finding,) = [f for f in report.findings if f.rule == "myelin-split"]
    assert "attention scores" in finding.detail


# --- duplicates ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("second_scale", "duplicate"), [(0.05, True), (0.07, False)])
def test_duplicate_quantizers(second_scale, duplicate):
    m = twin_convs(np.random.default_rng(0))
    for w in ("W1", "W2"):
        quantize_weight(m, w, axis=0)
    add_pair(m, "x", consumers=("c1",), scale=0.05)
    add_pair(m, "x", consumers=("c2",), scale=second_scale)
    found = [f for f in inspect_qdq(m).findings if f.rule == "duplicate-quantizer"]
    assert bool(found) is duplicate


@pytest.mark.parametrize(("axis", "bad"), [(0, False), (1, True)])
def test_weight_axis_is_followed_through_a_transpose(axis, bad):
    """DQ(W [N, K]) → Transpose → MatMul: scales on N (axis 0 before the transpose) are right."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], name="t", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "Wt"], ["y"], name="mm"),
    ]
    m = model(
        nodes, [value("x", (1, 8, 32))], [value("y", (1, 8, 64))], [numpy_helper.from_array(w, "W")]
    )
    quantize_weight(m, "W", axis=axis)
    add_pair(m, "x")
    assert ("weight-axis" in rules_at(inspect_qdq(m), "mm")) is bad


def test_flops_of_conv_transpose_gemm_and_grouped_conv():
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node(
            "ConvTranspose",
            ["x", "Wt"],
            ["up"],
            name="deconv",
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            output_padding=[1, 1],
        ),
        helper.make_node("Conv", ["up", "Wg"], ["g"], name="grouped", group=4, pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["g"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "Wf"], ["y"], name="fc", transB=1),
    ]
    inits = [
        numpy_helper.from_array(
            rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "Wt"
        ),  # [Cin, Cout, k, k]
        numpy_helper.from_array(
            rng.standard_normal((16, 4, 3, 3)).astype(np.float32), "Wg"
        ),  # 16 out, 16/4 in
        numpy_helper.from_array(rng.standard_normal((10, 16 * 16 * 16)).astype(np.float32), "Wf"),
    ]
    m = model(nodes, [value("x", (1, 32, 8, 8))], [value("y", (1, 10))], inits)
    flops = {n.node: n.flops for n in inspect_qdq(m).nodes}
    assert flops == {
        "deconv": 2 * 1 * 32 * 8 * 8 * 16 * 3 * 3,
        "grouped": 2 * 1 * 16 * 16 * 16 * 4 * 3 * 3,
        "fc": 2 * 1 * 10 * 16 * 16 * 16,
    }


@pytest.mark.parametrize(
    ("name", "block"),
    [
        ("/down_blocks.0/resnets.0/conv1/Conv", "down_blocks.0"),
        ("/unet/mid_block/attentions.0/proj_in/Conv", "unet/mid_block"),
        ("/vae/decoder/up_blocks.2/resnets.1/conv2/Conv", "vae/decoder/up_blocks.2"),
        ("/time_embedding/linear_1/Gemm", "time_embedding/linear_1"),
        ("/conv_in/Conv", "conv_in"),
        ("node_Conv_3", "(unscoped)"),
    ],
)
def test_blocks_come_from_unet_scopes_else_the_first_two_components(name, block):
    from graphfix.qdq.view import block_of

    assert block_of(name) == block
