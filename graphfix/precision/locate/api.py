"""`graphfix.locate`: find where a candidate diverges from the float32 reference, and repair it.

One pipeline for every backend: `plan_locate` checks the options and makes every choice once
(`plan.py`); the reference streams through onnxruntime in float32 and the candidate through a
`CandidateRunner` (`runners.py`: onnxruntime, or TensorRT through polygraphy) chunk by chunk;
the nodes that create the error are ranked; the remedy search runs its trials on the same runner.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphfix.attention.matcher import find_attention
from graphfix.float_types import LOW_PRECISIONS, spellings
from graphfix.graph.index import node_label
from graphfix.model_io import LoadedModel
from graphfix.precision import policy
from graphfix.precision.locate.candidate import build_candidate
from graphfix.precision.locate.localise import RANGE_MAX, measure, module_path, rank_suspects
from graphfix.precision.locate.plan import (
    DEFAULT_MAX_TRIALS,
    DEFAULT_TOP,
    LocatePlan,
    ModelArg,
    RemedyPlan,
    candidate_of,
    check_options,
    default_tolerance,
    load_reference,
)
from graphfix.precision.locate.reference import (
    DEFAULT_CHUNK_BYTES,
    GraphPlan,
    TensorStreamer,
    chunk_tensors,
    plan_graph,
    stream_pairs,
)
from graphfix.precision.locate.remedies import TrialRunner, worst_error
from graphfix.precision.locate.report import LocateReport, with_remedies
from graphfix.precision.locate.runners import CandidateRunner, OnnxRuntimeCandidate
from graphfix.progress import step
from graphfix.validation.backends.tensorrt_backend import require_tensorrt
from graphfix.validation.compare import compare_output
from graphfix.validation.inputs import ValueRange, cast_feeds, input_specs, make_inputs
from graphfix.validation.low_precision import (
    LowPrecision,
    emulate_low_precision,
    low_precision_mode,
    low_precision_types,
)
from graphfix.validation.masked_rows import leave_out_masked_rows
from graphfix.validation.validate import Backend

PRECISIONS = spellings(LOW_PRECISIONS)  # --precision: float16, bfloat16, fp16, bf16
BACKENDS = (Backend.ONNXRUNTIME.value, Backend.TENSORRT.value)


def locate(
    model: ModelArg,
    candidate: ModelArg | None = None,
    *,
    precision: str | None = None,
    backend: str | None = None,
    inputs: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    ranges: Mapping[str, ValueRange | tuple[float, float]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    quantile: float | None = None,
    seed: int | None = None,
    remedies: bool | None = None,
    apply: bool | None = None,
    output: str | os.PathLike[str] | None = None,
    overwrite: bool | None = None,
    chunk_bytes: int | None = None,
    max_trials: int | None = None,
    top: int | None = None,
    remedy_base: str | None = None,
    low_precision: str | None = None,
    allow_nonfinite: bool | None = None,
    pair_outputs: str | None = None,
) -> LocateReport:
    """Compare every intermediate tensor of `candidate` (or of `model` converted to `precision`)
    with `model` run in float32, rank the nodes that create the error, and search remedies.

    `candidate`: an ONNX sharing `model`'s tensor names (e.g. the user's own float16 export).
    `precision` ("float16"/"bfloat16"): the candidate is `model` converted, and the remedy search
    (on unless `remedies=False`) looks for the fewest float32 nodes / attention strategies that
    make it pass validate's tolerance.  `apply`: keep the repaired model in the report; with
    `output`, write it (same rules as `graphfix fix`).  `backend="tensorrt"` builds TensorRT
    engines instead (see `trt_candidate`).  `chunk_bytes` bounds the intermediates held per side.
    `remedy_base`: what the remedy trials convert with — "minimal" (default: only what a trial
    proves necessary stays float32) or "convert_precision" (its default islands plus remedies).
    `low_precision`, `allow_nonfinite`, `pair_outputs`: as in `graphfix.validate` (onnxruntime
    only) — float16/bfloat16 materialised at every node output unless "as-is", NaN/inf on both
    sides fails unless allowed, CANDIDATE's outputs paired by name unless "position".
    """
    runs_on, converted_to = check_options(
        candidate_given=candidate is not None,
        precision=precision,
        backend=backend,
        apply=apply,
        output=output,
        remedies=remedies,
        max_trials=max_trials,
        chunk_bytes=chunk_bytes,
        remedy_base=remedy_base,
        onnxruntime_only={
            "--low-precision": low_precision,
            "--allow-nonfinite": allow_nonfinite,
            "--pair-outputs": pair_outputs,
        },
    )
    mode = low_precision_mode(low_precision)
    tensorrt = require_tensorrt() if runs_on is Backend.TENSORRT else None
    reference = load_reference(model, output=output, overwrite=overwrite)
    data = make_inputs(reference.model, shapes=shapes, ranges=ranges, npz=inputs, seed=seed or 0)
    cand = candidate_of(reference, candidate, converted_to=converted_to, pair_outputs=pair_outputs)
    plan = LocatePlan(
        reference=reference,
        candidate=cand.model,
        candidate_label=cand.label,
        converted_to=converted_to,
        computes_in=cand.computes_in,
        backend=runs_on,
        tensorrt=tensorrt,
        tolerance=default_tolerance(
            cand.computes_in, atol, rtol, quantile, allow_nonfinite=allow_nonfinite
        ),
        feeds=data.feeds,
        chunk_bytes=chunk_bytes or DEFAULT_CHUNK_BYTES,
        top=top or DEFAULT_TOP,
        remedies=RemedyPlan(
            search=converted_to is not None and remedies is not False,
            apply=bool(apply),
            output=output,
            overwrite=overwrite,
            base=remedy_base,
            max_trials=max_trials or DEFAULT_MAX_TRIALS[runs_on],
        ),
        notes=(*data.notes, *cand.notes),
        low_precision=mode,
    )
    return run_plan(plan)


def run_plan(plan: LocatePlan) -> LocateReport:
    """Localise, then (after a divergence of a converted MODEL) search remedies, all on one
    candidate runner."""
    with contextlib.closing(_candidate_runner(plan)) as runner:
        report, reference_outputs = _localise(plan, runner)
        if not report.diverges or not plan.remedies.search or not report.suspects:
            return report
        assert plan.converted_to is not None  # remedies search converted models only
        trials = TrialRunner(
            plan.reference.model,
            precision=plan.converted_to.value,
            feeds=plan.feeds,
            reference_outputs=reference_outputs,
            tolerance=plan.tolerance,
            base=plan.remedies.base,
            run_trial=runner.run_trial,
            attention_accumulation=runner.offers_attention_accumulation,
        )
        return with_remedies(
            report,
            plan.reference.model,
            report.suspects,
            report.tensors,
            trials,
            max_trials=plan.remedies.max_trials,
            apply=plan.remedies.apply,
            output=plan.remedies.output,
            overwrite=plan.remedies.overwrite,
        )


def _localise(
    plan: LocatePlan, runner: CandidateRunner
) -> tuple[LocateReport, dict[str, np.ndarray]]:
    """Stream both sides chunk by chunk, measure every shared tensor, compare the outputs and
    rank the suspects; also the reference's outputs, which the remedy trials are judged on."""
    start = time.perf_counter()
    reference = plan.reference
    step(f"comparing every tensor of {plan.candidate_label} with the float32 original")
    graph = plan_graph(reference.model, plan.feeds)
    cand_tensors = {o for n in plan.candidate.model.graph.node for o in n.output if o}
    outputs = [o.name for o in reference.model.graph.output]
    names = [s.tensor for s in graph.sites if s.tensor in cand_tensors]
    names += [o for o in outputs if o not in names and o in cand_tensors]
    chunks = chunk_tensors(names, graph.nbytes, plan.chunk_bytes)
    sites = {s.tensor: s for s in graph.sites}
    errors = []
    ref_out: dict[str, np.ndarray] = {}
    cand_out: dict[str, np.ndarray] = {}
    ref_run = reference  # a float16/bfloat16 MODEL runs under the same semantics as validate's
    if plan.low_precision is LowPrecision.MATERIALISE and low_precision_types(reference.model):
        ref_run = LoadedModel(emulate_low_precision(reference.model), reference.path, True)
    ref_feeds = cast_feeds(plan.feeds, input_specs(ref_run.model))
    with TensorStreamer(ref_run, label=plan.reference_label) as ref_stream:
        for name, r, c in stream_pairs(ref_stream, runner, ref_feeds, plan.feeds, chunks):
            if name in outputs:
                ref_out[name], cand_out[name] = r, c
            if name in sites:
                measured = measure(sites[name], r, c, range_max=RANGE_MAX[plan.computes_in.value])
                if measured is not None:
                    errors.append(measured)
    comparisons = tuple(compare_output(n, ref_out[n], cand_out[n], plan.tolerance) for n in ref_out)
    notes = [*plan.notes, *runner.notes]
    if not all(c.passed for c in comparisons):  # as validate judges them
        comparisons, masked = leave_out_masked_rows(
            reference, plan.feeds, comparisons, ref_out, cand_out, plan.tolerance
        )
        notes += masked
    diverges = not all(c.passed for c in comparisons)
    suspects = ()
    # Outputs alone cannot say where the error starts (an engine without debug tensors gives
    # nothing else): then bisect by rebuilds instead of ranking.
    intermediates = any(e.tensor not in outputs for e in errors)
    if diverges and intermediates:
        suspects = rank_suspects(
            errors,
            sites,
            precision=plan.computes_in.value,
            attention_blocks=_attention_blocks(reference.model),
            modules={
                node_label(n, i): m
                for i, n in enumerate(reference.model.graph.node)
                if (m := module_path(n))
            },
            top=plan.top,
        )
    elif diverges and plan.converted_to is not None:
        notes += _differential_rebuilds(plan, runner, graph, ref_out)
    report = LocateReport(
        reference=f"onnxruntime (CPU, float32, graph optimisations off) on {plan.reference_label}",
        candidate=runner.description,
        precision=plan.computes_in.value,
        low_precision=runner.low_precision,
        tolerance=plan.tolerance,
        diverges=diverges,
        outputs=comparisons,
        suspects=suspects,
        tensors=tuple(errors),
        chunks=len(chunks),
        seconds_localise=time.perf_counter() - start,
        notes=tuple(notes),
    )
    return report, ref_out


