"""`locate --backend tensorrt` and the TensorRT plumbing it shares with `validate` (issue 20).

What needs no TensorRT runs everywhere: the polygraphy requirement per TensorRT major, the debug
tensor capability check, the error wrapping, the CUDA runtime error, the optimization profile,
bfloat16 handling, the internal-name count and the one plan.  What needs TensorRT is marked `trt`.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.cli import main
from graphfix.errors import UsageError
from graphfix.float_types import FloatType
from graphfix.model_io import LoadedModel
from graphfix.precision.locate.plan import candidate_of, check_options
from graphfix.precision.locate.runners import OnnxRuntimeCandidate
from graphfix.precision.locate.trt_candidate import (
    DebugTensorFilter,
    debug_tensor_problem,
    widen_bfloat16,
)
from graphfix.validation.backends import BackendError
from graphfix.validation.backends import tensorrt_backend as backend
from graphfix.validation.backends.gpu import _runtime_device, cuda_runtime_problem
from graphfix.validation.backends.tensorrt_backend import (
    TensorRTStatus,
    optimization_profiles,
    polygraphy_errors,
    polygraphy_problem,
    refuse_bfloat16_io,
)
from graphfix.validation.inputs import input_specs
from graphfix.validation.validate import Backend

F = TensorProto.FLOAT


def _softmax_model(*, batch: int | str = 2, elem_type: int = F) -> onnx.ModelProto:
    """y = Softmax(x @ W) with a batch dimension that is `batch` (an int, or symbolic)."""
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32) * 3.0, "W")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["scores"], name="/scores/MatMul"),
            helper.make_node("Softmax", ["scores"], ["y"], axis=-1, name="/softmax/Softmax"),
        ],
        "g",
        [helper.make_tensor_value_info("x", elem_type, [batch, 4, 8])],
        [helper.make_tensor_value_info("y", elem_type, [batch, 4, 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


# --- item 9: polygraphy >= 0.53.4 only where TensorRT 11 needs it ----------------------------


def test_tensorrt_10_keeps_the_polygraphy_its_ngc_image_ships():
    assert polygraphy_problem("0.49.26", "10.14.1") is None
    assert polygraphy_problem("0.49.13", "10.8.0") is None


def test_tensorrt_11_refuses_polygraphy_before_0_53_4():
    problem = polygraphy_problem("0.49.26", "11.1.0")
    assert problem is not None and "fails on TensorRT 11" in problem
    assert "polygraphy>=0.53.4" in problem


def test_validate_says_why_it_fell_back_from_tensorrt_11(monkeypatch):
    from graphfix.validation import validate as validate_module

    status = TensorRTStatus("11.1.0", "0.50.3", polygraphy_problem("0.50.3", "11.1.0"))
    monkeypatch.setattr(validate_module, "tensorrt_status", lambda: status)
    report = validate_module.validate(_softmax_model(), _softmax_model())
    assert report.backend == "onnxruntime"
    assert "TensorRT: not available here" in report.tensorrt_note
    assert "polygraphy 0.50.3, which fails on TensorRT 11" in report.tensorrt_note


# --- item 3: debug tensors only where TensorRT and polygraphy have them -----------------------


class _TrtRunner049:
    """polygraphy 0.49.26's TrtRunner.__init__ signature (backend/trt/runner.py), no listener."""

    def __init__(self, engine, name=None, optimization_profile=None, allocation_strategy=None):
        pass


@pytest.mark.parametrize("version", ["10.0.1", "10.8.0", "10.11.0"])
def test_tensorrt_before_10_12_goes_to_rebuild_bisection(version):
    problem = debug_tensor_problem(TensorRTStatus(version, "0.53.6", None))
    assert problem is not None and "markUnfusedTensorsAsDebugTensors" in problem
    assert "10.12" in problem


def test_polygraphy_without_debug_listener_goes_to_rebuild_bisection():
    status = TensorRTStatus("10.14.1", "0.49.26", None)
    problem = debug_tensor_problem(status, _TrtRunner049)
    assert problem == "polygraphy 0.49.26's TrtRunner takes no debug_listener"


