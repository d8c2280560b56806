"""One low-precision semantics for every verdict: float16/bfloat16 materialised at every node output.

Minimal graphs next to the assertions show what onnxruntime's CPU hides (an overflowing float16
Mul kept in float32), that If bodies, external data and lowered plugin nodes are materialised too,
and the `as-is` escape.  On the corpus, `validate` and `locate` must give the same verdict on the
same pair and the same inputs, for every float16 model the corpus makes: `graphfix precision`
outputs of its float32 exports, planted float16 overflows (`locate_faults`), and its native
float16 exports rewritten by `graphfix fix` (and, beyond float16, every `--to bfloat16` output).
The full sweep is marked `slow`; a representative subset runs in the default suite.
"""

from __future__ import annotations

import model_corpus
import numpy as np
import onnx
import pytest
from locate_faults import plant_overflow
from onnx import TensorProto, helper, numpy_helper

from graphfix.attention.rewrite import fix_attention
from graphfix.cli import main
from graphfix.errors import UsageError
from graphfix.precision.convert import convert_precision
from graphfix.precision.locate import locate
from graphfix.validation.inputs import make_inputs
from graphfix.validation.low_precision import (
    LowPrecision,
    describe_low_precision,
    emulate_low_precision,
    materialise,
)
from graphfix.validation.validate import _model_precision, validate

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
MATERIALISED = "float16 materialised at every node output"


