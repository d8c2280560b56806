"""`graphfix.validate` on real exported models: onnxruntime paths, reports, plots, fusion parsing.

The models are small torch modules exported here (seeded, a few KB): a ViT-like block using
`F.scaled_dot_product_attention` and a BERT-like block with eager attention and a padding mask.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import onnx
import pytest
from graphs import with_output_named
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.validation.backends import BackendError
from graphfix.validation.backends.tensorrt_backend import engine_options, tensorrt_status
from graphfix.validation.validate import CheckKind, ValidationUsageError, validate

torch = pytest.importorskip("torch", reason="exporting the test models needs torch")
nn, F = torch.nn, torch.nn.functional

TRT = tensorrt_status()


class VitBlock(nn.Module):
    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (
            self.qkv(self.norm(x))
            .reshape(b, n, 3, self.heads, d // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(y.transpose(1, 2).reshape(b, n, d))


class BertBlock(nn.Module):
    def __init__(self, vocab: int = 50, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.norm = nn.LayerNorm(width)

    def forward(self, input_ids, attention_mask):
        x = self.embed(input_ids)
        b, n, d = x.shape
        dh = d // self.heads

        def split(t):
            return t.view(b, n, self.heads, dh).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / math.sqrt(dh)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        probs = torch.softmax(scores + bias, dim=-1)
        y = (probs @ split(self.v(x))).transpose(1, 2).reshape(b, n, d)
        return self.norm(self.o(y) + x)


def export(module: nn.Module, args: tuple, path, inputs, outputs, dynamic) -> onnx.ModelProto:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    return onnx.load(str(path))


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    model = export(
        VitBlock(),
        (torch.randn(1, 8, 32),),
        folder / "vit.onnx",
        ["x"],
        ["y"],
        {"x": {0: "batch", 1: "tokens"}},
    )
    fixed = folder / "vit.fixed.onnx"
    onnx.save(graphfix.break_attention_fusion(model), fixed)
    return folder / "vit.onnx", fixed


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    args = (torch.randint(0, 50, (1, 6)), torch.ones(1, 6, dtype=torch.int64))
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    model = export(
        BertBlock(),
        args,
        folder / "bert.onnx",
        ["input_ids", "attention_mask"],
        ["hidden"],
        dynamic,
    )
    fixed = folder / "bert.fixed.onnx"
    onnx.save(graphfix.break_attention_fusion(model), fixed)
    return folder / "bert.onnx", fixed


def with_softmax_axis(path, axis: int) -> onnx.ModelProto:
    """The fixed model with every GraphfixSoftmax reduced over `axis`: a broken rewrite."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "GraphfixSoftmax":
            next(a for a in node.attribute if a.name == "axis").i = axis
    return model


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A hand conversion: float initializers, I/O, Constants and Casts to float become float16."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(
                numpy_helper.from_array(
                    numpy_helper.to_array(tensor).astype(np.float16), tensor.name
                )
            )
    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    del graph.value_info[:]
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
            elif attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(
                    numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float16))
                )
    return result


def test_wiring_check_of_a_correct_float32_rewrite_is_exact(vit):
    """Without TensorRT, GraphfixSoftmax's reference op in float32 is Softmax itself: the check
    proves the rewrite's wiring (inputs, outputs, axis), not the plugin's kernel."""
    original, fixed = vit
    report = validate(original, fixed, backend="onnxruntime", shapes={"x": (2, 9, 32)})
    assert report.passed and report.backend == "onnxruntime"
    assert report.check == CheckKind.WIRING and report.to_dict()["check"] == "wiring check"
    assert report.summary().startswith("graphfix validate: PASSED (wiring check)")
    assert "a wiring check of the rewrite" in report.tensorrt_note
    (out,) = report.outputs
    assert out.name == "y" and out.shape == (2, 9, 32)
    assert out.absolute.max == 0 and out.cosine_similarity == pytest.approx(1.0)
    assert "reference implementation of its 1 plugin node(s)" in report.candidate
    assert report.fusion is None


