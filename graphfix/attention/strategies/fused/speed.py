"""What the fused node's speed is, measured, for one block: the note `fused_plugin` prints.

A float16/bfloat16 block without softcap runs on cuDNN's fused attention where cuDNN loads (at
cuDNN's speed), and gets no note. float32 and softcap always run on graphfix's own kernels, whose
speed against the unfused chain depends on the element type and the head dimension (which kernel
takes it). The ratios below are the H200's, own time over the unfused chain's in the same type,
by CUDA-graph replay (`benchmarks/attention_bench.py`), the range over three runs: the table of
notes/attention_plugin.md, "Results: issue 22, session 10's final code".
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.graph.index import GraphIndex

_SIXTEEN_BIT = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


@dataclass(frozen=True)
class MeasuredSpeed:
    """The own kernel that takes head dims up to `widest` (multiples of `multiple`) for one
    element type, and its time over the unfused chain's on the benchmark shapes measured."""

    float32: bool
    widest: int
    multiple: int
    kernel: str
    low: float
    high: float
    shapes: str


# In order of `widest`, per type; a head dim past the last row, or not of its multiple, runs on
# the fallback kernel.
SPEEDS = (
    MeasuredSpeed(True, 72, 4, "3xTF32 wgmma kernel", 0.31, 0.42, "SDXL, SigLIP, BERT, SD 1.5"),
    MeasuredSpeed(True, 128, 4, "3xTF32 wgmma kernel", 0.18, 0.48, "Llama 4k causal, Flux-like"),
    MeasuredSpeed(True, 256, 4, "3xTF32 wgmma kernel", 0.38, 0.38, "Gemma-2-like causal"),
    MeasuredSpeed(
        False, 256, 8, "wgmma kernel", 0.05, 0.32, "SDXL, SigLIP, Llama, BERT, Flux, Gemma-2"
    ),
)
# The fallback kernel, float32 at head dim 256 (Gemma-2-like causal, issue 22's measurement).
FALLBACK_SLOWDOWN = 4.5


def head_dims(index: GraphIndex, match: AttentionMatch) -> tuple[int | None, int | None]:
    """D (Q's contracted axis at Q·Kᵀ) and Dv (V's axis kept by P·V), where the graph knows them;
    a sink key adds its 8 columns to D (fused/sink.py)."""
    layout = match.layout
    d = _axis(
        index.shape(match.q), _einsum_axis(layout.qk_equation if layout else None, 0, summed=True)
    )
    dv = _axis(
        index.shape(match.v), _einsum_axis(layout.pv_equation if layout else None, 1, summed=False)
    )
    if d is not None and match.sink is not None:
        d += 8
    return d, dv


def _einsum_axis(equation: str | None, operand: int, *, summed: bool) -> int:
    """The axis of Einsum operand `operand` that the product sums over (`summed`: Q's D at Q·Kᵀ)
    or that only it brings to the output (V's Dv at P·V); -1, a MatMul's last, otherwise."""
    if equation is None or "->" not in equation or "." in equation:
        return -1
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    mine, other = terms[operand], terms[1 - operand]
    picked = [c for c in mine if (c in other) == summed and (c in output) != summed]
    return mine.index(picked[0]) if len(picked) == 1 else -1


def _axis(shape: tuple | None, axis: int) -> int | None:
    if not shape or axis >= len(shape):
        return None
    value = shape[axis]
    return value if isinstance(value, int) and value > 0 else None


def speed_note(elem_type: int | None, d: int | None, dv: int | None, *, softcap: bool) -> str:
    """The note for a block of this element type and head dims ('' for 16-bit blocks cuDNN runs)."""
    float32 = elem_type == onnx.TensorProto.FLOAT
    if not float32 and not (softcap and elem_type in _SIXTEEN_BIT):
        return ""
    what = "float32" if float32 else "softcap"
    if d is None or dv is None:
        low, high = min(s.low for s in SPEEDS), max(s.high for s in SPEEDS)
        return (
            f"note: {what} runs on graphfix's own kernels, whose speed depends on the head dim, "
            f"unknown here (on an H200: {low:.2f}-{high:.2f}x the unfused chain's time up to head "
            "dim 256; notes/attention_plugin.md)"
        )
    widest = max(d, dv)
    for speed in SPEEDS:
        if speed.float32 == float32 and widest <= speed.widest:
            if d % speed.multiple or dv % speed.multiple:
                break
            span = (
                f"{speed.low:.2f}"
                if speed.low == speed.high
                else f"{speed.low:.2f}-{speed.high:.2f}"
            )
            return (
                f"note: {what} at head dim {widest} runs on graphfix's {speed.kernel}, "
                f"{span}x the unfused chain's time on an H200 ({speed.shapes}; "
                "notes/attention_plugin.md)"
            )
    return (
        f"note: {what} at head dim {widest} runs on graphfix's fallback kernel, slower than the "
        f"unfused chain ({FALLBACK_SLOWDOWN}x its time in float32 at head dim 256 on an H200; "
        "notes/attention_plugin.md)"
    )
