"""fused_plugin on minimal graphs: the GraphfixAttention contract, and honest fallbacks."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import D, Variant, attention_model, feeds_for
from onnx import helper

import graphfix
from graphfix.attention.strategies.base import FallbackKind
from graphfix.plugins.spec import ATTENTION, PLUGIN_DOMAIN


def _attention_nodes(model):
    return [n for n in model.graph.node if n.op_type == ATTENTION.op_type]


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _same_outputs(original, fixed):
    feeds = feeds_for(original)
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(None, feeds)  # noqa: E731
    for want, got in zip(run(original), run(graphfix.with_reference_ops(fixed)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_node_contract():
    model = attention_model(Variant(scale="sqrt_qk", mask="add"))
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    (node,) = _attention_nodes(fixed)
    assert node.domain == PLUGIN_DOMAIN
    assert list(node.input) == ["q_bhsd", "k_bhsd", "v_bhsd", "mask"]
    assert list(node.output) == ["ctx_bhsd"]  # P·V's output name: nothing downstream changes
    attrs = _attrs(node)
    assert attrs["scale"] == pytest.approx(1 / math.sqrt(D), rel=1e-6)
    assert attrs["k_transposed"] == 0 and attrs["causal"] == 0 and attrs["softcap"] == 0
    assert attrs["nan_to_zero"] == 0 and math.isinf(attrs["mask_fill"])
    assert (attrs["plugin_version"], attrs["plugin_namespace"]) == (b"1", b"graphfix")
    # the chain, K's Transpose and the √scale Muls are gone; so are their constants
    ops = [n.op_type for n in fixed.graph.node]
    assert "Softmax" not in ops and ops.count("MatMul") == 4 and ops.count("Transpose") == 4
    assert "sqrt_scale" not in {t.name for t in fixed.graph.initializer}
    _same_outputs(model, fixed)


def test_layout_k_is_passed_transposed():
    model = attention_model(Variant(k_layout="layout"))
    (node,) = _attention_nodes(graphfix.break_attention_fusion(model, strategy="fused_plugin"))
    assert node.input[1] == "k_t_layout" and _attrs(node)["k_transposed"] == 1


def test_where_mask_keeps_its_fill_and_the_nan_guard():
    model = attention_model(Variant(mask="where", nan_guard=True))
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    (node,) = _attention_nodes(fixed)
    attrs = _attrs(node)
    assert node.input[3] == "mask" and attrs["mask_fill"] == pytest.approx(-1e9)
    assert attrs["nan_to_zero"] == 1
    assert not any(n.op_type == "IsNaN" for n in fixed.graph.node)
    _same_outputs(model, fixed)


def test_pure_causal_constant_becomes_the_causal_flag():
    model = attention_model(Variant(mask="causal_const"))
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    (node,) = _attention_nodes(fixed)
    assert len(node.input) == 3 and _attrs(node)["causal"] == 1
    _same_outputs(model, fixed)


def test_softcap():
    model = attention_model(Variant(scale="mul_after", softcap=5.0))
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    (node,) = _attention_nodes(fixed)
    assert _attrs(node)["softcap"] == pytest.approx(5.0)
    _same_outputs(model, fixed)


def test_probabilities_used_elsewhere_fall_back_with_the_reason():
    model = attention_model(Variant())
    model.graph.output.append(helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, None))
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.rewritten and block.fallback.kind is FallbackKind.RETURNS_PROBABILITIES
    assert "graph output" in block.fallback.reason and block.fallback.reason in block.detail
    assert result.report.to_dict()["blocks"][0]["fallback"]["kind"] == "returns_probabilities"
    assert [n.op_type for n in result.model.graph.node].count("GraphfixSoftmax") == 1


def test_two_additive_biases_are_summed():
    model = attention_model(Variant(mask="add"))
    extra = helper.make_tensor_value_info("bias", onnx.TensorProto.FLOAT, [1, 3, 5, 5])
    model.graph.input.append(extra)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    softmax.input[0] = "biased"
    position = list(model.graph.node).index(softmax)
    model.graph.node.insert(
        position, helper.make_node("Add", ["masked", "bias"], ["biased"], name="bias_add")
    )
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    (node,) = _attention_nodes(fixed)
    summed = next(n for n in fixed.graph.node if n.output[0] == node.input[3])
    assert summed.op_type == "Add" and set(summed.input) == {"mask", "bias"}
    _same_outputs(model, fixed)
