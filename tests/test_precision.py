"""`convert_precision` rules on minimal graphs, each with a positive and a negative case."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import Variant, attention_model
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import SelectionError, UsageError
from graphfix.precision.convert import convert_precision
from graphfix.precision.policy import Reason

F32, F16, BF16, I64 = (
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.INT64,
)
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17, value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _vi(name, elem=F32, shape=(2, 4)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def _casts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Cast"]


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.output})
    return types


def _chain(*ops: str) -> onnx.ModelProto:
    """x → MatMul(W) → ops... → y, each op unary (Exp, Relu, Reshape-free)."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32) * 0.3, "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t0"], name="mm")]
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=f"{op.lower()}{i}"))
    nodes.append(helper.make_node("Identity", [f"t{len(ops)}"], ["y"], name="out"))
    return _model(nodes, [_vi("x")], [_vi("y")], [w])


def test_casts_only_at_the_island_border_and_io():
    model = _chain("Relu", "Exp", "Relu")
    result = convert_precision(model)
    (island,) = result.report.islands
    assert island.nodes == ("exp1",) and island.reasons[0].reason is Reason.OP_DEFAULT
    assert (island.casts_in, island.casts_out) == (1, 1)
    # + one Cast in (x) and one out (y): float32 graph I/O kept
    assert len(_casts(result.model)) == 4
    types = _types(result.model)
    assert types["t2"] == F32 and types["t1"] == F16 and types["t3"] == F16 and types["y"] == F32
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(
        _run(result.model, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-2, atol=1e-2
    )


def test_no_island_no_cast_inside():
    result = convert_precision(_chain("Relu", "Tanh"))
    assert result.report.islands == ()
    assert len(_casts(result.model)) == 2  # graph input and output only


def test_islands_joined_by_data_movement_merge():
    model = _chain("Exp", "Identity", "Exp")
    result = convert_precision(model)
    (island,) = result.report.islands
    assert set(island.nodes) == {"exp0", "identity1", "exp2", "out"}
    assert island.casts == 1  # in from the MatMul; out is the float32 graph output itself
    separated = convert_precision(_chain("Exp", "Relu", "Tanh", "Exp"))
    assert len(separated.report.islands) == 2  # Tanh computes: no merge across it


def test_no_cast_pairs_that_cancel():
    result = convert_precision(_chain("Exp", "Relu", "Exp"))
    producers = {o: n for n in result.model.graph.node for o in n.output}
    for cast in _casts(result.model):
        assert producers.get(cast.input[0]) is None or producers[cast.input[0]].op_type != "Cast"


def test_identity_casts_from_the_export_are_dropped():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r"),
        helper.make_node("Cast", ["a"], ["b"], name="same", to=F32),
        helper.make_node("Tanh", ["b"], ["y"], name="t"),
    ]
    result = convert_precision(_model(nodes, [_vi("x")], [_vi("y")]))
    assert "same" not in {n.name for n in result.model.graph.node}


def _shared_weight_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4) / 3, "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="low_mm"),
        helper.make_node("MatMul", ["x", "W"], ["b"], name="kept_mm"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    return _model(nodes, [_vi("x")], [_vi("y")], [w])


def test_shared_initializer_is_duplicated_not_corrupted():
    model = _shared_weight_model()
    original = numpy_helper.to_array(model.graph.initializer[0]).copy()
    result = convert_precision(model, keep=["kept_mm"])
    inits = {t.name: t for t in result.model.graph.initializer}
    assert set(inits) == {"W", "W_float16"}
    np.testing.assert_array_equal(numpy_helper.to_array(inits["W"]), original)
    assert inits["W_float16"].data_type == F16
    np.testing.assert_array_equal(
        numpy_helper.to_array(inits["W_float16"]), original.astype(np.float16)
    )
    assert result.report.initializers_duplicated == 1
    mm = {n.name: n for n in result.model.graph.node}
    assert mm["low_mm"].input[1] == "W_float16" and mm["kept_mm"].input[1] == "W"
    # without the keep: converted once, in place, no copy
    plain = convert_precision(model)
    assert [t.name for t in plain.model.graph.initializer] == ["W"]
    assert plain.model.graph.initializer[0].data_type == F16


def test_caller_model_is_not_mutated():
    model = _shared_weight_model()
    before = model.SerializeToString()
    convert_precision(model, keep=["kept_mm"])
    assert model.SerializeToString() == before


def _bias_model(values: np.ndarray) -> onnx.ModelProto:
    bias = numpy_helper.from_array(values.astype(np.float32), "B")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Add", ["a", "B"], ["b"], name="add_bias"),
        helper.make_node("Tanh", ["b"], ["y"], name="tanh"),
    ]
    return _model(nodes, [_vi("x")], [_vi("y")], [bias])


