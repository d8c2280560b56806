"""Progress of long steps, on stderr, where a person is watching.

A command turns it on with `reporting(enabled=...)`: the CLI does when stderr is a terminal and
neither --quiet nor --json was given.  Library code marks the start of each step that can take
more than a few seconds (a conversion, a reference run, a remedy trial, an engine build) with
`step("...")`, which prints one line with the time since the command started:

    graphfix: [  12.4 s] running the original: onnxruntime (CPU) on model.onnx

Without a reporter `step` prints nothing, so the Python API stays silent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class _Reporter:
    stream: TextIO
    started: float


_REPORTER: ContextVar[_Reporter | None] = ContextVar("graphfix_progress", default=None)


def step(what: str) -> None:
    """Say that `what` starts now, where progress is being reported."""
    reporter = _REPORTER.get()
    if reporter is None:
        return
    elapsed = time.monotonic() - reporter.started
    print(f"graphfix: [{elapsed:6.1f} s] {what}", file=reporter.stream, flush=True)


@contextmanager
def reporting(*, enabled: bool | None = None, stream: TextIO | None = None) -> Iterator[None]:
    """Report `step`s on `stream` (default stderr) within the block; `enabled` None: when the
    stream is a terminal."""
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        enabled = stream.isatty()
    token = _REPORTER.set(_Reporter(stream, time.monotonic()) if enabled else None)
    try:
        yield
    finally:
        _REPORTER.reset(token)