def test_wiring_check_of_the_masked_eager_attention_rewrite_passes(bert):
    original, fixed = bert
    report = validate(original, fixed, backend="onnxruntime", shapes={"input_ids": (2, 8)}, seed=3)
    assert report.passed
    assert report.outputs[0].absolute.max <= 1e-6
    ids, mask = report.inputs
    assert "random integers 0..49 (indices of Gather" in ids.origin
    assert mask.shape == (2, 8)


@pytest.mark.skipif(TRT.available, reason="checks the fallback used where TensorRT is absent")
def test_default_backend_without_tensorrt_says_so_in_one_line(vit):
    report = validate(*vit, shapes={"x": (1, 5, 32)})
    assert report.backend == "onnxruntime"
    assert report.tensorrt_note.startswith("TensorRT: not available here (import tensorrt failed")
    assert (
        "validated the candidate ONNX with onnxruntime and graphfix's reference ops"
        in report.tensorrt_note
    )
    assert "\n" not in report.tensorrt_note
    assert report.tensorrt_note in report.summary()


@pytest.mark.parametrize("which", ["vit", "bert"])
def test_wiring_check_catches_a_wrong_axis_with_the_right_statistics(which, request, tmp_path):
    original, fixed = request.getfixturevalue(which)
    broken = tmp_path / "broken.onnx"
    onnx.save(with_softmax_axis(fixed, 2), broken)  # softmax over queries instead of keys
    shapes = {"x": (2, 9, 32)} if which == "vit" else {"input_ids": (2, 8)}
    report = validate(original, broken, backend="onnxruntime", shapes=shapes)
    assert not report.passed
    (out,) = report.outputs
    assert report.failed_outputs == (out.name,)
    reference, candidate = report.reference_outputs[out.name], report.candidate_outputs[out.name]
    errors = np.abs(candidate.astype(np.float64) - reference)
    assert out.absolute.max > 1e-2
    assert out.absolute.max == pytest.approx(errors.max())
    assert all(0 <= i < d for i, d in zip(out.absolute.argmax, out.shape, strict=True))
    assert errors[out.absolute.argmax] == pytest.approx(errors.max())
    assert out.reference_at_max == pytest.approx(float(reference[out.absolute.argmax]))
    assert out.required_atol == pytest.approx(out.absolute.max)
    assert out.mismatches > out.size // 2
    assert out.cosine_similarity < 1 - 1e-4
    assert "FAILED: 1 of 1 output(s) out of tolerance" in report.summary()


@pytest.mark.parametrize("which", ["vit", "bert"])
def test_float16_conversion_has_nonzero_but_bounded_error(which, request, tmp_path):
    original, _ = request.getfixturevalue(which)
    half = tmp_path / "half.onnx"
    onnx.save(to_float16(onnx.load(str(original))), half)
    shapes = {"x": (2, 9, 32)} if which == "vit" else {"input_ids": (2, 8)}
    report = validate(original, half, backend="onnxruntime", shapes=shapes)
    (out,) = report.outputs
    assert out.candidate_dtype == "float16" and out.reference_dtype == "float32"
    assert 1e-5 < out.absolute.max < 1e-1
    assert out.cosine_similarity > 0.9999
    assert report.passed and report.tolerance_origin == "atol and rtol: default for fp16"
    strict = validate(original, half, backend="onnxruntime", shapes=shapes, atol=1e-6, rtol=1e-6)
    assert not strict.passed and strict.tolerance_origin == "given"
    assert strict.outputs[0].absolute == out.absolute  # the same inputs, the same statistics