def test_out_of_range_initializer_keeps_its_consumer_float32_unclamped():
    values = np.array([1.0, -1e6, 2.0, 70000.0], np.float32)
    result = convert_precision(_bias_model(values))
    (item,) = result.report.out_of_range
    assert item.tensor == "B" and item.max_abs == 1e6 and item.consumers == ("add_bias",)
    (island,) = result.report.islands
    assert island.nodes == ("add_bias",) and island.reasons[0].reason is Reason.OUT_OF_RANGE
    bias = next(t for t in result.model.graph.initializer if t.name == "B")
    assert bias.data_type == F32
    np.testing.assert_array_equal(numpy_helper.to_array(bias), values)
    # what the float32 Add computes from it is clipped to ±65504 where it is cast down
    assert result.report.saturated == ("b",)
    x = np.zeros((2, 4), np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], np.tanh(values + x), atol=1e-3)
    # bfloat16 holds 1e6: nothing to keep
    assert convert_precision(_bias_model(values), to="bfloat16").report.out_of_range == ()


def test_in_range_initializer_is_converted():
    result = convert_precision(_bias_model(np.array([1.0, -60000.0, np.inf, 0.5])))
    assert result.report.out_of_range == () and result.report.islands == ()
    assert result.model.graph.initializer[0].data_type == F16


def test_out_of_range_constant_node():
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="big",
            value=numpy_helper.from_array(np.array(-3.4e38, np.float32)),
        ),
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Max", ["a", "c"], ["y"], name="max"),
    ]
    result = convert_precision(_model(nodes, [_vi("x")], [_vi("y")]))
    assert [o.tensor for o in result.report.out_of_range] == ["c"]
    node = {n.name: n for n in result.model.graph.node}
    assert node["big"].attribute[0].t.data_type == F32


def test_typed_attributes_and_dtype_ops_follow_the_node():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node(
            "ConstantOfShape",
            ["s"],
            ["ones"],
            name="cos",
            value=numpy_helper.from_array(np.array([1.5], np.float32)),
        ),
        helper.make_node("Cast", ["s"], ["sf"], name="cast_shape", to=F32),
        helper.make_node("RandomNormalLike", ["x"], ["noise"], name="noise", dtype=F32, scale=1e-6),
        helper.make_node("EyeLike", ["sq"], ["eye"], name="eye", dtype=F32),
        helper.make_node("Constant", [], ["k"], name="k", value_float=2.0),
        helper.make_node("Mul", ["x", "ones"], ["a"], name="m1"),
        helper.make_node("Add", ["a", "noise"], ["b"], name="a1"),
        helper.make_node("Mul", ["b", "k"], ["c"], name="m2"),
        helper.make_node("ReduceMax", ["sf"], ["smax"], name="rmax", keepdims=0),
        helper.make_node("Add", ["c", "smax"], ["d"], name="a2"),
        helper.make_node("MatMul", ["eye", "d"], ["y"], name="mm"),
    ]
    sq = helper.make_tensor_value_info("sq", I64, [2, 2])
    model = _model(nodes, [_vi("x"), sq], [_vi("y")])
    result = convert_precision(model)
    node = {n.name: n for n in result.model.graph.node}
    attr = {n: {a.name: a for a in node[n].attribute} for n in node}
    assert attr["cos"]["value"].t.data_type == F16
    assert attr["cast_shape"]["to"].i == F16
    assert attr["noise"]["dtype"].i == F16
    assert attr["eye"]["dtype"].i == F32  # no float16 EyeLike in onnxruntime: kept
    assert attr["k"]["value"].t.data_type == F16 and "value_float" not in attr["k"]
    onnx.checker.check_model(result.model, full_check=True)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    feed = {"x": x, "sq": np.zeros((2, 2), np.int64)}
    np.testing.assert_allclose(
        _run(result.model, feed)[0], _run(model, feed)[0], rtol=1e-2, atol=1e-2
    )