@pytest.mark.parametrize("version", ["10.12.0", "10.14.1", "11.1.0"])
def test_installed_polygraphy_reads_debug_tensors_from_10_12(version):
    assert debug_tensor_problem(TensorRTStatus(version, "0.53.6", None)) is None


# --- items 5 and 15: one error wrapping, AttributeErrors blamed only where they belong --------


def test_attribute_error_raised_in_polygraphy_is_a_version_mismatch():
    from polygraphy.backend.trt import Profile

    status = TensorRTStatus("11.1.0", "0.50.3", None)
    profile = Profile().add("x", min=(1, 2), opt=(1, 2), max=(1, 2))
    builder_of_another_tensorrt = types.SimpleNamespace()  # lacks create_optimization_profile
    with pytest.raises(BackendError) as raised:
        with polygraphy_errors("build an engine of m.onnx", status=status):
            profile.to_trt(builder_of_another_tensorrt, None)
    message = str(raised.value)
    assert "polygraphy 0.50.3 does not work with TensorRT 11.1.0" in message
    assert "create_optimization_profile" in message and "polygraphy>=0.53.4" in message


def test_attribute_error_of_graphfix_itself_is_not_blamed_on_polygraphy():
    status = TensorRTStatus("11.1.0", "0.53.6", None)
    with pytest.raises(AttributeError, match="no attribute 'specs'"):
        with polygraphy_errors("build an engine of m.onnx", status=status):
            types.SimpleNamespace().specs  # noqa: B018 - a graphfix bug stays a traceback


def test_polygraphy_exception_is_one_line_backend_error():
    from polygraphy.exception import PolygraphyException

    status = TensorRTStatus("10.14.1", "0.53.6", None)
    with pytest.raises(BackendError, match="^TensorRT could not run m.onnx: bad thing$"):
        with polygraphy_errors("run m.onnx", status=status):
            raise PolygraphyException("bad\nthing")


def test_locate_checks_polygraphy_like_validate(tmp_path, capsys, monkeypatch):
    status = TensorRTStatus("11.1.0", "0.49.26", polygraphy_problem("0.49.26", "11.1.0"))
    monkeypatch.setattr(backend, "tensorrt_status", lambda: status)
    path = tmp_path / "m.onnx"
    onnx.save(_softmax_model(), path)
    code = main(["locate", str(path), "--precision", "fp16", "--backend", "tensorrt"])
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1
    assert "polygraphy 0.49.26, which fails on TensorRT 11" in err
    assert "pip install 'graphfix[tensorrt]'" in err


# --- item 8: pip CUDA 13 without a toolkit on default paths -------------------------------------


def _cuda13_wheel_layout(root):
    """The layout of the nvidia-cuda-runtime 13.x wheel (nvidia/cu13/lib/libcudart.so.13), which
    polygraphy 0.53.6 (nvidia/cuda_runtime/lib) does not search."""
    lib = root / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"")
    return lib


def test_cuda_runtime_load_failure_names_the_wheel_folder_to_add(tmp_path, monkeypatch):
    lib = _cuda13_wheel_layout(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(OSError) as failed:
        ctypes.CDLL("libcudart.so.99")  # what the loader raises for a runtime it cannot find
    message = cuda_runtime_problem(failed.value)
    assert "polygraphy cannot load the CUDA runtime (libcudart.so.99" in message
    assert f'export LD_LIBRARY_PATH={lib}:"$LD_LIBRARY_PATH"' in message and "\n" not in message


def test_cuda_runtime_load_failure_without_a_wheel_says_what_to_install(monkeypatch):
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if not (Path(p or ".") / "nvidia").is_dir()]
    )
    with pytest.raises(OSError) as failed:
        ctypes.CDLL("libcudart.so.99")
    message = cuda_runtime_problem(failed.value)
    assert "pip install nvidia-cuda-runtime" in message and "LD_LIBRARY_PATH" in message


def test_polygraphy_failing_to_load_the_cuda_runtime_is_a_backend_error(tmp_path, monkeypatch):
    if ctypes.util.find_library("cudart"):
        pytest.skip("a CUDA runtime is on the loader path here, so polygraphy loads it")
    lib = _cuda13_wheel_layout(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendError, match=f"export LD_LIBRARY_PATH={lib}:"):
        _runtime_device()  # polygraphy's CUDA wrapper really fails to load libcudart here


