"""Attention inside If/Loop/Scan bodies and model-local functions: matched and rewritten, or
listed with the reason; initializers that a body reads survive a rewrite of the main graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import B, D, H, S, Variant, attention_model, feeds_for
from onnx import TensorProto, helper

import graphfix
from graphfix.plugins.spec import ATTENTION, SOFTMAX


def _in_if_branch(*, main_attention: bool = False) -> onnx.ModelProto:
    """The attention chain of graphs.attention_model inside an If's then_branch (reading the
    weights and `x` from the main graph); else_branch scales x by the chain's own `denom`
    initializer.  With `main_attention`, the same chain also runs in the main graph."""
    plain = attention_model(Variant())
    body_nodes = list(plain.graph.node)
    then_branch = helper.make_graph(
        body_nodes, "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Div", ["x", "denom"], ["y_else"], name="else_div")],
        "else",
        [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node(
            "If",
            ["cond"],
            ["out"],
            name="branch",
            then_branch=then_branch,
            else_branch=else_branch,
        )
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, H * D])]
    if main_attention:
        renamed = attention_model(Variant())
        produced = {o for n in renamed.graph.node for o in n.output}
        for node in renamed.graph.node:
            node.name = f"main/{node.name}"
            node.output[:] = [f"main/{o}" for o in node.output]
            node.input[:] = [f"main/{i}" if i in produced else i for i in node.input]
        nodes = list(renamed.graph.node) + nodes
        outputs.append(helper.make_tensor_value_info("main/y", TensorProto.FLOAT, [B, S, H * D]))
    inputs = [*plain.graph.input, helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "if_model", inputs, outputs, list(plain.graph.initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_attention_in_an_if_branch_is_matched_with_its_location():
    (match,) = graphfix.find_attention(_in_if_branch())
    assert match.location == "If 'branch'/then_branch"
    assert match.softmax == "softmax" and match.scale.value == pytest.approx(1 / np.sqrt(D))


@pytest.mark.parametrize("strategy", ["plugin", "fused_plugin"])
def test_attention_in_an_if_branch_is_rewritten(strategy):
    model = _in_if_branch()
    result = graphfix.fix_attention(model, strategy=strategy)
    (block,) = result.report.blocks
    assert block.rewritten and "inside If 'branch'/then_branch" in block.detail
    assert not block.detail.startswith("fell back"), block.detail
    (then_branch,) = (a.g for a in result.model.graph.node[0].attribute if a.name == "then_branch")
    op = SOFTMAX.op_type if strategy == "plugin" else ATTENTION.op_type
    assert [n.op_type for n in then_branch.node].count(op) == 1
    assert "trt.plugins" in {o.domain for o in result.model.opset_import}
    onnx.checker.check_model(result.model)
    for cond in (True, False):
        feeds = {**feeds_for(attention_model(Variant())), "cond": np.array(cond)}
        (want,) = _run(model, feeds)
        (got,) = _run(graphfix.with_reference_ops(result.model), feeds)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_an_initializer_a_body_reads_survives_the_main_rewrite():
    """fused_plugin drops the main chain's `denom` once its Div is gone, unless a body reads it
    (GraphEdit's unused check sees subgraph references)."""
    model = _in_if_branch(main_attention=True)
    result = graphfix.fix_attention(model, strategy="fused_plugin", select=[0])
    assert [b.rewritten for b in result.report.blocks] == [True, False]
    assert "denom" in {t.name for t in result.model.graph.initializer}
    onnx.checker.check_model(result.model, full_check=True)


def test_softmax_in_a_loop_body_that_is_not_attention_is_listed():
    body = helper.make_graph(
        [
            helper.make_node("Softmax", ["state_in"], ["probs"], name="loop_softmax", axis=-1),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_id"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 3]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], name="loop", body=body)],
        "loop_model",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    scan = graphfix.scan_attention(model)
    assert scan.matches == ()
    (skipped,) = scan.skipped
    assert skipped.softmax == "Loop 'loop'/body/loop_softmax"
    assert "not multiplied by V" in skipped.reason


def test_softmax_in_a_local_function_is_listed_with_the_fix():
    function = helper.make_function(
        "local",
        "attn",
        ["s"],
        ["p"],
        [helper.make_node("Softmax", ["s"], ["p"], axis=-1)],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [helper.make_node("attn", ["x"], ["y"], domain="local", name="call")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        functions=[function],
    )
    (skipped,) = graphfix.scan_attention(model).skipped
    assert "model-local function local::attn" in skipped.reason
    assert "inline_local_functions" in skipped.reason
