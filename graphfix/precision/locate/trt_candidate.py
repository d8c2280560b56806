"""The TensorRT candidate of `locate` (`--backend tensorrt`), through polygraphy.

NOT RUN HERE: this machine has no TensorRT; the code follows polygraphy 0.53's sources
(`backend/trt/loader.py` NetworkFromOnnxPath / CreateConfig / EngineFromNetwork, `runner.py`
TrtRunner and its IDebugListener) and TensorRT 10.14's NvInfer.h, and its tests are marked `trt`.

Outputs are never marked (marking changes what TensorRT fuses, TensorRT issues #4351/#4400).
Where the network has `markUnfusedTensorsAsDebugTensors` (TensorRT ≥ 10.x: polygraphy's
`mark_unfused_tensors_as_debug_tensors`), the engine is built once with it — it does not prevent
fusion — and each chunk of tensor names is read through a debug listener that keeps only that
chunk, so memory stays bounded as for onnxruntime.  TensorRT may report internal names for such
tensors (NvInfer.h's warning); tensors whose names do not match an ONNX tensor are skipped and
counted in the report's notes.  Without debug tensors, the suspect is found by differential
rebuilds: keep a prefix of the compute nodes in float32, rebuild, and bisect on where the error
goes away — ⌈log2(nodes)⌉ + 1 engine builds.  The remedy search then runs as with onnxruntime,
each trial an engine build whose inference latency is reported with its error.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from graphfix.errors import EnvironmentProblem, UsageError
from graphfix.model_io import load_model
from graphfix.precision import policy
from graphfix.precision.locate.candidate import build_candidate
from graphfix.precision.locate.localise import RANGE_MAX, measure, rank_suspects
from graphfix.precision.locate.reference import (
    DEFAULT_CHUNK_BYTES,
    TensorStreamer,
    chunk_tensors,
    plan_graph,
)
from graphfix.precision.locate.remedies import TrialRunner, worst_error
from graphfix.precision.locate.report import LocateReport, with_remedies
from graphfix.validation.compare import DEFAULT_TOLERANCES, compare_output
from graphfix.validation.inputs import make_inputs


def require_polygraphy_trt():
    """polygraphy's TensorRT backend and tensorrt itself, or EnvironmentProblem (exit 3)."""
    try:
        import tensorrt  # noqa: F401
        from polygraphy.backend import trt as poly_trt
    except ImportError as exc:
        raise EnvironmentProblem(
            f"--backend tensorrt needs TensorRT and polygraphy ({exc}); install TensorRT, or use "
            "--backend onnxruntime"
        ) from exc
    return poly_trt


class TensorRTCandidate:
    """An engine of an ONNX file built by polygraphy; `fetch(names)` reads debug tensors."""

    def __init__(self, onnx_path: Path, *, debug_tensors: bool) -> None:
        trt_mod = require_polygraphy_trt()
        self.debug_tensors = debug_tensors
        network = trt_mod.NetworkFromOnnxPath(
            str(onnx_path),
            strongly_typed=True,  # the precision is in the ONNX (TensorRT 11 has no --fp16)
            mark_unfused_tensors_as_debug_tensors=debug_tensors or None,
        )
        start = time.perf_counter()
        self.engine = trt_mod.EngineFromNetwork(network, config=trt_mod.CreateConfig())()
        self.build_seconds = time.perf_counter() - start
        self._trt_mod = trt_mod
        self.unmatched = 0

    def run(self, feeds: Mapping[str, np.ndarray], keep: set[str] | None = None):
        listener = _chunk_listener(keep) if keep is not None else None
        with self._trt_mod.TrtRunner(self.engine, debug_listener=listener) as runner:
            start = time.perf_counter()
            outputs = dict(runner.infer(feeds))
            latency = time.perf_counter() - start
        if listener is not None:
            outputs.update(listener.tensors)
            self.unmatched += listener.unmatched
        return outputs, latency


def _chunk_listener_class():
    import tensorrt as trt
    from polygraphy import cuda

    class ChunkListener(trt.IDebugListener):
        """Copies to the host only the debug tensors of the current chunk (polygraphy's own
        listener keeps every one, which is what runs out of memory on big models, #4443)."""

        def __init__(self, keep: set[str]) -> None:
            trt.IDebugListener.__init__(self)
            self.keep = keep
            self.tensors: dict[str, np.ndarray] = {}
            self.unmatched = 0

        def process_debug_tensor(self, addr, location, type, shape, name, stream):
            if name not in self.keep:
                self.unmatched += 1
                return
            dtype = trt.nptype(type)
            host = np.empty(tuple(shape), dtype=dtype)
            cuda.wrapper().stream_synchronize(stream)
            if location == trt.TensorLocation.HOST:
                import ctypes

                ctypes.memmove(host.ctypes.data, addr, host.nbytes)
            else:
                cuda.wrapper().memcpy(
                    dst=host.ctypes.data,
                    src=addr,
                    nbytes=host.nbytes,
                    kind=cuda.MemcpyKind.DeviceToHost,
                    stream_ptr=stream,
                )
                cuda.wrapper().stream_synchronize(stream)
            self.tensors[name] = host

    return ChunkListener


def _chunk_listener(keep: set[str]):  # tensorrt is imported on use only
    return _chunk_listener_class()(keep)


def bisect_prefix(nodes: Sequence[str], passes: Callable[[Sequence[str]], bool]) -> int | None:
    """The smallest k such that keeping nodes[:k] in float32 passes (passes must be monotone);
    None when even all of them do not.  Calls `passes` at most ⌈log2(len)⌉ + 1 times."""
    if not passes(nodes):
        return None
    low, high = 0, len(nodes)
    while low < high:
        middle = (low + high) // 2
        if passes(nodes[:middle]):
            high = middle
        else:
            low = middle + 1
    return low


