"""PNG figures of a validation report: an error histogram and an error heat map per output.

matplotlib is imported only here, and only through its object API (no pyplot, no global backend
switch), so figures render in notebooks as they are and save anywhere without a display.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from graphfix.errors import EnvironmentProblem
from graphfix.validation.compare import OutputComparison
from graphfix.validation.inputs import ValidationUsageError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from graphfix.validation.validate import ValidationReport

EXACT_COLOUR = "#2ca02c"  # green: not in magma, so an exact zero never reads as a tiny error
_MAX_CELLS = 512  # heat map rows/columns beyond this are max-pooled, so a hot spot stays visible


def plot_report(report: ValidationReport, directory: str | os.PathLike[str]) -> tuple[Path, ...]:
    """Write `<output>.error_histogram.png` and `<output>.error_heatmap.png` per output."""
    folder = prepare_plot_folder(directory)
    written: list[Path] = []
    used: set[str] = set()
    for comparison in report.outputs:
        if comparison.absolute is None:
            continue
        stem = _file_stem(comparison.name, used)
        reference = report.reference_outputs[comparison.name]
        candidate = report.candidate_outputs[comparison.name]
        for suffix, figure in (
            ("error_histogram", error_histogram_figure(comparison, reference, candidate)),
            ("error_heatmap", error_heatmap_figure(comparison, reference, candidate)),
        ):
            path = folder / f"{stem}.{suffix}.png"
            try:
                figure.savefig(path, dpi=110)
            except OSError as exc:
                raise ValidationUsageError(
                    f"cannot write the plot {path}: {exc.strerror or exc}; give --plot a folder "
                    "you can write to"
                ) from exc
            written.append(path)
    return tuple(written)


def prepare_plot_folder(directory: str | os.PathLike[str]) -> Path:
    """The folder plots go into, created if missing; ValidationUsageError when it cannot be,
    EnvironmentProblem when matplotlib is missing (checked here, before any model runs)."""
    _require_matplotlib()
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise ValidationUsageError(f"--plot {folder} is a file; give a folder to write PNGs into")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValidationUsageError(
            f"cannot create the plot folder {folder}: {exc.strerror or exc}; give --plot a folder "
            "you can write to"
        ) from exc
    if not os.access(folder, os.W_OK):
        raise ValidationUsageError(
            f"the plot folder {folder} is not writable; give --plot a folder you can write to"
        )
    return folder


def error_histogram_figure(
    comparison: OutputComparison, reference: np.ndarray, candidate: np.ndarray
) -> Figure:
    """Absolute errors on log-spaced bins, with the tolerance marked."""
    errors = _abs_error(reference, candidate).ravel()
    figure = _figure(figsize=(7, 4))
    axes = figure.add_subplot()
    nonzero = errors[errors > 0]
    zeros = errors.size - nonzero.size
    if nonzero.size:
        low, high = np.log10(nonzero.min()), np.log10(nonzero.max())
        edges = np.logspace(np.floor(low), np.ceil(high) + (high == np.ceil(high)), 41)
        axes.hist(nonzero, bins=edges, color="tab:blue")
        axes.set_xscale("log")
        axes.axvline(
            comparison.tolerance.atol,
            color="tab:red",
            linestyle="--",
            label=f"atol {comparison.tolerance.atol:g}",
        )
        axes.legend()
    else:
        _no_error(axes, errors.size)
    axes.set_xlabel("|candidate - reference|")
    axes.set_ylabel("elements")
    verdict = "PASS" if comparison.passed else "FAIL"
    axes.set_title(
        f"{comparison.name} {list(comparison.shape)}: {verdict}, max {comparison.absolute.max:.3g}"
        + (f", {zeros} exact" if zeros else ""),
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def error_heatmap_figure(
    comparison: OutputComparison, reference: np.ndarray, candidate: np.ndarray
) -> Figure:
    """Absolute error laid out as rows (all leading dims) × last dim, log colour scale."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Patch

    errors = _abs_error(reference, candidate)
    grid = errors.reshape(-1, errors.shape[-1]) if errors.ndim >= 2 else errors.reshape(1, -1)
    grid, pooled = _pool(grid)
    figure = _figure(figsize=(7, 5))
    axes = figure.add_subplot()
    positive = grid[grid > 0]
    if positive.size:
        vmax = float(positive.max())
        norm = LogNorm(vmin=max(float(positive.min()), vmax * 1e-8), vmax=vmax)
        # exact zeros are masked and drawn in a colour magma never uses; tiny errors stay dark
        shown = np.ma.masked_where(grid == 0, np.maximum(grid, norm.vmin))
        cmap = colormaps["magma"].with_extremes(bad=EXACT_COLOUR)
        image = axes.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
        figure.colorbar(image, ax=axes, label="|candidate - reference|")
        if (grid == 0).any():
            axes.legend(
                handles=[Patch(color=EXACT_COLOUR, label="exact (error 0)")],
                loc="upper right",
                fontsize=8,
            )
    else:
        _no_error(axes, errors.size)
    lead = "x".join(str(d) for d in comparison.shape[:-1]) or "1"
    axes.set_xlabel(f"last dimension ({comparison.shape[-1] if comparison.shape else 1})")
    axes.set_ylabel(f"flattened leading dimensions ({lead})" + (", max-pooled" if pooled else ""))
    axes.set_title(f"{comparison.name}: absolute error", fontsize=10)
    figure.tight_layout()
    return figure


def _no_error(axes, size: int) -> None:
    axes.text(
        0.5,
        0.5,
        f"no error to plot: all {size} elements agree exactly",
        ha="center",
        va="center",
        transform=axes.transAxes,
    )
    axes.set_xticks([])
    axes.set_yticks([])


def _require_matplotlib() -> None:
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(
            f"plots need matplotlib ({exc}); install it with pip install 'graphfix[plot]'"
        ) from exc


def _figure(*, figsize: tuple[float, float]) -> Figure:
    _require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _abs_error(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    r, c = reference.astype(np.float64), candidate.astype(np.float64)
    errors = np.abs(c - r)
    return np.where(np.isfinite(errors), errors, 0.0)


def _pool(grid: np.ndarray) -> tuple[np.ndarray, bool]:
    rows, cols = grid.shape
    fr, fc = -(-rows // _MAX_CELLS), -(-cols // _MAX_CELLS)
    if fr == 1 and fc == 1:
        return grid, False
    padded = np.zeros((-(-rows // fr) * fr, -(-cols // fc) * fc))
    padded[:rows, :cols] = grid
    return padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(
        axis=(1, 3)
    ), True


def _file_stem(name: str, used: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "output"
    candidate, n = stem, 1
    while candidate in used:
        n += 1
        candidate = f"{stem}_{n}"
    used.add(candidate)
    return candidate
