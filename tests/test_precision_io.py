"""`convert_precision` on models whose weights live in external data, and `graphfix precision`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import Variant, attention_model
from onnx import TensorProto, helper, numpy_helper
from test_model_io import save_external

from graphfix.cli.main import main
from graphfix.precision import weights
from graphfix.precision.convert import convert_precision


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(path_or_model, feed):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feed)


def _feed(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(0)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def test_external_weights_are_streamed_into_a_new_data_file(tmp_path: Path) -> None:
    model = attention_model(Variant(mask="add"))
    source = save_external(model, tmp_path / "in", threshold=200)
    data = source.parent / "model.onnx.data"
    before = _digest(data)
    result = convert_precision(str(source), external_data=tmp_path / "out" / "half.onnx.data")
    assert result.source == tmp_path / "out" / "half.onnx"
    assert _digest(data) == before  # the input's weights are untouched
    written = (tmp_path / "out" / "half.onnx.data").stat().st_size
    assert written == data.stat().st_size // 2  # every external weight is float32 → float16
    external = [t for t in result.model.graph.initializer if weights.is_external(t)]
    assert external and {t.data_type for t in external} == {TensorProto.FLOAT16}
    assert {e.value for t in external for e in t.external_data if e.key == "location"} == {
        "half.onnx.data"
    }
    feed = _feed(model)
    np.testing.assert_allclose(
        _run(str(result.source), feed)[0], _run(model, feed)[0], atol=1e-2, rtol=1e-2
    )


def test_default_folder_lives_as_long_as_the_result(tmp_path: Path) -> None:
    source = save_external(attention_model(), tmp_path / "in", threshold=200)
    result = convert_precision(str(source))
    folder = result.source.parent
    assert (folder / "model.onnx.data").is_file()
    del result
    import gc

    gc.collect()
    assert not folder.exists()


def test_big_weight_beyond_range_found_while_streaming(tmp_path: Path) -> None:
    count = weights.DEFERRED_CHECK_BYTES // 4 + 16  # checked while streamed, not before
    values = np.full(count, 0.5, np.float32)
    values[7] = 1e6
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Add", ["a", "big"], ["b"], name="add_big"),
        helper.make_node("Tanh", ["b"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])],
        [numpy_helper.from_array(values, "big")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source = save_external(model, tmp_path / "in")
    result = convert_precision(str(source), external_data=tmp_path / "out" / "m.onnx.data")
    assert [o.tensor for o in result.report.out_of_range] == ["big"]
    assert result.report.islands[0].nodes == ("add_big",)
    stored = onnx.load(str(result.source))
    np.testing.assert_array_equal(numpy_helper.to_array(stored.graph.initializer[0]), values)


def test_cli_writes_the_converted_weights_next_to_the_output(tmp_path: Path, capsys) -> None:
    model = attention_model(Variant(mask="add"))
    source = save_external(model, tmp_path / "in", threshold=200)
    out = tmp_path / "out" / "half.onnx"
    out.parent.mkdir()
    assert main(["precision", str(source), "-o", str(out), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["weights"] == "written as external data"
    assert document["report"]["to"] == "float16"
    assert sorted(p.name for p in out.parent.iterdir()) == ["half.onnx", "half.onnx.data"]
    assert (out.parent / "half.onnx.data").stat().st_nlink == 1
    onnx.checker.check_model(str(out), full_check=True)  # by path: the weights stay on disk
    feed = _feed(model)
    np.testing.assert_allclose(_run(str(out), feed)[0], _run(model, feed)[0], atol=1e-2, rtol=1e-2)


def test_cli_refuses_an_existing_output_and_bad_selectors(tmp_path: Path, capsys) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(attention_model(), src)
    out = tmp_path / "h.onnx"
    assert (
        main(["precision", str(src), "-o", str(out), "--keep", "op:Softmax", "--to", "bfloat16"])
        == 0
    )
    assert "bfloat16" in capsys.readouterr().out
    assert main(["precision", str(src), "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["precision", str(src), "-o", str(tmp_path / "k.onnx"), "--keep", "op:Conv"]) == 2
    assert "op types are" in capsys.readouterr().err
    assert not (tmp_path / "k.onnx").exists()


@pytest.mark.parametrize("flag", ["--no-fuse-norms", "--convert-io"])
def test_cli_flags_reach_the_api(tmp_path: Path, capsys, flag: str) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(attention_model(), src)
    assert main(["precision", str(src), "-o", str(tmp_path / "o.onnx"), flag, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    if flag == "--convert-io":
        assert report["keep_io_types"] is False
    else:
        assert report["norms"].startswith("not run")


def test_cli_opset_reaches_norm_fusion(tmp_path: Path, capsys) -> None:
    from norm_graphs import NormGraph

    src = tmp_path / "rms.onnx"
    onnx.save(NormGraph(kind="rms", opset=18, inverse="div").build(), src)
    out = tmp_path / "o.onnx"
    assert main(["precision", str(src), "-o", str(out), "--opset", "23", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    assert "opset 18 → 23" in report["norms"] and report["islands"] == []
    assert "RMSNormalization" in {n.op_type for n in onnx.load(out).graph.node}
    bad = ["precision", str(src), "-o", str(tmp_path / "b.onnx"), "--opset", "23"]
    assert main([*bad, "--no-fuse-norms"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["precision", str(src), "-o", str(tmp_path / "c.onnx"), "--opset", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "norm fusion is off" in err and "invalid int value" in err
    assert not (tmp_path / "b.onnx").exists() and not (tmp_path / "c.onnx").exists()


def _two_matmuls(side: int) -> onnx.ModelProto:
    """x → MatMul(w1) → Relu → MatMul(w2) → y; both weights over the size converted ahead."""
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((side, side)) / side).astype(np.float32)
    w2 = (rng.standard_normal((side, side)) / side).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "w2"], ["y"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, side])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_weight_converted_ahead_but_kept_float32_leaves_no_gap(tmp_path: Path) -> None:
    side = 640  # 1.6 MB of float32: converted ahead, before the plan keeps `first` float32
    assert 4 * side * side > weights.DEFERRED_CHECK_BYTES
    model = _two_matmuls(side)
    source = save_external(model, tmp_path / "in")
    out = tmp_path / "out" / "m.onnx.data"
    result = convert_precision(str(source), external_data=out, keep=["first"])
    stored = {t.name: t for t in result.model.graph.initializer}
    assert stored["w1"].data_type == TensorProto.FLOAT
    assert stored["w2"].data_type == TensorProto.FLOAT16
    # w1's float16 copy made ahead is gone: w2 moved down into its place, nothing in between
    assert out.stat().st_size == 4 * side * side + 2 * side * side
    offsets = {
        t.name: {e.key: int(e.value) for e in t.external_data if e.key != "location"}
        for t in stored.values()
    }
    spans = sorted((o["offset"], o["offset"] + o["length"]) for o in offsets.values())
    assert spans[0][0] == 0 and spans[0][1] == spans[1][0] and spans[1][1] == out.stat().st_size
    loaded = onnx.load(str(result.source))
    arrays = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    np.testing.assert_array_equal(arrays["w1"], numpy_helper.to_array(model.graph.initializer[0]))
    np.testing.assert_array_equal(
        arrays["w2"], numpy_helper.to_array(model.graph.initializer[1]).astype(np.float16)
    )
    feed = _feed(model)
    np.testing.assert_allclose(
        _run(str(result.source), feed)[0], _run(model, feed)[0], atol=1e-2, rtol=1e-2
    )


def test_weights_converted_ahead_are_taken_not_converted_again(tmp_path: Path) -> None:
    side = 640
    source = save_external(_two_matmuls(side), tmp_path / "in")
    out = tmp_path / "out" / "m.onnx.data"
    result = convert_precision(str(source), external_data=out)
    assert out.stat().st_size == 2 * 2 * side * side  # each weight written once, in float16
    assert {t.data_type for t in result.model.graph.initializer} == {TensorProto.FLOAT16}


def test_a_failed_conversion_leaves_no_data_file(tmp_path: Path) -> None:
    source = save_external(_two_matmuls(640), tmp_path / "in")
    out = tmp_path / "out" / "m.onnx.data"
    with pytest.raises(Exception, match="op types are"):
        convert_precision(str(source), external_data=out, keep=["op:Conv"])
    assert not out.exists()  # the weights converted ahead were thrown away with it


def test_cli_precision_leaves_blas_threads_alone_in_a_process_that_has_numpy(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    src = tmp_path / "m.onnx"
    onnx.save(attention_model(), src)
    assert main(["precision", str(src), "-o", str(tmp_path / "o.onnx")]) == 0
    import os

    assert "OPENBLAS_NUM_THREADS" not in os.environ  # numpy was loaded before: no effect


@pytest.mark.parametrize(("preset", "expected"), [(None, "1"), ("3", "3")])
def test_cli_precision_starts_numpy_without_blas_threads(preset, expected) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from graphfix.cli.main import main\n"
        "try:\n    main(['precision', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset  # the user's choice wins
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[-2:] == [expected, "True"]


def test_truncated_small_weight_on_disk_is_reported(tmp_path: Path) -> None:
    from graphfix.errors import ModelLoadError

    source = save_external(_two_matmuls(64), tmp_path / "in")  # small: range-checked first
    data = tmp_path / "in" / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(ModelLoadError, match="truncated"):
        convert_precision(str(source), external_data=tmp_path / "out" / "m.onnx.data")
    assert not (tmp_path / "out" / "m.onnx.data").exists()


def test_streamer_hands_the_gil_over_quickly_while_converting_ahead(tmp_path: Path) -> None:
    import sys

    before = sys.getswitchinterval()
    source = save_external(_two_matmuls(640), tmp_path / "in")
    model = onnx.load(str(source), load_external_data=False)
    with open(tmp_path / "d", "x+b") as stream, weights.Streamer(stream, "d", source.parent) as s:
        assert sys.getswitchinterval() == before  # nothing converts yet
        s.convert_ahead(iter(model.graph.initializer), "float16")
        assert sys.getswitchinterval() <= 2e-4 < before
    assert sys.getswitchinterval() == before
    convert_precision(str(source), external_data=tmp_path / "a" / "m.onnx.data")
    assert sys.getswitchinterval() == before
    with pytest.raises(Exception, match="op types are"):
        convert_precision(
            str(source), external_data=tmp_path / "b" / "m.onnx.data", keep=["op:Conv"]
        )
    assert sys.getswitchinterval() == before


def test_cli_precision_freezes_the_gc_only_as_the_program(tmp_path: Path, capsys) -> None:
    import gc
    import subprocess
    import sys

    src = tmp_path / "m.onnx"
    onnx.save(attention_model(), src)
    assert main(["precision", str(src), "-o", str(tmp_path / "a.onnx")]) == 0
    assert gc.get_freeze_count() == 0  # a caller in Python keeps its garbage collector
    code = (
        "import gc, sys\nfrom graphfix.cli.main import main\n"
        f"sys.argv = ['graphfix', 'precision', {str(src)!r}, '-o', {str(tmp_path / 'b.onnx')!r}]\n"
        "rc = main()\nprint(rc, gc.get_freeze_count() > 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["0", "True"]
    assert (tmp_path / "b.onnx").is_file()


def test_cli_attention_strategy_names_checked_without_loading_them_up_front(
    tmp_path: Path, capsys
) -> None:
    import subprocess
    import sys

    src = tmp_path / "m.onnx"
    onnx.save(attention_model(), src)
    out = tmp_path / "o.onnx"
    with pytest.raises(SystemExit) as stopped:
        main(["precision", str(src), "-o", str(out), "--attention-strategy", "nope"])
    assert stopped.value.code == 2
    assert "invalid choice: 'nope' (choose from 'plugin'" in capsys.readouterr().err
    assert main(["precision", str(src), "-o", str(out), "--attention-strategy", "plugin"]) == 0
    code = (
        "import sys\nfrom graphfix.cli.main import main\n"
        f"rc = main(['precision', {str(src)!r}, '-o', {str(tmp_path / 'p.onnx')!r}])\n"
        "print(rc, 'graphfix.attention.strategies' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["0", "False"]


def test_weights_on_disk_without_their_folder_are_refused_and_nothing_is_left(
    tmp_path: Path, monkeypatch
) -> None:
    import tempfile

    from graphfix.errors import ModelLoadError

    source = save_external(_two_matmuls(640), tmp_path / "in")
    bare = onnx.load(str(source), load_external_data=False)  # a ModelProto: no folder known
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(ModelLoadError, match="folder is unknown"):
        convert_precision(bare)
    assert not list((tmp_path / "tmp").iterdir())  # the temporary data folder is gone


def test_subgraph_weight_on_disk_kept_when_the_new_data_file_has_the_input_s_name(
    tmp_path: Path,
) -> None:
    # the input's data file and the default output's are both "model.onnx.data": the If
    # branch's weight must be copied into the new file, not left pointing at its old offset
    rng = np.random.default_rng(0)
    w_then = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w_then")
    then_graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_then"], ["yt"])],
        "then",
        [],
        [helper.make_tensor_value_info("yt", TensorProto.FLOAT, [2, 4])],
        [w_then],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["ye"])],
        "else",
        [],
        [helper.make_tensor_value_info("ye", TensorProto.FLOAT, [2, 4])],
    )
    w0 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w0")
    nodes = [
        helper.make_node("MatMul", ["x0", "w0"], ["x"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w0],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source = save_external(model, tmp_path / "in")
    result = convert_precision(str(source))
    assert result.source.name == "model.onnx"  # its data file: model.onnx.data, like the input's
    stored = onnx.load(str(result.source))  # every tensor read back from the new file
    if_node = next(n for n in stored.graph.node if n.op_type == "If")
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    then_weight = then_branch.initializer[0]
    np.testing.assert_array_equal(numpy_helper.to_array(then_weight), numpy_helper.to_array(w_then))
    feed = {"x0": rng.standard_normal((2, 4)).astype(np.float32), "c": np.array(True)}
    np.testing.assert_allclose(
        _run(str(result.source), feed)[0], _run(str(source), feed)[0], atol=1e-2, rtol=1e-2
    )


def test_cli_refuses_a_quantized_model_in_one_line(tmp_path: Path, capsys) -> None:
    from qdq_graphs import residual_block

    src = tmp_path / "int8.onnx"
    onnx.save(residual_block(qdq_on_conv=True, qdq_on_skip=True), src)
    out = tmp_path / "half.onnx"
    assert main(["precision", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the model is quantized (" in err[0]
    assert "convert the float32 model first, then quantize the result" in err[0]
    assert not out.exists()
