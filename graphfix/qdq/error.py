"""Error of a quantized model and of its fixed version against the float model (onnxruntime).

Sessions run with graph optimizations off, so Q/DQ nodes compute exactly what ONNX specifies
(fake quantization), as TensorRT's explicit quantization is meant to reproduce; onnxruntime's
QDQ fusions would otherwise swap in its own integer kernels.  A quantized model that stores
float16/bfloat16 runs with those tensors materialised (`graphfix.validation.low_precision`), as
every verdict graphfix gives does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphfix.errors import EnvironmentProblem, UsageError
from graphfix.model_io import LoadedModel, load_model
from graphfix.progress import step
from graphfix.qdq.report import ErrorCheck
from graphfix.validation.low_precision import (
    LowPrecision,
    describe_low_precision,
    emulate_low_precision,
    low_precision_types,
)
from graphfix.validation.random_ops import seed_random_ops

DEFAULT_SAMPLES = 2


class ErrorGuard:
    """Measures models against the float reference on fixed inputs; remembers the input model's
    error as the bound a fix must stay within."""

    def __init__(
        self,
        quantized: onnx.ModelProto,
        reference: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
        *,
        feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
        max_trials: int = 48,
    ) -> None:
        ref = load_model(reference, load_weights=True)
        self.label = str(ref.path) if ref.path is not None else "reference model"
        ref_inputs = _input_names(ref.model)
        quantized_inputs = _input_names(quantized)
        if ref_inputs != quantized_inputs:
            raise UsageError(
                f"the float model {self.label} takes inputs {sorted(ref_inputs)}, the quantized "
                f"model {sorted(quantized_inputs)}; pass the float model the quantized one was "
                "made from"
            )
        if feeds is None:
            from graphfix.validation.inputs import make_inputs

            feeds = [make_inputs(ref.model, seed=seed).feeds for seed in range(DEFAULT_SAMPLES)]
        self.feeds = [dict(f) for f in feeds]
        # how the quantized model and its fixes run (the float reference runs as written)
        self.low_precision = describe_low_precision(
            LowPrecision.MATERIALISE, low_precision_types(quantized)
        )
        self.expected = [run(ref.model, f) for f in self.feeds]
        self.bound = self.error(quantized)
        self.max_trials = max_trials
        self.trials = 0

    def error(self, model: onnx.ModelProto) -> tuple[float, float]:
        """(max |Δ|, mean |Δ|) over all outputs and samples."""
        diffs = []
        if self.low_precision is not None:
            model = emulate_low_precision(model)
        for feed, expected in zip(self.feeds, self.expected, strict=True):
            actual = run(model, feed)
            if len(actual) != len(expected):
                raise UsageError(
                    f"the quantized model has {len(actual)} outputs, the float model "
                    f"{len(expected)}; pass the float model the quantized one was made from"
                )
            diffs += [
                np.abs(a.astype(np.float64) - e.astype(np.float64)).reshape(-1)
                for a, e in zip(actual, expected, strict=True)
            ]
        flat = np.concatenate(diffs)
        return float(flat.max()), float(flat.mean())

    @property
    def exhausted(self) -> bool:
        return self.trials >= self.max_trials

    def acceptable(self, model: onnx.ModelProto) -> bool:
        self.trials += 1
        step(f"error guard: trial {self.trials} of at most {self.max_trials} against the float model")
        worst, mean = self.error(model)
        return worst <= self.bound[0] and mean <= self.bound[1]

    def check(self, fixed: onnx.ModelProto) -> ErrorCheck:
        after = self.error(fixed)
        return ErrorCheck(self.label, self.bound[0], after[0], self.bound[1], after[1])


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    model = seed_random_ops(model) or model  # the float and quantized models draw alike
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own exception types; keep its message
        raise EnvironmentProblem(
            f"onnxruntime cannot load the model to measure its error: {exc}".splitlines()[0]
        ) from exc
    names = {i.name for i in session.get_inputs()}
    missing = names - set(feeds)
    if missing:
        raise UsageError(
            f"the inputs given lack {', '.join(sorted(missing))}; the models take "
            f"{', '.join(sorted(names))}"
        )
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def _input_names(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that are fed at run time (initializers listed as inputs left out)."""
    initializers = {i.name for i in model.graph.initializer}
    return {i.name for i in model.graph.input if i.name not in initializers}
