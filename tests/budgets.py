"""Time budgets of the heavy checks, the markers the default run leaves out.

Each marker's tests share one budget, counted from its first test: past it, the marker's remaining
tests skip with the reason (a slow or busy machine is not a failure), and a compile still running
is stopped (tests/compile_cache.py).  With the default run and the installs, both fit in CI's 90
minutes (`.ci/run`); the README gives their times on 2 quiet cores.
"""

from __future__ import annotations

import os
import time

import pytest

# marker → (environment variable, default seconds)
BUDGETS = {
    "compile": ("GRAPHFIX_COMPILE_BUDGET_S", 1800.0),
    "corpus": ("GRAPHFIX_CORPUS_BUDGET_S", 2400.0),
}
_started: dict[str, float] = {}


def seconds(marker: str) -> float:
    variable, default = BUDGETS[marker]
    configured = os.environ.get(variable)
    return float(configured) if configured else default


def remaining(marker: str) -> float:
    """Seconds left of `marker`'s budget; its clock starts at the first call."""
    started = _started.setdefault(marker, time.monotonic())
    return seconds(marker) - (time.monotonic() - started)


def spent(marker: str, *, doing: str = "") -> str:
    """Why a test of `marker` skips once its budget is spent."""
    variable, _ = BUDGETS[marker]
    return (
        f"{doing}the {marker} checks' budget of {seconds(marker):.0f} s (${variable}) is "
        "spent: this machine is slower or busier than it assumes; rerun with a larger budget"
    )


def skip_when_spent(marker: str) -> None:
    if remaining(marker) <= 0:
        pytest.skip(spent(marker))
