"""The one exception root for problems the user can fix."""

from __future__ import annotations


class GraphfixError(Exception):
    """A problem with the user's input or environment that the user can fix.

    The CLI prints the message on one line and exits with code 1 (2 for usage errors) without a
    traceback.  Messages say what failed, the actual value, what was expected and what to do next.
    """


class ModelLoadError(GraphfixError):
    """The model file is missing, is not ONNX, is truncated, or its external data is missing."""


class UnsupportedModelError(GraphfixError):
    """The model uses an opset or op that graphfix does not understand."""


class OutputPathError(GraphfixError):
    """The output path would overwrite the input or an existing file without permission."""


class SelectionError(GraphfixError):
    """A `select` entry matches no attention block."""


class PluginBuildError(GraphfixError):
    """The TensorRT plugin library cannot be built or found (missing nvcc, headers, ...)."""


class UsageError(GraphfixError):
    """The command line or its inputs contradict each other; the CLI exits with code 2."""
