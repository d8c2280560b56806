"""`locate`'s plan: every option checked and every choice made once, before anything runs.

`locate()` (api.py) builds a `LocatePlan` with these helpers: the options checked against each
other, the reference and the candidate (the user's, or MODEL converted), the type the candidate
computes in, the backend that runs it, the tolerance, the inputs, and the budget (chunk size,
suspects shown, remedy trials); then runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from graphfix.attention.native.decompose import lower_trt_ops, trt_node_count
from graphfix.errors import UsageError
from graphfix.float_types import LOW_PRECISIONS, FloatType
from graphfix.graph.index import all_graphs
from graphfix.model_io import LoadedModel, check_output_path, load_model
from graphfix.plugins.reference import has_plugin_ops, with_reference_ops
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.precision.locate.candidate import BASES, build_candidate
from graphfix.precision.locate.reference import DEFAULT_CHUNK_BYTES
from graphfix.progress import step
from graphfix.validation.backends.tensorrt_backend import TensorRTStatus
from graphfix.validation.compare import (
    DEFAULT_TOLERANCES,
    OutputPairing,
    Tolerance,
    pair_output_names,
)
from graphfix.validation.inputs import check_same_inputs, input_specs
from graphfix.validation.low_precision import LowPrecision
from graphfix.validation.validate import Backend, _model_precision

DEFAULT_MAX_TRIALS = {Backend.ONNXRUNTIME: 32, Backend.TENSORRT: 16}  # a trial: a run or a build
DEFAULT_TOP = 10
ModelArg = onnx.ModelProto | LoadedModel | str | os.PathLike[str]


@dataclass(frozen=True)
class RemedyPlan:
    """The remedy search after a divergence (only for MODEL converted by `precision`)."""

    search: bool
    apply: bool
    output: str | os.PathLike[str] | None
    overwrite: bool | None
    base: str | None  # what each trial converts with: "minimal" (None) or "convert_precision"
    max_trials: int


@dataclass(frozen=True)
class LocatePlan:
    reference: LoadedModel
    candidate: LoadedModel
    candidate_label: str
    converted_to: FloatType | None  # MODEL converted to this; None: the user's candidate
    computes_in: FloatType
    backend: Backend
    tensorrt: TensorRTStatus | None  # probed once, with the TensorRT backend
    tolerance: Tolerance
    feeds: Mapping[str, np.ndarray]
    chunk_bytes: int
    top: int
    remedies: RemedyPlan
    notes: tuple[str, ...]
    low_precision: LowPrecision  # how onnxruntime runs a float16/bfloat16 candidate

    @property
    def reference_label(self) -> str:
        return label(self.reference, "model")


def check_options(
    *,
    candidate_given: bool,
    precision: str | FloatType | None,
    backend: str | None,
    apply: bool | None,
    output: str | os.PathLike[str] | None,
    remedies: bool | None,
    max_trials: int | None,
    chunk_bytes: int | None,
    remedy_base: str | None,
    onnxruntime_only: Mapping[str, object] | None = None,
) -> tuple[Backend, FloatType | None]:
    """`locate()`'s options checked against each other (UsageError, exit 2) before anything
    loads: the backend, and the type MODEL is converted to (None: the user's CANDIDATE).
    `onnxruntime_only`: flags (by their CLI spelling) that only the onnxruntime backend takes."""
    if remedy_base not in (None, *BASES):
        raise UsageError(f"remedy_base {remedy_base!r} is not one of {', '.join(BASES)}")
    backends = tuple(b.value for b in (Backend.ONNXRUNTIME, Backend.TENSORRT))
    if backend not in (None, *backends):
        raise UsageError(f"backend {backend!r} is not one of {', '.join(backends)}")
    runs_on = Backend(backend or Backend.ONNXRUNTIME)
    converted_to = None if precision is None else FloatType.parse(precision, allowed=LOW_PRECISIONS)
    if candidate_given == (converted_to is not None):
        raise UsageError(
            "give either a CANDIDATE model or --precision float16|bfloat16 (the candidate is then "
            "MODEL converted), not " + ("both" if candidate_given else "neither")
        )
    given = [flag for flag, value in (onnxruntime_only or {}).items() if value is not None]
    if runs_on is Backend.TENSORRT and given:
        raise UsageError(
            f"{', '.join(given)} apply to the onnxruntime backend (a TensorRT engine stores "
            "each tensor in its own type and locate's TensorRT path pairs outputs by name); "
            "drop them or use --backend onnxruntime"
        )
    if runs_on is Backend.TENSORRT and converted_to is None:
        raise UsageError(
            "--backend tensorrt locates MODEL converted by --precision: pass --precision instead "
            "of CANDIDATE"
        )
    if apply and converted_to is None:
        raise UsageError("--apply repairs MODEL converted by --precision; pass --precision too")
    if output is not None and not apply:
        raise UsageError("-o/--output is where --apply writes the repaired model; pass --apply")
    if apply and remedies is False:
        raise UsageError(
            "--apply writes the model the remedy search repaired; drop --no-remedies "
            "(remedies=False)"
        )
    if max_trials is not None and (isinstance(max_trials, bool) or max_trials < 1):
        raise UsageError(f"--max-trials (max_trials) must be an integer >= 1, got {max_trials!r}")
    if chunk_bytes is not None and chunk_bytes <= 0:
        raise UsageError(
            f"--chunk-mb must be more than 0 (chunk_bytes {chunk_bytes!r}); the default is "
            f"{DEFAULT_CHUNK_BYTES >> 20} MiB"
        )
    return runs_on, converted_to


def load_reference(
    model: ModelArg, *, output: str | os.PathLike[str] | None, overwrite: bool | None
) -> LoadedModel:
    """MODEL with its weights, refused when it is a `graphfix fix` output; `output` checked."""
    reference = load_model(model, load_weights=True)
    if has_plugin_ops(reference.model):
        raise UsageError(
            f"MODEL {label(reference, 'model')} has {PLUGIN_DOMAIN} plugin nodes (a `graphfix fix` "
            "output); locate runs MODEL as the float32 reference: pass the original export as "
            "MODEL, and the fixed model as CANDIDATE"
        )
    if output is not None:
        check_output_path(reference.model, output, source=reference.path, overwrite=overwrite)
    return reference


@dataclass(frozen=True)
class Candidate:
    """What `locate` compares with MODEL, and what it computes in."""

    model: LoadedModel
    label: str
    computes_in: FloatType
    notes: tuple[str, ...]


def candidate_of(
    reference: LoadedModel,
    candidate: ModelArg | None,
    *,
    converted_to: FloatType | None,
    pair_outputs: str | None = None,
) -> Candidate:
    """The user's CANDIDATE (plugin nodes as reference ops, outputs paired with MODEL's by name
    or by position, checked comparable), or MODEL converted to `converted_to`."""
    if candidate is None:
        assert converted_to is not None  # check_options: one of the two
        step(f"converting {label(reference, 'model')} to {converted_to.value}")
        built = build_candidate(reference.model, precision=converted_to.value)
        return Candidate(
            LoadedModel(built.model, None, True),
            f"{label(reference, 'model')} converted to {converted_to.value} by {built.converter}",
            converted_to,
            (),
        )
    cand = load_model(candidate, load_weights=True)
    notes = []
    if has_plugin_ops(cand.model) or trt_node_count(cand.model):  # as validate does
        lowered = with_reference_ops(lower_trt_ops(cand.model))
        cand = LoadedModel(lowered, cand.path, True)
        notes.append(
            "the candidate's plugin nodes run as graphfix's reference ops (standard ONNX), as "
            "in validate's wiring check: their kernels are not what is compared"
        )
    notes += check_same_inputs(input_specs(reference.model), input_specs(cand.model))
    paired = pair_output_names(
        [o.name for o in reference.model.graph.output],
        [o.name for o in cand.model.graph.output],
        by=pair_outputs,
    )
    if OutputPairing(pair_outputs or OutputPairing.NAME) is OutputPairing.POSITION:
        cand = LoadedModel(_renamed_outputs(cand.model, paired.pairs), cand.path, True)
        notes += paired.notes
    _check_comparable(reference.model, cand.model)
    computes_in = FloatType.parse(_model_precision(cand.model))
    return Candidate(cand, label(cand, "candidate"), computes_in, tuple(notes))


def default_tolerance(
    computes_in: FloatType,
    atol: float | None,
    rtol: float | None,
    quantile: float | None,
    *,
    allow_nonfinite: bool | None = None,
) -> Tolerance:
    """validate's default tolerance for the type, where atol/rtol are not given."""
    default = DEFAULT_TOLERANCES[computes_in.short]
    return Tolerance(
        atol=default.atol if atol is None else atol,
        rtol=default.rtol if rtol is None else rtol,
        quantile=quantile,
        allow_nonfinite=bool(allow_nonfinite),
    )


