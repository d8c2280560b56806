"""fuse_norms on minimal graphs: every exporter variant fuses and computes what it did; every
near-miss is left alone with its reason (tests/norm_graphs.py builds the graphs)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from norm_graphs import F16, F32, NormGraph, group_norm_graph, run, seeded_feed
from onnx import helper, numpy_helper

import graphfix
from graphfix.errors import UsageError
from graphfix.precision.norm_types import NormKind

# |fused - original| ≤ atol + rtol·|original|: float32 rounding, or float16's for float16 outputs.
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (4e-3, 4e-3)}


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    feed = seeded_feed(original)
    for got, want in zip(run(fused, feed), run(original, feed), strict=True):
        atol, rtol = TOLERANCE[want.dtype.type]
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol
        )


def _fused_one(
    model: onnx.ModelProto, op_type: str, *, opset: int | None = None
) -> graphfix.NormFusionResult:
    result = graphfix.fuse_norms(model, opset=opset)
    assert len(result.report.fused) == 1, result.report.summary()
    assert result.report.fused[0].op_type == op_type
    assert _ops(result.model)[op_type] == 1
    onnx.checker.check_model(result.model)
    _assert_same_outputs(model, result.model)
    return result


# --- LayerNorm -------------------------------------------------------------------------------

LAYER_NORM_VARIANTS = {
    "opset17-pow-div": NormGraph(),
    "opset18-axes-input": NormGraph(opset=18),
    "mul-square": NormGraph(square="mul"),
    "reciprocal": NormGraph(inverse="reciprocal"),
    "div-one": NormGraph(inverse="div_one"),
    "pow-minus-half": NormGraph(inverse="pow_half"),
    "no-scale-no-bias": NormGraph(scale=False, bias=False),
    "scale-only": NormGraph(bias=False),
    "two-axes": NormGraph(axes=(-2, -1), scale_shape=(3, 8), bias=False),
    "positive-axes": NormGraph(axes=(2,)),
    "scale-with-leading-ones": NormGraph(scale_shape=(1, 1, 8)),
    "scalar-scale": NormGraph(scale_shape=()),
    "identity-casts-float32": NormGraph(casts="input"),
    "float16-cast-to-float32": NormGraph(dtype=F16, casts="input"),
    "float16-torch-legacy": NormGraph(dtype=F16, casts="legacy"),
    "float16-no-casts": NormGraph(dtype=F16),
}


@pytest.mark.parametrize("graph", LAYER_NORM_VARIANTS.values(), ids=LAYER_NORM_VARIANTS.keys())
def test_layer_norm_variants_fuse_and_compute_the_same(graph: NormGraph) -> None:
    model = graph.build()
    result = _fused_one(model, "LayerNormalization")
    fused = result.report.fused[0]
    node = next(n for n in result.model.graph.node if n.op_type == "LayerNormalization")
    assert fused.kind is NormKind.LAYER_NORM and fused.node == node.name
    assert list(node.output) == [model.graph.output[0].name]
    assert node.input[0] == "x"  # the Casts around a float32 computation are absorbed
    assert _ops(result.model).keys() == {"LayerNormalization"}  # Casts and constants gone
    assert len(node.input) == (3 if graph.bias else 2)
    assert {n.name for n in model.graph.node} >= set(fused.replaced)


def test_float16_layer_norm_notes_the_float32_computation() -> None:
    report = graphfix.fuse_norms(NormGraph(dtype=F16).build()).report
    assert report.fused[0].notes == ("computes in float32 (was float16)",)
    report = graphfix.fuse_norms(NormGraph(dtype=F16, casts="input").build()).report
    assert report.fused[0].notes == ()


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_bfloat16_casts_are_absorbed(kind: str) -> None:
    """Checked structurally: onnxruntime's CPU provider has no bfloat16 LayerNormalization."""
    model = NormGraph(kind=kind, opset=23, dtype=onnx.TensorProto.BFLOAT16, casts="input").build()
    result = graphfix.fuse_norms(model)
    (node,) = result.model.graph.node
    assert node.op_type == ("LayerNormalization" if kind == "layer" else "RMSNormalization")
    assert node.input[0] == "x" and node.output[0] == model.graph.output[0].name
    scale = next(t for t in result.model.graph.initializer if t.name == node.input[1])
    assert scale.data_type == onnx.TensorProto.BFLOAT16
    onnx.checker.check_model(result.model)
    inferred = onnx.shape_inference.infer_shapes(result.model, strict_mode=True)
    assert inferred.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


def test_opset14_layer_norm_upgrades_to_17() -> None:
    model = NormGraph(opset=14).build()
    result = _fused_one(model, "LayerNormalization")
    assert (result.report.opset_before, result.report.opset_after) == (14, 17)
    assert "raised to 17" in result.report.opset_note
    assert model.opset_import[0].version == 14  # the caller's model is not mutated


