"""The C++ plugin spells its identity as graphfix/plugins/spec.py does (no build needed).

The built libraries are checked against the same spec at run time by test_plugin_host_harness.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from graphfix.plugins.spec import ATTENTION, SOFTMAX

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins" / "graphfixSoftmax"


def _constant(header: str, name: str) -> str:
    match = re.search(rf'constexpr char const\* {name}\{{"([^"]*)"\}};', header)
    assert match is not None, f"{name} is not defined in graphfixSoftmaxPlugin.h"
    return match.group(1)


def test_name_version_namespace_agree() -> None:
    header = (PLUGIN_DIR / "graphfixSoftmaxPlugin.h").read_text()
    assert _constant(header, "kGRAPHFIX_SOFTMAX_PLUGIN_NAME") == SOFTMAX.op_type
    assert _constant(header, "kGRAPHFIX_SOFTMAX_PLUGIN_VERSION") == SOFTMAX.version
    assert _constant(header, "kGRAPHFIX_PLUGIN_NAMESPACE") == SOFTMAX.namespace


def test_creator_fields_agree() -> None:
    header = (PLUGIN_DIR / "graphfixSoftmaxPlugin.h").read_text()
    source = (PLUGIN_DIR / "graphfixSoftmaxPlugin.cpp").read_text()
    constructor = source[
        source.index("GraphfixSoftmaxPluginCreator::GraphfixSoftmaxPluginCreator()") :
    ]
    constructor = constructor[: constructor.index("{\n")]
    fields = re.findall(
        r"PluginField\{(k\w+), nullptr, nvinfer1::PluginFieldType::(k\w+), 1\}", constructor
    )
    assert tuple((_constant(header, name), kind) for name, kind in fields) == SOFTMAX.fields


ATTENTION_DIR = PLUGIN_DIR.parent / "graphfixAttention"


def test_attention_name_version_namespace_agree() -> None:
    header = (ATTENTION_DIR / "graphfixAttentionPlugin.h").read_text()
    assert _constant(header, "kGRAPHFIX_ATTENTION_PLUGIN_NAME") == ATTENTION.op_type
    assert _constant(header, "kGRAPHFIX_ATTENTION_PLUGIN_VERSION") == ATTENTION.version
    assert _constant(header, "kGRAPHFIX_ATTENTION_PLUGIN_NAMESPACE") == ATTENTION.namespace


def test_attention_creator_fields_agree() -> None:
    header = (ATTENTION_DIR / "graphfixAttentionPlugin.h").read_text()
    source = (ATTENTION_DIR / "graphfixAttentionPlugin.cpp").read_text()
    start = source.index("GraphfixAttentionPluginCreator::GraphfixAttentionPluginCreator()")
    constructor = source[start : source.index("\n{\n", start)]
    fields = re.findall(
        r"PluginField\{(k\w+), nullptr, nvinfer1::PluginFieldType::(k\w+), 1\}", constructor
    )
    assert tuple((_constant(header, name), kind) for name, kind in fields) == ATTENTION.fields
