"""`--plot DIR`: the candidate's error along graph depth, with the suspects marked."""

from __future__ import annotations

import os
from pathlib import Path

from graphfix.precision.locate.report import LocateReport

PLOT_NAME = "locate_error_by_depth.png"


def error_by_depth_figure(report: LocateReport):
    """A matplotlib Figure: relative error per intermediate tensor against topological position;
    tensors holding NaN/inf where the reference is finite sit on the top edge as triangles."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.5), dpi=110)
    axes = figure.add_subplot()
    finite = [t for t in report.tensors if not t.nonfinite and t.error > 0]
    broken = [t for t in report.tensors if t.nonfinite]
    axes.scatter(
        [t.position for t in finite],
        [t.error for t in finite],
        s=8,
        color="tab:blue",
        label="relative error ‖c−r‖/‖r‖",
    )
    values = [t.error for t in finite] or [1e-4]
    top = max(values) * 10
    axes.set_yscale("log")
    if broken:
        axes.scatter(
            [t.position for t in broken],
            [top] * len(broken),
            marker="^",
            s=18,
            color="tab:gray",
            label="NaN/inf where the reference is finite",
        )
    for s in report.suspects:
        y = top if s.nonfinite else max(s.error, min(values))
        axes.scatter(
            [s.position], [y], s=90, facecolors="none", edgecolors="tab:red", linewidths=1.8
        )
        axes.annotate(
            f"{s.rank}. {s.op_type}",
            (s.position, y),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=8,
            color="tab:red",
        )
    axes.set_xlabel("graph depth (topological position of the producing node)")
    axes.set_ylabel("relative error vs float32")
    axes.set_title(f"{report.precision} candidate against the float32 reference (suspects circled)")
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    return figure


def plot_locate(report: LocateReport, directory: str | os.PathLike[str]) -> Path:
    """Write the error-by-depth PNG into `directory` (created if needed); return its path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PLOT_NAME
    error_by_depth_figure(report).savefig(path)
    return path
