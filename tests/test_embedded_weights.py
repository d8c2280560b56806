"""Embedded weights stay on disk: inspect and fix read the graph only and stream the weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import feeds_for
from onnx import numpy_helper

import graphfix
from graphfix.cli import main
from graphfix.embedded_weights import REFERENCE_THRESHOLD, load_referencing_embedded
from graphfix.examples import vit_example
from graphfix.model_io import load_model, save_model


@pytest.fixture
def embedded(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "vit.onnx"
    path.parent.mkdir()
    onnx.save(vit_example(), path)
    return path


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _outputs(path: Path) -> list[np.ndarray]:
    model = graphfix.with_reference_ops(onnx.load(path))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds_for(model))


def test_big_embedded_tensors_become_references_to_their_own_bytes(embedded: Path) -> None:
    original = onnx.load(embedded)
    light = load_referencing_embedded(embedded)
    data = embedded.read_bytes()
    referenced = 0
    for full, lazy in zip(original.graph.initializer, light.graph.initializer, strict=True):
        assert (full.name, list(full.dims), full.data_type) == (
            lazy.name,
            list(lazy.dims),
            lazy.data_type,
        )
        if len(full.raw_data) >= REFERENCE_THRESHOLD:
            info = {e.key: e.value for e in lazy.external_data}
            assert lazy.data_location == onnx.TensorProto.EXTERNAL and not lazy.raw_data
            assert info["location"] == embedded.name
            start, length = int(info["offset"]), int(info["length"])
            assert data[start : start + length] == full.raw_data
            referenced += 1
        else:
            assert lazy.SerializeToString() == full.SerializeToString()
    assert referenced >= 4  # the ViT's weight matrices; its scalars and shapes stay in memory
    assert list(light.graph.node) == list(original.graph.node)
    assert light.opset_import == original.opset_import
    assert light.ByteSize() < original.ByteSize() / 4


@pytest.mark.parametrize("where", ["same folder", "other folder", "over the input"])
def test_fix_of_an_embedded_model_writes_a_self_contained_copy(
    embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    weights, expected = _weights(onnx.load(embedded)), _outputs(embedded)
    out = {
        "same folder": embedded.with_name("vit.fixed.onnx"),
        "other folder": tmp_path / "out" / "vit.fixed.onnx",
        "over the input": embedded,
    }[where]
    argv = ["fix", str(embedded), "-o", str(out)] + (["--overwrite"] if out == embedded else [])
    assert main(argv) == 0
    assert "(weights embedded)" in capsys.readouterr().out
    saved = onnx.load(out, load_external_data=False)
    onnx.checker.check_model(saved)
    assert not any(t.external_data for t in saved.graph.initializer)
    assert sum(n.op_type == "GraphfixSoftmax" for n in saved.graph.node) == 2
    assert _weights(saved).keys() == weights.keys()
    for name, value in _weights(saved).items():
        np.testing.assert_array_equal(value, weights[name])
    if out != embedded:
        embedded.unlink()  # the copy needs nothing from the input
    for got, want in zip(_outputs(out), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_save_model_of_a_lazily_loaded_model_is_byte_equivalent(
    embedded: Path, tmp_path: Path
) -> None:
    loaded = load_model(embedded, load_weights=False, reference_embedded=True)
    saved = save_model(loaded.model, tmp_path / "copy.onnx", source=loaded.path)
    assert saved.weights == "embedded" and saved.data_files == ()
    copy, original = onnx.load(saved.path), onnx.load(embedded)
    assert copy.graph.node == original.graph.node
    for a, b in zip(copy.graph.initializer, original.graph.initializer, strict=True):
        assert a.raw_data == b.raw_data and a.dims == b.dims and a.name == b.name


def test_public_load_keeps_embedded_weights_in_memory_unless_asked(embedded: Path) -> None:
    for loaded in (load_model(embedded), load_model(embedded, load_weights=False)):
        assert not any(t.external_data for t in loaded.model.graph.initializer)


def test_shape_inference_never_serializes_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    model = vit_example()
    big = numpy_helper.from_array(np.zeros((512, 512), np.float32), "unused_big_weight")
    model.graph.initializer.append(big)  # 1 MB that shape inference must not be handed
    seen: list[int] = []
    infer = onnx.shape_inference.infer_shapes

    def spy(given: onnx.ModelProto, **kwargs):
        seen.append(given.ByteSize())
        return infer(given, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    matches = graphfix.find_attention(model)
    assert [(m.heads, m.q_len, m.kv_len) for m in matches] == [(4, 16, 16), (4, 16, 16)]
    assert seen and max(seen) < model.ByteSize() - big.ByteSize() / 2


def test_inspect_says_why_shape_inference_failed(tmp_path: Path, capsys) -> None:
    model = vit_example()
    for tensor in model.graph.initializer:
        if tensor.name == "pos_embed":  # 15 positions for 16 patches: the Add cannot broadcast
            tensor.CopyFrom(numpy_helper.from_array(np.zeros((1, 15, 64), np.float32), "pos_embed"))
    onnx.save(model, tmp_path / "bad.onnx")
    assert main(["inspect", str(tmp_path / "bad.onnx")]) == 0
    out = capsys.readouterr().out
    assert "0  /blocks.0/attn/Softmax  self  ?      ?      ?" in out
    assert (
        "note: onnx shape inference failed, so sizes it would have given show as ?: "
        "(op_type:Add, node name: /pos_embed/Add): [ShapeInferenceError] Incompatible dimensions"
    ) in out
    onnx.save(vit_example(), tmp_path / "good.onnx")
    assert main(["inspect", str(tmp_path / "good.onnx")]) == 0
    assert "shape inference" not in capsys.readouterr().out


@pytest.mark.parametrize("strategy", sorted(graphfix.STRATEGIES))
def test_fix_on_disk_equals_fix_in_memory(
    embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: str
) -> None:
    out = tmp_path / f"{strategy}.onnx"
    assert main(["fix", str(embedded), "-o", str(out), "-s", strategy, "--always-write"]) == 0
    capsys.readouterr()
    expected = graphfix.fix_attention(onnx.load(embedded), strategy=strategy).model
    saved = onnx.load(out)
    assert list(saved.graph.node) == list(expected.graph.node)
    assert list(saved.graph.output) == list(expected.graph.output)
    assert _weights(saved).keys() == _weights(expected).keys()
    for name, value in _weights(expected).items():
        np.testing.assert_array_equal(_weights(saved)[name], value)
