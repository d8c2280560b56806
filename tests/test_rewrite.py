"""Rewrites on minimal graphs: the plugin node contract, output preservation, selection."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import Variant, attention_model, feeds_for, non_attention_models

import graphfix
from graphfix.plugins.spec import PLUGIN_DOMAIN

F16 = onnx.TensorProto.FLOAT16
VARIANTS = {
    "div": Variant(),
    "sqrt_qk_where": Variant(scale="sqrt_qk", mask="where", nan_guard=True),
    "einsum_causal": Variant(einsum=True, mask="causal_trilu"),
    "cross_add": Variant(cross=True, mask="add"),
    "fp16": Variant(dtype=F16, mask="add"),
    "fp16_island": Variant(dtype=F16, cast_island=True, mask="add"),
    "opset14": Variant(opset=14, scale="mul_after"),
    "opset18": Variant(opset=18, mask="causal_const"),
}


def run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("strategy", sorted(graphfix.STRATEGIES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_strategy_preserves_outputs_plugins_as_reference_ops(strategy, variant):
    """For the heuristics, the rewritten graph itself; for `plugin` and `fused_plugin`, a wiring
    check: their nodes run as graphfix's reference ops (`with_reference_ops`), whose math is checked
    against the node contract in tests/test_attention_reference.py, not the plugins' kernels."""
    model = attention_model(VARIANTS[variant])
    feeds = feeds_for(model)
    fixed = graphfix.break_attention_fusion(model, strategy=strategy)
    onnx.checker.check_model(fixed)
    expected = run(model, feeds)
    got = run(graphfix.with_reference_ops(fixed), feeds)
    assert len(got) >= len(expected)
    low = VARIANTS[variant].dtype == F16
    for want, have in zip(expected, got, strict=False):
        if strategy == "fp32_island" and low:
            # widening the softmax changes float16 rounding, by design
            np.testing.assert_allclose(have, want, rtol=0, atol=5e-2)
        elif strategy == "plugin" and low and not VARIANTS[variant].cast_island:
            np.testing.assert_allclose(have, want, rtol=0, atol=5e-2)  # plugin math is float32
        elif strategy == "native_attention" and low:
            # onnxruntime's float16 Attention kernel computes in float32 inside
            np.testing.assert_allclose(have, want, rtol=0, atol=5e-2)
        else:
            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6)


def test_plugin_node_contract_and_nothing_else_changes():
    model = attention_model(Variant(mask="add"))
    before = model.SerializeToString()
    fixed = graphfix.break_attention_fusion(model)
    assert model.SerializeToString() == before, "the caller's model was mutated"
    original = {n.name: n for n in model.graph.node}
    (plugin,) = [n for n in fixed.graph.node if n.domain == PLUGIN_DOMAIN]
    assert plugin.op_type == "GraphfixSoftmax" and plugin.name == "softmax"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in plugin.attribute}
    assert attrs == {"axis": -1, "plugin_version": b"1", "plugin_namespace": b"graphfix"}
    assert list(plugin.input) == ["masked"] and list(plugin.output) == ["probs"]
    assert [(o.domain, o.version) for o in fixed.opset_import] == [("", 17), ("trt.plugins", 1)]
    assert [n.name for n in fixed.graph.node] == [n.name for n in model.graph.node]
    for node in fixed.graph.node:
        if node.name != "softmax":
            assert node.SerializeToString() == original[node.name].SerializeToString()
    assert fixed.graph.initializer == model.graph.initializer
    assert fixed.graph.output == model.graph.output


def test_report_names_what_was_done_and_why():
    model = attention_model(Variant())
    result = graphfix.fix_attention(model, strategy="fp32_island")
    (block,) = result.report.blocks
    assert not block.rewritten and "float32" in block.detail
    assert result.report.rewritten == 0 and not result.report.strategy_proven


def test_non_attention_left_alone_and_reported():
    model = non_attention_models()["moe_router"]
    result = graphfix.fix_attention(model)
    assert result.report.blocks == ()
    assert result.model.SerializeToString() == model.SerializeToString()
    assert "TopK" in result.report.not_attention[0].reason


def _two_block_model() -> onnx.ModelProto:
    first = attention_model(Variant())
    second = attention_model(Variant(mask="add"))
    return onnx.compose.merge_models(first, second, io_map=[("y", "x")], prefix1="a/", prefix2="b/")


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ([1], {"b/softmax"}),
        (["a/softmax"], {"a/softmax"}),
        ([re.compile("^b/")], {"b/softmax"}),
        (["soft"], {"a/softmax", "b/softmax"}),
        (["attention:1"], {"b/softmax"}),
        (["op:Softmax"], {"a/softmax", "b/softmax"}),
        (["re:^a/"], {"a/softmax"}),
        (None, {"a/softmax", "b/softmax"}),
    ],
)
def test_select(select, expected):
    fixed = graphfix.break_attention_fusion(_two_block_model(), select=select)
    assert {n.name for n in fixed.graph.node if n.domain == PLUGIN_DOMAIN} == expected


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ([7], "numbered 0..1"),
        (["nope"], "matches no node name"),
        (["("], "regex"),
        (["op:MatMul"], "matches no attention block"),
        ([-1], "not a block index"),
    ],
)
def test_select_matching_nothing_is_an_error(bad, words):
    with pytest.raises(graphfix.SelectionError, match=words):
        graphfix.break_attention_fusion(_two_block_model(), select=bad)


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(graphfix.GraphfixError, match="plugin, mark_output"):
        graphfix.break_attention_fusion(attention_model(), strategy="nope")


def test_mark_output_adds_typed_output():
    fixed = graphfix.break_attention_fusion(attention_model(), strategy="mark_output")
    assert [o.name for o in fixed.graph.output] == ["y", "probs"]
    assert fixed.graph.output[1].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_max_subtract_uses_axes_input_from_opset_18():
    fixed = graphfix.break_attention_fusion(
        attention_model(Variant(opset=18)), strategy="max_subtract"
    )
    (reduce,) = [n for n in fixed.graph.node if n.op_type == "ReduceMax"]
    assert len(reduce.input) == 2 and not reduce.attribute[0].name == "axes"