def test_integer_and_bool_tensors_are_untouched():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Greater", ["x", "zero"], ["pos"], name="gt"),
        helper.make_node("Where", ["pos", "x", "zero"], ["r"], name="where"),
        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape"),
    ]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    result = convert_precision(_model(nodes, [_vi("x")], [_vi("y")], [zero]))
    types = _types(result.model)
    assert types["s"] == I64 and types["pos"] == TensorProto.BOOL


@pytest.mark.parametrize("keep_io", [True, False])
def test_graph_io_types(keep_io):
    result = convert_precision(_chain("Relu"), keep_io_types=keep_io)
    expected = F32 if keep_io else F16
    assert result.model.graph.input[0].type.tensor_type.elem_type == expected
    assert result.model.graph.output[0].type.tensor_type.elem_type == expected
    assert result.model.graph.output[0].name == "y"
    assert len(_casts(result.model)) == (2 if keep_io else 0)
    x = RNG.standard_normal((2, 4)).astype(np.float32 if keep_io else np.float16)
    assert _run(result.model, {"x": x})[0].dtype == (np.float32 if keep_io else np.float16)


def test_value_info_is_retyped():
    model = _chain("Relu", "Exp")
    assert any(v.name == "t1" for v in model.graph.value_info)
    result = convert_precision(model)
    info = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.value_info}
    assert info["t1"] == F16 and info["t2"] == F32


def _if_model() -> onnx.ModelProto:
    then_graph = helper.make_graph(
        [helper.make_node("Exp", ["a"], ["out_then"], name="inner_exp")],
        "then",
        [],
        [_vi("out_then")],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["out_else"], name="inner_neg")],
        "else",
        [],
        [_vi("out_else")],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node(
            "If", ["cond"], ["y0"], name="branch", then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Tanh", ["y0"], ["y"], name="tanh"),
    ]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    return _model(nodes, [_vi("x"), cond], [_vi("y")])


def test_subgraphs_run_float32_and_read_outer_tensors_through_casts():
    model = _if_model()
    result = convert_precision(model)
    (island,) = result.report.islands
    assert island.nodes == ("branch",) and island.reasons[0].reason is Reason.CONTROL_FLOW
    branch = next(n for n in result.model.graph.node if n.op_type == "If")
    then_graph = next(a.g for a in branch.attribute if a.name == "then_branch")
    assert then_graph.node[0].input[0] == "a_to_float32"
    onnx.checker.check_model(result.model, full_check=True)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    for cond in (True, False):
        feed = {"x": x, "cond": np.array(cond)}
        np.testing.assert_allclose(
            _run(result.model, feed)[0], _run(model, feed)[0], rtol=1e-2, atol=1e-2
        )


def test_keep_selectors():
    model = _chain("Relu", "Tanh", "Sigmoid")
    by_name = convert_precision(model, keep=["tanh1"]).report.islands
    assert [i.nodes for i in by_name] == [("tanh1",)]
    assert by_name[0].reasons[0].reason is Reason.KEEP
    by_op = convert_precision(model, keep=["op:Sigmoid"]).report.islands
    assert [i.nodes for i in by_op] == [("sigmoid2", "out")]  # Identity to a float32 output
    by_regex = convert_precision(model, keep=["re:^(tanh|sigmoid)"]).report.islands
    assert [i.nodes for i in by_regex] == [("tanh1", "sigmoid2", "out")]
    with pytest.raises(SelectionError, match="op types are"):
        convert_precision(model, keep=["op:Softmax"])


def test_bad_target_type():
    with pytest.raises(UsageError, match="float16, bfloat16"):
        convert_precision(_chain("Relu"), to="float8")


def _attention_types(result, model) -> dict[str, int]:
    from graphfix.attention.matcher import find_attention

    (match,) = find_attention(model)
    types = _types(result.model)
    node = {n.name: n for n in result.model.graph.node}
    return {name: types.get(node[name].output[0]) for name in match.chain_nodes}


