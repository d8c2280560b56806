"""What runs `locate`'s candidate: one protocol, an onnxruntime runner and a TensorRT one.

onnxruntime runs the candidate on the CPU with its float16/bfloat16 rounding made explicit
(`emulate_low_precision`); TensorRT builds it through polygraphy
(`graphfix.precision.locate.trt_candidate`).  The pipeline in `api.py` reads both alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx

from graphfix.model_io import LoadedModel
from graphfix.precision.locate.emulate import emulate_low_precision
from graphfix.precision.locate.reference import TensorStream, TensorStreamer
from graphfix.precision.locate.remedies import run_trial_on_onnxruntime


class CandidateRunner(TensorStream, Protocol):
    """Runs the candidate: its tensors a chunk at a time (`stream`: per chunk, those the runner
    could read), and remedy trials' models."""

    description: str  # what ran, for the report
    notes: list[str]  # what the report should say about how it ran

    def run_trial(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float | None]:
        """`model`'s outputs on `feeds`, and its latency in ms where that means something."""
        ...

    def close(self) -> None: ...


class OnnxRuntimeCandidate:
    """The candidate on onnxruntime's CPU, each float16/bfloat16 tensor rounded where stored."""

    def __init__(self, model: LoadedModel, *, label: str, computes_in: str) -> None:
        self.notes: list[str] = []
        emulated = emulate_low_precision(model.model)
        if len(emulated.graph.node) != len(model.model.graph.node):  # it stores something low
            model = LoadedModel(emulated, model.path, True)
            self.notes.append(
                f"{computes_in} rounding made explicit (a Cast pair after every {computes_in} "
                f"tensor): onnxruntime's CPU otherwise runs most {computes_in} ops in float32"
            )
        self._streamer = TensorStreamer(model, label=label)
        self.description = f"onnxruntime (CPU) on {label}"

    def stream(
        self, chunks: Sequence[Sequence[str]], feeds: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]:
        return self._streamer.stream(chunks, feeds)

    def run_trial(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float | None]:
        return run_trial_on_onnxruntime(model, feeds)

    def close(self) -> None:
        self._streamer.close()