class TensorRTTrialRunner(TrialRunner):
    """Remedy trials as engine builds: each trial's model is built by polygraphy (no debug
    tensors, no marked outputs) and run once; its latency is the trial's `latency_ms`."""

    @property
    def offers_attention_accumulation(self) -> bool:
        """IAttention accumulates in float32 around float32 Casts from TensorRT 11.3 on."""
        import tensorrt as trt

        major, minor = (int(part) for part in trt.__version__.split(".")[:2])
        return (major, minor) >= (11, 3)

    def run_candidate(self, model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], float | None]:
        with tempfile.TemporaryDirectory(prefix="graphfix-locate-trial-") as folder:
            path = Path(folder) / "trial.onnx"
            onnx.save(model, path, save_as_external_data=True, location="trial.data")
            outputs, seconds = TensorRTCandidate(path, debug_tensors=False).run(self.feeds)
        return outputs, seconds * 1e3


def locate_tensorrt(
    model,
    *,
    precision: str | None,
    shapes=None,
    ranges=None,
    inputs=None,
    seed: int | None = None,
    chunk_bytes: int | None = None,
    remedies: bool | None = None,
    apply: bool | None = None,
    output=None,
    overwrite: bool | None = None,
    max_trials: int | None = None,
) -> LocateReport:
    """`locate` with the candidate a TensorRT engine of `model` converted to `precision`; the
    remedy search (unless `remedies=False`) builds one engine per trial."""
    require_polygraphy_trt()
    if precision is None:
        raise UsageError("--backend tensorrt locates MODEL converted by --precision; pass it")
    reference = load_model(model, load_weights=True)
    data = make_inputs(reference.model, shapes=shapes, ranges=ranges, npz=inputs, seed=seed or 0)
    built = build_candidate(reference.model, precision=precision)
    folder = tempfile.TemporaryDirectory(prefix="graphfix-locate-trt-")
    path = Path(folder.name) / "candidate.onnx"
    onnx.save(built.model, path, save_as_external_data=True, location="candidate.data")
    short = {"float16": "fp16", "bfloat16": "bf16"}[precision]
    tolerance = DEFAULT_TOLERANCES[short]
    outputs = [o.name for o in reference.model.graph.output]
    start = time.perf_counter()
    plan = plan_graph(reference.model, data.feeds)
    sites = {s.tensor: s for s in plan.sites}
    notes = [f"TensorRT candidate built by polygraphy from MODEL converted by {built.converter}"]
    engine = TensorRTCandidate(path, debug_tensors=True)
    errors = []
    with TensorStreamer(reference, label=str(reference.path or "the model")) as ref_stream:
        ref_out = ref_stream.fetch(outputs, data.feeds)
        cand_out, _ = engine.run(data.feeds, keep=set())
        names = [s.tensor for s in plan.sites if s.tensor not in outputs]
        for chunk in chunk_tensors(names, plan.nbytes, chunk_bytes or DEFAULT_CHUNK_BYTES):
            ref = ref_stream.fetch(chunk, data.feeds)
            cand, _ = engine.run(data.feeds, keep=set(chunk))
            for name in chunk:
                if name in ref and name in cand:
                    e = measure(sites[name], ref[name], cand[name], range_max=RANGE_MAX[precision])
                    if e is not None:
                        errors.append(e)
    comparisons = tuple(
        compare_output(n, ref_out[n], cand_out[n], tolerance) for n in outputs if n in cand_out
    )
    diverges = not all(c.passed for c in comparisons)
    suspects = rank_suspects(errors, sites, precision=precision) if diverges and errors else ()
    if diverges and not errors:
        notes.append(
            "no debug tensor matched an ONNX tensor name: localised by differential "
            "rebuilds instead"
        )
        compute = [s.node for s in plan.sites if policy.is_compute(s.op_type)]

        def passes(keep: Sequence[str]) -> bool:
            candidate = build_candidate(reference.model, precision=precision, keep=list(keep))
            onnx.save(candidate.model, path, save_as_external_data=True, location="candidate.data")
            out, _ = TensorRTCandidate(path, debug_tensors=False).run(data.feeds)
            cmp = [compare_output(n, ref_out[n], out[n], tolerance) for n in outputs]
            notes.append(
                f"rebuild keeping {len(keep)} node(s) in float32: error {worst_error(cmp):.3g}"
            )
            return all(c.passed for c in cmp)

        k = bisect_prefix(compute, passes)
        if k:
            notes.append(
                f"differential rebuilds ({math.ceil(math.log2(max(len(compute), 2))) + 1}"
                f" at most): the error goes away once {compute[k - 1]} is float32"
            )
    if engine.unmatched:
        notes.append(f"{engine.unmatched} debug tensor(s) carried TensorRT-internal names")
    folder.cleanup()
    report = LocateReport(
        reference=f"onnxruntime (CPU, float32) on {reference.path}",
        candidate=f"TensorRT (polygraphy) on MODEL converted to {precision}",
        precision=precision,
        tolerance=tolerance,
        diverges=diverges,
        outputs=comparisons,
        suspects=suspects,
        tensors=tuple(errors),
        chunks=1,
        seconds_localise=time.perf_counter() - start,
        notes=tuple(notes),
    )
    if not diverges or remedies is False or not suspects:
        return report
    runner = TensorRTTrialRunner(
        reference.model,
        precision=precision,
        feeds=data.feeds,
        reference_outputs=ref_out,
        tolerance=tolerance,
    )
    return with_remedies(
        report,
        reference.model,
        suspects,
        errors,
        runner,
        max_trials=max_trials or 16,
        apply=apply,
        output=output,
        overwrite=overwrite,
    )
