"""Per-block bar chart of quantized vs float conv/matmul FLOPs (the Amdahl ceiling, block by block).

matplotlib is imported only here, through its object API (no pyplot), as in validation/plot.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from graphfix.errors import EnvironmentProblem, UsageError
from graphfix.qdq.report import QdqReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COVERAGE_PNG = "qdq_coverage.png"


def plot_coverage(report: QdqReport, directory: str | os.PathLike[str]) -> Path:
    """Write `qdq_coverage.png` into `directory` and return its path."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--plot {folder} is a file; give a folder to write the PNG into")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / COVERAGE_PNG
    coverage_figure(report).savefig(path, dpi=110)
    return path


def coverage_figure(report: QdqReport) -> Figure:
    """Horizontal stacked bars per block: FLOPs that run quantized, FLOPs left in float."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise EnvironmentProblem(
            f"--plot needs matplotlib ({exc}); install it with pip install 'graphfix[plot]'"
        ) from exc

    blocks = [b for b in report.coverage.blocks if b.flops_total] or list(report.coverage.blocks)
    figure = Figure(figsize=(8, 1.2 + 0.35 * max(len(blocks), 1)), layout="constrained")
    axes = figure.add_subplot()
    names = [b.block for b in blocks]
    quantized = [b.flops_quantized / 1e6 for b in blocks]
    floating = [(b.flops_total - b.flops_quantized) / 1e6 for b in blocks]
    positions = range(len(blocks))
    axes.barh(positions, quantized, color="#2a9d8f", label="runs INT8/FP8")
    axes.barh(positions, floating, left=quantized, color="#e76f51", label="stays float")
    for y, block in zip(positions, blocks, strict=True):
        axes.text(
            block.flops_total / 1e6, y, f" {100 * block.fraction:.0f}%", va="center", fontsize=8
        )
    axes.set_yticks(list(positions), names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("MFLOPs (conv, matmul)")
    total = report.coverage
    axes.set_title(
        f"Q/DQ coverage: {100 * total.fraction:.1f}% of {total.flops_total / 1e6:.1f} MFLOPs quantized",
        fontsize=10,
    )
    axes.legend(loc="lower right", fontsize=8)
    return figure
