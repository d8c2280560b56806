"""`graphfix.locate`: find where a candidate diverges from the float32 reference, and repair it."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphfix.attention.matcher import find_attention
from graphfix.errors import UsageError
from graphfix.graph.index import node_label
from graphfix.model_io import LoadedModel, check_output_path, load_model
from graphfix.plugins.reference import has_plugin_ops, with_reference_ops
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.precision.locate.candidate import BASES, build_candidate
from graphfix.precision.locate.emulate import emulate_low_precision
from graphfix.precision.locate.localise import RANGE_MAX, measure, module_path, rank_suspects
from graphfix.precision.locate.reference import (
    DEFAULT_CHUNK_BYTES,
    TensorStreamer,
    chunk_tensors,
    plan_graph,
    stream_pairs,
)
from graphfix.precision.locate.remedies import TrialRunner
from graphfix.precision.locate.report import LocateReport, with_remedies
from graphfix.progress import step
from graphfix.validation.compare import DEFAULT_TOLERANCES, Tolerance, compare_output
from graphfix.validation.inputs import ValueRange, check_same_inputs, input_specs, make_inputs
from graphfix.validation.validate import _model_precision

PRECISIONS = ("float16", "bfloat16")
DEFAULT_MAX_TRIALS = 32  # candidate runs the remedy search may make

BACKENDS = ("onnxruntime", "tensorrt")
_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_LONG = {v: k for k, v in _SHORT.items()}
ModelArg = onnx.ModelProto | LoadedModel | str | os.PathLike[str]


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
    """
    if remedy_base not in (None, *BASES):
        raise UsageError(f"remedy_base {remedy_base!r} is not one of {', '.join(BASES)}")
    if backend not in (None, *BACKENDS):
        raise UsageError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if precision is not None and precision not in PRECISIONS:
        raise UsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if (candidate is None) == (precision is None):
        raise UsageError(
            "give either a CANDIDATE model or --precision float16|bfloat16 (the candidate is then "
            "MODEL converted), not " + ("both" if candidate is not None else "neither")
        )
    if apply and precision is None:
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
    if backend == "tensorrt":
        from graphfix.precision.locate.trt_candidate import locate_tensorrt

        return locate_tensorrt(
            model,
            precision=precision,
            shapes=shapes,
            ranges=ranges,
            inputs=inputs,
            seed=seed,
            chunk_bytes=chunk_bytes,
            remedies=remedies,
            apply=apply,
            output=output,
            overwrite=overwrite,
            max_trials=max_trials,
        )
    reference = load_model(model, load_weights=True)
    if has_plugin_ops(reference.model):
        raise UsageError(
            f"MODEL {_label(reference, 'model')} has {PLUGIN_DOMAIN} plugin nodes (a `graphfix fix` "
            "output); locate runs MODEL as the float32 reference: pass the original export as "
            "MODEL, and the fixed model as CANDIDATE"
        )
    if output is not None:
        check_output_path(reference.model, output, source=reference.path, overwrite=overwrite)
    data = make_inputs(reference.model, shapes=shapes, ranges=ranges, npz=inputs, seed=seed or 0)
    notes = list(data.notes)
    if candidate is not None:
        cand = load_model(candidate, load_weights=True)
        if has_plugin_ops(cand.model):  # as validate does without TensorRT
            cand = LoadedModel(with_reference_ops(cand.model), cand.path, True)
            notes.append(
                "the candidate's plugin nodes run as graphfix's reference ops (standard ONNX), as "
                "in validate's wiring check: their kernels are not what is compared"
            )
        notes += check_same_inputs(input_specs(reference.model), input_specs(cand.model))
        _check_comparable(reference.model, cand.model)
        computes_in = _LONG[_model_precision(cand.model)]
        cand_label = _label(cand, "candidate")
    else:
        step(f"converting {_label(reference, 'model')} to {precision}")
        built = build_candidate(reference.model, precision=precision)
        cand = LoadedModel(built.model, None, True)
        computes_in = precision
        cand_label = f"{_label(reference, 'model')} converted to {precision} by {built.converter}"
    default = DEFAULT_TOLERANCES[_SHORT[computes_in]]
    tolerance = Tolerance(
        atol=default.atol if atol is None else atol,
        rtol=default.rtol if rtol is None else rtol,
        quantile=quantile,
    )

    start = time.perf_counter()
    step(f"comparing every tensor of {cand_label} with the float32 original")
    plan = plan_graph(reference.model, data.feeds)
    cand_tensors = {o for n in cand.model.graph.node for o in n.output if o}
    outputs = [o.name for o in reference.model.graph.output]
    names = [s.tensor for s in plan.sites if s.tensor in cand_tensors]
    names += [o for o in outputs if o not in names and o in cand_tensors]
    chunks = chunk_tensors(names, plan.nbytes, chunk_bytes or DEFAULT_CHUNK_BYTES)
    sites = {s.tensor: s for s in plan.sites}
    errors = []
    ref_out: dict[str, np.ndarray] = {}
    cand_out: dict[str, np.ndarray] = {}
    emulated = emulate_low_precision(cand.model)
    if len(emulated.graph.node) != len(cand.model.graph.node):  # it stores something low
        cand = LoadedModel(emulated, cand.path, True)
        notes.append(
            f"{computes_in} rounding made explicit (a Cast pair after every {computes_in} "
            f"tensor): onnxruntime's CPU otherwise runs most {computes_in} ops in float32"
        )
    with (
        TensorStreamer(reference, label=_label(reference, "model")) as ref_stream,
        TensorStreamer(cand, label=cand_label) as cand_stream,
    ):
        for name, r, c in stream_pairs(ref_stream, cand_stream, data.feeds, data.feeds, chunks):
            if name in outputs:
                ref_out[name], cand_out[name] = r, c
            if name in sites:
                measured = measure(sites[name], r, c, range_max=RANGE_MAX[computes_in])
                if measured is not None:
                    errors.append(measured)
    comparisons = tuple(compare_output(n, ref_out[n], cand_out[n], tolerance) for n in ref_out)
    diverges = not all(c.passed for c in comparisons)
    suspects = ()
    if diverges:
        suspects = rank_suspects(
            errors,
            sites,
            precision=computes_in,
            attention_blocks=_attention_blocks(reference.model),
            modules={
                node_label(n, i): m
                for i, n in enumerate(reference.model.graph.node)
                if (m := module_path(n))
            },
            top=top or 10,
        )
    seconds = time.perf_counter() - start
    report = LocateReport(
        reference=f"onnxruntime (CPU, float32, graph optimisations off) on "
        f"{_label(reference, 'model')}",
        candidate=f"onnxruntime (CPU) on {cand_label}",
        precision=computes_in,
        tolerance=tolerance,
        diverges=diverges,
        outputs=comparisons,
        suspects=suspects,
        tensors=tuple(errors),
        chunks=len(chunks),
        seconds_localise=seconds,
        notes=tuple(notes),
    )
    if not diverges or precision is None or remedies is False:
        return report
    runner = TrialRunner(
        reference.model,
        precision=precision,
        feeds=data.feeds,
        reference_outputs=ref_out,
        tolerance=tolerance,
        base=remedy_base,
    )
    return with_remedies(
        report,
        reference.model,
        suspects,
        errors,
        runner,
        max_trials=max_trials or DEFAULT_MAX_TRIALS,
        apply=apply,
        output=output,
        overwrite=overwrite,
    )


def _label(model: LoadedModel, fallback: str) -> str:
    return str(model.path) if model.path is not None else f"the {fallback} (in memory)"


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


def _attention_blocks(model: onnx.ModelProto) -> dict[str, int]:
    blocks: dict[str, int] = {}
    for match in find_attention(model):
        for name, position in zip(match.chain_nodes, match.chain_positions, strict=False):
            blocks[node_label(model.graph.node[position], position) if not name else name] = (
                match.index
            )
    return blocks