def test_opset_upgrade_refused_when_an_op_changes_meaning() -> None:
    """RoiAlign-16 adds coordinate_transformation_mode with a new default: not safe to bump."""
    model = NormGraph(opset=14).build()
    roi = helper.make_node("RoiAlign", ["x4", "rois", "idx"], ["pooled"], name="roi")
    model.graph.node.append(roi)
    model.graph.input.extend(
        [
            helper.make_tensor_value_info("x4", F32, [1, 2, 4, 4]),
            helper.make_tensor_value_info("rois", F32, [1, 4]),
            helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, [1]),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("pooled", F32, [None] * 4))
    result = graphfix.fuse_norms(model)
    assert result.report.fused == ()
    assert result.report.opset_after == 14
    (kept,) = result.report.unfused
    assert "needs opset 17" in kept.reason and "RoiAlign" in kept.reason
    assert result.model.SerializeToString() != b""  # nothing fused, model intact
    assert _ops(result.model) == _ops(model)


def test_reduce_axes_move_to_an_input_when_crossing_opset_18() -> None:
    model = NormGraph(kind="rms", opset=17, casts="input").build()
    result = _fused_one(model, "RMSNormalization", opset=23)
    assert (result.report.opset_before, result.report.opset_after) == (17, 23)


def test_reduce_axes_rewrite_keeps_other_reductions_equal() -> None:
    """A ReduceMean that is not a norm (mean pooling) keeps its meaning across the upgrade."""
    model = NormGraph(kind="rms").build()
    pool = helper.make_node("ReduceMean", ["x"], ["pooled"], name="pool", axes=[1], keepdims=0)
    model.graph.node.append(pool)
    model.graph.output.append(helper.make_tensor_value_info("pooled", F32, [None, None]))
    result = graphfix.fuse_norms(model, opset=23)
    assert _ops(result.model)["ReduceMean"] == 1
    pool_after = next(n for n in result.model.graph.node if n.name == "pool")
    assert len(pool_after.input) == 2 and not [a for a in pool_after.attribute if a.name == "axes"]
    _assert_same_outputs(model, result.model)


def test_opset_below_the_models_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="never lowers"):
        graphfix.fuse_norms(NormGraph(opset=18).build(), opset=17)


# --- RMSNorm ---------------------------------------------------------------------------------

RMS_NORM_VARIANTS = {
    "pow-reciprocal": NormGraph(kind="rms", inverse="reciprocal"),
    "mul-div": NormGraph(kind="rms", square="mul"),
    "div-one": NormGraph(kind="rms", inverse="div_one"),
    "no-weight": NormGraph(kind="rms", scale=False),
    "llama-float16-casts": NormGraph(kind="rms", dtype=F16, casts="input", inverse="reciprocal"),
    "identity-casts": NormGraph(kind="rms", casts="input", inverse="div_one"),
    "gemma-one-plus-weight": NormGraph(kind="rms", gemma=True, inverse="reciprocal"),
}


@pytest.mark.parametrize("graph", RMS_NORM_VARIANTS.values(), ids=RMS_NORM_VARIANTS.keys())
def test_rms_norm_variants_fuse_at_opset_23(graph: NormGraph) -> None:
    graph.opset = 23
    model = graph.build()
    result = _fused_one(model, "RMSNormalization")
    assert result.report.fused[0].kind is NormKind.RMS_NORM
    assert _ops(result.model).keys() == {"RMSNormalization"}  # Gemma's 1 + w folded, Casts absorbed


def test_rms_norm_below_opset_23_is_kept_with_its_nodes() -> None:
    model = NormGraph(kind="rms", casts="input", inverse="reciprocal").build()
    result = graphfix.fuse_norms(model)
    assert result.report.fused == ()
    (kept,) = result.report.unfused
    assert kept.kind is NormKind.RMS_NORM
    assert kept.reason.startswith("opset 17 model: RMSNormalization needs opset 23; kept")
    names = {n.name for n in model.graph.node}
    assert set(kept.chain) == names  # every node of the chain, Casts and the weight Mul included
    assert set(kept.nodes) == names - {
        "n_scaled"
    }  # the island: what RMSNormalization does in float32
    assert (kept.input, kept.output) == ("x", "scaled")
    assert result.model.graph.node == model.graph.node


def test_rms_norm_fuses_when_asked_to_raise_the_opset() -> None:
    model = NormGraph(kind="rms", opset=18).build()
    result = _fused_one(model, "RMSNormalization", opset=23)
    assert result.report.opset_after == 23


# --- near misses: nothing fused, the reason reported -----------------------------------------

