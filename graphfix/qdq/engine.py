"""Quantized vs float layers of a built TensorRT engine, from its engine-inspector JSON.

The JSON is what `IEngineInspector.get_engine_information(LayerInformationFormat.JSON)` returns
(or trtexec `--exportLayerInfo`) at detailed profiling verbosity: a `Layers` list whose entries
carry `Inputs[i]["Format/Datatype"]` and, for convolutions and GEMMs, a `Weights` type.  As TREx
does (trex/activations.py), a layer's precision is its first input's data type.  Layer kinds and
ONNX node names are read as `graphfix.validation.fusion_proof` reads them: since TensorRT 9 a
Myelin region is listed kernel by kernel, and a Myelin `gemm` kernel is a GEMM like any other
(counted with the conv/GEMM layers), a `kgen` kernel a generated fused one (counted with Myelin).  Pure JSON: no
TensorRT needed to read a file someone else built; `engine_layer_precisions(engine)` needs one.

`compare_with_lint` says, per Conv/MatMul the lint covers, whether the engine agrees.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from graphfix.errors import UsageError
from graphfix.qdq.report import QdqReport
from graphfix.validation.fusion_proof import EngineLayer, LayerKind, engine_layer

QUANTIZED_TYPES = frozenset({"INT8", "FP8", "INT4", "FP4"})
# Data-type words in "Format/Datatype" strings, e.g. "Thirty-two wide channel vectorized row major
# Int8 format", "Row major linear FP32", "Channel major FP16 format where channel % 8 == 0".
_TYPE_WORDS = {
    "int8": "INT8", "fp8": "FP8", "int4": "INT4", "fp4": "FP4", "fp4e2m1": "FP4",
    "fp16": "FP16", "half": "FP16", "bfloat16": "BF16", "fp32": "FP32", "float": "FP32",
    "int32": "INT32", "int64": "INT64", "bool": "BOOL", "uint8": "UINT8",
}  # fmt: skip
_COMPUTE_TYPES = frozenset(
    {"Convolution", "Deconvolution", "MatrixMultiply", "FullyConnected", "Gemm", "ConvActPool"}
)


@dataclass(frozen=True)
class EngineLayerPrecision:
    name: str
    layer_type: str
    parameter_type: str
    precision: str  # of the first input ("" when the JSON has no formats: a lower verbosity)
    weights: str  # "INT8", "FP16"... for layers with weights, else ""
    compute: bool  # a convolution or GEMM (a Myelin `gemm` kernel included)
    onnx_nodes: tuple[str, ...]
    kind: LayerKind = LayerKind.LAYER

    @property
    def quantized(self) -> bool:
        return self.precision in QUANTIZED_TYPES or self.weights in QUANTIZED_TYPES


@dataclass(frozen=True)
class EnginePrecisionCount:
    layers: tuple[EngineLayerPrecision, ...]
    compute_quantized: int
    compute_float: int
    by_precision: dict[str, int] = field(default_factory=dict)  # compute layers per precision
    reformats_to_or_from_quantized: int = 0  # TREx ReformatLinter's red flag
    # Myelin regions ({ForeignNode[...]}) hide their convs/GEMMs, and Myelin's generated (kgen)
    # and MHA kernels fuse what they compute: counted apart, by input type
    myelin_quantized: int = 0
    myelin_float: int = 0

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.by_precision.items()))
        return (
            f"{self.compute_quantized} quantized and {self.compute_float} float conv/GEMM layers "
            f"({kinds}); {self.reformats_to_or_from_quantized} reformats to or from a quantized type; "
            f"Myelin regions and generated kernels: {self.myelin_quantized} with quantized and {self.myelin_float} with "
            "float inputs"
        )


def engine_precision(info: str | dict) -> EnginePrecisionCount:
    """Count quantized vs float conv/GEMM layers in engine-inspector JSON (text or parsed)."""
    data = json.loads(info) if isinstance(info, str) else info
    entries = data.get("Layers") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise UsageError(
            "engine-inspector JSON has no 'Layers' list; export it with detailed verbosity"
        )
    layers = []
    reformats = 0
    for entry in entries:
        if not isinstance(entry, dict):
            raise UsageError(
                "the engine-inspector JSON lists layer names only (LAYER_NAMES_ONLY verbosity); "
                "rebuild with ProfilingVerbosity.DETAILED (trtexec --profilingVerbosity=detailed)"
            )
        inputs = [_dtype(i.get("Format/Datatype", "")) for i in entry.get("Inputs", [])]
        outputs = [_dtype(o.get("Format/Datatype", "")) for o in entry.get("Outputs", [])]
        weights = entry.get("Weights")
        weight_type = _dtype(str(weights.get("Type", ""))) if isinstance(weights, dict) else ""
        parameter = str(entry.get("ParameterType", ""))
        layer = engine_layer(entry)
        if parameter == "Reformat" and inputs and outputs:
            if (inputs[0] in QUANTIZED_TYPES) != (outputs[0] in QUANTIZED_TYPES):
                reformats += 1
        layers.append(
            EngineLayerPrecision(
                name=layer.name,
                layer_type=layer.layer_type,
                parameter_type=parameter,
                precision=inputs[0] if inputs else "",
                weights=weight_type,
                compute=parameter in _COMPUTE_TYPES or _myelin_gemm(layer),
                onnx_nodes=layer.onnx_nodes,
                kind=layer.kind,
            )
        )
    compute = [layer for layer in layers if layer.compute]
    myelin = [layer for layer in layers if layer.kind in _FUSED_KINDS and not layer.compute]
    return EnginePrecisionCount(
        layers=tuple(layers),
        compute_quantized=sum(1 for layer in compute if layer.quantized),
        compute_float=sum(1 for layer in compute if not layer.quantized),
        by_precision=dict(Counter(layer.precision or "unknown" for layer in compute)),
        reformats_to_or_from_quantized=reformats,
        myelin_quantized=sum(1 for layer in myelin if layer.quantized),
        myelin_float=sum(1 for layer in myelin if not layer.quantized),
    )


# Counted apart from conv/GEMM layers: what fuses several ops into one kernel or region.
_FUSED_KINDS = (LayerKind.MYELIN_REGION, LayerKind.MYELIN_KERNEL, LayerKind.ATTENTION_KERNEL)


def _myelin_gemm(layer: EngineLayer) -> bool:
    return layer.kind is LayerKind.MYELIN_KERNEL and layer.layer_type.lower() == "gemm"


def _dtype(text: str) -> str:
    for word in re.split(r"[\s:]+", text):
        found = _TYPE_WORDS.get(word.lower())
        if found:
            return found
    return ""


def engine_layer_precisions(engine) -> EnginePrecisionCount:
    """From a built `tensorrt.ICudaEngine` (detailed profiling verbosity)."""
    import tensorrt as trt

    inspector = engine.create_engine_inspector()
    return engine_precision(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


@dataclass(frozen=True)
class LintAgreement:
    node: str
    lint_quantized: bool
    engine_quantized: bool | None  # None: no engine layer names this node (fused away or renamed)


def compare_with_lint(report: QdqReport, engine: EnginePrecisionCount) -> tuple[LintAgreement, ...]:
    """Per compute node of the lint: does the engine layer that carries it run quantized?"""
    carriers: dict[str, list[EngineLayerPrecision]] = {}
    for layer in engine.layers:
        if layer.compute:
            for node in layer.onnx_nodes:
                carriers.setdefault(node, []).append(layer)
    return tuple(
        LintAgreement(
            node=n.node,
            lint_quantized=n.quantized,
            engine_quantized=(
                any(layer.quantized for layer in carriers[n.node]) if n.node in carriers else None
            ),
        )
        for n in report.nodes
    )
