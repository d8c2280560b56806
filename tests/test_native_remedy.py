"""locate's remedy "float32 accumulation through IAttention" on onnxruntime, with the
materialised float16 semantics: the float32-accumulating Attention repairs a planted large-logit
overflow that a plain float16 Attention does not, and the search prefers it to islands."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphfix.precision.locate import locate
from graphfix.precision.locate.remedies import Remedy, RemedyKind, TrialRunner, search_remedies
from graphfix.validation.compare import Tolerance

S, D = 12, 16


def _overflowing_attention() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Q = K with integer entries (exact in float16) whose self-logits Σq² reach ~9e4: finite in
    float32, beyond float16's 65504 once the scores are stored in float16."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="/attn/Transpose"),
        helper.make_node("MatMul", ["q", "kt"], ["logits"], name="/attn/MatMul"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="/attn/Softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="/attn/MatMul_1"),
    ]
    shape = [1, 2, S, D]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 129, shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    return model, {"q": q, "k": q, "v": v}


def _runner(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> TrialRunner:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, feeds)
    assert np.abs(np.einsum("bhsd,bhsd->bhs", feeds["q"], feeds["k"])).max() > 65504
    return TrialRunner(
        model,
        precision="float16",
        feeds=feeds,
        reference_outputs={"y": y},
        tolerance=Tolerance(atol=1e-2, rtol=1e-2),
        base="minimal",
    )


def test_float32_accumulation_repairs_what_plain_float16_attention_does_not() -> None:
    model, feeds = _overflowing_attention()
    runner = _runner(model, feeds)
    plain = Remedy(
        RemedyKind.ATTENTION_STRATEGY, "/attn/MatMul", block=0, strategy="native_attention"
    )
    widened = Remedy(
        RemedyKind.ATTENTION_ACCUMULATION, "/attn/MatMul", block=0, strategy="native_attention"
    )
    as_converted, _ = runner.trial("as converted", [])
    plain_trial, plain_model = runner.trial("plain", [plain])
    widened_trial, widened_model = runner.trial("widened", [widened])
    for built in (plain_model, widened_model):
        assert [n.op_type for n in built.model.graph.node].count("Attention") == 1
    assert not as_converted.passed and as_converted.error == np.inf
    assert not plain_trial.passed and plain_trial.error == np.inf  # float16 scores overflow
    assert widened_trial.passed and widened_trial.error < 1e-2
    assert widened.keeps_fusion and not plain.keeps_fusion


def test_locate_prefers_float32_accumulation_to_a_float32_island(tmp_path) -> None:
    model, feeds = _overflowing_attention()
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **feeds)
    report = locate(model, precision="float16", inputs=inputs, apply=True)
    assert report.diverges and report.suspects[0].attention_block == 0
    (kept,) = report.remedies_kept
    assert kept.kind is RemedyKind.ATTENTION_ACCUMULATION and kept.keeps_fusion
    assert "IAttention" in kept.describe() and "11.3" in kept.describe()
    # the first remedy tried after the conversion itself, and no island was needed
    assert [r.kind for t in report.remedies_tried[1:2] for r in t.remedies] == [kept.kind]
    assert report.fixed is not None and report.fixed.passed
    assert [n.op_type for n in report.fixed_model.graph.node].count("Attention") == 1


@pytest.mark.parametrize(
    ("version", "offered"), [("10.14.1", False), ("11.2.0", False), ("11.3.0", True)]
)
def test_tensorrt_honours_the_remedy_from_11_3(version, offered) -> None:
    from graphfix.precision.locate.trt_candidate import accumulates_attention_in_float32
    from graphfix.validation.backends.tensorrt_backend import TensorRTStatus

    status = TensorRTStatus(version, "0.53.6", None)
    assert accumulates_attention_in_float32(status) is offered


def test_a_runner_without_it_searches_the_other_remedies(tmp_path) -> None:
    """A TensorRT older than 11.3: the search goes on to the attention strategy and islands."""
    model, feeds = _overflowing_attention()
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **feeds)
    report = locate(model, precision="float16", inputs=inputs, remedies=False)
    runner = _runner(model, feeds)
    older = TrialRunner(
        model,
        precision="float16",
        feeds=feeds,
        reference_outputs=runner.reference_outputs,
        tolerance=runner.tolerance,
        base="minimal",
        attention_accumulation=False,
    )
    found = search_remedies(model, report.suspects, report.tensors, older)
    tried = {r.kind for t in found.trials for r in t.remedies}
    assert RemedyKind.ATTENTION_ACCUMULATION not in tried
    assert found.passed and RemedyKind.FLOAT32_ISLAND in {r.kind for r in found.kept}
