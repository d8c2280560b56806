"""The TensorRT candidate of `locate` (`--backend tensorrt`), through polygraphy.

NOT RUN HERE: this machine has no TensorRT; the code follows polygraphy 0.49.26 and 0.53.6's
sources (`backend/trt/loader.py` NetworkFromOnnxPath / CreateConfig / EngineFromNetwork,
`runner.py` TrtRunner and its IDebugListener) and TensorRT 10.14's and 11's NvInfer.h; what
needs TensorRT is tested in tests marked `trt`, the rest on its own.

It shares `validate`'s TensorRT plumbing (`graphfix.validation.backends.tensorrt_backend`): the
polygraphy requirement, polygraphy's log on stderr (so `--json` prints one document), one error
wrapping, and an optimization profile fixed to the feeds' shapes for dynamic inputs.

Outputs are never marked (marking changes what TensorRT fuses, TensorRT issues #4351/#4400).
Where the network has `markUnfusedTensorsAsDebugTensors` (TensorRT >= 10.12) and polygraphy's
TrtRunner takes a `debug_listener` (not 0.49.x), the engine is built once with it — it does not
prevent fusion — and each chunk of tensor names is read through a listener that copies only that
chunk to the host, so memory stays bounded as for onnxruntime.  TensorRT may give such tensors
internal names (NvInfer.h); those absent from the ONNX graph are counted in the report's notes.
Otherwise `locate` finds the suspect by differential rebuilds (`bisect_prefix`).
"""

from __future__ import annotations

import ctypes
import inspect
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from graphfix.model_io import save_model, system_temporary_prefix
from graphfix.progress import step
from graphfix.validation.backends.tensorrt_backend import (
    TensorRTStatus,
    optimization_profiles,
    polygraphy_errors,
    polygraphy_logs_on_stderr,
    refuse_bfloat16_io,
    require_tensorrt,
)
from graphfix.validation.inputs import input_specs

DEBUG_TENSORS_SINCE = (10, 12)  # INetworkDefinition::markUnfusedTensorsAsDebugTensors
# IAttention with Q, K, V cast from float16 to float32 keeps the FP16 fused kernel and
# accumulates in float32 (TensorRT 11.3 release notes)
ATTENTION_ACCUMULATION_SINCE = (11, 3)


def accumulates_attention_in_float32(status: TensorRTStatus) -> bool:
    """Whether this TensorRT honours locate's float32-accumulation-through-IAttention remedy."""
    version = tuple(int(p) for p in str(status.version).split(".")[:2])
    return version >= ATTENTION_ACCUMULATION_SINCE


def debug_tensor_problem(status: TensorRTStatus, runner_class: type | None = None) -> str | None:
    """Why this TensorRT and polygraphy cannot hand unfused tensors to a listener, or None.

    `runner_class`: polygraphy's TrtRunner (None: imported), whose `debug_listener` parameter
    0.49.x lacks."""
    version = tuple(int(p) for p in str(status.version).split(".")[:2])
    if version < DEBUG_TENSORS_SINCE:
        return (
            f"TensorRT {status.version} has no markUnfusedTensorsAsDebugTensors (TensorRT "
            f"{'.'.join(map(str, DEBUG_TENSORS_SINCE))} added it)"
        )
    if runner_class is None:
        from polygraphy.backend.trt import TrtRunner as runner_class
    if "debug_listener" not in inspect.signature(runner_class.__init__).parameters:
        return f"polygraphy {status.polygraphy}'s TrtRunner takes no debug_listener"
    return None


class DebugTensorFilter:
    """Which debug tensors a chunk keeps, and which names TensorRT made up.

    A name in the chunk is kept; a name of the ONNX graph outside it is another chunk's business;
    any other name is TensorRT-internal, counted once however many chunks see it."""

    def __init__(self, onnx_names: set[str]) -> None:
        self.onnx_names = onnx_names
        self.internal: set[str] = set()
        self.unreadable: set[str] = set()  # of a type NumPy cannot hold (fp8, int4, fp4)
        self.chunk: set[str] = set()

    def wants(self, name: str) -> bool:
        if name in self.chunk:
            return True
        if name not in self.onnx_names:
            self.internal.add(name)
        return False


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values copied as their uint16 bit patterns, as float32 (exact: bfloat16 is the
    upper half of a float32).  NumPy has no bfloat16, and `trt.nptype(trt.bfloat16)` raises."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _listener(trt, filter_: DebugTensorFilter):
    """A trt.IDebugListener copying to the host the tensors `filter_` wants (polygraphy's own
    listener keeps every one, which runs out of memory on big models, TensorRT #4443, and drops
    bfloat16 ones)."""
    from polygraphy import cuda

    class ChunkListener(trt.IDebugListener):
        def __init__(self) -> None:
            trt.IDebugListener.__init__(self)
            self.tensors: dict[str, np.ndarray] = {}

        def process_debug_tensor(self, addr, location, type, shape, name, stream):
            if not filter_.wants(name):
                return
            bfloat16 = type == trt.bfloat16
            try:  # trt.nptype (tensorrt/__init__.py) maps float32/16, int8/32/64, bool, uint8
                dtype = np.uint16 if bfloat16 else trt.nptype(type)
            except TypeError:  # fp8, int4, fp4: nothing in NumPy holds them
                filter_.unreadable.add(name)
                return
            host = np.empty(tuple(shape), dtype=dtype)
            cuda.wrapper().stream_synchronize(stream)
            if location == trt.TensorLocation.HOST:
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
            self.tensors[name] = widen_bfloat16(host) if bfloat16 else host

    return ChunkListener()