NEAR_MISSES = {
    "axes-not-last": (NormGraph(axes=(1,), scale=False, bias=False), "not the last"),
    "axes-differ": (NormGraph(var_axes=(-2, -1)), "different axes"),
    "cube-not-square": (NormGraph(exponent=3.0), "not 2"),
    "epsilon-not-scalar": (NormGraph(eps_shape=(8,)), "not a finite scalar"),
    "epsilon-adds-dims": (NormGraph(eps_shape=(1, 1, 1, 1)), "has 4 dims, more than x"),
    "mean-minus-x": (NormGraph(sub_reversed=True), "mean − x"),
    "keepdims-0": (NormGraph(keepdims=0, x_shape=(8, 8)), "keepdims=0"),
    "mean-is-an-output": (NormGraph(expose="mean"), "graph output"),
    "x-minus-mean-is-an-output": (NormGraph(expose="centred"), "graph output"),
    "variance-is-an-output": (NormGraph(kind="rms", opset=23, expose="var"), "graph output"),
    "root-read-elsewhere": (NormGraph(tap="root"), "also feeds n_tapped"),
    "centred-read-elsewhere": (NormGraph(tap="centred"), "also feeds n_tapped"),
    "dynamic-dims-no-scale": (
        NormGraph(scale=False, bias=False, x_shape=(2, 3, "c")),
        "not static",
    ),
}


@pytest.mark.parametrize(("graph", "reason"), NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_are_kept_with_the_reason(graph: NormGraph, reason: str) -> None:
    model = graph.build()
    result = graphfix.fuse_norms(model, opset=max(graph.opset, 17))
    assert result.report.fused == ()
    (kept,) = result.report.unfused
    assert reason in kept.reason
    assert _ops(result.model) == _ops(model)


def test_x_minus_the_mean_of_another_tensor_is_not_a_layer_norm() -> None:
    """Sub(x, ReduceMean(y)): not x's LayerNorm; what remains is the RMSNorm of x − mean(y)."""
    model = NormGraph(mean_of="y", bias=False).build()
    kept = graphfix.fuse_norms(model).report
    assert kept.found(NormKind.LAYER_NORM) == 0 and kept.found(NormKind.RMS_NORM) == 1
    assert "needs opset 23" in kept.unfused[0].reason
    result = _fused_one(NormGraph(mean_of="y", bias=False, opset=23).build(), "RMSNormalization")
    assert result.report.fused[0].input == "centred"


def test_dividing_something_else_is_not_a_norm() -> None:
    model = NormGraph(numerator="x").build()
    result = graphfix.fuse_norms(model)
    assert result.report.found() == 0
    assert _ops(result.model) == _ops(model)


@pytest.mark.parametrize(
    ("graph", "left"),
    [
        (NormGraph(scale_shape=(2, 1, 1), bias=False), "Mul"),  # per-batch, not per-channel
        (NormGraph(bias_input=True), "Add"),  # β computed at run time
    ],
    ids=["scale-over-batch", "bias-not-constant"],
)
def test_affine_that_is_not_per_channel_stays_after_the_fused_node(
    graph: NormGraph, left: str
) -> None:
    model = graph.build()
    result = _fused_one(model, "LayerNormalization")
    assert _ops(result.model)[left] == 1


# --- GroupNorm -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"affine": False},
        {"static_merge": True},
        {"gamma_shape": (8, 1, 1), "groups": 4},
        {"merge_to": (2, 8, 16)},  # dynamo: a flatten(2) folded into the last Reshape
    ],
    ids=["affine", "no-affine", "static-shape", "four-groups", "flattened"],
)
def test_group_norm_fuses_at_opset_21(kwargs: dict) -> None:
    model = group_norm_graph(**kwargs)
    result = _fused_one(model, "GroupNormalization")
    node = next(n for n in result.model.graph.node if n.op_type == "GroupNormalization")
    assert helper.get_attribute_value(
        node.attribute[[a.name for a in node.attribute].index("num_groups")]
    ) == kwargs.get("groups", 2)
    reshape = {"Reshape"} if "merge_to" in kwargs else set()  # x to the flattened layout first
    assert _ops(result.model).keys() == {"GroupNormalization"} | reshape
    scale = next(t for t in result.model.graph.initializer if t.name == node.input[1])
    assert tuple(scale.dims) == (8,)  # per channel: GroupNormalization-21


