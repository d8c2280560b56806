"""The plugin node contracts (see DESIGN.md): the one place the Python side spells them.

The C++ plugins spell the same strings in `plugins/graphfixSoftmax/graphfixSoftmaxPlugin.h` and
`plugins/graphfixAttention/graphfixAttentionPlugin.h`; tests/test_plugin_spec_agrees.py checks
that they agree.
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

# GraphfixAttention, version 1: the whole chain MatMul(Q,Kᵀ) → scale → softcap → mask → Softmax
# → MatMul(·,V) as one node (the `fused_plugin` strategy).
#   inputs:  Q [B, Hq, S, D]; K [B, Hkv, T, D] (or Kᵀ [B, Hkv, D, T] when k_transposed = 1);
#            V [B, Hkv, T, Dv]; optional mask, broadcastable to [B, Hq, S, T]: BOOL (True keeps;
#            a blocked score becomes `mask_fill`) or additive, of Q's type or float32.
#            Rank 3 ([N, S, D]) means one head per batch entry.  Hq % Hkv == 0 (grouped heads:
#            query head h reads key/value head h // (Hq / Hkv)).  Q, K, V share one element type:
#            float32, float16 or bfloat16.
#   output:  [B, Hq, S, Dv], Q's element type.
#   math:    s = scale · Q·Kᵀ; if softcap > 0: s = softcap · tanh(s / softcap); s = s + mask or
#            where(mask, s, mask_fill); if causal: key j > query i is blocked (-inf; top-left
#            aligned, used only where S == T); p = softmax(s) over T with float32 statistics;
#            a row whose scores are all -inf gives NaN, or 0 when nan_to_zero = 1 (the graph's
#            Where(IsNaN) guard); out = p·V with float32 accumulation.
ATTENTION = PluginSpec(
    op_type="GraphfixAttention",
    version="1",
    namespace=PLUGIN_NAMESPACE,
    fields=(
        ("scale", "kFLOAT32"),
        ("k_transposed", "kINT32"),
        ("causal", "kINT32"),
        ("softcap", "kFLOAT32"),
        ("mask_fill", "kFLOAT32"),
        ("nan_to_zero", "kINT32"),
    ),
)

# Every graphfix plugin: what a loaded plugin library must register (checked after loading it).
PLUGIN_SPECS = (SOFTMAX, ATTENTION)

# Element types the plugins accept on their inputs and outputs.
PLUGIN_ELEMENT_TYPES = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
)


def make_softmax_node(input_name: str, output_name: str, *, axis: int, name: str) -> onnx.NodeProto:
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


def make_attention_node(
    inputs: list[str],
    output_name: str,
    *,
    scale: float,
    k_transposed: bool,
    causal: bool,
    softcap: float,
    mask_fill: float,
    nan_to_zero: bool,
    name: str,
) -> onnx.NodeProto:
    """A GraphfixAttention node (see ATTENTION above); `inputs` is [Q, K, V] or [Q, K, V, mask]."""
    return onnx.helper.make_node(
        ATTENTION.op_type,
        inputs,
        [output_name],
        name=name,
        domain=PLUGIN_DOMAIN,
        scale=float(scale),
        k_transposed=int(k_transposed),
        causal=int(causal),
        softcap=float(softcap),
        mask_fill=float(mask_fill),
        nan_to_zero=int(nan_to_zero),
        plugin_version=ATTENTION.version,
        plugin_namespace=ATTENTION.namespace,
    )


def ensure_plugin_opset(model: onnx.ModelProto) -> None:
    """Add the `trt.plugins` opset import to `model` if it is not there (in place)."""
    for opset in model.opset_import:
        if opset.domain == PLUGIN_DOMAIN:
            return
    model.opset_import.append(onnx.helper.make_opsetid(PLUGIN_DOMAIN, PLUGIN_DOMAIN_VERSION))
