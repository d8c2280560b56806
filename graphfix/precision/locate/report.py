"""`LocateReport`: suspects, per-tensor errors, remedies tried and kept, and the fixed model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from graphfix.graph.value_info import reconcile_value_info
from graphfix.jsonable import plain
from graphfix.model_io import save_model
from graphfix.precision.locate.localise import Suspect, TensorError
from graphfix.precision.locate.remedies import Remedy, Trial, TrialRunner, search_remedies
from graphfix.validation.compare import OutputComparison, Tolerance

# How a trial's verdict and its error column relate (the two disagree when the relative bound
# passes what the absolute one fails, e.g. "PASS, max abs error 0.339" next to "fail, 0.0367").
VERDICT_RULE = (
    "verdict: PASS when every output element is within the tolerance ({tolerance}), the "
    "absolute OR the relative bound; error: the largest absolute error over the outputs, "
    "inf when NaN/inf disagree"
)


@dataclass(frozen=True)
class FixedModel:
    """The model `--apply` wrote (or would write) and whether it passes."""

    path: str | None
    float32_nodes: tuple[str, ...]
    passed: bool
    error: float


@dataclass(frozen=True)
class LocateReport:
    """Where the candidate diverges from the reference and what repairs it."""

    reference: str
    candidate: str
    precision: str  # the type the candidate computes in ("float16", "bfloat16", "float32")
    tolerance: Tolerance
    diverges: bool  # some output is out of tolerance
    outputs: tuple[OutputComparison, ...]
    suspects: tuple[Suspect, ...]
    tensors: tuple[TensorError, ...]  # every compared intermediate, in topological order
    chunks: int  # reference/candidate runs per side the streaming took
    seconds_localise: float
    remedies_tried: tuple[Trial, ...] = ()
    remedies_kept: tuple[Remedy, ...] = ()
    fixed: FixedModel | None = None
    notes: tuple[str, ...] = ()
    low_precision: str | None = None  # how a float16/bfloat16 candidate ran on onnxruntime
    fixed_model: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The JSON document: `suspects`, `remedies` (tried, kept), `fixed`, and the rest."""
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "precision": self.precision,
            "low_precision": self.low_precision,
            "tolerance": plain(self.tolerance),
            "verdict_rule": VERDICT_RULE.format(tolerance=self.tolerance.describe()),
            "diverges": self.diverges,
            "outputs": [
                {
                    "name": o.name,
                    "passed": o.passed,
                    "max_abs_error": None if o.absolute is None else _num(o.absolute.max),
                    "nonfinite_mismatches": o.nonfinite_mismatches,
                    "nonfinite_both": o.nonfinite_both,
                    "excluded": o.excluded,  # elements at query positions every key masks
                }
                for o in self.outputs
            ],
            "suspects": [plain(s) for s in self.suspects],
            "remedies": {
                "tried": [plain(t) for t in self.remedies_tried],
                "kept": [plain(r) for r in self.remedies_kept],
            },
            "fixed": None if self.fixed is None else plain(self.fixed),
            "tensors_compared": len(self.tensors),
            "chunks": self.chunks,
            "seconds_localise": round(self.seconds_localise, 3),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        lines = [
            f"graphfix locate: {'DIVERGES' if self.diverges else 'no divergence'}",
            f"  reference: {self.reference}",
            f"  candidate: {self.candidate}",
            *([f"  low precision: {self.low_precision}"] if self.low_precision else []),
            f"  tolerance: {self.tolerance.describe()}",
            f"  compared {len(self.tensors)} intermediate tensors in {self.chunks} chunk(s)",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        for o in self.outputs:
            err = "n/a" if o.absolute is None else f"{o.absolute.max:.3g}"
            extra = f", {o.nonfinite_mismatches} NaN/inf" if o.nonfinite_mismatches else ""
            if o.nonfinite_both:
                extra += f", NaN/inf on both sides at {o.nonfinite_both}"
            lines.append(
                f"  output {o.name}: {'PASS' if o.passed else 'FAIL'} (max abs error {err}{extra})"
            )
        if not self.diverges:
            lines.append("no divergence: every output agrees within tolerance; nothing to locate")
            return "\n".join(lines)
        lines.append("")
        lines.append("suspects (where error is created, most suspect first):")
        if not self.suspects:
            lines.append("  none stands out: the error grows gradually along the graph")
        for s in self.suspects:
            where = []
            if s.attention_block is not None:
                where.append(f"attention block {s.attention_block}")
            if s.module:
                where.append(s.module)
            lines.append(
                f"  {s.rank}. {s.node} ({s.op_type}{', ' + ', '.join(where) if where else ''}): "
                f"error {s.error:.3g}, inputs {s.input_error:.3g}, amplification "
                f"{s.amplification:.3g}x"
            )
            lines += [f"       {reason}" for reason in s.reasons]
        if self.remedies_tried:
            lines.append("")
            lines.append(
                "remedy search (each trial one candidate run; "
                f"{VERDICT_RULE.format(tolerance=self.tolerance.describe())}):"
            )
            for t in self.remedies_tried:
                what = "; ".join(r.describe() for r in t.remedies) or "no remedy"
                latency = "" if t.latency_ms is None else f"  latency {t.latency_ms:.3g} ms"
                lines.append(
                    f"  {t.step:12s} {'PASS' if t.passed else 'fail'} (abs or rel)  "
                    f"max abs error {t.error:.3g}  float32 nodes {t.float32_nodes}{latency}  "
                    f"({what})"
                )
            kept = "; ".join(r.describe() for r in self.remedies_kept) or "nothing"
            lines.append(f"kept: {kept}")
        if self.fixed is not None:
            verdict = "passes" if self.fixed.passed else "still FAILS"
            where = f"wrote {self.fixed.path}" if self.fixed.path else "not written"
            lines.append(
                f"fixed model {verdict} (max abs error {self.fixed.error:.3g}, "
                f"{len(self.fixed.float32_nodes)} float32 compute nodes); {where}"
            )
        return "\n".join(lines)


def with_remedies(
    report: LocateReport,
    model: onnx.ModelProto,
    suspects: Sequence[Suspect],
    errors: Sequence[TensorError],
    runner: TrialRunner,
    *,
    max_trials: int,
    apply: bool | None,
    output,
    overwrite: bool | None,
) -> LocateReport:
    """`report` with the remedy search's trials and kept remedies; with `apply`, the fixed model
    too (written to `output` when given and the fix passes)."""
    found = search_remedies(model, suspects, errors, runner, max_trials=max_trials)
    fixed = None
    if apply and found.model is not None:
        reconcile_value_info(found.model)  # the trials' converters leave annotations behind
        path = None
        if output is not None and found.passed:
            path = str(save_model(found.model, output, overwrite=overwrite).path)
        fixed = FixedModel(path, found.float32_nodes, found.passed, found.error)
    return dataclasses.replace(
        report,
        remedies_tried=found.trials,
        remedies_kept=found.kept,
        fixed=fixed,
        fixed_model=found.model if apply else None,
    )


def _num(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