def test_attention_chain_kept_whole():
    model = attention_model(Variant(scale="div_after", mask="add"))
    result = convert_precision(model, keep=["op:Softmax"])
    chain = _attention_types(result, model)
    assert set(chain.values()) == {F32}
    assert result.report.attention_blocks_float32 == (0,)
    (island,) = result.report.islands
    assert {r.reason for r in island.reasons} >= {Reason.KEEP, Reason.ATTENTION}
    # no Cast between two chain nodes
    producers = {o: n.name for n in result.model.graph.node for o in n.output}
    for cast in _casts(result.model):
        consumers = [n.name for n in result.model.graph.node if cast.output[0] in n.input]
        assert not (producers.get(cast.input[0]) in chain and set(consumers) & set(chain))


def test_attention_chain_low_when_nothing_keeps_it():
    model = attention_model(Variant(scale="div_after", mask="add"))
    result = convert_precision(model)
    assert set(_attention_types(result, model).values()) == {F16}
    assert result.report.attention_blocks_float32 == ()


def test_kept_attention_block_rewritten_with_a_strategy():
    from graphfix.plugins.reference import with_reference_ops

    model = attention_model(Variant(scale="div_after", mask="add"))
    result = convert_precision(model, keep=["attention:0"], attention_strategy="plugin")
    assert result.report.attention_blocks_rewritten == (0,)
    assert result.report.attention_blocks_float32 == ()
    plugin = next(n for n in result.model.graph.node if n.op_type == "GraphfixSoftmax")
    inferred = onnx.shape_inference.infer_shapes(result.model)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    assert types[plugin.input[0]] == F16
    feed = {
        i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }
    got = _run(with_reference_ops(result.model), feed)[0]
    np.testing.assert_allclose(got, _run(model, feed)[0], rtol=2e-2, atol=2e-2)


def _layer_norm_model(rms: bool) -> onnx.ModelProto:
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm")]
    centred = "h"
    if not rms:
        nodes += [
            helper.make_node("ReduceMean", ["h"], ["mean"], name="mean", axes=[-1]),
            helper.make_node("Sub", ["h", "mean"], ["hc"], name="centre"),
        ]
        centred = "hc"
    nodes += [
        helper.make_node("Pow", [centred, "two"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="variance", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
        helper.make_node("Div", [centred, "std"], ["y"], name="normalise"),
    ]
    w = numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32) * 30, "W")
    return _model(nodes, [_vi("x")], [_vi("y")], [w, eps, two])


@pytest.mark.parametrize("rms", [False, True])
def test_decomposed_norm_statistics_are_a_float32_island(rms):
    model = _layer_norm_model(rms)
    result = convert_precision(model, fuse_norms=False)
    (island,) = result.report.islands
    expected = {"square", "variance", "add_eps", "sqrt"} | (set() if rms else {"mean", "centre"})
    assert set(island.nodes) == expected
    assert {r.reason for r in island.reasons} <= {Reason.NORM, Reason.OP_DEFAULT}
    # values whose squares overflow float16 (|h| ~ 100s) still normalise correctly
    x = RNG.standard_normal((2, 4)).astype(np.float32) * 10
    np.testing.assert_allclose(
        _run(result.model, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-2, atol=1e-2
    )


def test_mean_that_is_not_a_variance_is_not_a_norm():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("ReduceMean", ["a"], ["y"], name="pool", axes=[-1]),
    ]
    result = convert_precision(_model(nodes, [_vi("x")], [_vi("y", shape=(2, 1))]))
    assert result.report.islands == ()


def test_rotary_angle_is_computed_in_float32():
    freq = numpy_helper.from_array(np.linspace(0.01, 1, 4, dtype=np.float32), "freq")
    nodes = [
        helper.make_node("Cast", ["pos"], ["posf"], name="pos_float", to=F32),
        helper.make_node("Mul", ["posf", "freq"], ["angle"], name="angle"),
        helper.make_node("Sin", ["angle"], ["s"], name="sin"),
        helper.make_node("Mul", ["x", "s"], ["y"], name="apply"),
    ]
    pos = helper.make_tensor_value_info("pos", I64, [2, 4])
    model = _model(nodes, [_vi("x"), pos], [_vi("y")], [freq])
    result = convert_precision(model)
    (island,) = result.report.islands
    assert set(island.nodes) == {"pos_float", "angle", "sin"}
    assert {r.reason for r in island.reasons} >= {Reason.ANGLE, Reason.OP_DEFAULT}
    feed = {"x": np.ones((2, 4), np.float32), "pos": np.full((2, 4), 3000, np.int64)}
    np.testing.assert_allclose(_run(result.model, feed)[0], _run(model, feed)[0], atol=2e-3)


