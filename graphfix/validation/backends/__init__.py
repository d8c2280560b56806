"""Where a model runs for validation: onnxruntime on the CPU, or a TensorRT engine.

Each backend module offers a runner with `description` and `infer(feeds) -> {output: array}`;
`validate` picks one for each side.  Importing this package never imports TensorRT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol

import numpy as np

from graphfix.errors import EnvironmentProblem


class BackendError(EnvironmentProblem):
    """A backend cannot load, build or run a model (the CLI exits with code 3)."""


class InputsRejected(BackendError):
    """The model refused the inputs it was run on (onnxruntime's INVALID_ARGUMENT at run time:
    an index out of range, a shape the graph cannot take).  `validate` decides whose fault that
    is: the inputs' (exit 2) when the original refused them, the candidate's (a failed check,
    exit 1) when the original ran on them."""

    exit_code: ClassVar[int] = 2

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(f"{what}; {hint}")
        self.what = what


class Runner(Protocol):
    """A model made ready to run on one backend.

    `description`: one line saying what runs where; `lowered_nodes`: how many graphfix plugin
    nodes were replaced by their reference ops to run here (0 where the plugins themselves run);
    `low_precision`: how float16/bfloat16 tensors were made to run (None: as the backend runs
    them, e.g. TensorRT storing them in their type).
    """

    description: str
    lowered_nodes: int
    low_precision: str | None

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...
