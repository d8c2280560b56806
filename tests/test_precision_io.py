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
