"""GraphIndex reads small external tensors (shape tensors, scales, biases) through one open file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_model_io import save_external

from graphfix.graph.index import GraphIndex


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal(300).astype(np.float32), "bias"),
        numpy_helper.from_array(np.array([2, 150], np.int64), "shape"),
        numpy_helper.from_array(np.array(0.125, np.float32), "scale"),
        numpy_helper.from_array(rng.integers(0, 9, (4, 5)).astype(np.int32), "table"),
    ]
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["a"]),
        helper.make_node("Mul", ["a", "scale"], ["b"]),
        helper.make_node("Reshape", ["b", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_small_external_tensors_read_as_onnx_reads_them(tmp_path: Path) -> None:
    model = _model()
    path = save_external(model, tmp_path)
    stored = onnx.load(str(path), load_external_data=False)
    index = GraphIndex(stored, base_dir=tmp_path)
    for tensor, original in zip(stored.graph.initializer, model.graph.initializer, strict=True):
        value = index.constant_value(tensor.name)
        expected = numpy_helper.to_array(original)
        assert value is not None and value.dtype == expected.dtype
        np.testing.assert_array_equal(value, expected)
    assert len(index._reader.files) == 1  # one file opened for the model, not one per tensor
    # the constant shape reaches shape inference: Reshape's output is [2, 150]
    dims = index.value_info["y"].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 150]


def test_external_tensor_beyond_the_file_end_is_unknown(tmp_path: Path) -> None:
    path = save_external(_model(), tmp_path)
    stored = onnx.load(str(path), load_external_data=False)
    size = (tmp_path / "model.onnx.data").stat().st_size
    bad = stored.graph.initializer[3]
    for entry in bad.external_data:
        if entry.key == "offset":
            entry.value = str(size - 8)  # 80 bytes from 8 before the end
    index = GraphIndex(stored, base_dir=tmp_path)
    assert index.constant_value("bias") is not None  # opens the file through onnx's checks
    assert index.constant_value("table") is None  # read with pread: out of range → unknown


def test_a_location_onnx_refuses_is_never_read(tmp_path: Path) -> None:
    path = save_external(_model(), tmp_path / "m")
    stored = onnx.load(str(path), load_external_data=False)
    for tensor in stored.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../m/model.onnx.data"  # outside the model's folder
    index = GraphIndex(stored, base_dir=tmp_path / "m")
    assert all(index.constant_value(t.name) is None for t in stored.graph.initializer)
    assert not index._reader.files
