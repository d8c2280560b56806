"""Validate a candidate (a TensorRT engine, or onnxruntime) against onnxruntime on the original.

The reference is always onnxruntime on the CPU running the original model as written (a
float16/bfloat16 original materialised as the candidate is, `graphfix.validation.low_precision`).  The
candidate is, by default, a TensorRT engine of the fixed model with graphfix's plugin library
loaded, or, where TensorRT is absent, onnxruntime running the fixed model with graphfix's
reference implementation of its plugin ops: a wiring check of the rewrite on any machine (for a
float32 GraphfixSoftmax the reference op is Softmax itself, so the plugins' kernels and TensorRT's
numerics are not checked).

`validate` works out everything from its arguments once, before anything runs (a `ValidationPlan`:
backend, engine options, plugin libraries, tolerance, inputs), then runs that plan.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
import onnx

from graphfix.attention.matcher import find_attention
from graphfix.errors import CheckFailed
from graphfix.float_types import FloatType
from graphfix.jsonable import plain
from graphfix.model_io import LoadedModel, ModelArg, load_model
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.progress import step
from graphfix.validation.backends import BackendError, InputsRejected, Runner
from graphfix.validation.backends.tensorrt_backend import (
    EngineOptions,
    TensorRTRunner,
    TensorRTStatus,
    default_plugin_libraries,
    engine_options,
    require_tensorrt,
    tensorrt_status,
)
from graphfix.validation.compare import (
    DEFAULT_TOLERANCES,
    OutputComparison,
    OutputPairs,
    Tolerance,
    compare_output,
    format_comparison,
    pair_output_names,
)
from graphfix.validation.fusion_proof import FusionProof, classify_blocks
from graphfix.validation.inputs import (
    InputData,
    InputSource,
    ValidationUsageError,
    ValueRange,
    check_same_inputs,
    input_specs,
    make_inputs,
)
from graphfix.validation.low_precision import LowPrecision, low_precision_mode
from graphfix.validation.masked_rows import leave_out_masked_rows
from graphfix.validation.random_ops import random_note


class Backend(str, Enum):
    """Where the candidate runs (the JSON and the CLI spell the values)."""

    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


BACKENDS = tuple(b.value for b in Backend)
_ARRAYS = {"json": False}
_LOOSENESS = ("fp32", "fp16", "bf16")  # order: each looser than the one before

__all__ = [
    "BACKENDS",
    "CheckKind",
    "ValidationReport",
    "ValidationUsageError",
    "validate",
]


class CheckKind(str, Enum):
    """What a validation checked."""

    ENGINE = "TensorRT engine"  # the candidate ran as a TensorRT engine, plugins loaded
    WIRING = "wiring check"  # onnxruntime with graphfix's reference ops for the plugin nodes
    ONNXRUNTIME = "onnxruntime"  # onnxruntime on the candidate as written (no plugin nodes)


@dataclass(frozen=True)
class ValidationReport:
    """The verdict, per-output statistics, what ran on each side, and the fusion proof."""

    passed: bool
    backend: Backend
    check: CheckKind
    reference: str
    candidate: str
    outputs: tuple[OutputComparison, ...]
    inputs: tuple[InputSource, ...]
    tolerance: Tolerance
    tolerance_origin: str
    fusion: FusionProof | None
    tensorrt_note: str | None  # one line when the TensorRT side was not exercised, and why
    notes: tuple[str, ...] = ()
    low_precision: str | None = None  # how a float16/bfloat16 candidate ran on onnxruntime
    reference_outputs: Mapping[str, np.ndarray] = field(
        default_factory=dict, repr=False, compare=False, metadata=_ARRAYS
    )
    candidate_outputs: Mapping[str, np.ndarray] = field(  # by the reference output compared with
        default_factory=dict, repr=False, compare=False, metadata=_ARRAYS
    )

    @property
    def failed_outputs(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs if not o.passed)

    def to_dict(self) -> dict:
        """JSON-ready: everything but the raw output arrays."""
        data = {
            f.name: plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.metadata.get("json", True)
        }
        if self.fusion is not None:
            data["fusion"]["candidate_fused"] = self.fusion.candidate_fused
            data["fusion"]["original_fused"] = self.fusion.original_fused
        return data

    def summary(self, *, histograms: bool = True) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"graphfix validate: {verdict} ({self.check.value})",
            f"  reference: {self.reference}",
            f"  candidate: {self.candidate}",
        ]
        if self.tensorrt_note:
            lines.append(f"  {self.tensorrt_note}")
        if self.low_precision:
            lines.append(f"  low precision: {self.low_precision}")
        lines.append(f"  tolerance: {self.tolerance.describe()} ({self.tolerance_origin})")
        lines.append("  inputs:")
        lines += [f"    {s.name} {s.dtype} {list(s.shape)}: {s.origin}" for s in self.inputs]
        lines += [f"  note: {n}" for n in self.notes]
        if self.fusion is not None:
            lines += ["  " + line for line in self.fusion.summary_lines()]
        for comparison in self.outputs:
            lines.append("")
            lines.append(format_comparison(comparison, histogram=histograms))
        lines.append("")
        if self.passed:
            lines.append(
                "PASSED: the candidate agrees with the reference on all "
                f"{len(self.outputs)} output(s)"
            )
        else:
            lines.append(
                f"FAILED: {len(self.failed_outputs)} of {len(self.outputs)} output(s) out of "
                f"tolerance: {', '.join(self.failed_outputs)}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class BackendPlan:
    """What runs the candidate: the backend, TensorRT's status, its builder settings and plugins."""

    name: Backend
    tensorrt: TensorRTStatus
    engine: EngineOptions | None  # TensorRT builder settings; None with onnxruntime
    plugin_libraries: tuple[Path, ...]
    note: str | None = None