# --- item 4: a dynamic model is built for the feeds' shapes -----------------------------------


def test_dynamic_input_gets_a_profile_fixed_to_the_feed_shape():
    specs = input_specs(_softmax_model(batch="batch"))
    profiles = optimization_profiles(specs, {"x": (3, 4, 8)})
    assert profiles is not None and len(profiles) == 1
    shape = profiles[0]["x"]
    assert tuple(shape.min) == tuple(shape.opt) == tuple(shape.max) == (3, 4, 8)


def test_static_model_needs_no_profile():
    assert optimization_profiles(input_specs(_softmax_model()), {"x": (2, 4, 8)}) is None


# --- item 6: bfloat16 -----------------------------------------------------------------------


def test_bfloat16_bits_widen_to_the_values_torch_holds():
    torch = pytest.importorskip("torch")
    values = torch.tensor([0.0, -1.5, 3.140625, 65504.0, 1e-30, float("inf"), -3.0e38])
    as_bf16 = values.to(torch.bfloat16)
    bits = as_bf16.view(torch.int16).numpy().view(np.uint16)
    widened = widen_bfloat16(bits)
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened, as_bf16.to(torch.float32).numpy())


def test_bfloat16_graph_inputs_are_refused_with_the_fix():
    with pytest.raises(BackendError, match="bfloat16 inputs or outputs \\(x, y\\)") as raised:
        refuse_bfloat16_io(_softmax_model(elem_type=TensorProto.BFLOAT16), "m.onnx")
    assert "Casts at the edges" in str(raised.value)
    refuse_bfloat16_io(_softmax_model(), "m.onnx")  # float32 edges pass


# --- item 7: internal names are those absent from the ONNX graph ---------------------------------


def test_only_names_absent_from_the_graph_count_as_internal():
    debug = DebugTensorFilter({"scores", "y", "x"})
    debug.chunk = {"scores"}
    seen = [debug.wants(n) for n in ("scores", "y", "(Unnamed Layer* 3) [Shuffle]_output")]
    assert seen == [True, False, False]
    debug.chunk = {"y"}  # the next chunk sees the same internal tensor again
    assert [debug.wants(n) for n in ("scores", "y", "(Unnamed Layer* 3) [Shuffle]_output")] == [
        False,
        True,
        False,
    ]
    assert debug.internal == {"(Unnamed Layer* 3) [Shuffle]_output"}


# --- the design: one plan, one precision enum ------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [("float16", FloatType.FLOAT16), ("fp16", FloatType.FLOAT16), ("bf16", FloatType.BFLOAT16)],
)
def test_both_spellings_name_one_precision(spelling, expected):
    assert FloatType.parse(spelling) is expected
    assert FloatType.parse(expected.short) is FloatType.parse(expected.value)


def test_precision_command_takes_the_short_spelling_too(tmp_path, capsys):
    from graphfix.precision.convert import convert_precision

    converted = convert_precision(_softmax_model(), to="bf16").model
    assert {i.name: i.data_type for i in converted.graph.initializer} == {"W": TensorProto.BFLOAT16}
    path, out = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(_softmax_model(), path)
    assert main(["precision", str(path), "-o", str(out), "--to", "fp16"]) == 0
    assert onnx.load(out).graph.initializer[0].data_type == TensorProto.FLOAT16
    with pytest.raises(UsageError, match="to 'int8' is not one of float16, bfloat16, fp16, bf16"):
        convert_precision(_softmax_model(), to="int8")


def _options(**given):
    options = dict(
        candidate_given=False,
        precision="fp16",
        backend=None,
        apply=None,
        output=None,
        remedies=None,
        max_trials=None,
        chunk_bytes=None,
        remedy_base=None,
    )
    return check_options(**{**options, **given})


def test_options_resolve_to_one_backend_and_one_precision():
    assert _options() == (Backend.ONNXRUNTIME, FloatType.FLOAT16)
    assert _options(precision="bfloat16", backend="tensorrt") == (
        Backend.TENSORRT,
        FloatType.BFLOAT16,
    )
    with pytest.raises(UsageError, match="precision 'fp32' is not one of float16, bfloat16"):
        _options(precision="fp32")
    with pytest.raises(UsageError, match="--backend tensorrt locates MODEL converted"):
        _options(candidate_given=True, precision=None, backend="tensorrt")


