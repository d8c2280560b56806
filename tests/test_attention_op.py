"""ONNX Attention (opset 23): reported as such, and decomposed into a chain graphfix rewrites."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphfix
from graphfix.plugins.spec import PLUGIN_DOMAIN

B, H, S, T, D = 2, 3, 5, 7, 8


def attention_op_model(*, mask: str | None = None, is_causal=False, scale=None, softcap=None):
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, H, S, D]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, H, T, D]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, T, D]),
    ]
    names = ["q", "k", "v"]
    if mask:
        elem = TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT
        inputs.append(helper.make_tensor_value_info("mask", elem, [B, 1, S, T]))
        names.append("mask")
    attrs = {"is_causal": int(is_causal)}
    if scale is not None:
        attrs["scale"] = scale
    if softcap is not None:
        attrs["softcap"] = softcap
    node = helper.make_node("Attention", names, ["y"], name="attn", **attrs)
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.type.tensor_type.elem_type == TensorProto.BOOL:
            value = rng.random(shape) > 0.3
            value[..., 0] = True
        else:
            value = rng.standard_normal(shape).astype(np.float32)
        out[inp.name] = value
    return out


def run(model, data):
    return ort.InferenceSession(model.SerializeToString()).run(None, data)[0]


def test_attention_op_is_reported_not_rewritten():
    model = attention_op_model()
    scan = graphfix.scan_attention(model)
    assert scan.matches == () and len(scan.attention_ops) == 1
    result = graphfix.fix_attention(model)
    assert result.report.rewritten == 0
    assert "decompose" in result.report.summary()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mask": "bool"},
        {"mask": "float", "scale": 0.25},
        {"is_causal": True},
        {"softcap": 2.0},
    ],
)
def test_decomposed_attention_matches_the_op(kwargs):
    model = attention_op_model(**kwargs)
    data = feeds(model)
    result = graphfix.fix_attention(model, decompose_attention_ops=True)
    assert result.report.decomposed_attention_ops == 1 and result.report.rewritten == 1
    (match,) = result.report.matches
    assert match.causal == kwargs.get("is_causal", False)
    if kwargs.get("softcap"):
        assert match.softcap == pytest.approx(kwargs["softcap"])
    assert any(n.domain == PLUGIN_DOMAIN for n in result.model.graph.node)
    onnx.checker.check_model(result.model)
    np.testing.assert_allclose(
        run(graphfix.with_reference_ops(result.model), data), run(model, data), rtol=1e-5, atol=1e-5
    )


def test_half_a_kv_cache_is_left_alone_with_the_reason():
    """past_key without past_value breaks the spec: the node stays, and the report says why."""
    model = attention_op_model()
    model.graph.node[0].input.extend(["", "", ""])
    model.graph.node[0].input[4] = "k"
    result = graphfix.fix_attention(model, decompose_attention_ops=True)
    assert result.report.decomposed_attention_ops == 0
    assert [n.op_type for n in result.model.graph.node] == ["Attention"]
    assert "only one of past_key and past_value" in result.report.summary()