def _backend_plan(
    candidate: LoadedModel,
    *,
    backend: str | None,
    precision: FloatType | None,
    plugins: Sequence[str | os.PathLike[str]] | None,
) -> BackendPlan:
    """TensorRT probed once; the precision checked once, against the backend that will run."""
    if backend is not None and backend not in BACKENDS:
        raise ValidationUsageError(
            f"backend {backend!r} is not one of {', '.join(BACKENDS)}; leave it unset to use "
            "TensorRT where it is installed"
        )
    status = tensorrt_status()
    chosen = Backend(backend or (Backend.TENSORRT if status.available else Backend.ONNXRUNTIME))
    if chosen is Backend.TENSORRT:
        require_tensorrt(status)
        engine = engine_options(precision, tensorrt_version=str(status.version))
        return BackendPlan(chosen, status, engine, _plugin_libraries(candidate, plugins, status))
    if precision not in (None, FloatType.FLOAT32):
        raise ValidationUsageError(
            f"precision {precision.short!r} applies to the TensorRT backend only; with onnxruntime the "
            "candidate runs in the precision its ONNX is written in"
        )
    note = (
        "plugin libraries not loaded: onnxruntime runs graphfix's reference ops"
        if plugins
        else None
    )
    return BackendPlan(chosen, status, None, (), note)


@dataclass(frozen=True)
class ValidationPlan:
    """Everything `validate` decides before anything runs: backend, engine options, tolerance and
    inputs, each worked out once from the arguments."""

    reference: LoadedModel
    candidate: LoadedModel
    backend: BackendPlan
    inputs: InputData
    tolerance: Tolerance
    tolerance_origin: str
    engine_cache: Path | None
    notes: tuple[str, ...]
    outputs: OutputPairs
    low_precision: LowPrecision

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(array.shape) for name, array in self.inputs.feeds.items()}


