"""The candidate `locate` compares with the reference: a user's ONNX, or MODEL converted.

`--precision` converts MODEL with `graphfix.precision.convert.convert_precision` when that module
is present, else with the minimal builder (`internal_fp16`; the report says which one ran).

The remedy search builds its trials on a base converter: "minimal" (default: every node in the
low type except those a trial proves must stay float32 — so the float32 set is exactly what the
search found necessary on these inputs) or "convert_precision" (its conservative default islands
plus the remedies).  Remedies: nodes kept in float32, attention strategies.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import onnx

from graphfix.precision.locate.internal_fp16 import convert_minimal


@dataclass(frozen=True)
class BuiltCandidate:
    """A converted model and how it was made."""

    model: onnx.ModelProto
    converter: str  # "convert_precision" or "graphfix's minimal converter"


BASES = ("minimal", "convert_precision")


def build_candidate(
    model: onnx.ModelProto,
    *,
    precision: str,
    keep: Sequence[str] = (),
    attention: Sequence[tuple[int, str, Sequence[str]]] = (),
    accumulate: Collection[int] = (),
    base: str | None = None,
) -> BuiltCandidate:
    """`model` converted to `precision`, keeping the nodes `keep` names in float32, then the
    attention strategy of each (block, strategy, chain nodes) in `attention` applied (with float32
    accumulation for the blocks in `accumulate`: native_attention's option).

    A block the matcher no longer finds in the converted graph (a conversion's Casts can split
    its chain) is kept in float32 whole instead: its chain nodes join `keep`.
    `base`: "convert_precision" (the default where it exists) or "minimal"."""
    from graphfix.attention.matcher import find_attention
    from graphfix.attention.rewrite import fix_attention

    keep = list(keep)
    built = _convert(model, precision, keep, base)
    found = {m.index for m in find_attention(built.model)} if attention else set()
    lost = [nodes for block, _, nodes in attention if block not in found]
    if lost:
        keep += [n for nodes in lost for n in nodes if n not in keep]
        built = _convert(model, precision, keep, base)
    # last block first: a strategy that removes a block's Softmax renumbers the blocks after it
    for block, strategy, _ in sorted(attention, reverse=True):
        if block in found:
            fixed = fix_attention(
                built.model,
                strategy=strategy,
                select=[block],
                accumulate="float32" if block in accumulate else None,
            )
            built = BuiltCandidate(fixed.model, built.converter)
    return built


def _convert(
    model: onnx.ModelProto, precision: str, keep: Sequence[str], base: str | None
) -> BuiltCandidate:
    if base in (None, "convert_precision"):
        from graphfix.precision.convert import convert_precision

        result = convert_precision(model, to=precision, keep=list(keep) or None)
        return BuiltCandidate(result.model, "convert_precision")
    return BuiltCandidate(
        convert_minimal(model, to=precision, keep=keep), "graphfix's minimal converter"
    )