def test_sin_of_activations_does_not_pull_the_network_into_float32():
    result = convert_precision(_chain("Relu", "Sin"))
    (island,) = result.report.islands
    assert island.nodes == ("sin1", "out")  # the Identity to the float32 output joins it


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bfloat16_structure_and_rounding():
    pytest.importorskip("torch")
    values = np.array([1.0, 1 / 3, -2.5e-3, 3.0e38, np.nan, 1.00390625, 1.01171875], np.float32)
    model = _bias_model(values[:4])
    result = convert_precision(model, to="bfloat16")
    (bias,) = result.model.graph.initializer
    assert bias.data_type == BF16
    got = np.frombuffer(bias.raw_data, dtype="<u2")
    np.testing.assert_array_equal(got, _bf16_bits(values[:4]))
    from graphfix.precision.weights import to_target_bytes

    rounded = np.frombuffer(to_target_bytes(values, "bfloat16"), dtype="<u2")
    expected = _bf16_bits(values)
    assert np.isnan(values[4]) and rounded[4] == 0x7FC0
    np.testing.assert_array_equal(np.delete(rounded, 4), np.delete(expected, 4))
    casts = {a.i for n in _casts(result.model) for a in n.attribute}
    assert casts == {BF16, F32}
    types = _types(result.model)
    assert types["a"] == BF16 and types["y"] == F32


def _torch_eval():
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "torch_onnx_eval.py"
    spec = importlib.util.spec_from_file_location("torch_onnx_eval", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _node_types(model: onnx.ModelProto) -> dict[str, int]:
    """Node name → the element type of its first output."""
    types = _types(model)
    return {n.name: types.get(n.output[0]) for n in model.graph.node if n.name}


@pytest.mark.parametrize("inverse", ["div", "reciprocal", "div_one", "pow_half"])
@pytest.mark.parametrize("gemma", [False, True])
def test_unfused_rmsnorm_keeps_only_its_statistics_float32(inverse, gemma):
    """Below opset 23 an RMSNorm stays decomposed: x², its mean, + ε and the root run in float32
    (x² overflows float16 from |x| = 256), x / rms (LLaMA, T5's x · (1 / rms), the exporters'
    Reciprocal and Pow −0.5 forms) and the scale (Gemma's 1 + w) in float16."""
    from norm_graphs import NormGraph

    from graphfix.precision.census import precision_census

    model = NormGraph(kind="rms", opset=18, inverse=inverse, gemma=gemma).build()
    result = convert_precision(model)
    root = "n_inv" if inverse == "pow_half" else "n_root"
    (island,) = result.report.islands
    assert set(island.nodes) == {"n_sq", "n_var", "n_with_eps", root}
    (why,) = island.reasons
    assert why.reason is Reason.NORM and "RMSNormalization needs opset 23" in why.detail
    assert (island.casts_in, island.casts_out) == (0, 1)  # x is a float32 input: no Cast up
    types = _node_types(result.model)
    low = {"n_normed", "n_scaled"} | ({"n_inv"} if inverse in ("reciprocal", "div_one") else set())
    assert {types[n] for n in low} == {F16}
    assert {types[n] for n in island.nodes} == {F32}
    # the census counts the island's four nodes float32, the normalisation and scale float16
    census = precision_census(result.model)
    assert census.float32 == 4 and census.compute == 4 + len(low) + gemma
    # |x| ~ 400: x² (1.6e5) overflows float16; rms does not
    x = (400 * RNG.standard_normal((2, 3, 8))).astype(np.float32)
    expected = _run(model, {"x": x})[0]
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], expected, rtol=1e-2, atol=1e-2)
    (got,) = _torch_eval().run_model(result.model, {"x": x}, "cpu")
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)


