"""Counting quantized vs float layers in engine-inspector JSON: real engines NVIDIA published
(TREx test data, tests/data/trex/README.md), and, where TensorRT exists, an engine built here."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from qdq_graphs import conv_block

from graphfix.errors import UsageError
from graphfix.qdq import inspect_qdq
from graphfix.qdq.engine import compare_with_lint, engine_precision

DATA = Path(__file__).parent / "data" / "trex"


def load(name: str) -> str:
    return (DATA / name).read_text()


def test_int8_qat_mobilenet_runs_every_convolution_in_int8():
    count = engine_precision(load("mobilenet.qat.onnx.engine.graph.json"))
    assert (count.compute_quantized, count.compute_float) == (53, 0)
    assert count.by_precision == {"INT8": 53}
    assert count.reformats_to_or_from_quantized == 17


def test_fp16_resnet_has_no_quantized_layer():
    count = engine_precision(load("resnet-fp16.onnx.engine.graph.json"))
    assert (count.compute_quantized, count.compute_float) == (0, 21)
    assert count.by_precision == {"FP16": 21}


def test_residual_qat_resnet_fuses_its_residual_adds_into_int8_convolutions():
    """The placement the lint asks for (Q/DQ on the skip input only) gives Conv + Add layers."""
    count = engine_precision(load("resnet-qat-residual.onnx.engine.graph.json"))
    assert (count.compute_quantized, count.compute_float) == (21, 0)
    fused = [
        layer
        for layer in count.layers
        if layer.compute and layer.quantized and any(n.startswith("Add_") for n in layer.onnx_nodes)
    ]
    assert len(fused) == 8  # one per ResNet-18 basic block
    assert "Conv_34" in fused[0].onnx_nodes and "Add_42" in fused[0].onnx_nodes


def test_myelin_gemm_kernels_are_counted_as_gemms():
    """TensorRT >= 9 lists a Myelin region kernel by kernel (issue 20 item 13): its `gemm`
    kernels are GEMM layers like any other, its generated (`kgen`) and MHA kernels fused ones."""
    info = Path(__file__).parent / "data" / "engine_inspector" / "issue4397_bert_myelin_layers.json"
    count = engine_precision(info.read_text())
    assert (count.compute_quantized, count.compute_float) == (0, 2)
    assert count.by_precision == {"FP16": 2}
    assert (count.myelin_quantized, count.myelin_float) == (0, 2)
    gemms = [layer for layer in count.layers if layer.compute]
    # the ONNX nodes come from the layer's Metadata, not from its Myelin kernel name
    assert gemms[1].onnx_nodes == (
        "/encoder/layers.8/mha/output/dense/MatMul",
        "/encoder/layers.8/mha/output/dense/Add",
    )


def test_names_only_json_asks_for_detailed_verbosity():
    with pytest.raises(UsageError, match="DETAILED"):
        engine_precision(json.dumps({"Layers": ["Conv_0 + Relu_1"]}))


@pytest.mark.trt
@pytest.mark.gpu
def test_lint_agrees_with_a_real_engine(tmp_path):
    """Not run where TensorRT is absent (this machine): builds a strongly typed engine of a
    quantized Conv and checks the lint's verdict against the engine's layer precision."""
    trt = pytest.importorskip("tensorrt", reason="TensorRT's Python package is not importable here")
    from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath

    from graphfix.qdq.engine import engine_layer_precisions

    path = tmp_path / "conv.onnx"
    onnx.save(conv_block(), path)
    config = CreateConfig(profiling_verbosity=trt.ProfilingVerbosity.DETAILED)
    engine = EngineFromNetwork(NetworkFromOnnxPath(str(path), strongly_typed=True), config=config)()
    agreement = compare_with_lint(inspect_qdq(path), engine_layer_precisions(engine))
    assert [(a.node, a.lint_quantized, a.engine_quantized) for a in agreement] == [
        ("conv", True, True)
    ]
