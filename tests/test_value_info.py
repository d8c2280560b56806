"""`reconcile_value_info`: declared types follow the nodes; annotations nobody can confirm go,
those of tensors made by ops inference cannot see through stay."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph.value_info import reconcile_value_info
from graphfix.plugins.spec import PLUGIN_DOMAIN

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _strictly_valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _model(nodes, inputs, outputs, *, value_info=(), initializers=(), opsets=(("", 18),)):
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info)
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _types(model: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}


def test_a_float32_annotation_on_a_tensor_now_float16_is_retyped():
    # x (float16) → Relu → r, annotated float32 as an exporter wrote it before conversion
    model = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        [helper.make_tensor_value_info("x", F16, [2, 3])],
        [helper.make_tensor_value_info("y", F16, [2, 3])],
        value_info=[helper.make_tensor_value_info("r", F32, [2, 3])],
    )
    with pytest.raises(onnx.shape_inference.InferenceError, match=r"\(10\) vs \(1\)"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    repair = reconcile_value_info(model)
    assert repair.retyped == ("r",) and repair.dropped == () and _types(model) == {"r": F16}
    _strictly_valid(model)


def test_a_contradicting_shape_takes_the_inferred_one_and_symbolic_dims_are_kept():
    model = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["x"], ["s"])],
        [helper.make_tensor_value_info("x", F32, ["batch", 3])],
        [helper.make_tensor_value_info(n, F32, ["batch", 3]) for n in ("r", "s")],
        value_info=[
            helper.make_tensor_value_info("r", F32, ["batch", 4]),  # wrong: 4 is 3
            helper.make_tensor_value_info("s", F32, ["batch", 3]),  # right: untouched
        ],
    )
    repair = reconcile_value_info(model)
    assert repair.retyped == ("r",)
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in model.graph.value_info
    }
    assert shapes == {"r": ["batch", 3], "s": ["batch", 3]}
    _strictly_valid(model)


def test_an_annotation_of_an_initializer_that_changed_type_is_dropped():
    weight = numpy_helper.from_array(np.ones(3, np.float16), "w")
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F16, [3])],
        [helper.make_tensor_value_info("y", F16, [3])],
        value_info=[helper.make_tensor_value_info("w", F32, [3])],  # dynamo annotates weights
        initializers=[weight],
    )
    assert reconcile_value_info(model).dropped == ("w",)
    assert _types(model) == {}
    _strictly_valid(model)


def test_a_graph_output_declared_float32_but_computed_in_float16_is_retyped():
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F16, [3])],
        [helper.make_tensor_value_info("y", F32, [3])],
    )
    assert reconcile_value_info(model).outputs_retyped == ("y",)
    assert model.graph.output[0].type.tensor_type.elem_type == F16
    _strictly_valid(model)


def test_a_foreign_custom_op_keeps_its_annotation_and_typing_flows_on_from_it():
    # com.vendor::Thing is opaque to inference: its output's annotation is the only type there
    # is; a stale annotation after it is retyped from that seed
    model = _model(
        [
            helper.make_node("Thing", ["x"], ["t"], domain="com.vendor"),
            helper.make_node("Cast", ["t"], ["c"], to=F16),
            helper.make_node("Neg", ["c"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F32, [3])],
        [helper.make_tensor_value_info("y", F16, [3])],
        value_info=[
            helper.make_tensor_value_info("t", F32, [3]),
            helper.make_tensor_value_info("c", F32, [3]),  # stale: the Cast makes float16
        ],
        opsets=(("", 18), ("com.vendor", 1)),
    )
    repair = reconcile_value_info(model)
    assert repair.retyped == ("c",) and repair.dropped == ()
    assert _types(model) == {"t": F32, "c": F16}
    _strictly_valid(model)


def test_an_annotation_inference_cannot_confirm_is_dropped():
    # Reshape to a shape computed at run time from a graph input: inference knows the type but
    # here the annotation names a tensor no node makes any more (left by a rewrite)
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F32, [3])],
        [helper.make_tensor_value_info("y", F32, [3])],
        value_info=[helper.make_tensor_value_info("gone", F32, [3])],
    )
    assert reconcile_value_info(model).dropped == ("gone",)
    assert _types(model) == {}


def test_graphfix_plugin_outputs_are_typed_through_their_reference_lowering():
    # a float16 GraphfixSoftmax annotated float32: the lowering (Cast, Softmax, Cast back to the
    # input's type) says float16, so the annotation is retyped, not kept as an opaque seed
    softmax = helper.make_node(
        "GraphfixSoftmax", ["x"], ["p"], domain=PLUGIN_DOMAIN, axis=-1,
        plugin_version="1", plugin_namespace="graphfix",
    )  # fmt: skip
    model = _model(
        [softmax, helper.make_node("Neg", ["p"], ["y"])],
        [helper.make_tensor_value_info("x", F16, [2, 4])],
        [helper.make_tensor_value_info("y", F16, [2, 4])],
        value_info=[helper.make_tensor_value_info("p", F32, [2, 4])],
        opsets=(("", 18), (PLUGIN_DOMAIN, 1)),
    )
    repair = reconcile_value_info(model)
    assert repair.retyped == ("p",) and _types(model) == {"p": F16}
    _strictly_valid(model)


def test_annotations_inside_a_subgraph_are_reconciled_too():
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["inner"]), helper.make_node("Neg", ["inner"], ["b"])],
        "then",
        [],
        [helper.make_tensor_value_info("b", F16, [3])],
        value_info=[helper.make_tensor_value_info("inner", F32, [3])],
    )
    model = _model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", F16, [3]),
        ],
        [helper.make_tensor_value_info("y", F16, [3])],
    )
    repair = reconcile_value_info(model)
    assert set(repair.retyped) == {"inner"}
    _strictly_valid(model)


def test_a_consistent_model_is_left_as_it_was():
    model = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        [helper.make_tensor_value_info("x", F32, [2])],
        [helper.make_tensor_value_info("y", F32, [2])],
        value_info=[helper.make_tensor_value_info("r", F32, [2])],
    )
    before = model.SerializeToString()
    assert not reconcile_value_info(model).modified
    assert model.SerializeToString() == before
