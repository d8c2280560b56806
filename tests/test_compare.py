"""Per-output statistics, the tolerance check and the text histogram, on arrays built in place."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from graphfix.validation.compare import (
    DEFAULT_TOLERANCES,
    HistogramBin,
    Tolerance,
    compare_output,
    error_histogram,
    format_comparison,
    text_histogram,
)
from graphfix.validation.inputs import ValidationUsageError

STRICT = Tolerance(atol=1e-6, rtol=1e-6)


def _ramp(shape=(4, 5)):
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1) / 10


def test_identical_outputs_pass_with_zero_error():
    ref = _ramp()
    c = compare_output("y", ref, ref.copy(), STRICT)
    assert c.passed and c.mismatches == 0 and c.problem is None
    assert c.absolute.max == 0 and c.relative.max == 0
    assert c.cosine_similarity == pytest.approx(1.0, abs=1e-12)
    assert c.required_atol == 0 and c.required_rtol == 0
    assert c.histogram == (HistogramBin(0.0, 0.0, 20),)


def test_single_outlier_is_located_and_sized():
    ref = _ramp()
    cand = ref.copy()
    cand[2, 3] += 0.5
    c = compare_output("y", ref, cand, Tolerance(atol=1e-3, rtol=1e-3))
    assert not c.passed
    assert c.mismatches == 1
    assert c.absolute.argmax == (2, 3)
    assert c.absolute.max == pytest.approx(0.5, abs=1e-6)
    assert c.reference_at_max == pytest.approx(ref[2, 3])
    assert c.candidate_at_max == pytest.approx(cand[2, 3])
    assert c.required_atol == pytest.approx(0.5, abs=1e-6)
    assert c.required_rtol == pytest.approx(0.5 / ref[2, 3], rel=1e-6)
    assert compare_output("y", ref, cand, Tolerance(atol=0.5 + 1e-6, rtol=0)).passed


def test_statistics_match_numpy():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((50, 40))
    cand = ref + rng.standard_normal((50, 40)) * 1e-3
    c = compare_output("y", ref, cand, STRICT)
    err = np.abs(cand - ref)
    rel = err / np.abs(ref)
    assert c.absolute.mean == pytest.approx(err.mean(), rel=1e-12)
    assert c.absolute.std == pytest.approx(err.std(), rel=1e-12)
    assert c.absolute.median == pytest.approx(np.median(err), rel=1e-12)
    for got, q in ((c.absolute.p90, 90), (c.absolute.p95, 95), (c.absolute.p99, 99)):
        assert got == pytest.approx(np.percentile(err, q), rel=1e-12)
    assert c.relative.max == pytest.approx(rel.max(), rel=1e-12)
    assert c.absolute.argmax == np.unravel_index(np.argmax(err), err.shape)
    expected_cos = np.dot(ref.ravel(), cand.ravel()) / np.linalg.norm(ref) / np.linalg.norm(cand)
    assert c.cosine_similarity == pytest.approx(expected_cos, abs=1e-12)


def test_element_passes_on_either_tolerance_like_polygraphy():
    ref = np.array([1000.0, 1e-3])
    cand = np.array([1000.5, 1e-3 + 1e-6])  # abs 0.5 (rel 5e-4); abs 1e-6 (rel 1e-3)
    assert compare_output("y", ref, cand, Tolerance(atol=1e-5, rtol=1e-3)).passed
    assert not compare_output("y", ref, cand, Tolerance(atol=1e-7, rtol=1e-4)).passed


def test_zero_reference_gives_epsilon_relative_error():
    c = compare_output(
        "y", np.array([0.0, 1.0]), np.array([1e-8, 1.0]), Tolerance(atol=1e-7, rtol=0)
    )
    assert c.passed
    assert c.relative.max == pytest.approx(1e-8 / 2.220446049250313e-16)


def test_quantile_check_tolerates_rare_outliers():
    ref = np.zeros(1000)
    cand = np.full(1000, 1e-6)
    cand[7] = 1.0
    elementwise = compare_output("y", ref, cand, Tolerance(atol=1e-5, rtol=0))
    assert not elementwise.passed and elementwise.mismatches == 1
    q = compare_output("y", ref, cand, Tolerance(atol=1e-5, rtol=0, quantile=0.99))
    assert q.passed
    assert q.required_atol == pytest.approx(1e-6)
    assert q.mismatches == 1  # still reported


def test_nan_and_inf_on_both_sides_fail_unless_allowed_and_one_sided_nan_always_fails():
    ref = np.array([np.nan, np.inf, 1.0, 2.0])
    same = compare_output("y", ref, ref.copy(), STRICT)
    assert not same.passed  # a NaN output has not been validated, even when both sides agree
    assert same.nonfinite_both == 2 and same.nonfinite_mismatches == 2 and same.mismatches == 2
    assert "NaN/inf on both sides at 2 element(s): not agreement" in format_comparison(same)
    allowed = dataclasses.replace(STRICT, allow_nonfinite=True)
    expected = compare_output("y", ref, ref.copy(), allowed)
    assert expected.passed and expected.nonfinite_mismatches == 0 and expected.nonfinite_both == 2
    assert "NaN/inf on both sides allowed" in allowed.describe()
    cand = np.array([np.nan, np.inf, np.nan, 2.0])
    c = compare_output("y", ref, cand, allowed)
    assert not c.passed
    assert c.nonfinite_mismatches == 1 and c.mismatches == 1
    assert np.isfinite(c.absolute.max) and c.absolute.max == 0


def test_all_nan_on_both_sides_is_a_finding_not_a_pass():
    ref = np.full((2, 3), np.nan, dtype=np.float32)
    c = compare_output("y", ref, ref.copy(), STRICT)
    assert not c.passed and c.absolute is None and c.nonfinite_both == 6
    assert "every position is NaN/inf on one side or both" in c.problem


def test_shape_mismatch_is_a_failure_without_statistics():
    c = compare_output("y", np.zeros((2, 3)), np.zeros((3, 2)), STRICT)
    assert not c.passed and c.absolute is None
    assert "shape differs: reference [2, 3], candidate [3, 2]" in c.problem


def test_histogram_counts_per_decade_and_folds_tiny_errors():
    errors = np.array([0, 0, 3e-7, 5e-7, 2e-3, 0.5])
    assert error_histogram(errors) == (
        HistogramBin(0.0, 0.0, 2),
        HistogramBin(1e-7, 1e-6, 2),
        HistogramBin(1e-6, 1e-5, 0),
        HistogramBin(1e-5, 1e-4, 0),
        HistogramBin(1e-4, 1e-3, 0),
        HistogramBin(1e-3, 1e-2, 1),
        HistogramBin(1e-2, 1e-1, 0),
        HistogramBin(1e-1, 1.0, 1),
    )
    folded = error_histogram(np.array([1e-20, 1.0]))
    assert len(folded) == 10
    assert folded[0] == HistogramBin(0.0, 1e-8, 1)
    assert folded[-1] == HistogramBin(1.0, 10.0, 1)


def test_text_histogram_lines():
    text = text_histogram(
        (HistogramBin(0.0, 0.0, 5), HistogramBin(1e-7, 1e-6, 10), HistogramBin(1e-6, 1e-5, 0)),
        width=10,
    )
    assert text.splitlines() == [
        "== 0           |  5 | #####",
        "[1e-07, 1e-06) | 10 | ##########",
        "[1e-06, 1e-05) |  0 |",
    ]


def test_format_comparison_shows_verdict_stats_and_histogram():
    ref = _ramp()
    cand = ref.copy()
    cand[1, 1] += 0.25
    text = format_comparison(compare_output("logits", ref, cand, DEFAULT_TOLERANCES["fp32"]))
    assert text.startswith("output 'logits' float32 [4, 5]: FAIL")
    assert "largest abs error at [1, 1]" in text
    assert "minimum tolerance to pass (elementwise): atol 0.25 or rtol" in text
    assert "abs error histogram" in text and "[1e-01, 1e+00) |  1 |" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"atol": -1, "rtol": 0}, "atol must be"),
        ({"atol": 0, "rtol": float("nan")}, "rtol must be"),
        ({"atol": 0, "rtol": 0, "quantile": 0}, "quantile must be in (0, 1]"),
    ],
)
def test_bad_tolerances_are_usage_errors(kwargs, message):
    with pytest.raises(ValidationUsageError, match=re.escape(message)):
        Tolerance(**kwargs)