def _candidate_runner(plan: LocatePlan) -> CandidateRunner:
    if plan.backend is Backend.TENSORRT:
        from graphfix.precision.locate.trt_candidate import TensorRTCandidate

        return TensorRTCandidate(
            plan.candidate.model,
            label=plan.candidate_label,
            shapes={name: array.shape for name, array in plan.feeds.items()},
            status=plan.tensorrt,
        )
    return OnnxRuntimeCandidate(
        plan.candidate, label=plan.candidate_label, low_precision=plan.low_precision
    )


def _differential_rebuilds(
    plan: LocatePlan,
    runner: CandidateRunner,
    graph: GraphPlan,
    ref_out: Mapping[str, np.ndarray],
) -> list[str]:
    """Where no intermediate tensor could be compared (TensorRT without debug tensors): keep a
    prefix of the compute nodes in float32, rerun, and bisect on where the error goes away —
    ⌈log2(nodes)⌉ + 1 runs."""
    from graphfix.precision.locate.trt_candidate import bisect_prefix

    notes = ["no intermediate tensor could be compared: localised by differential rebuilds"]
    compute = [s.node for s in graph.sites if policy.is_compute(s.op_type)]

    def passes(keep: Sequence[str]) -> bool:
        assert plan.converted_to is not None  # rebuilds convert MODEL
        built = build_candidate(
            plan.reference.model, precision=plan.converted_to.value, keep=list(keep)
        )
        out, _ = runner.run_trial(built.model, plan.feeds)
        cmp = [compare_output(n, r, out[n], plan.tolerance) for n, r in ref_out.items()]
        notes.append(
            f"rebuild keeping {len(keep)} node(s) in float32: error {worst_error(cmp):.3g}"
        )
        return all(c.passed for c in cmp)

    k = bisect_prefix(compute, passes)
    if k:
        notes.append(
            f"differential rebuilds ({math.ceil(math.log2(max(len(compute), 2))) + 1} at most): "
            f"the error goes away once {compute[k - 1]} is float32"
        )
    return notes


def _attention_blocks(model: onnx.ModelProto) -> dict[str, int]:
    blocks: dict[str, int] = {}
    for match in find_attention(model):
        if match.location:
            continue  # a block inside an If/Loop body: its nodes are not the main graph's
        for bound in match.path:
            blocks[node_label(bound.node, bound.position)] = match.index
    return blocks