def test_rmsnorm_fused_at_opset_23_has_no_float32_node():
    """Asked for opset 23, the same norm is one RMSNormalization (statistics in float32 inside,
    stash_type) that runs in float16; the torch interpreter's RMSNormalization matches
    onnxruntime's on the float32 model first."""
    from norm_graphs import NormGraph

    from graphfix.precision.census import precision_census
    from graphfix.precision.norms import fuse_norms

    model = NormGraph(kind="rms", opset=18, inverse="reciprocal").build()
    fused = fuse_norms(model, opset=23).model
    assert [n.op_type for n in fused.graph.node] == ["RMSNormalization"]
    x = (400 * RNG.standard_normal((2, 3, 8))).astype(np.float32)
    expected = _run(model, {"x": x})[0]
    evaluator = _torch_eval()
    np.testing.assert_allclose(evaluator.run_model(fused, {"x": x}, "cpu")[0], expected, rtol=1e-5)
    result = convert_precision(fused)
    assert result.report.islands == ()
    assert precision_census(result.model).float32 == 0
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], expected, rtol=1e-2, atol=1e-2)
    (got,) = evaluator.run_model(result.model, {"x": x}, "cpu")
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)


def test_opset_option_fuses_rmsnorm_at_23_in_one_call():
    """`convert_precision(opset=23)` (CLI `--opset 23`) raises the opset for norm fusion: the
    RMSNorm becomes one float16 RMSNormalization instead of a float32 island."""
    from norm_graphs import NormGraph

    model = NormGraph(kind="rms", opset=18, inverse="div").build()
    result = convert_precision(model, opset=23)
    assert [n.op_type for n in result.model.graph.node if n.op_type != "Cast"] == [
        "RMSNormalization"
    ]
    assert {o.version for o in result.model.opset_import if o.domain in ("", "ai.onnx")} == {23}
    assert result.report.islands == () and "opset 18 → 23" in result.report.summary()
    x = (400 * RNG.standard_normal((2, 3, 8))).astype(np.float32)
    expected = _run(model, {"x": x})[0]
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], expected, rtol=1e-2, atol=1e-2)
    default = convert_precision(model)  # without it: the model's opset, a float32 island
    assert len(default.report.islands) == 1


def test_opset_option_needs_norm_fusion_and_never_lowers():
    from norm_graphs import NormGraph

    model = NormGraph(kind="rms", opset=18, inverse="div").build()
    with pytest.raises(UsageError, match="norm fusion is off"):
        convert_precision(model, opset=23, fuse_norms=False)
    with pytest.raises(UsageError, match="below the model's opset 18"):
        convert_precision(model, opset=17)


