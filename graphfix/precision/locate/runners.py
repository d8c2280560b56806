"""What runs `locate`'s candidate: one protocol, an onnxruntime runner and a TensorRT one.

onnxruntime runs the candidate on the CPU with its float16/bfloat16 tensors materialised where
they are produced (`graphfix.validation.low_precision`, unless asked to run it as is); TensorRT
builds it through polygraphy
(`graphfix.precision.locate.trt_candidate`).  The pipeline in `api.py` reads both alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx

from graphfix.model_io import LoadedModel
from graphfix.precision.locate.reference import TensorStream, TensorStreamer
from graphfix.precision.locate.remedies import run_trial_on_onnxruntime
from graphfix.validation.inputs import cast_feeds, input_specs
from graphfix.validation.low_precision import (
    LowPrecision,
    describe_low_precision,
    low_precision_types,
    materialise,
)
from graphfix.validation.random_ops import random_note, unseeded_random_nodes


class CandidateRunner(TensorStream, Protocol):
    """Runs the candidate: its tensors a chunk at a time (`stream`: per chunk, those the runner
    could read), and remedy trials' models."""

    description: str  # what ran, for the report
    notes: list[str]  # what the report should say about how it ran
    low_precision: str | None  # how float16/bfloat16 ran (None: as the backend stores them)
    # whether trials honour float32 accumulation through IAttention (remedies.py)
    offers_attention_accumulation: bool

    def run_trial(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float | None]:
        """`model`'s outputs on `feeds`, and its latency in ms where that means something."""
        ...

    def close(self) -> None: ...


class OnnxRuntimeCandidate:
    """The candidate on onnxruntime's CPU, each float16/bfloat16 tensor materialised where it is
    produced (`low_precision` MATERIALISE) or run as onnxruntime runs it (AS_IS)."""

    offers_attention_accumulation = True  # trials lower Attention with float16 materialised

    def __init__(self, model: LoadedModel, *, label: str, low_precision: LowPrecision) -> None:
        self.notes: list[str] = []
        self._mode = low_precision
        types = low_precision_types(model.model)
        self.low_precision = describe_low_precision(low_precision, types)
        if self.low_precision is not None and low_precision is LowPrecision.MATERIALISE:
            done = materialise(model.model)
            model = LoadedModel(done.model, model.path, True)
            self.low_precision = describe_low_precision(low_precision, types, untyped=done.untyped)
        self._specs = input_specs(model.model)  # float16 inputs: float32 once materialised
        self._streamer = TensorStreamer(model, label=label)
        if unseeded_random_nodes(model.model):
            self.notes += random_note(model.model, model.model, candidate_on_onnxruntime=True)
        self.description = f"onnxruntime (CPU) on {label}"

    def stream(
        self, chunks: Sequence[Sequence[str]], feeds: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]:
        return self._streamer.stream(chunks, cast_feeds(feeds, self._specs))

    def run_trial(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float | None]:
        return run_trial_on_onnxruntime(model, feeds, low_precision=self._mode)

    def close(self) -> None:
        self._streamer.close()
