"""Error plots: an exact match says so instead of drawing empty axes; exact zeros stand out."""

from __future__ import annotations

import numpy as np

from graphfix.validation.compare import Tolerance, compare_output
from graphfix.validation.plot import (
    EXACT_COLOUR,
    error_heatmap_figure,
    error_histogram_figure,
)

TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)


def _texts(figure) -> list[str]:
    return [t.get_text() for t in figure.axes[0].texts]


def test_an_exact_match_says_there_is_no_error_to_plot() -> None:
    reference = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    comparison = compare_output("y", reference, reference.copy(), TOLERANCE)
    for make in (error_histogram_figure, error_heatmap_figure):
        figure = make(comparison, reference, reference.copy())
        assert _texts(figure) == ["no error to plot: all 32 elements agree exactly"]
        assert not figure.axes[0].images and not figure.axes[0].patches


def test_heat_map_draws_exact_zeros_apart_from_tiny_errors() -> None:
    from matplotlib.colors import to_rgba

    rng = np.random.default_rng(1)
    reference = rng.standard_normal((6, 10))
    candidate = reference.copy()
    candidate[0, 0] += 1e-12  # far below the largest error: the bottom of the colour scale
    candidate[5, 9] += 1e-1
    comparison = compare_output("y", reference, candidate, TOLERANCE)
    figure = error_heatmap_figure(comparison, reference, candidate)
    image = figure.axes[0].images[0]
    colours = image.to_rgba(image.get_array())
    exact, tiny, large = colours[1, 1], colours[0, 0], colours[5, 9]
    assert tuple(exact) == to_rgba(EXACT_COLOUR)
    assert not np.allclose(exact, tiny) and not np.allclose(tiny, large)
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["exact (error 0)"]
    histogram = error_histogram_figure(comparison, reference, candidate)
    assert not _texts(histogram) and "58 exact" in histogram.axes[0].get_title()