def test_an_opset_onnx_does_not_know_is_a_usage_error(tmp_path, capsys):
    """`--opset 99` once left the model at its opset with a note; it is the user's error (exit
    2, one line naming the opsets allowed)."""
    from norm_graphs import NormGraph

    from graphfix.cli import main

    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(UsageError, match=f"up to {newest}.*from the model's 18 to {newest}"):
        convert_precision(NormGraph(kind="rms", opset=18, inverse="div").build(), opset=99)
    path = tmp_path / "rms.onnx"
    onnx.save(NormGraph(kind="rms", opset=18, inverse="div").build(), path)
    code = main(["precision", str(path), "-o", str(tmp_path / "out.onnx"), "--opset", "99"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("graphfix: error: opset 99") and err.count("\n") == 1
    assert not (tmp_path / "out.onnx").exists()


def test_unfused_rmsnorm_input_is_cast_up_once_at_the_island():
    from norm_graphs import NormGraph

    graph = NormGraph(kind="rms", opset=17, inverse="reciprocal")
    model = graph.build()
    # make x an activation (float16 after conversion) rather than the float32 graph input
    model.graph.node.insert(0, helper.make_node("Relu", ["x"], ["x_act"], name="act"))
    for node in model.graph.node[1:]:
        node.input[:] = ["x_act" if i == "x" else i for i in node.input]
    result = convert_precision(model)
    (island,) = result.report.islands
    assert (island.casts_in, island.casts_out) == (1, 1)
    ups = [c for c in _casts(result.model) if c.attribute[0].i == F32]
    assert [c.input[0] for c in ups] == ["x_act", "scaled_float16"]  # the island, the output
    square = next(n for n in result.model.graph.node if n.name == "n_sq")
    assert square.input[0] == ups[0].output[0]


def test_unfused_rmsnorm_with_a_tiny_epsilon_normalises_in_float32():
    """ε = 1e-12: rms of a zero row is 1e-6, subnormal in float16 (1/rms overflows), so the
    normalisation stays in the float32 island; bfloat16 holds it."""
    from norm_graphs import NormGraph

    model = NormGraph(kind="rms", opset=18, inverse="reciprocal", epsilon=1e-12).build()
    (island,) = convert_precision(model).report.islands
    assert set(island.nodes) == {"n_sq", "n_var", "n_with_eps", "n_root", "n_inv", "n_normed"}
    assert "ε = 1e-12 too small to normalise in float16" in island.reasons[0].detail
    (island,) = convert_precision(model, to="bfloat16").report.islands
    assert set(island.nodes) == {"n_sq", "n_var", "n_with_eps", "n_root"}


def test_unfused_layernorm_keeps_its_statistics_up_to_the_normalisation():
    """LayerNorm that cannot fuse (mean − x, not x − mean) keeps the whole statistics float32:
    the small RMSNorm island is for RMSNorm only."""
    from norm_graphs import NormGraph

    model = NormGraph(kind="layer", opset=17, sub_reversed=True).build()
    result = convert_precision(model)
    (island,) = result.report.islands
    assert {"n_mean", "n_centred", "n_sq", "n_var", "n_with_eps", "n_root", "n_normed"} <= set(
        island.nodes
    )


def test_a_model_already_in_float16_is_refused():
    half = convert_precision(_chain("Relu"), keep_io_types=False).model
    with pytest.raises(UsageError, match="already in float16"):
        convert_precision(half)


LOWEST = np.finfo(np.float32).min


def _masked_attention(bias: np.ndarray, *, through_where: bool = False) -> onnx.ModelProto:
    """The test attention graph with scores + `bias` (a [S, S] initializer), or, with
    `through_where`, + Where(bias != 0, lowest, 0) built from a scalar fill outside the chain."""
    model = attention_model(Variant(scale="div_after", mask="causal_const"))
    graph = model.graph
    (init,) = [t for t in graph.initializer if t.name == "causal_bias"]
    if not through_where:
        init.CopyFrom(numpy_helper.from_array(bias.astype(np.float32), "causal_bias"))
        return model
    graph.initializer.remove(init)
    graph.initializer.extend([
        numpy_helper.from_array(bias != 0, "blocked"),
        numpy_helper.from_array(np.array(LOWEST, np.float32), "fill"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ])  # fmt: skip
    graph.node.insert(
        0, helper.make_node("Where", ["blocked", "fill", "zero"], ["causal_bias"], name="fill_mask")
    )
    return model


def _attention_feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32)}


def _agrees_in_both(result, model) -> None:
    feed = _attention_feed(model)
    expected = _run(model, feed)[0]
    np.testing.assert_allclose(_run(result.model, feed)[0], expected, rtol=1e-2, atol=1e-2)
    (got,) = _torch_eval().run_model(result.model, feed, "cpu")
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)


def _causal(s: int = 5) -> np.ndarray:
    return np.triu(np.full((s, s), LOWEST, np.float32), k=1)


def test_mask_fill_in_an_attention_chain_is_lowered_and_reported():
    from graphfix.precision.mask_fill import MaskFill

    values = _causal()
    values[0, 4] = -np.inf  # lowered too, as the saturating Clip does
    model = _masked_attention(values)
    result = convert_precision(model)
    assert result.report.mask_fills == (
        MaskFill("causal_bias", float(LOWEST), -65504.0, (0,), ("mask_add",)),
    )
    assert result.report.out_of_range == () and result.report.attention_blocks_float32 == ()
    assert result.report.islands == () and result.report.saturated == ()
    assert set(_attention_types(result, model).values()) == {F16}
    (bias,) = [t for t in result.model.graph.initializer if t.name == "causal_bias"]
    assert bias.data_type == F16
    np.testing.assert_array_equal(numpy_helper.to_array(bias), np.maximum(_causal(), -65504))
    assert "mask fill lowered: causal_bias (-3.403e+38 → -65504)" in result.report.summary()
    _agrees_in_both(result, model)
    # bfloat16's lowest is -3.39e38: float32's lowest is beyond it too
    (fill,) = convert_precision(model, to="bfloat16").report.mask_fills
    assert fill.lowered_to == -3.3895313892515355e38
    # the caller's model still holds float32's lowest
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[-1]), values)


