"""graphfix: ONNX graph surgery so TensorRT engines come out accurate.

Public API::

    import graphfix
    matches = graphfix.find_attention("model.onnx")
    fixed = graphfix.break_attention_fusion(model)            # a new ModelProto
    result = graphfix.fix_attention(model, strategy="plugin")  # model + report
    report = graphfix.locate("model.onnx", precision="float16")  # where float16 diverges
    report = graphfix.inspect_qdq("unet.int8.onnx")            # Q/DQ lint + FLOP coverage
    fixed = graphfix.fix_qdq("unet.int8.onnx", reference="unet.onnx")  # model + report
    half = graphfix.convert_precision(model, to="float16")     # float32 islands + report
"""

from typing import TYPE_CHECKING

# Every public name loads on first use (`graphfix.X`, `from graphfix import X`): a command
# imports only what it runs (`graphfix precision` starts without the matcher's strategies,
# locate, the Q/DQ lint, validation or plotting).
_LAZY = {
    "AttentionKind": "graphfix.attention.match_types",
    "AttentionMatch": "graphfix.attention.match_types",
    "AttentionOpNode": "graphfix.attention.match_types",
    "AttentionScan": "graphfix.attention.match_types",
    "Scale": "graphfix.attention.match_types",
    "SkippedSoftmax": "graphfix.attention.match_types",
    "find_attention": "graphfix.attention.matcher",
    "scan_attention": "graphfix.attention.matcher",
    "BlockOutcome": "graphfix.attention.report",
    "FixReport": "graphfix.attention.report",
    "FixResult": "graphfix.attention.report",
    "break_attention_fusion": "graphfix.attention.rewrite",
    "fix_attention": "graphfix.attention.rewrite",
    "STRATEGIES": "graphfix.attention.strategies",
    "FallbackKind": "graphfix.attention.strategies.base",
    "GraphfixError": "graphfix.errors",
    "ModelLoadError": "graphfix.errors",
    "OutputPathError": "graphfix.errors",
    "PluginBuildError": "graphfix.errors",
    "SelectionError": "graphfix.errors",
    "UnsupportedModelError": "graphfix.errors",
    "LoadedModel": "graphfix.model_io",
    "SavedModel": "graphfix.model_io",
    "load_model": "graphfix.model_io",
    "save_model": "graphfix.model_io",
    "with_reference_ops": "graphfix.plugins.reference",
    "convert_precision": "graphfix.precision.convert",
    "LocateReport": "graphfix.precision.locate",
    "locate": "graphfix.precision.locate",
    "emulate_low_precision": "graphfix.validation.low_precision",
    "NormKind": "graphfix.precision.norm_types",
    "NormFusionReport": "graphfix.precision.norms",
    "NormFusionResult": "graphfix.precision.norms",
    "fuse_norms": "graphfix.precision.norms",
    "Island": "graphfix.precision.report",
    "PrecisionReport": "graphfix.precision.report",
    "PrecisionResult": "graphfix.precision.report",
    "fix_qdq": "graphfix.qdq.fix",
    "inspect_qdq": "graphfix.qdq.lint",
    "QdqFixReport": "graphfix.qdq.report",
    "QdqFixResult": "graphfix.qdq.report",
    "QdqReport": "graphfix.qdq.report",
    "Selection": "graphfix.selectors",
    "Selector": "graphfix.selectors",
    "parse_selectors": "graphfix.selectors",
    "select_nodes": "graphfix.selectors",
    "ValidationReport": "graphfix.validation.validate",
    "ValidationUsageError": "graphfix.validation.validate",
    "validate": "graphfix.validation.validate",
    "draw_attention_block": "graphfix.attention.draw",
    "draw_before_after": "graphfix.attention.draw",
    "plot_report": "graphfix.validation.plot",
    "plot_locate": "graphfix.precision.locate.plot",
    "error_by_depth_figure": "graphfix.precision.locate.plot",
    "plot_coverage": "graphfix.qdq.plot",
    "error_histogram_figure": "graphfix.validation.plot",
    "error_heatmap_figure": "graphfix.validation.plot",
}

if TYPE_CHECKING:  # static analysis sees the names; at run time they load lazily
    from graphfix.attention.match_types import (
        AttentionKind,
        AttentionMatch,
        AttentionOpNode,
        AttentionScan,
        Scale,
        SkippedSoftmax,
    )
    from graphfix.attention.matcher import find_attention, scan_attention
    from graphfix.attention.report import BlockOutcome, FixReport, FixResult
    from graphfix.attention.rewrite import break_attention_fusion, fix_attention
    from graphfix.attention.strategies import STRATEGIES
    from graphfix.attention.strategies.base import FallbackKind
    from graphfix.errors import (
        GraphfixError,
        ModelLoadError,
        OutputPathError,
        PluginBuildError,
        SelectionError,
        UnsupportedModelError,
    )
    from graphfix.model_io import LoadedModel, SavedModel, load_model, save_model
    from graphfix.plugins.reference import with_reference_ops
    from graphfix.precision.convert import convert_precision
    from graphfix.precision.locate import LocateReport, locate
    from graphfix.precision.norm_types import NormKind
    from graphfix.precision.norms import NormFusionReport, NormFusionResult, fuse_norms
    from graphfix.precision.report import Island, PrecisionReport, PrecisionResult
    from graphfix.qdq.fix import fix_qdq
    from graphfix.qdq.lint import inspect_qdq
    from graphfix.qdq.report import QdqFixReport, QdqFixResult, QdqReport
    from graphfix.selectors import Selection, Selector, parse_selectors, select_nodes
    from graphfix.validation.low_precision import emulate_low_precision
    from graphfix.validation.validate import ValidationReport, ValidationUsageError, validate


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'graphfix' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "AttentionKind",
    "AttentionMatch",
    "AttentionOpNode",
    "AttentionScan",
    "BlockOutcome",
    "FallbackKind",
    "FixReport",
    "FixResult",
    "GraphfixError",
    "Island",
    "LoadedModel",
    "LocateReport",
    "ModelLoadError",
    "NormFusionReport",
    "NormFusionResult",
    "NormKind",
    "OutputPathError",
    "PluginBuildError",
    "PrecisionReport",
    "PrecisionResult",
    "QdqFixReport",
    "QdqFixResult",
    "QdqReport",
    "SavedModel",
    "Scale",
    "Selection",
    "SelectionError",
    "Selector",
    "SkippedSoftmax",
    "UnsupportedModelError",
    "ValidationReport",
    "ValidationUsageError",
    "break_attention_fusion",
    "convert_precision",
    "draw_attention_block",
    "draw_before_after",
    "emulate_low_precision",
    "error_by_depth_figure",
    "error_heatmap_figure",
    "error_histogram_figure",
    "find_attention",
    "fix_attention",
    "fix_qdq",
    "fuse_norms",
    "inspect_qdq",
    "load_model",
    "locate",
    "parse_selectors",
    "plot_coverage",
    "plot_locate",
    "plot_report",
    "save_model",
    "scan_attention",
    "select_nodes",
    "validate",
    "with_reference_ops",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