def test_converted_candidate_computes_in_the_parsed_type():
    reference = LoadedModel(_softmax_model(), None, True)
    cand = candidate_of(reference, None, converted_to=FloatType.BFLOAT16)
    assert cand.computes_in is FloatType.BFLOAT16
    assert cand.label == "the model (in memory) converted to bfloat16 by convert_precision"
    weights = {i.name: i.data_type for i in cand.model.model.graph.initializer}
    assert weights == {"W": TensorProto.BFLOAT16}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cand.label = "another"  # type: ignore[misc]


def test_locate_and_validate_take_both_spellings(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_softmax_model(), path)
    assert main(["locate", str(path), "--precision", "bf16", "--json"]) in (0, 1)
    document = json.loads(capsys.readouterr().out)
    assert document["precision"] == "bfloat16"
    code = main(
        ["validate", str(path), str(path), "--backend", "onnxruntime", "--precision", "float32"]
    )
    assert code == 0, capsys.readouterr().err


class _OutputsOnly(OnnxRuntimeCandidate):
    """A candidate runner that exposes the graph outputs only, as a TensorRT engine without debug
    tensors does (TensorRT < 10.12, polygraphy 0.49.x): the pipeline must bisect by rebuilds."""

    def stream(self, chunks, feeds):
        for got in super().stream(chunks, feeds):
            yield {name: array for name, array in got.items() if name == "y"}


def test_without_intermediates_the_pipeline_bisects_by_rebuilds(monkeypatch):
    from graphfix.precision.locate import api

    w = numpy_helper.from_array(np.full((8, 8), 1e4, np.float32), "W")  # x @ W reaches 8e4
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="/proj/MatMul"),
            helper.make_node("Mul", ["h", "half"], ["y"], name="/scale/Mul"),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        [w, numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    runners = []

    def outputs_only(plan):
        runners.append(
            _OutputsOnly(
                plan.candidate, label=plan.candidate_label, low_precision=plan.low_precision
            )
        )
        return runners[-1]

    monkeypatch.setattr(api, "_candidate_runner", outputs_only)
    report = api.locate(model, precision="float16", ranges={"x": (1.0, 1.0)}, remedies=False)
    assert report.diverges and not report.suspects
    assert [e.tensor for e in report.tensors] == ["y"]  # the output, compared, blames nothing
    assert "no intermediate tensor could be compared" in " ".join(report.notes)
    assert any(n.startswith("differential rebuilds") for n in report.notes), report.notes
    # MatMul in float32 still hands 8e4 to a float16 Mul: the prefix must reach /scale/Mul,
    # whose output (4e4) is back in float16's range
    assert "rebuild keeping 1 node(s) in float32: error inf" in report.notes
    assert "the error goes away once /scale/Mul is float32" in " ".join(report.notes)


# --- TensorRT itself ----------------------------------------------------------------------------


@pytest.mark.trt
def test_locate_json_on_tensorrt_is_one_document(tmp_path, capsys):
    pytest.importorskip("tensorrt", reason="needs TensorRT")
    path = tmp_path / "m.onnx"
    onnx.save(_softmax_model(), path)
    code = main(["locate", str(path), "--precision", "float16", "--backend", "tensorrt", "--json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    document = json.loads(captured.out)  # polygraphy's and TensorRT's lines went to stderr
    assert document["candidate"].startswith("TensorRT ")


@pytest.mark.trt
def test_locate_builds_a_dynamic_model_for_the_feed_shapes(tmp_path):
    pytest.importorskip("tensorrt", reason="needs TensorRT")
    from graphfix.precision.locate import locate

    report = locate(
        _softmax_model(batch="batch"),
        precision="float16",
        backend="tensorrt",
        shapes={"x": [3, 4, 8]},
        remedies=False,
    )
    assert [o.name for o in report.outputs] == ["y"]
    assert report.outputs[0].absolute is not None  # ran at batch 3, compared element by element
