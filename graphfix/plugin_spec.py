"""The plugin node contracts (see DESIGN.md): the one place the Python side spells them.

The C++ plugin spells the same strings in `plugins/graphfixSoftmax/graphfixSoftmaxPlugin.h`; a test
checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

PLUGIN_DOMAIN = "trt.plugins"
PLUGIN_DOMAIN_VERSION = 1
PLUGIN_NAMESPACE = "graphfix"


@dataclass(frozen=True)
class PluginSpec:
    """Name, version, namespace and creator fields of one TensorRT plugin."""

    op_type: str
    version: str
    namespace: str
    # (field name, TensorRT PluginFieldType name) in creator order
    fields: tuple[tuple[str, str], ...]


SOFTMAX = PluginSpec(
    op_type="GraphfixSoftmax",
    version="1",
    namespace=PLUGIN_NAMESPACE,
    fields=(("axis", "kINT32"),),
)

# Element types the plugins accept on their inputs and outputs.
PLUGIN_ELEMENT_TYPES = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
)


def make_softmax_node(
    input_name: str, output_name: str, *, axis: int, name: str
) -> onnx.NodeProto:
    """A GraphfixSoftmax node exactly as DESIGN.md specifies it."""
    return onnx.helper.make_node(
        SOFTMAX.op_type,
        [input_name],
        [output_name],
        name=name,
        domain=PLUGIN_DOMAIN,
        axis=axis,
        plugin_version=SOFTMAX.version,
        plugin_namespace=SOFTMAX.namespace,
    )


def ensure_plugin_opset(model: onnx.ModelProto) -> None:
    """Add the `trt.plugins` opset import to `model` if it is not there (in place)."""
    for opset in model.opset_import:
        if opset.domain == PLUGIN_DOMAIN:
            return
    model.opset_import.append(onnx.helper.make_opsetid(PLUGIN_DOMAIN, PLUGIN_DOMAIN_VERSION))