def test_npz_inputs_match_generated_ones(vit, tmp_path):
    original, fixed = vit
    generated = validate(original, fixed, backend="onnxruntime", shapes={"x": (1, 4, 32)}, seed=7)
    x = graphfix.validation.inputs.make_inputs(
        onnx.load(str(original)), shapes={"x": (1, 4, 32)}, seed=7
    ).feeds["x"]
    np.savez(tmp_path / "x.npz", x=x)
    from_file = validate(original, fixed, backend="onnxruntime", inputs=tmp_path / "x.npz")
    assert np.array_equal(from_file.reference_outputs["y"], generated.reference_outputs["y"])
    assert from_file.inputs[0].origin == "from x.npz"


def test_in_memory_models(vit):
    original, fixed = vit
    report = validate(
        onnx.load(str(original)),
        onnx.load(str(fixed)),
        backend="onnxruntime",
        shapes={"x": (1, 3, 32)},
    )
    assert report.passed and "(in memory)" in report.candidate


def test_usage_errors(vit, bert, tmp_path):
    original, fixed = vit
    with pytest.raises(ValidationUsageError, match="take different inputs"):
        validate(original, bert[1], backend="onnxruntime")
    np.savez(tmp_path / "empty.npz", other=np.zeros(1))
    with pytest.raises(ValidationUsageError, match="the inputs lack x"):
        validate(original, fixed, backend="onnxruntime", inputs=tmp_path / "empty.npz")
    with pytest.raises(ValidationUsageError, match="dynamic dimensions need values: x"):
        validate(original, fixed, backend="onnxruntime")
    with pytest.raises(
        ValidationUsageError, match="backend 'ort' is not one of tensorrt, onnxruntime"
    ):
        validate(original, fixed, backend="ort")
    with pytest.raises(ValidationUsageError, match="applies to the TensorRT backend only"):
        validate(original, fixed, backend="onnxruntime", precision="fp16", shapes={"x": (1, 3, 32)})
    renamed = onnx.load(str(fixed))
    renamed.graph.output[0].name = "z"
    renamed.graph.node[-1].output[0] = "z"
    with pytest.raises(
        ValidationUsageError,
        match=r"the candidate lacks output\(s\) of the original: y \(only the candidate has z; "
        r"the original's outputs are y, the candidate's z\).*--pair-outputs position",
    ):
        validate(original, renamed, backend="onnxruntime")


def test_outputs_named_differently_pair_by_position(vit):
    """A legacy export numbers its outputs (591 in one export, 600 in the other): by position the
    pair is compared, and the report says which name went with which."""
    original, fixed = vit
    renamed = with_output_named(onnx.load(str(fixed)), "600")
    shapes = {"x": (1, 3, 32)}
    report = validate(
        original, renamed, backend="onnxruntime", shapes=shapes, pair_outputs="position"
    )
    assert report.passed and [o.name for o in report.outputs] == ["y"]
    assert "outputs paired by position: y ↔ 600" in report.notes
    assert set(report.candidate_outputs) == {"y"}  # keyed as compared, so plots find them
    broken = onnx.load(str(fixed))  # same pairing, but the candidate's output is now wrong
    broken.graph.output[0].name = "600"
    broken.graph.node[-1].output[0] = "600/raw"
    broken.graph.node.append(helper.make_node("Neg", ["600/raw"], ["600"]))
    worse = validate(
        original, broken, backend="onnxruntime", shapes=shapes, pair_outputs="position"
    )
    assert not worse.passed and worse.failed_outputs == ("y",)
    with pytest.raises(ValidationUsageError, match="output pairing 'order' is not one of name"):
        validate(original, renamed, backend="onnxruntime", shapes=shapes, pair_outputs="order")


def test_model_onnxruntime_cannot_run(vit):
    original, _ = vit
    odd = onnx.load(str(original))
    last = odd.graph.node[-1]
    odd.graph.node[-1].CopyFrom(
        helper.make_node("Mystery", list(last.input), list(last.output), domain="com.example")
    )
    odd.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(
        BackendError, match=r"onnxruntime cannot load the candidate model \(in memory\): .*Mystery"
    ):
        validate(original, odd, backend="onnxruntime", shapes={"x": (1, 3, 32)})


