"""`graphfix validate`: verdict exit codes, JSON, plots, and one-line errors with exit 1 or 2."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from graphs import with_output_named
from onnx import TensorProto, helper

import graphfix
from graphfix.cli import main
from graphfix.examples import vit_example
from graphfix.validation.backends.tensorrt_backend import tensorrt_status


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    original = vit_example()
    fixed = graphfix.break_attention_fusion(original)
    broken = onnx.ModelProto()
    broken.CopyFrom(fixed)
    for node in broken.graph.node:
        if node.op_type == "GraphfixSoftmax":
            next(a for a in node.attribute if a.name == "axis").i = 2
    paths = {}
    for name, model in (("original", original), ("fixed", fixed), ("broken", broken)):
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


@pytest.fixture
def dynamic(tmp_path):
    """tokens [batch, seq, 8] → Softmax over the last axis; static and dynamic twins of it."""
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["tokens"], ["probs"], name="sm", axis=-1)],
        "dyn",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", "seq", 8])],
    )
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _run(capsys, *argv):
    code = main(["validate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_pass_exits_0_with_statistics_and_histogram(models, capsys):
    code, out, err = _run(capsys, models["original"], models["fixed"], "--backend", "onnxruntime")
    assert code == 0, err
    assert out.startswith("graphfix validate: PASSED")
    assert "output 'probabilities' float32 [1, 10]: PASS" in out
    assert "abs error histogram (elements per decade):" in out and "== 0 | 10 | ####" in out
    assert out.rstrip().endswith(
        "PASSED: the candidate agrees with the reference on all 1 output(s)"
    )


def test_fail_exits_1(models, capsys):
    code, out, _ = _run(capsys, models["original"], models["broken"], "--backend", "onnxruntime")
    assert code == 1
    assert "output 'probabilities' float32 [1, 10]: FAIL" in out
    assert "FAILED: 1 of 1 output(s) out of tolerance: probabilities" in out


def test_json_report(models, capsys):
    code, out, _ = _run(
        capsys,
        models["original"],
        models["broken"],
        "--backend",
        "onnxruntime",
        "--json",
        "--atol",
        "0.5",
        "--rtol",
        "0",
    )
    data = json.loads(out)
    assert code == (0 if data["passed"] else 1)
    assert data["tolerance"] == {
        "atol": 0.5,
        "rtol": 0.0,
        "quantile": None,
        "allow_nonfinite": False,
    }
    assert data["outputs"][0]["name"] == "probabilities" and data["plots"] == []


def test_plot_writes_pngs(models, tmp_path, capsys):
    code, out, _ = _run(
        capsys,
        models["original"],
        models["broken"],
        "--backend",
        "onnxruntime",
        "--plot",
        tmp_path / "p",
    )
    assert code == 1
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "probabilities.error_heatmap.png",
        "probabilities.error_histogram.png",
    ]
    assert f"wrote {tmp_path / 'p' / 'probabilities.error_heatmap.png'}" in out


def test_outputs_numbered_differently_compare_and_plot_by_position(models, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    path = tmp_path / "numbered.onnx"
    onnx.save(with_output_named(onnx.load(models["fixed"]), "600"), path)
    code, _, err = _run(capsys, models["original"], path, "--backend", "onnxruntime")
    assert code == 2 and "--pair-outputs position" in err and err.count("\n") == 1
    code, out, _ = _run(
        capsys,
        models["original"],
        path,
        "--backend",
        "onnxruntime",
        "--pair-outputs",
        "position",
        "--plot",
        tmp_path / "p",
        "--json",
    )
    report = json.loads(out)
    assert code == 0 and report["passed"] and report["outputs"][0]["name"] == "probabilities"
    assert "outputs paired by position: probabilities ↔ 600" in report["notes"]
    assert len(report["plots"]) == 2


def test_shape_range_and_npz_options(dynamic, tmp_path, capsys):
    code, out, err = _run(
        capsys, dynamic, dynamic, "--shape", "tokens:2x5x8", "--range", "tokens:-3:3", "--seed", "4"
    )
    assert code == 0, err
    assert "tokens float32 [2, 5, 8]: uniform [-3, 3) (given range), seed 4" in out
    np.savez(tmp_path / "in.npz", tokens=np.zeros((1, 3, 8), np.float32))
    code, out, err = _run(
        capsys, dynamic, dynamic, "--inputs", tmp_path / "in.npz", "--quantile", "0.99"
    )
    assert code == 0, err
    assert "tokens float32 [1, 3, 8]: from in.npz" in out and "0.99-quantile" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--shape", "tokens=2x5x8"], "--shape 'tokens=2x5x8' is not NAME:DIMS"),
        (
            ["--shape", "tokens:2x5x8", "--shape", "tokens:1x5x8"],
            "--shape is given twice for 'tokens'",
        ),
        ([], "dynamic dimensions need values: tokens [batch, seq, 8]"),
        (["--shape", "tokens:2x5x9"], "does not fit the model's tokens"),
        (["--shape", "tokens:2x5x8", "--atol", "-1"], "atol must be a finite number >= 0"),
        (["--shape", "tokens:2x5x8", "--quantile", "1.5"], "quantile must be in (0, 1]"),
        (["--shape", "tokens:2x5x8", "--seed", "-3"], "seed must be an integer >= 0"),
        (["--shape", "tokens:2x5x8", "--range", "tokens:1"], "is not NAME:LOW:HIGH"),
        (
            ["--shape", "tokens:2x5x8", "--backend", "onnxruntime", "--precision", "fp16"],
            "TensorRT backend only",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(dynamic, capsys, extra, message):
    code, _, err = _run(capsys, dynamic, dynamic, *extra)
    assert code == 2
    assert err.startswith("graphfix: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_npz_missing_an_input_exits_2(dynamic, tmp_path, capsys):
    np.savez(tmp_path / "in.npz", other=np.zeros(3))
    code, _, err = _run(capsys, dynamic, dynamic, "--inputs", tmp_path / "in.npz")
    assert code == 2 and "the inputs lack tokens; they hold other" in err


def test_mismatched_models_exit_2(models, dynamic, capsys):
    code, _, err = _run(capsys, models["original"], dynamic)
    assert code == 2 and "the two models take different inputs" in err


def test_model_onnxruntime_cannot_run_exits_3(dynamic, tmp_path, capsys):
    # Valid ONNX (a custom domain, imported) that onnxruntime has no kernel for.
    odd = onnx.load(dynamic)
    odd.graph.node[0].op_type = "NoSuchOp"
    odd.graph.node[0].domain = "com.example"
    odd.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    onnx.save(odd, tmp_path / "odd.onnx")
    code, _, err = _run(capsys, dynamic, tmp_path / "odd.onnx", "--shape", "tokens:1x2x8")
    assert code == 3
    assert "onnxruntime cannot load" in err and "NoSuchOp" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_model_with_an_op_onnx_does_not_define_exits_2(dynamic, tmp_path, capsys):
    odd = onnx.load(dynamic)
    odd.graph.node[0].op_type = "NoSuchOp"  # in the ai.onnx domain: not a valid ONNX model
    onnx.save(odd, tmp_path / "odd.onnx")
    code, _, err = _run(capsys, dynamic, tmp_path / "odd.onnx", "--shape", "tokens:1x2x8")
    assert code == 2
    assert "is not a valid ONNX model" in err and "NoSuchOp" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_model_file_exits_2(dynamic, tmp_path, capsys):
    code, _, err = _run(capsys, dynamic, tmp_path / "nope.onnx")
    assert code == 2 and "model file not found" in err


@pytest.mark.skipif(
    tensorrt_status().available, reason="checks the message where TensorRT is absent"
)
def test_tensorrt_requested_without_tensorrt_exits_3(models, capsys):
    code, _, err = _run(capsys, models["original"], models["fixed"], "--backend", "tensorrt")
    assert code == 3 and "the TensorRT backend needs TensorRT (import tensorrt failed" in err


def test_argparse_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "only-one.onnx"])
    assert exc.value.code == 2


def test_an_npy_instead_of_an_npz_exits_2(dynamic, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 2, 8), np.float32))
    code, _, err = _run(capsys, dynamic, dynamic, "--inputs", tmp_path / "x.npy")
    assert code == 2 and "holds one unnamed array (a .npy)" in err and "numpy.savez" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_float64_npz_cast_is_noted(dynamic, tmp_path, capsys):
    np.savez(tmp_path / "in.npz", tokens=np.full((1, 2, 8), 0.1, dtype=np.float64))
    code, out, _ = _run(capsys, dynamic, dynamic, "--inputs", tmp_path / "in.npz")
    assert code == 0
    assert (
        "note: npz arrays cast to the model's narrower input types: tokens float64 → float32" in out
    )
    np.savez(tmp_path / "same.npz", tokens=np.full((1, 2, 8), 0.1, dtype=np.float32))
    code, out, _ = _run(capsys, dynamic, dynamic, "--inputs", tmp_path / "same.npz")
    assert code == 0 and "npz arrays cast" not in out


@pytest.mark.parametrize("where", ["under-a-file", "file"])
def test_plot_folder_that_cannot_be_created_exits_2_before_running(models, tmp_path, capsys, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    folder = blocker / "plots" if where == "under-a-file" else blocker
    code, out, err = _run(capsys, models["original"], models["fixed"], "--plot", folder)
    assert code == 2 and out == ""
    assert err.startswith("graphfix: error: ") and "--plot" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_plugins_with_the_onnxruntime_backend_is_refused(models, tmp_path, capsys):
    library = tmp_path / "libgraphfix_plugins.so"
    library.write_bytes(b"")
    code, _, err = _run(
        capsys,
        models["original"],
        models["fixed"],
        "--plugins",
        library,
        "--backend",
        "onnxruntime",
    )
    assert code == 2 and "--backend onnxruntime runs graphfix's reference ops" in err


def _gather_model(path, rows: int):
    table = onnx.numpy_helper.from_array(np.ones((rows, 3), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup")],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [table],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_out_of_range_values_exit_2_in_one_line_without_onnxruntimes_log(tmp_path, capfd):
    """Inputs the original refuses are the inputs' fault (exit 2), not the environment's (3)."""
    path = _gather_model(tmp_path / "gather.onnx", rows=10)
    code = main(["validate", str(path), str(path), "--range", "ids:0:50", "--seed", "1"])
    _, err = capfd.readouterr()  # file-descriptor level: onnxruntime logs from C++
    assert code == 2
    assert err.startswith("graphfix: error: onnxruntime failed to run") and "idx=" in err
    assert "check --shape/--range/--inputs" in err
    assert "\x1b[" not in err and "[E:onnxruntime" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_candidate_refusing_inputs_the_original_ran_on_fails_the_check(tmp_path, capfd):
    """Same inputs, the original runs them and the candidate cannot: the candidate is broken."""
    original = _gather_model(tmp_path / "gather.onnx", rows=64)
    candidate = _gather_model(tmp_path / "short.onnx", rows=10)
    code = main(["validate", str(original), str(candidate), "--range", "ids:0:50", "--seed", "1"])
    _, err = capfd.readouterr()
    assert code == 1
    assert err.startswith("graphfix: error: the candidate refused inputs the original ran on")
    assert "short.onnx" in err and "check --shape" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_mark_output_rewrite_is_validated_on_the_shared_outputs(models, tmp_path, capsys):
    marked = graphfix.fix_attention(models["original"], strategy="mark_output").model
    extra = [o.name for o in marked.graph.output][1:]
    assert len(extra) == 2  # one attention probability tensor per block
    onnx.save(marked, tmp_path / "marked.onnx")
    code, out, _ = _run(capsys, models["original"], tmp_path / "marked.onnx")
    assert code == 0
    assert f"note: 2 output(s) only the candidate has, not compared: {', '.join(extra)}" in out
    assert "PASSED: the candidate agrees with the reference on all 1 output(s)" in out
    code, _, err = _run(capsys, tmp_path / "marked.onnx", models["original"])
    assert code == 2 and "the candidate lacks output(s) of the original" in err
