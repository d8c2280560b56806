"""The one exception root for problems the user can fix, and the exit code each one means.

Exit codes (DESIGN.md, every command): 0 success; 1 the check ran and failed (a `CheckFailed`);
2 the user's input or options are wrong; 3 the environment cannot do it (a runtime or TensorRT
missing or unable to load the model, a build failed).  The CLI prints one line, no traceback.
"""

from __future__ import annotations

from typing import ClassVar


class GraphfixError(Exception):
    """A problem with the user's input or environment that the user can fix.

    Messages say what failed, the actual value, what was expected and what to do next.
    `exit_code` is what the CLI exits with when this error reaches it.
    """

    exit_code: ClassVar[int] = 2


class UsageError(GraphfixError):
    """The command line or its inputs contradict each other (exit code 2)."""


class ModelLoadError(GraphfixError):
    """The model file is missing, is not ONNX, is truncated, or its external data is missing."""


class UnsupportedModelError(GraphfixError):
    """The model uses an opset or op that graphfix does not understand."""


class OutputPathError(GraphfixError):
    """The output path would overwrite the input or an existing file without permission."""


class SelectionError(GraphfixError):
    """A selector (`--select`, `--keep`, …) is empty or matches nothing in the model."""


class EnvironmentProblem(GraphfixError):
    """The environment cannot do it: a runtime, TensorRT or a build tool is missing or fails (exit 3)."""

    exit_code: ClassVar[int] = 3


class PluginBuildError(EnvironmentProblem):
    """The TensorRT plugin library cannot be built or found (missing nvcc, headers, ...)."""


class CheckFailed(GraphfixError):
    """A check ran and failed: validation mismatch, divergence not repaired, lint findings (exit 1)."""

    exit_code: ClassVar[int] = 1


class InvalidOutputError(CheckFailed):
    """The model to be written fails ONNX's checker: nothing is written (exit 1)."""