@pytest.mark.skipif(TRT.available, reason="checks the message where TensorRT is absent")
def test_tensorrt_backend_requested_without_tensorrt(vit):
    with pytest.raises(
        BackendError, match=r"the TensorRT backend needs TensorRT \(import tensorrt failed"
    ):
        validate(*vit, backend="tensorrt", shapes={"x": (1, 3, 32)})


def test_report_json_and_summary(bert, tmp_path):
    original, fixed = bert
    broken = tmp_path / "broken.onnx"
    onnx.save(with_softmax_axis(fixed, 2), broken)
    report = validate(original, broken, backend="onnxruntime", shapes={"input_ids": (1, 6)})
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False
    assert "reference_outputs" not in data and "candidate_outputs" not in data
    out = data["outputs"][0]
    assert out["absolute"]["max"] == pytest.approx(report.outputs[0].absolute.max)
    assert out["absolute"]["argmax"] == list(report.outputs[0].absolute.argmax)
    assert {"mean", "median", "std", "p90", "p95", "p99", "max", "argmax"} <= set(out["relative"])
    assert out["histogram"] and data["tolerance"] == {
        "atol": 1e-4,
        "rtol": 1e-3,
        "quantile": None,
        "allow_nonfinite": False,
    }
    text = report.summary()
    assert "abs error histogram (elements per decade):" in text and "#" in text
    assert "abs error histogram" not in report.summary(histograms=False)


def test_plots_are_written(bert, tmp_path):
    from graphfix.validation.plot import plot_report

    original, fixed = bert
    broken = tmp_path / "broken.onnx"
    onnx.save(with_softmax_axis(fixed, 2), broken)
    report = validate(original, broken, backend="onnxruntime", shapes={"input_ids": (1, 6)})
    paths = plot_report(report, tmp_path / "plots")
    assert [p.name for p in paths] == ["hidden.error_histogram.png", "hidden.error_heatmap.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValidationUsageError, match="is a file"):
        plot_report(report, tmp_path / "file")


# --- TensorRT-side logic that needs no TensorRT: option mapping -------------------------------


def test_engine_options_by_tensorrt_version():
    assert engine_options("fp16", tensorrt_version="10.13.0").fp16
    assert engine_options("bf16", tensorrt_version="10.13.0").bf16
    assert not engine_options(None, tensorrt_version="10.13.0").strongly_typed
    assert engine_options(None, tensorrt_version="11.0.0").strongly_typed
    with pytest.raises(
        ValidationUsageError, match=r"strongly typed .* the precision must be in the ONNX"
    ):
        engine_options("fp16", tensorrt_version="11.0.0")


def test_a_different_quantization_is_said_to_change_the_outputs_by_design(tmp_path):
    """A quantized model against its float original, and against a copy with one Q/DQ pair
    fewer (what `qdq fix` does): the notes say the outputs differ by design and where the measure
    is; the same quantization on both sides gets no note."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")

    def model(pairs: int) -> onnx.ModelProto:
        nodes, tensor = [], "x"
        for i in range(pairs):
            nodes += [
                helper.make_node("QuantizeLinear", [tensor, "s"], [f"q{i}"]),
                helper.make_node("DequantizeLinear", [f"q{i}", "s"], [f"d{i}"]),
            ]
            tensor = f"d{i}"
        nodes.append(helper.make_node("Relu", [tensor], ["y"]))
        graph = helper.make_graph(nodes, "g", [x], [y], [scale])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    float_model, once, twice = model(0), model(1), model(2)
    against_float = validate(float_model, once, backend="onnxruntime")
    assert any(
        "only the candidate is quantized (1 QuantizeLinear" in n for n in against_float.notes
    )
    fixed = validate(twice, once, backend="onnxruntime")
    assert any("original has 2 QuantizeLinear nodes and the candidate 1" in n for n in fixed.notes)
    assert any("qdq fix --reference" in n for n in fixed.notes)
    assert not any("QuantizeLinear" in n for n in validate(once, once, backend="onnxruntime").notes)