def test_group_norm_below_opset_21_is_kept() -> None:
    result = graphfix.fuse_norms(group_norm_graph(opset=18))
    (kept,) = result.report.unfused
    assert "GroupNormalization needs opset 21" in kept.reason
    assert set(kept.chain) == {"split", "inorm", "shape", "merge", "scale", "shift"}
    assert kept.nodes == ("inorm",)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"instance_scale": 2.0}, "scales or shifts each group"),
        ({"split": (16, -1, 1)}, "does not reshape to [N, groups, -1]"),
        ({"allowzero": 1}, "allowzero=1"),
        ({"merge_to": (4, 4, 16), "affine": False}, "does not restore the shape"),
    ],
    ids=["instance-norm-affine", "not-grouped-by-batch", "allowzero", "batch-changes"],
)
def test_group_norm_near_misses_are_kept(kwargs: dict, reason: str) -> None:
    model = group_norm_graph(**kwargs)
    result = graphfix.fuse_norms(model)
    (kept,) = result.report.unfused
    assert reason in kept.reason
    assert _ops(result.model) == _ops(model)


def test_group_norm_scale_over_space_stays_after_the_fused_node() -> None:
    model = group_norm_graph(gamma_shape=(1, 1, 4, 4))
    result = _fused_one(model, "GroupNormalization")
    assert _ops(result.model)["Mul"] == 1 and _ops(result.model)["Add"] == 1


def test_group_norm_18_blocks_an_upgrade_past_21() -> None:
    """GroupNormalization-18 scales per group; at 21 the same node would mean per channel."""
    model = group_norm_graph(opset=18)
    old = helper.make_node("GroupNormalization", ["x", "g", "b"], ["old"], name="old", num_groups=2)
    model.graph.node.append(old)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.ones(2, np.float32), "g"),
            numpy_helper.from_array(np.zeros(2, np.float32), "b"),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("old", F32, [None] * 4))
    result = graphfix.fuse_norms(model, opset=21)
    assert result.report.opset_after == 18
    assert "GroupNormalization" in result.report.opset_note
    assert [e.op_type for e in result.report.existing] == ["GroupNormalization"]


def test_external_weights_stay_on_disk(tmp_path) -> None:
    """A path whose weights are external data: read without loading them, saved referencing them."""
    model = NormGraph(kind="rms", opset=17, gemma=True, inverse="reciprocal").build()
    source = tmp_path / "model.onnx"
    on_disk = onnx.ModelProto()
    on_disk.CopyFrom(model)  # onnx.save turns the tensors it writes out into references
    onnx.save(on_disk, source, save_as_external_data=True, location="w.data", size_threshold=0)
    result = graphfix.fuse_norms(source, opset=23)  # the opset check runs without the weights
    assert len(result.report.fused) == 1 and result.report.opset_after == 23
    out = tmp_path / "fused.onnx"
    graphfix.save_model(result.model, out, source=source)
    _assert_same_outputs(model, onnx.load(str(out)))


# --- report ----------------------------------------------------------------------------------


def test_existing_fused_norms_are_counted_not_refused() -> None:
    model = NormGraph().build()
    fused = graphfix.fuse_norms(model).model
    again = graphfix.fuse_norms(fused)
    assert again.report.fused == () and again.report.unfused == ()
    assert again.report.found(NormKind.LAYER_NORM) == 1
    assert again.report.counts() == {"LayerNorm": {"fused": 0, "unfused": 0, "existing": 1}}


def test_report_summary_and_json() -> None:
    model = NormGraph().build()
    rms = NormGraph(kind="rms").build()
    model.graph.node.extend(rms.graph.node)
    for node in model.graph.node[len(model.graph.node) - len(rms.graph.node) :]:
        node.name += "_rms"
        node.input[:] = [i if i == "x" else f"{i}_rms" for i in node.input]
        node.output[:] = [f"{o}_rms" for o in node.output]
    model.graph.initializer.extend(
        numpy_helper.from_array(numpy_helper.to_array(t), f"{t.name}_rms")
        for t in rms.graph.initializer
    )
    model.graph.output.append(helper.make_tensor_value_info("scaled_rms", F32, [None] * 3))
    report = graphfix.fuse_norms(model).report
    data = json.loads(json.dumps(report.to_dict()))
    assert data["counts"] == {
        "LayerNorm": {"fused": 1, "unfused": 0, "existing": 0},
        "RMSNorm": {"fused": 0, "unfused": 1, "existing": 0},
    }
    assert data["unfused"][0]["kind"] == "RMSNorm" and data["unfused"][0]["nodes"]
    assert data["fused"][0]["node"] in {n.name for n in graphfix.fuse_norms(model).model.graph.node}
    text = report.summary()
    assert "LayerNorm: 1 fused" in text and "RMSNorm: 0 fused, 1 kept" in text
    assert "needs opset 23" in text


def test_unnamed_nodes_are_named_so_the_report_can_name_them() -> None:
    model = NormGraph(kind="rms").build()
    for node in model.graph.node:
        node.name = ""
    result = graphfix.fuse_norms(model)
    (kept,) = result.report.unfused
    assert all(kept.nodes) and set(kept.nodes) <= {n.name for n in result.model.graph.node}
    assert all(n.name == "" for n in model.graph.node)