class TensorRTCandidate:
    """A candidate runner (`graphfix.precision.locate.runners.CandidateRunner`): `model` built
    into a strongly typed TensorRT engine by polygraphy, its unfused tensors read chunk by chunk."""

    def __init__(
        self,
        model: onnx.ModelProto,
        *,
        label: str,
        shapes: Mapping[str, Sequence[int]],
        status: TensorRTStatus | None = None,
    ) -> None:
        self.status = require_tensorrt(status)
        self.shapes = dict(shapes)
        self.label = label
        problem = debug_tensor_problem(self.status)
        self._notes = [] if problem is None else [f"no debug tensors: {problem}"]
        self._filter = DebugTensorFilter(
            {o for n in model.graph.node for o in n.output if o}
            | {i.name for i in model.graph.input}
        )
        self._folder = tempfile.TemporaryDirectory(prefix=system_temporary_prefix("locate-trt"))
        self._builds = 0
        self.engine, self.build_seconds = self._build(model, debug_tensors=problem is None)
        self.debug_tensors = problem is None
        self.low_precision: str | None = None  # the engine stores each tensor in its own type
        self.offers_attention_accumulation = accumulates_attention_in_float32(self.status)
        self.description = (
            f"TensorRT {self.status.version} (polygraphy {self.status.polygraphy}, strongly "
            f"typed) on {label}"
        )

    @property
    def notes(self) -> list[str]:
        notes = list(self._notes)
        if self._filter.internal:
            notes.append(
                f"{len(self._filter.internal)} debug tensor(s) carried TensorRT-internal names "
                "(absent from the ONNX graph) and were not compared"
            )
        if self._filter.unreadable:
            notes.append(
                f"{len(self._filter.unreadable)} debug tensor(s) of fp8/int4/fp4 type were not "
                f"compared: {', '.join(sorted(self._filter.unreadable)[:5])}"
            )
        return notes

    def close(self) -> None:
        self._folder.cleanup()

    def stream(
        self, chunks: Sequence[Sequence[str]], feeds: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]:
        """Each chunk's tensors the engine exposes (its outputs, and its debug tensors)."""
        outputs: dict[str, np.ndarray] | None = None
        for chunk in chunks:
            if self.debug_tensors or outputs is None:
                outputs, _ = self._run(self.engine, feeds, chunk if self.debug_tensors else None)
            yield {name: outputs[name] for name in chunk if name in outputs}

    def run_trial(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float | None]:
        """A remedy trial: `model` built (no debug tensors) and run once; latency in ms."""
        engine, _ = self._build(model, debug_tensors=False)
        outputs, seconds = self._run(engine, feeds, None)
        return outputs, seconds * 1e3

    def _build(self, model: onnx.ModelProto, *, debug_tensors: bool):
        from polygraphy.backend import trt as poly_trt

        refuse_bfloat16_io(model, self.label)
        self._builds += 1  # one file per build (a model over 2 GB spills to <name>.data)
        path = Path(self._folder.name) / f"build-{self._builds}.onnx"
        save_model(model, path)  # unlike onnx.save's external data, leaves `model` untouched
        with (
            polygraphy_logs_on_stderr(),
            polygraphy_errors(f"build an engine of {self.label}", status=self.status),
        ):
            network = poly_trt.NetworkFromOnnxPath(
                str(path),
                strongly_typed=True,  # the precision is in the ONNX (TensorRT 11 has no --fp16)
                mark_unfused_tensors_as_debug_tensors=debug_tensors or None,
            )
            config = poly_trt.CreateConfig(
                profiles=optimization_profiles(input_specs(model), self.shapes)
            )
            start = time.perf_counter()
            step(f"building TensorRT engine {self._builds} of {self.label}")
            engine = poly_trt.EngineFromNetwork(network, config=config)()
        return engine, time.perf_counter() - start

    def _run(self, engine, feeds: Mapping[str, np.ndarray], chunk: Sequence[str] | None):
        import tensorrt as trt
        from polygraphy.backend.trt import TrtRunner

        listener = None
        if chunk is not None:
            self._filter.chunk = set(chunk)
            listener = _listener(trt, self._filter)
        with (
            polygraphy_logs_on_stderr(),
            polygraphy_errors(f"run the engine of {self.label}", status=self.status),
        ):
            extra = {} if listener is None else {"debug_listener": listener}
            with TrtRunner(engine, **extra) as runner:
                start = time.perf_counter()
                outputs = {n: np.array(v) for n, v in runner.infer(feeds).items()}
                seconds = time.perf_counter() - start
        if listener is not None:
            outputs.update(listener.tensors)
        return outputs, seconds


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