def label(model: LoadedModel, fallback: str) -> str:
    return str(model.path) if model.path is not None else f"the {fallback} (in memory)"


def _renamed_outputs(model: onnx.ModelProto, pairs: Sequence[tuple[str, str]]) -> onnx.ModelProto:
    """A copy of `model` whose outputs carry the reference's names (outputs paired by position);
    a tensor of `model` already holding one of those names is renamed out of the way first."""
    renames = {c: r for r, c in pairs if r != c}
    taken = set(renames.values()) - set(renames)
    renames.update({name: f"{name}/graphfix_renamed" for name in taken})
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for graph in all_graphs(result.graph):
        for node in graph.node:
            node.input[:] = [renames.get(i, i) for i in node.input]
            node.output[:] = [renames.get(o, o) for o in node.output]
        for value in (*graph.input, *graph.output, *graph.value_info):
            value.name = renames.get(value.name, value.name)
    return result


def _check_comparable(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> None:
    ref_out = [o.name for o in reference.graph.output]
    cand_out = {o.name for o in candidate.graph.output}
    if set(ref_out) != cand_out:
        raise UsageError(
            "MODEL and CANDIDATE produce different outputs: only MODEL has "
            f"{sorted(set(ref_out) - cand_out) or 'none'}, only CANDIDATE has "
            f"{sorted(cand_out - set(ref_out)) or 'none'}; locate compares a model with its own "
            "conversion"
        )
    ref_tensors = {o for n in reference.graph.node for o in n.output if o} - set(ref_out)
    cand_tensors = {o for n in candidate.graph.node for o in n.output if o}
    shared = ref_tensors & cand_tensors
    if not shared:
        raise UsageError(
            f"CANDIDATE shares no intermediate tensor name with MODEL ({len(ref_tensors)} in MODEL,"
            f" {len(cand_tensors)} in CANDIDATE), so nothing can be compared tensor by tensor; "
            "export both from the same graph, or pass --precision to convert MODEL instead"
        )
