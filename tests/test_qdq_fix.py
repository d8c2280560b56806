"""`fix_qdq` on hand-built graphs: each repair is exact (or better) and is reported; the error
guard refuses a change that would make the output worse than the input model's."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from qdq_graphs import (
    add_pair,
    conv_block,
    layernorm_model_for_fix,
    model,
    residual_block,
    twin_convs,
    value,
)

from graphfix.qdq import inspect_qdq
from graphfix.qdq.error import run
from graphfix.qdq.fix import fix_qdq

RNG = np.random.default_rng(7)


def outputs(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return run(m, feeds)


def test_residual_pair_is_bypassed_exactly_and_kept_for_the_skip():
    planted = residual_block(qdq_on_conv=True, qdq_on_skip=True)
    clean = residual_block(qdq_on_conv=False, qdq_on_skip=True)
    result = fix_qdq(planted)
    (change,) = [c for c in result.report.changes if c.rule == "residual-qdq-on-conv-branch"]
    assert change.action == "bypass" and change.node == "h_Q"
    assert result.report.after.count("residual-qdq-on-conv-branch") == 0
    assert not any(n.name == "h_Q" for n in result.model.graph.node)  # no other consumer: removed
    feeds = {"x": RNG.standard_normal((1, 32, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(outputs(result.model, feeds)[0], outputs(clean, feeds)[0])
    assert len(planted.graph.node) == len(clean.graph.node) + 2  # the caller's model is untouched


def test_pairs_splitting_a_norm_are_removed_exactly():
    planted, clean = layernorm_model_for_fix()
    result = fix_qdq(planted)
    assert [c.rule for c in result.report.changes] == ["myelin-split"]
    assert result.report.after.findings == ()
    feeds = {"x": RNG.standard_normal((1, 8, 32)).astype(np.float32)}
    np.testing.assert_array_equal(outputs(result.model, feeds)[0], outputs(clean, feeds)[0])


def test_reformat_only_pair_is_removed_and_the_norm_reads_float():
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="norm")]
    inits = [numpy_helper.from_array(np.ones(32, np.float32), n) for n in ("s", "b")]
    clean = model(nodes, [value("x", (1, 32, 8, 8))], [value("y", (1, 32, 8, 8))], inits)
    planted = onnx.ModelProto()
    planted.CopyFrom(clean)
    add_pair(planted, "x")
    result = fix_qdq(planted)
    assert [c.rule for c in result.report.changes] == ["qdq-reformat"]
    feeds = {"x": RNG.standard_normal((1, 32, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(outputs(result.model, feeds)[0], outputs(clean, feeds)[0])


def test_concat_inputs_are_requantized_with_the_output_scale():
    # Concat → Q/DQ → a quantized 1×1 Conv: the Concat's output pair feeds INT8 compute and stays
    weight = (RNG.standard_normal((2, 8, 1, 1)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["c"], name="concat", axis=1),
        helper.make_node("Conv", ["c", "w"], ["y"], name="conv"),
    ]
    shape = (1, 4, 8, 8)
    reference = model(nodes, [value("a", shape), value("b", shape)], [value("y", (1, 2, 8, 8))])
    reference.graph.initializer.append(numpy_helper.from_array(weight, "w"))
    planted = onnx.ModelProto()
    planted.CopyFrom(reference)
    add_pair(planted, "a", scale=0.013)
    add_pair(planted, "b", scale=0.031)
    add_pair(planted, "c", scale=0.02, consumers=("conv",))
    add_pair(planted, "w", scale=0.01, consumers=("conv",))
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in "ab"}
    result = fix_qdq(planted, reference=reference, feeds=[feeds])
    assert [c.rule for c in result.report.changes] == ["concat-scale-mismatch"] * 2
    assert result.report.after.count("concat-scale-mismatch") == 0
    # one rounding onto the output grid: exactly fake-quant(concat(a, b)) with scale 0.02
    grid = np.clip(np.round(np.concatenate([feeds["a"], feeds["b"]], 1) / 0.02), -128, 127) * 0.02
    weights = np.clip(np.round(weight / 0.01), -128, 127) * 0.01
    expected = np.einsum("oc,nchw->nohw", weights[:, :, 0, 0], grid)
    np.testing.assert_allclose(outputs(result.model, feeds)[0], expected, rtol=0, atol=1e-5)
    assert result.report.error.passed
    assert result.report.error.after_mean_abs < result.report.error.before_mean_abs
    assert fix_qdq(result.model).report.changes == ()  # the fixpoint


def test_duplicate_quantizers_are_merged():
    rng = np.random.default_rng(0)
    shape = (1, 32, 8, 8)
    planted = twin_convs(rng, shape)
    add_pair(planted, "x", consumers=("c1",))
    add_pair(planted, "x", consumers=("c2",))
    result = fix_qdq(planted)
    assert [c.action for c in result.report.changes] == ["merge", "merge"]  # the Q, then the DQ
    assert sum(n.op_type == "QuantizeLinear" for n in result.model.graph.node) == 1
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    for a, b in zip(outputs(result.model, feeds), outputs(planted, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def cancelling_residual() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """h = Conv(x); y = Q/DQ(h) + Q/DQ(−h): the roundings cancel exactly (y = 0, as in float), so
    bypassing the pair on the conv branch (exact for that tensor) makes the output worse."""
    float_model = conv_block(quantize_input=False)
    g = float_model.graph
    next(n for n in g.node if n.name == "conv").output[0] = "h"
    g.node.extend(
        [
            helper.make_node("Neg", ["h"], ["neg"], name="neg"),
            helper.make_node("Add", ["h", "neg"], ["y"], name="add"),
        ]
    )
    planted = onnx.ModelProto()
    planted.CopyFrom(float_model)
    add_pair(planted, "x", scale=0.05)
    add_pair(planted, "h", scale=0.2, consumers=("add",))
    add_pair(planted, "neg", scale=0.2, consumers=("add",))
    return planted, float_model


def test_guard_refuses_a_change_that_would_raise_the_error():
    planted, reference = cancelling_residual()
    assert inspect_qdq(planted).count("residual-qdq-on-conv-branch") == 1
    feeds = {"x": RNG.standard_normal((1, 32, 8, 8)).astype(np.float32)}
    unguarded = fix_qdq(planted)
    assert any(c.rule == "residual-qdq-on-conv-branch" for c in unguarded.report.changes)
    guarded = fix_qdq(planted, reference=reference, feeds=[feeds])
    assert not any(c.rule == "residual-qdq-on-conv-branch" for c in guarded.report.changes)
    assert guarded.report.after.count("residual-qdq-on-conv-branch") == 1
    assert [c.node for c in guarded.report.refused] == ["h_Q"]
    assert guarded.report.error.passed
    assert guarded.report.error.before_max_abs == 0.0 == guarded.report.error.after_max_abs
