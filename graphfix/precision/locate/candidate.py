"""The candidate `locate` compares with the reference: a user's ONNX, or MODEL converted.

`--precision` converts MODEL with `graphfix.precision.convert.convert_precision` when that module
is present, else with the minimal internal builder (`internal_fp16`, a stand-in; the report says
which one ran).  Remedies are applied here too: nodes kept in float32, attention strategies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from graphfix.precision.locate.internal_fp16 import convert_minimal


@dataclass(frozen=True)
class BuiltCandidate:
    """A converted model and how it was made."""

    model: onnx.ModelProto
    converter: str  # "convert_precision" or "internal (minimal stand-in)"


def converter_name() -> str:
    return (
        "convert_precision" if _convert_precision() is not None else "internal (minimal stand-in)"
    )


def build_candidate(
    model: onnx.ModelProto,
    *,
    precision: str,
    keep: Sequence[str] = (),
    attention: Sequence[tuple[int, str]] = (),
) -> BuiltCandidate:
    """`model` converted to `precision`, keeping the nodes `keep` names in float32, then the
    attention strategy of each (block, strategy) in `attention` applied."""
    convert = _convert_precision()
    if convert is not None:
        result = convert(model, to=precision, keep=list(keep) or None)
        built = BuiltCandidate(result.model, "convert_precision")
    else:
        converted = convert_minimal(model, to=precision, keep=keep)
        built = BuiltCandidate(converted, "internal (minimal stand-in)")
    for block, strategy in attention:
        from graphfix.attention.rewrite import fix_attention

        fixed = fix_attention(built.model, strategy=strategy, select=[block])
        built = BuiltCandidate(fixed.model, built.converter)
    return built


def _convert_precision():
    try:
        from graphfix.precision.convert import convert_precision
    except ImportError:
        return None
    return convert_precision
