"""nvcc compiles the tests need: run once per source hash, cached, within a time budget.

A compile's result (its output file and its log: the tests read ptxas's messages) is kept under
cache_dirs.root()/nvcc/, keyed by the command line, nvcc's version and the bytes of every file in
the folders it reads, so a rerun on unchanged sources compiles nothing.  A compile still running when
the compile checks' budget (tests/budgets.py) runs out is killed and the test skips saying so:
machine load is not a test failure.  nvcc's temporary files go to a folder the compile owns,
removed whatever happens, so a killed compile leaves nothing in the system temp folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import budgets
import cache_dirs
import pytest


@dataclass(frozen=True)
class Compiled:
    output: Path  # absent when the compile failed (returncode != 0): only its log is kept
    log: str
    returncode: int


def _digest(command: list[str], read: Iterable[Path]) -> str:
    nvcc_version = subprocess.run(
        [command[0], "--version"], capture_output=True, text=True, check=False
    ).stdout
    digest = hashlib.sha256("\0".join([*command, nvcc_version]).encode())
    for folder in sorted(read):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def compile_once(
    name: str, command: Callable[[Path], list[str]], *, read: Iterable[Path]
) -> Compiled:
    """`command(output)` run once for these sources; `read`: the folders its inputs live in."""
    cached = cache_dirs.root() / "nvcc" / f"{name}-{_digest(command(Path(name)), read)}"
    output, log_file = cached / name, cached / "log.txt"
    if output.is_file() and log_file.is_file():
        return Compiled(output, log_file.read_text(), 0)
    cached.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cached.parent))
    try:
        log, returncode = _run(command(work / name), work)
        if returncode != 0:
            return Compiled(work / name, log, returncode)
        (work / "log.txt").write_text(log)
        shutil.rmtree(work / "tmp")
        if not cached.exists():
            work.rename(cached)  # whole or absent: a concurrent run finds both files or neither
        return Compiled(output, log, 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def owned_temp_folder() -> Iterator[None]:
    """Within the block, subprocesses (CMake's nvcc) write their temporary files into a folder of
    the cache that is removed afterwards, however the block ends."""
    root = cache_dirs.root() / "nvcc"
    root.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _run(command: list[str], work: Path) -> tuple[str, int]:
    budgets.skip_when_spent("compile")
    (work / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(work / "tmp")}  # nvcc's intermediate files
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: cicc and ptxas die with it
    )
    try:
        log, _ = process.communicate(timeout=budgets.remaining("compile"))
    except subprocess.TimeoutExpired:
        pytest.skip(budgets.spent("compile", doing=f"`{Path(command[0]).name}` stopped: "))
    finally:  # past the budget, or the test run interrupted: stop the whole compile
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return log, process.returncode