def _square_model(*, in_if: bool = False) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """float32 y = (x·w)² · 0.01 and its float16 conversion; x·w peaks near 905, so the square
    (819025) overflows float16 while the result (8190) would fit."""
    w = np.full((4, 4), 0.25, np.float32)

    def build(elem: int) -> onnx.ModelProto:
        dtype = np.float32 if elem == F else np.float16
        inits = [
            numpy_helper.from_array(w.astype(dtype), "w"),
            numpy_helper.from_array(np.array(0.01, dtype), "scale"),
        ]
        body_nodes = [
            helper.make_node("Mul", ["h", "h"], ["sq"], name="square"),
            helper.make_node("Mul", ["sq", "scale"], ["y_body"], name="scale"),
        ]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul")]
        if in_if:
            body = helper.make_graph(
                body_nodes, "then", [], [helper.make_tensor_value_info("y_body", elem, None)]
            )
            other = helper.make_graph(
                [helper.make_node("Identity", ["h"], ["y_else"])],
                "else",
                [],
                [helper.make_tensor_value_info("y_else", elem, None)],
            )
            inits.append(numpy_helper.from_array(np.array(True), "flag"))
            nodes.append(
                helper.make_node("If", ["flag"], ["y"], then_branch=body, else_branch=other)
            )
        else:
            nodes += body_nodes
            nodes.append(helper.make_node("Identity", ["y_body"], ["y"]))
        graph = helper.make_graph(
            nodes,
            "square",
            [helper.make_tensor_value_info("x", elem, [2, 4])],
            [helper.make_tensor_value_info("y", elem, [2, 4])],
            inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    return build(F), build(H)


@pytest.fixture
def square_inputs(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, x=np.full((2, 4), 905.2, np.float32))
    return path


@pytest.mark.parametrize("in_if", [False, True], ids=["main graph", "If body"])
def test_float16_overflow_onnxruntime_hides_is_a_fail(in_if, square_inputs, tmp_path):
    original, half = _square_model(in_if=in_if)
    report = validate(original, half, backend="onnxruntime", inputs=square_inputs)
    assert not report.passed
    (out,) = report.outputs
    assert out.nonfinite_mismatches == out.size  # (905·0.25·4)² is inf in float16
    assert report.low_precision.startswith(MATERIALISED)
    assert f"low precision: {MATERIALISED}" in report.summary()
    assert report.to_dict()["low_precision"].startswith(MATERIALISED)
    hidden = validate(
        original, half, backend="onnxruntime", inputs=square_inputs, low_precision="as-is"
    )
    assert hidden.passed  # the false PASS of onnxruntime as is: the square stayed in float32
    assert "as-is" in hidden.low_precision
    located = locate(original, half, inputs=square_inputs)
    assert located.diverges and located.low_precision.startswith(MATERIALISED)
    assert not locate(original, half, inputs=square_inputs, low_precision="as-is").diverges


def test_cli_names_the_semantics_and_takes_as_is(square_inputs, tmp_path, capsys):
    original, half = _square_model()
    paths = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    onnx.save(original, paths[0])
    onnx.save(half, paths[1])
    argv = [
        "validate",
        *map(str, paths),
        "--backend",
        "onnxruntime",
        "--inputs",
        str(square_inputs),
    ]
    assert main(argv) == 1
    assert f"low precision: {MATERIALISED}" in capsys.readouterr().out
    assert main([*argv, "--low-precision", "as-is"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--low-precision", "rounded"])
    assert exit_.value.code == 2 and "invalid choice: 'rounded'" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"--low-precision \(low_precision\) 'rounded' is not one"):
        validate(*paths, backend="onnxruntime", low_precision="rounded")


def test_external_data_model_is_materialised(square_inputs, tmp_path):
    original, half = _square_model()
    path = tmp_path / "half.onnx"
    onnx.save(half, path, save_as_external_data=True, location="half.data", size_threshold=0)
    report = validate(original, path, backend="onnxruntime", inputs=square_inputs)
    assert not report.passed and report.low_precision.startswith(MATERIALISED)


def test_emulation_rounds_each_stored_tensor_and_keeps_names():
    _, half = _square_model()
    emulated = emulate_low_precision(half)
    onnx.checker.check_model(emulated, full_check=True)
    rounds = [n for n in emulated.graph.node if n.name.endswith("/graphfix_round")]
    # the input on entry, then h, sq, y_body and y: every float16 tensor a node stores
    assert sorted(n.output[0].split("/")[0] for n in rounds) == ["h", "sq", "x", "y", "y_body"]
    assert {o.name for o in emulated.graph.output} == {"y"}
    # weights stay stored in float16, widened exactly by a Cast onnxruntime folds at load time
    assert {t.name: t.data_type for t in emulated.graph.initializer} == {
        "w/graphfix_stored": H,
        "scale/graphfix_stored": H,
    }
    widened = [n for n in emulated.graph.node if n.name.endswith("/graphfix_widen")]
    assert {n.output[0] for n in widened} >= {"w", "scale"}


def test_stale_float32_annotations_do_not_hide_a_float16_tensor(square_inputs):
    """A converter that leaves value_info saying float32 on a tensor now float16 (issue 19's
    dynamo exports): the types are inferred from the nodes, so the square is still rounded."""
    original, half = _square_model()
    half.graph.value_info.extend(
        [helper.make_tensor_value_info(name, F, [2, 4]) for name in ("h", "sq", "y_body")]
    )
    rounded = {n.output[0] for n in emulate_low_precision(half).graph.node if n.op_type == "Cast"}
    assert {"sq/graphfix_rounded", "sq"} <= rounded
    assert not validate(original, half, backend="onnxruntime", inputs=square_inputs).passed


def test_weights_listed_as_graph_inputs_stay_initializers(square_inputs):
    """Older exports list initializers among the graph inputs: they are not fed, not retyped."""
    original, half = _square_model()
    half.graph.input.append(helper.make_tensor_value_info("w", H, [4, 4]))
    emulated = emulate_low_precision(half)
    assert [i.name for i in emulated.graph.input] == ["x", "w/graphfix_stored"]
    assert emulated.graph.input[1].type.tensor_type.elem_type == H
    assert not validate(original, half, backend="onnxruntime", inputs=square_inputs).passed


def test_tensors_onnx_cannot_type_are_named_not_claimed():
    """An op outside ONNX's schemas leaves its output (and what follows) untyped: those tensors
    are not rounded, and the report line says which, instead of claiming every node output."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Mystery", ["h"], ["m"], domain="com.example"),
        helper.make_node("Mul", ["m", "m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", H, [2, 4])],
        [helper.make_tensor_value_info("y", H, [2, 4])],
        [numpy_helper.from_array(np.ones((4, 4), np.float16), "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    done = materialise(model)
    assert done.untyped == ("m",)  # y is typed by the graph output; h by inference
    rounded = {n.output[0] for n in done.model.graph.node if n.name.endswith("/graphfix_round")}
    assert rounded == {
        "x/graphfix_input/graphfix_rounded",
        "h/graphfix_rounded",
        "y/graphfix_rounded",
    }
    line = describe_low_precision(LowPrecision.MATERIALISE, ("float16",), untyped=done.untyped)
    assert line.endswith(
        "except 1 tensor(s) of unknown type (ops ONNX has no schema for), run "
        "as onnxruntime computes them: m"
    )


@pytest.fixture(scope="module")
def native_fp16():
    pytest.importorskip("torch", reason="exporting the corpus model needs torch")
    entry = next(e for e in model_corpus.CORPUS if e.name == "sdpa_fp16-legacy17")
    return onnx.load(str(model_corpus.model_path(entry)))


def test_lowered_plugin_nodes_are_materialised(native_fp16):
    """validate lowers GraphfixSoftmax to its reference ops, then materialises the float16."""
    fixed = fix_attention(native_fp16, strategy="plugin").model
    report = validate(native_fp16, fixed, backend="onnxruntime")
    assert report.check.value == "wiring check" and report.low_precision.startswith(MATERIALISED)
    assert report.passed


# --- validate and locate agree, on every float16 model the corpus makes ---------------------


def _verdicts(reference: onnx.ModelProto, candidate: onnx.ModelProto, **inputs) -> tuple:
    checked = validate(reference, candidate, backend="onnxruntime", **inputs)
    located = locate(reference, candidate, remedies=False, **inputs)
    return checked.passed, not located.diverges


def _assert_agree(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> bool:
    """validate and locate on the same pair: default inputs (dynamic dimensions sized as the
    corpus's recipe sizes them), then the corpus's own recipe inputs."""
    recipe = model_corpus.random_feed(reference, np.random.default_rng(0))
    default = _verdicts(reference, candidate, shapes={k: v.shape for k, v in recipe.items()})
    assert default[0] == default[1], f"validate {default[0]}, locate {default[1]} (default inputs)"
    given = _verdicts(reference, candidate, inputs=recipe)
    assert given[0] == given[1], f"validate {given[0]}, locate {given[1]} (the corpus's inputs)"
    return default[0]


def _float32_entries(subset: tuple[str, ...]):
    return [
        pytest.param(e, id=e.name, marks=[] if e.name in subset else [pytest.mark.slow])
        for e in model_corpus.CORPUS
        if e.export_error is None
    ]


SUBSET = ("sdpa_mask-legacy17", "eager_causal_triu-dynamo18")  # torch-only exports: quick


def _corpus_model(entry) -> onnx.ModelProto:
    pytest.importorskip("torch", reason="exporting the corpus model needs torch")
    return onnx.load(str(model_corpus.model_path(entry)))


@pytest.mark.parametrize("entry", _float32_entries(SUBSET))
def test_precision_output_gets_one_verdict(entry):
    model = _corpus_model(entry)
    if _model_precision(model) != "fp32":
        pytest.skip(f"{entry.name} is not a float32 export (its native type is swept below)")
    converted = convert_precision(model, to="float16").model
    _assert_agree(model, converted)


@pytest.mark.parametrize(
    "entry",
    [pytest.param(*p.values, id=p.id, marks=pytest.mark.slow) for p in _float32_entries(())],
)
def test_bfloat16_precision_output_runs_materialised_with_one_verdict(entry):
    """onnxruntime's CPU cannot load a bfloat16 MatMul as is; materialised, every op computes in
    float32 with bfloat16 rounding at its output, so `graphfix precision --to bfloat16` can be
    judged on any machine, and validate and locate agree."""
    model = _corpus_model(entry)
    if _model_precision(model) != "fp32":
        pytest.skip(f"{entry.name} is not a float32 export")
    _assert_agree(model, convert_precision(model, to="bfloat16").model)


PLANTED_SUBSET = ("attention_then_classifier-legacy17", "eager_mask_add-dynamo18")


@pytest.mark.parametrize("entry", _float32_entries(PLANTED_SUBSET))
def test_planted_overflow_fails_validate_and_locate(entry):
    """The issue's RoBERTa case: a MatMul whose output peaks at 3e5, converted by `precision`."""
    model = _corpus_model(entry)
    if _model_precision(model) != "fp32":
        pytest.skip(f"{entry.name} is not a float32 export")
    try:
        recipe = model_corpus.random_feed(model, np.random.default_rng(0))
        shapes = {k: v.shape for k, v in recipe.items()}  # dynamic dimensions as the recipe's
        fault = plant_overflow(model, make_inputs(model, shapes=shapes).feeds)
    except ValueError as exc:  # no MatMul/Gemm/Conv with a float32 weight to scale
        pytest.skip(str(exc))
    converted = convert_precision(fault.model, to="float16").model
    assert _assert_agree(fault.model, converted) is False


NATIVE_SUBSET = ("sdpa_fp16-legacy17",)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(e, id=e.name, marks=[] if e.name in NATIVE_SUBSET else [pytest.mark.slow])
        for e in model_corpus.CORPUS
        if e.export_error is None and ("fp16" in e.model or "bf16" in e.model)
    ],
)
def test_native_low_precision_export_fixed_gets_one_verdict(entry):
    model = _corpus_model(entry)
    if _model_precision(model) == "fp32":
        pytest.skip(f"{entry.name} stores no float16/bfloat16")
    fixed = fix_attention(model).model
    _assert_agree(model, fixed)


def test_qdq_fix_guard_measures_float16_materialised(tmp_path):
    """`qdq fix`'s error guard judges a float16 model as validate does: the overflow counts."""
    from graphfix.qdq.error import ErrorGuard

    original, half = _square_model()
    feeds = [{"x": np.full((2, 4), 905.2, np.float32)}]
    guard = ErrorGuard(half, original, feeds=feeds)
    assert guard.low_precision.startswith(MATERIALISED)
    worst, _ = guard.error(half)
    assert not np.isfinite(worst)  # inf − finite: onnxruntime as is would report 0
    assert guard.error(original) == (0.0, 0.0)  # a float32 candidate runs as written