def test_mask_fill_made_outside_the_chain_is_lowered_not_saturated():
    model = _masked_attention(_causal(), through_where=True)
    result = convert_precision(model)
    (fill,) = result.report.mask_fills
    assert (fill.tensor, fill.readers) == ("fill", ("mask_add",))
    assert result.report.saturated == () and result.report.islands == ()
    assert not [n for n in result.model.graph.node if n.op_type == "Clip"]
    _agrees_in_both(result, model)


def test_mask_constant_outside_attention_is_reported_and_kept_float32():
    """The issue's rule stands for every constant that is not an attention mask's fill."""
    values = np.array([0.0, LOWEST, 0.0, 0.0], np.float32)
    result = convert_precision(_bias_model(values))
    assert result.report.mask_fills == ()
    (item,) = result.report.out_of_range
    assert item.tensor == "B" and item.consumers == ("add_bias",)
    bias = next(t for t in result.model.graph.initializer if t.name == "B")
    assert bias.data_type == F32
    np.testing.assert_array_equal(numpy_helper.to_array(bias), values)


@pytest.mark.parametrize(
    "case", ["row_masked_whole", "also_read_elsewhere", "positive_beyond_range", "chain_kept"]
)
def test_mask_constant_that_does_not_qualify_keeps_the_chain_float32(case):
    bias = _causal()
    keep = None
    if case == "row_masked_whole":
        bias = np.triu(np.full((5, 5), LOWEST, np.float32), k=0)  # row 0 masks every key
    elif case == "positive_beyond_range":
        bias[0, 0] = 1e6
    elif case == "chain_kept":
        keep = ["op:Softmax"]
    model = _masked_attention(bias)
    if case == "also_read_elsewhere":
        model.graph.node.append(helper.make_node("Neg", ["causal_bias"], ["neg_bias"], name="neg"))
        model.graph.output.append(helper.make_tensor_value_info("neg_bias", F32, [5, 5]))
    result = convert_precision(model, keep=keep)
    assert result.report.mask_fills == ()
    assert [o.tensor for o in result.report.out_of_range] == ["causal_bias"]
    assert result.report.attention_blocks_float32 == (0,)
    (bias_init,) = [t for t in result.model.graph.initializer if t.name == "causal_bias"]
    np.testing.assert_array_equal(numpy_helper.to_array(bias_init), bias)
    feed = _attention_feed(model)
    np.testing.assert_allclose(
        _run(result.model, feed)[0], _run(model, feed)[0], rtol=1e-2, atol=1e-2
    )


def test_constant_of_shape_without_a_value_makes_zeros_of_the_target_type():
    # torch.zeros / new_zeros in a dynamo export: ConstantOfShape with no `value` (float32 zeros)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros"),
        helper.make_node("Add", ["x", "z"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "w"], ["y"], name="matmul"),
    ]
    weight = numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32), "w")
    model = _model(nodes, [_vi("x")], [_vi("y")], [weight])
    result = convert_precision(model)
    (zeros,) = [n for n in result.model.graph.node if n.op_type == "ConstantOfShape"]
    (value,) = [a.t for a in zeros.attribute if a.name == "value"]
    assert value.data_type == F16 and numpy_helper.to_array(value).tolist() == [0]
    onnx.checker.check_model(result.model, full_check=True)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], _run(model, {"x": x})[0], atol=1e-2)


@pytest.mark.parametrize("opset", [14, 16])
def test_bfloat16_keeps_an_op_float32_where_its_schema_has_no_bfloat16(opset: int):
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["positive"], name="greater"),
        helper.make_node("Where", ["positive", "x", "zero"], ["relu"], name="where"),
        helper.make_node("MatMul", ["relu", "w"], ["y"], name="matmul"),
    ]
    inits = [
        numpy_helper.from_array(np.zeros((), np.float32), "zero"),
        numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32), "w"),
    ]
    model = _model(nodes, [_vi("x")], [_vi("y")], inits, opset=opset)
    result = convert_precision(model, to="bfloat16")
    typed = [r for i in result.report.islands for r in i.reasons if r.reason is Reason.TYPE]
    if opset == 14:  # Where takes bfloat16 from opset 16
        assert [(r.nodes, r.detail) for r in typed] == [
            (("where",), "Where has no bfloat16 at opset 14 (ONNX accepts it from opset 16)")
        ]
    else:
        assert typed == []
    onnx.checker.check_model(result.model, full_check=True)
    onnx.shape_inference.infer_shapes(result.model, strict_mode=True)
