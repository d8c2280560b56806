"""Per-output error statistics between a reference and a candidate, and the pass/fail check.

Definitions follow polygraphy's comparator so the numbers mean what its users expect:
absolute error |c - r|; relative error |c - r| / |r| (a zero in r counts as 2.2e-16); an element
passes when its absolute error is within `atol` OR its relative error within `rtol`.  With a
`quantile` q the check is instead on the q-quantiles of both errors (again either may pass).
Non-finite values never count as agreement: NaN/inf in the candidate fails the output, and so
does NaN (or the same infinity) on both sides — a model whose output is NaN has not been
validated — unless the tolerance says it is expected (`allow_nonfinite`).  Non-finite positions
are counted and left out of the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from graphfix.validation.inputs import ValidationUsageError

_EPSILON = 2.220446049250313e-16
_MAX_DECADES = 10
_BAR_WIDTH = 40


@dataclass(frozen=True)
class Tolerance:
    """When an output passes: elementwise (quantile None) or on the q-quantile of the errors."""

    atol: float
    rtol: float
    quantile: float | None = None
    allow_nonfinite: bool = False  # NaN, or the same infinity, on both sides counts as agreement

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValidationUsageError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.quantile is not None and not 0 < self.quantile <= 1:
            raise ValidationUsageError(f"quantile must be in (0, 1], got {self.quantile!r}")

    def describe(self) -> str:
        rule = f"abs error <= {self.atol:g} or rel error <= {self.rtol:g}"
        if self.allow_nonfinite:
            rule += ", NaN/inf on both sides allowed"
        if self.quantile is None:
            return f"every element: {rule}"
        return f"{self.quantile:g}-quantile: {rule}"


# Defaults by the lowest precision the candidate computes in (see `precision_of` in validate).
DEFAULT_TOLERANCES = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-3),
    "fp16": Tolerance(atol=1e-2, rtol=1e-2),
    "bf16": Tolerance(atol=5e-2, rtol=5e-2),
}


@dataclass(frozen=True)
class ErrorStats:
    """Summary of one error array; `argmax` indexes the output tensor."""

    mean: float
    median: float
    std: float
    p90: float
    p95: float
    p99: float
    max: float
    argmax: tuple[int, ...]


@dataclass(frozen=True)
class HistogramBin:
    """Elements with error in [low, high); low == high == 0 is the bin of exact zeros."""

    low: float
    high: float
    count: int


@dataclass(frozen=True)
class OutputComparison:
    """How one output of the candidate differs from the reference, and the verdict."""

    name: str
    shape: tuple[int, ...]
    reference_dtype: str
    candidate_dtype: str
    tolerance: Tolerance
    passed: bool
    size: int
    mismatches: int  # elements failing the elementwise check (non-finite disagreements included)
    nonfinite_mismatches: int  # positions NaN/inf on either side that do not count as agreeing
    nonfinite_both: int = 0  # positions NaN (or the same infinity) on both sides
    absolute: ErrorStats | None = None
    relative: ErrorStats | None = None
    cosine_similarity: float | None = None
    reference_at_max: float | None = None  # reference and candidate values where abs error peaks
    candidate_at_max: float | None = None
    required_atol: float | None = None  # the smallest atol that passes alone (rtol 0) ...
    required_rtol: float | None = None  # ... or rtol alone (atol 0)
    histogram: tuple[HistogramBin, ...] = ()
    problem: str | None = None  # why there are no statistics (e.g. the shapes differ)
    # elements left out of the statistics and the verdict (`compare_output`'s `exclude`: query
    # positions whose every key is masked, graphfix.validation.masked_rows)
    excluded: int = 0


class OutputPairing(str, Enum):
    """How the candidate's outputs are matched with the reference's (the CLI spells the values)."""

    NAME = "name"  # the same tensor name on both sides (default)
    POSITION = "position"  # the i-th graph output of each (legacy exports number their names)


OUTPUT_PAIRINGS = tuple(p.value for p in OutputPairing)


@dataclass(frozen=True)
class OutputPairs:
    """Each reference output with the candidate output it is compared with, and notes."""

    pairs: tuple[tuple[str, str], ...]  # (reference name, candidate name)
    notes: tuple[str, ...] = ()

    @property
    def candidate_names(self) -> dict[str, str]:
        return dict(self.pairs)


def pair_output_names(
    reference: Sequence[str], candidate: Sequence[str], *, by: OutputPairing | str | None = None
) -> OutputPairs:
    """Pair every reference output with a candidate output, by name (default) or by position.

    By name, extra candidate outputs (a `mark_output` rewrite exposes attention probabilities)
    are listed, not compared; by position, the candidate's first outputs are paired in order.
    """
    try:
        pairing = OutputPairing(by or OutputPairing.NAME)
    except ValueError:
        raise ValidationUsageError(
            f"output pairing {by!r} is not one of {', '.join(OUTPUT_PAIRINGS)}"
        ) from None
    ref, cand = list(reference), list(candidate)
    if pairing is OutputPairing.POSITION:
        if len(cand) < len(ref):
            raise ValidationUsageError(
                f"the original has {len(ref)} outputs ({', '.join(ref)}) but the candidate only "
                f"{len(cand)} ({', '.join(cand) or 'none'}); pairing by position needs one "
                "candidate output per original output"
            )
        pairs = tuple(zip(ref, cand[: len(ref)], strict=True))
        renamed = [f"{r} ↔ {c}" for r, c in pairs if r != c]
        notes = [f"outputs paired by position: {', '.join(renamed)}"] if renamed else []
        if len(cand) > len(ref):
            notes.append(
                f"candidate outputs past the original's, not compared: {', '.join(cand[len(ref) :])}"
            )
        return OutputPairs(pairs, tuple(notes))
    missing = [name for name in ref if name not in set(cand)]
    if missing:
        extra = [name for name in cand if name not in set(ref)]
        hint = (
            "; if they are the same outputs named differently (a legacy export numbers its "
            "outputs), pair them by position: --pair-outputs position"
            if len(cand) >= len(ref)
            else "; compare a model with its own rewrite or conversion"
        )
        raise ValidationUsageError(
            f"the candidate lacks output(s) of the original: {', '.join(missing)} (only the "
            f"candidate has {', '.join(extra) or 'none'}; the original's outputs are "
            f"{', '.join(ref)}, the candidate's {', '.join(cand)}){hint}"
        )
    extra = [name for name in cand if name not in set(ref)]
    notes = (
        (
            f"{len(extra)} output(s) only the candidate has, not compared: {', '.join(extra)} "
            "(e.g. attention probabilities a mark_output rewrite exposes)",
        )
        if extra
        else ()
    )
    return OutputPairs(tuple((name, name) for name in ref), notes)


def compare_output(
    name: str,
    reference: np.ndarray,
    candidate: np.ndarray,
    tolerance: Tolerance,
    *,
    exclude: np.ndarray | None = None,
) -> OutputComparison:
    """Statistics of `candidate` against `reference` and whether `tolerance` passes them.

    `exclude` (boolean, broadcastable to the output): elements left out of the statistics and
    the verdict where the candidate is finite there (a NaN/inf there still fails)."""
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    common = {
        "name": name,
        "shape": tuple(reference.shape),
        "reference_dtype": str(reference.dtype),
        "candidate_dtype": str(candidate.dtype),
        "tolerance": tolerance,
        "size": int(reference.size),
    }
    if reference.shape != candidate.shape:
        problem = (
            f"shape differs: reference {list(reference.shape)}, candidate {list(candidate.shape)}"
        )
        return OutputComparison(
            **common,
            passed=False,
            mismatches=int(reference.size),
            nonfinite_mismatches=0,
            problem=problem,
        )
    if reference.size == 0:
        return OutputComparison(
            **common, passed=True, mismatches=0, nonfinite_mismatches=0, problem="empty output"
        )
    r = reference.astype(np.float64)
    c = candidate.astype(np.float64)
    finite = np.isfinite(r) & np.isfinite(c)
    both = (np.isnan(r) & np.isnan(c)) | (np.isinf(r) & (r == c))
    valid = finite | both if tolerance.allow_nonfinite else finite
    skipped = np.zeros(r.shape, bool)
    if exclude is not None:
        skipped = np.broadcast_to(exclude, r.shape) & np.isfinite(c)
        valid = valid & ~skipped
        common["excluded"] = int(np.count_nonzero(skipped))
    nonfinite = int(r.size - np.count_nonzero(valid) - np.count_nonzero(skipped))
    common["nonfinite_both"] = int(np.count_nonzero(both))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are non-finite
        absdiff = np.where(finite, np.abs(c - r), 0.0)
    denominator = np.abs(np.where(finite, r, 1.0))
    reldiff = absdiff / np.where(denominator == 0, _EPSILON, denominator)
    if not valid.any() and nonfinite == 0:  # every element left out
        return OutputComparison(
            **common,
            passed=True,
            mismatches=0,
            nonfinite_mismatches=0,
            problem="every element lies at a query position every key masks: nothing to compare",
        )
    if not valid.any():
        problem = "no element agrees: every position is NaN/inf on one side or both"
        return OutputComparison(
            **common,
            passed=False,
            mismatches=int(r.size),
            nonfinite_mismatches=nonfinite,
            problem=problem,
        )
    abs_stats = _stats(absdiff, valid)
    rel_stats = _stats(reldiff, valid)
    element_ok = (absdiff <= tolerance.atol) | (reldiff <= tolerance.rtol)
    mismatches = int(np.count_nonzero(valid & ~element_ok)) + nonfinite
    if tolerance.quantile is None:
        required_atol, required_rtol = abs_stats.max, rel_stats.max
        within = mismatches == 0
    else:
        required_atol = float(np.quantile(absdiff[valid], tolerance.quantile))
        required_rtol = float(np.quantile(reldiff[valid], tolerance.quantile))
        within = nonfinite == 0 and (
            required_atol <= tolerance.atol or required_rtol <= tolerance.rtol
        )
    at = abs_stats.argmax
    return OutputComparison(
        **common,
        passed=bool(within),
        mismatches=mismatches,
        nonfinite_mismatches=nonfinite,
        absolute=abs_stats,
        relative=rel_stats,
        cosine_similarity=_cosine(r[finite & ~skipped], c[finite & ~skipped]),
        reference_at_max=float(r[at]),
        candidate_at_max=float(c[at]),
        required_atol=required_atol,
        required_rtol=required_rtol,
        histogram=error_histogram(absdiff[valid]),
    )


def _stats(errors: np.ndarray, valid: np.ndarray) -> ErrorStats:
    values = errors[valid]
    p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
    flat = int(np.argmax(np.where(valid, errors, -1.0)))
    return ErrorStats(
        mean=float(values.mean()),
        median=float(p50),
        std=float(values.std()),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        max=float(values.max()),
        argmax=tuple(int(i) for i in np.unravel_index(flat, errors.shape)),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.size == 0:
        return None
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def error_histogram(errors: np.ndarray) -> tuple[HistogramBin, ...]:
    """Counts of `errors` per decade (log10 bins), plus a bin of exact zeros.

    Decades more than ten below the largest error fold into the first bin, which then starts at 0.
    """
    errors = np.asarray(errors, dtype=np.float64).ravel()
    zeros = int(np.count_nonzero(errors == 0))
    bins = [HistogramBin(0.0, 0.0, zeros)] if zeros else []
    nonzero = errors[errors > 0]
    if nonzero.size == 0:
        return tuple(bins)
    exponents = np.floor(np.log10(nonzero)).astype(np.int64)
    top = int(exponents.max())
    bottom = max(int(exponents.min()), top - _MAX_DECADES + 1)
    counts = np.bincount(np.clip(exponents, bottom, top) - bottom, minlength=top - bottom + 1)
    for offset, count in enumerate(counts):
        exponent = bottom + offset
        low = 0.0 if offset == 0 and exponents.min() < bottom else 10.0**exponent
        bins.append(HistogramBin(low, 10.0 ** (exponent + 1), int(count)))
    return tuple(bins)


def text_histogram(bins: tuple[HistogramBin, ...], *, width: int = _BAR_WIDTH) -> str:
    """The bins as terminal lines: `[1e-07, 1e-06)  |    340 | #########`."""
    if not bins:
        return "(no elements)"
    peak = max(b.count for b in bins) or 1
    labels = [
        "== 0" if b.low == b.high == 0 else f"[{b.low:.0e}, {b.high:.0e})".replace("[0e+00", "(0")
        for b in bins
    ]
    label_width = max(len(label) for label in labels)
    count_width = max(len(str(b.count)) for b in bins)
    lines = []
    for label, b in zip(labels, bins, strict=True):
        bar = "#" * (max(1, round(width * b.count / peak)) if b.count else 0)
        lines.append(
            f"{label.ljust(label_width)} | {str(b.count).rjust(count_width)} | {bar}".rstrip()
        )
    return "\n".join(lines)


def format_comparison(comparison: OutputComparison, *, histogram: bool = True) -> str:
    """A readable block for one output: verdict, statistics, histogram."""
    c = comparison
    verdict = "PASS" if c.passed else "FAIL"
    head = f"output '{c.name}' {c.candidate_dtype} {list(c.shape)}: {verdict}"
    if c.reference_dtype != c.candidate_dtype:
        head += f" (reference {c.reference_dtype})"
    lines = [head]
    if c.problem is not None:
        lines.append(f"  {c.problem}")
    if c.absolute is not None and c.relative is not None:
        lines.append(f"  abs error: {_format_stats(c.absolute)}")
        lines.append(f"  rel error: {_format_stats(c.relative)}")
        if c.absolute.max > 0:
            lines.append(
                f"  largest abs error at {list(c.absolute.argmax)}: "
                f"reference {c.reference_at_max:.7g}, candidate {c.candidate_at_max:.7g}"
            )
        else:
            lines.append("  every element agrees exactly")
        cosine = "n/a" if c.cosine_similarity is None else f"{c.cosine_similarity:.8f}"
        lines.append(f"  cosine similarity: {cosine}")
        scope = (
            "elementwise" if c.tolerance.quantile is None else f"{c.tolerance.quantile:g}-quantile"
        )
        lines.append(
            f"  minimum tolerance to pass ({scope}): atol {c.required_atol:.3g} "
            f"or rtol {c.required_rtol:.3g}"
        )
    if c.excluded:
        lines.append(f"  left out: {c.excluded} element(s) at query positions every key masks")
    lines.append(
        f"  mismatched elements: {c.mismatches} of {c.size - c.excluded} ({c.tolerance.describe()})"
        + (f"; {c.nonfinite_mismatches} NaN/inf disagreement(s)" if c.nonfinite_mismatches else "")
    )
    if c.nonfinite_both:
        allowed = (
            "allowed (--allow-nonfinite)"
            if c.tolerance.allow_nonfinite
            else "not agreement: pass --allow-nonfinite if the model is meant to produce them"
        )
        lines.append(f"  NaN/inf on both sides at {c.nonfinite_both} element(s): {allowed}")
    if histogram and c.histogram:
        lines.append("  abs error histogram (elements per decade):")
        lines.extend("    " + line for line in text_histogram(c.histogram).splitlines())
    return "\n".join(lines)


def _format_stats(s: ErrorStats) -> str:
    return (
        f"mean {s.mean:.3g}  median {s.median:.3g}  std {s.std:.3g}  p90 {s.p90:.3g}  "
        f"p95 {s.p95:.3g}  p99 {s.p99:.3g}  max {s.max:.3g}"
    )