def _quantization_note(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> list[str]:
    """A note when the two models quantize differently: their outputs then differ by design, and
    the float model is the measure (`graphfix qdq fix --reference` reports both errors)."""

    def pairs(model: onnx.ModelProto) -> int:
        return sum(n.op_type == "QuantizeLinear" for n in model.graph.node)

    ours, theirs = pairs(reference), pairs(candidate)
    if ours == theirs:
        return []
    wider = "judge a quantile with wider tolerances (--quantile, --atol, --rtol)"
    if not ours or not theirs:
        which = "candidate" if theirs else "original"
        return [
            f"only the {which} is quantized ({max(ours, theirs)} QuantizeLinear nodes): the "
            f"outputs differ by its quantization error, which the default tolerances (for float "
            f"models) do not allow; {wider}"
        ]
    return [
        f"the original has {ours} QuantizeLinear nodes and the candidate {theirs}: a different "
        "quantization changes the outputs by design, so this compares two quantizations; measure "
        "each against the float model instead (`graphfix qdq fix --reference FLOAT.onnx` prints "
        f"both errors), or {wider}"
    ]


def validate(
    reference_model: ModelArg,
    candidate_model: ModelArg,
    *,
    inputs: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    ranges: Mapping[str, ValueRange | tuple[float, float]] | None = None,
    backend: str | None = None,
    precision: str | None = None,
    plugins: Sequence[str | os.PathLike[str]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    quantile: float | None = None,
    seed: int = 0,
    engine_cache: str | os.PathLike[str] | None = None,
    low_precision: str | None = None,
    allow_nonfinite: bool | None = None,
    pair_outputs: str | None = None,
) -> ValidationReport:
    """Run both models on the same inputs and compare every output.

    `backend`: None picks "tensorrt" when TensorRT and polygraphy are usable, else "onnxruntime"
    (the report says so); "onnxruntime" lowers graphfix plugin nodes to their reference ops, which
    makes it a wiring check of the rewrite, not of the plugins or of TensorRT.
    `precision` ("fp32", "fp16", "bf16") applies to TensorRT: builder flags on TensorRT 10; on
    TensorRT 11 networks are strongly typed, so fp16/bf16 are refused (put the Casts in the ONNX).
    `plugins`: library paths to load; None finds graphfix's built library when the candidate has
    plugin nodes.  `inputs`: an .npz path or arrays by name; otherwise seeded random data shaped by
    `shapes` (needed for dynamic dimensions) and drawn from `ranges`.  `atol`/`rtol` default by the
    candidate's lowest precision (`graphfix.validation.compare.DEFAULT_TOLERANCES`); `quantile`
    checks that quantile of the errors instead of every element.
    `low_precision` ("materialise", the default, or "as-is"): how onnxruntime runs a
    float16/bfloat16 candidate (`graphfix.validation.low_precision`).  `allow_nonfinite`: NaN/inf
    on both sides counts as agreement (by default it fails).  `pair_outputs` ("name", the
    default, or "position"): how the candidate's outputs are matched with the original's.
    """
    reference = load_model(reference_model, load_weights=False)
    candidate = load_model(candidate_model, load_weights=False)
    mode = low_precision_mode(low_precision)
    notes = list(check_same_inputs(input_specs(reference.model), input_specs(candidate.model)))
    outputs = pair_output_names(
        [o.name for o in reference.model.graph.output],
        [o.name for o in candidate.model.graph.output],
        by=pair_outputs,
    )
    notes += outputs.notes
    notes += _quantization_note(reference.model, candidate.model)

    chosen = None if precision is None else FloatType.parse(precision, error=ValidationUsageError)
    runs_on = _backend_plan(candidate, backend=backend, precision=chosen, plugins=plugins)
    if runs_on.note:
        notes.append(runs_on.note)
    notes += random_note(
        reference.model,
        candidate.model,
        candidate_on_onnxruntime=runs_on.name is Backend.ONNXRUNTIME,
    )
    data = make_inputs(reference.model, shapes=shapes, ranges=ranges, npz=inputs, seed=seed)
    lowest = _loosest(
        _model_precision(candidate.model),
        _model_precision(reference.model),
        None if chosen is None else chosen.short,
    )
    tolerance, origin = _tolerance(atol, rtol, quantile, lowest, allow_nonfinite=allow_nonfinite)
    plan = ValidationPlan(
        reference=reference,
        candidate=candidate,
        backend=runs_on,
        inputs=data,
        tolerance=tolerance,
        tolerance_origin=origin,
        engine_cache=Path(engine_cache) if engine_cache is not None else None,
        notes=(*notes, *data.notes),
        outputs=outputs,
        low_precision=mode,
    )
    return _run(plan)


def _run(plan: ValidationPlan) -> ValidationReport:
    """Build both runners, run them on the plan's inputs, compare, and prove what fused."""
    reference_runner = _runner(plan, plan.reference, "original", backend=Backend.ONNXRUNTIME)
    candidate_runner = _runner(plan, plan.candidate, "candidate", backend=plan.backend.name)
    feeds = plan.inputs.feeds
    step(f"running the original: {reference_runner.description}")
    reference_outputs = reference_runner.infer(feeds)  # InputsRejected here: the inputs' fault
    step(f"running the candidate: {candidate_runner.description}")
    try:
        candidate_outputs = candidate_runner.infer(feeds)
    except InputsRejected as exc:  # the original ran on these inputs: the candidate is broken
        raise CheckFailed(f"the candidate refused inputs the original ran on: {exc.what}") from exc
    paired = plan.outputs.candidate_names
    missing = [paired[name] for name in reference_outputs if paired[name] not in candidate_outputs]
    if missing:
        raise BackendError(
            f"{candidate_runner.description} produced no {', '.join(missing)} (it produced "
            f"{', '.join(candidate_outputs) or 'nothing'}); the engine lost a graph output"
        )
    comparisons = tuple(
        compare_output(
            name, reference_outputs[name], candidate_outputs[paired[name]], plan.tolerance
        )
        for name in reference_outputs
    )
    notes = list(plan.notes)
    if not all(c.passed for c in comparisons):
        comparisons, masked = leave_out_masked_rows(
            plan.reference,
            plan.inputs.feeds,
            comparisons,
            reference_outputs,
            {name: candidate_outputs[paired[name]] for name in reference_outputs},
            plan.tolerance,
        )
        notes += masked
    fusion = None
    if isinstance(candidate_runner, TensorRTRunner):
        fusion = _fusion_proof(plan, candidate_runner)
    return ValidationReport(
        passed=all(c.passed for c in comparisons),
        backend=plan.backend.name,
        check=_check_kind(plan, candidate_runner),
        reference=reference_runner.description,
        candidate=candidate_runner.description,
        outputs=comparisons,
        inputs=plan.inputs.sources,
        tolerance=plan.tolerance,
        tolerance_origin=plan.tolerance_origin,
        fusion=fusion,
        tensorrt_note=_tensorrt_note(plan, candidate_runner),
        notes=tuple(notes),
        low_precision=candidate_runner.low_precision,
        reference_outputs=reference_outputs,
        candidate_outputs={name: candidate_outputs[paired[name]] for name in reference_outputs},
    )


def _runner(plan: ValidationPlan, model: LoadedModel, role: str, *, backend: Backend) -> Runner:
    """One model made ready on one backend; every runner answers the `Runner` protocol."""
    label = _label(model, role)
    if backend is Backend.TENSORRT:
        runs_on = plan.backend
        assert runs_on.engine is not None  # the plan sets engine options for the TensorRT backend
        return TensorRTRunner(
            model,
            label=label,
            shapes=plan.shapes,
            options=runs_on.engine,
            plugin_libraries=runs_on.plugin_libraries if model is plan.candidate else (),
            cache_dir=plan.engine_cache,
            status=runs_on.tensorrt,
        )
    from graphfix.validation.backends.onnxruntime_backend import (
        OnnxRuntimeRunner,  # imports onnxruntime
    )

    return OnnxRuntimeRunner(model, label=label, low_precision=plan.low_precision)


def _label(model: LoadedModel, fallback: str) -> str:
    return str(model.path) if model.path is not None else f"the {fallback} model (in memory)"


def _model_precision(model: onnx.ModelProto) -> str:
    """The loosest float type the model holds: "bf16", "fp16" or "fp32"."""
    types = {t.data_type for t in model.graph.initializer}
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        types.add(value.type.tensor_type.elem_type)
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to":
                types.add(attr.i)
            elif attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                types.add(attr.t.data_type)
    if onnx.TensorProto.BFLOAT16 in types:
        return "bf16"
    if onnx.TensorProto.FLOAT16 in types:
        return "fp16"
    return "fp32"


def _loosest(*precisions: str | None) -> str:
    return max((p for p in precisions if p), key=_LOOSENESS.index)


def _tolerance(
    atol: float | None,
    rtol: float | None,
    quantile: float | None,
    precision: str,
    *,
    allow_nonfinite: bool | None = None,
) -> tuple[Tolerance, str]:
    default = DEFAULT_TOLERANCES[precision]
    tolerance = Tolerance(
        atol=default.atol if atol is None else atol,
        rtol=default.rtol if rtol is None else rtol,
        quantile=quantile,
        allow_nonfinite=bool(allow_nonfinite),
    )
    if atol is not None and rtol is not None:
        return tolerance, "given"
    defaulted = " and ".join(n for n, v in (("atol", atol), ("rtol", rtol)) if v is None)
    return tolerance, f"{defaulted}: default for {precision}"


def _plugin_libraries(
    candidate: LoadedModel,
    plugins: Sequence[str | os.PathLike[str]] | None,
    status: TensorRTStatus,
) -> tuple[Path, ...]:
    if plugins is not None:
        return tuple(Path(p) for p in plugins)
    if any(n.domain == PLUGIN_DOMAIN for n in candidate.model.graph.node):
        return default_plugin_libraries(tensorrt_major=status.major)
    return ()


def _fusion_proof(plan: ValidationPlan, runner: TensorRTRunner) -> FusionProof:
    """Per rewritten block (plugin nodes, else the attention Softmaxes left), what TensorRT ran."""
    candidate, reference = plan.candidate, plan.reference
    rewritten = [n.name for n in candidate.model.graph.node if n.domain == PLUGIN_DOMAIN]
    blocks = rewritten or [m.softmax for m in find_attention(candidate.model)]
    candidate_blocks = classify_blocks(runner.layers(), blocks)
    try:
        original = _runner(plan, reference, "original", backend=Backend.TENSORRT)
    except BackendError as exc:
        return FusionProof(
            runner.tensorrt_version, candidate_blocks, None, original_problem=str(exc)
        )
    assert isinstance(original, TensorRTRunner)
    original_blocks = classify_blocks(
        original.layers(), [m.softmax for m in find_attention(reference.model)]
    )
    return FusionProof(runner.tensorrt_version, candidate_blocks, original_blocks)


def _check_kind(plan: ValidationPlan, runner: Runner) -> CheckKind:
    if plan.backend.name is Backend.TENSORRT:
        return CheckKind.ENGINE
    return CheckKind.WIRING if runner.lowered_nodes else CheckKind.ONNXRUNTIME


def _tensorrt_note(plan: ValidationPlan, runner: Runner) -> str | None:
    if plan.backend.name is Backend.TENSORRT:
        return None
    what = "the candidate ONNX with onnxruntime"
    wiring = ""
    if runner.lowered_nodes:
        what += " and graphfix's reference ops"
        wiring = (
            "; a wiring check of the rewrite: reference ops stand in for the plugins (for float32 "
            "GraphfixSoftmax, Softmax itself)"
        )
    status = plan.backend.tensorrt
    if not status.available:
        return (
            f"TensorRT: not available here ({status.reason}); validated {what} instead, so neither "
            f"the engine nor its fusion was checked{wiring}"
        )
    return (
        f"TensorRT: installed ({status.version}) but not requested; validated {what}, "
        f"no fusion proof{wiring}"
    )
