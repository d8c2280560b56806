"""tests/compile_cache.py, which the nvcc tests rely on, with a stand-in compiler (a shell script):
a compile runs once per source hash; past its budget it is stopped, the test skips with the
reason, and nothing of it is left."""

from __future__ import annotations

import time
from pathlib import Path

import budgets
import pytest
from compile_cache import compile_once

COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "stand-in compiler 1.0"; exit 0; fi
echo run >> "{runs}"
echo scratch > "$TMPDIR/intermediate"
sleep "{seconds}"
echo "ptxas info: compiled $1"
cat "$1" > "$3"
"""


def _compiler(folder: Path, seconds: float) -> tuple[Path, Path]:
    script, runs = folder / "cc", folder / "runs.txt"
    script.write_text(COMPILER.format(runs=runs, seconds=seconds))
    script.chmod(0o755)
    return script, runs


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRAPHFIX_TEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(budgets, "_started", {})  # this test's own budget clock
    return tmp_path / "cache"


def test_a_compile_runs_once_per_source_hash(tmp_path: Path, cache: Path) -> None:
    compiler, runs = _compiler(tmp_path, 0)
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "kernel.cu").write_text("one")

    def command(output: Path) -> list[str]:
        return [str(compiler), str(sources / "kernel.cu"), "-o", str(output)]

    first = compile_once("kernel.cubin", command, read=[sources])
    assert first.returncode == 0 and first.output.read_text() == "one"
    assert "ptxas info: compiled" in first.log
    again = compile_once("kernel.cubin", command, read=[sources])
    assert again == first and runs.read_text().count("run") == 1  # cached: not run again
    (sources / "kernel.cu").write_text("two")
    changed = compile_once("kernel.cubin", command, read=[sources])
    assert changed.output.read_text() == "two" and runs.read_text().count("run") == 2
    kept = sorted(p.name for p in (cache / "nvcc").iterdir())
    assert len(kept) == 2 and all(name.startswith("kernel.cubin-") for name in kept)


def test_past_its_budget_a_compile_is_stopped_and_skips_leaving_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHFIX_COMPILE_BUDGET_S", "1")
    compiler, runs = _compiler(tmp_path, 60)
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "kernel.cu"
    source.write_text("slow")
    start = time.monotonic()
    with pytest.raises(pytest.skip.Exception, match=r"stopped: the compile checks' budget of 1 s"):
        compile_once("slow.cubin", lambda out: [str(compiler), str(source), "-o", str(out)],
                     read=[source.parent])  # fmt: skip
    assert time.monotonic() - start < 30  # stopped, not waited for
    assert runs.read_text().count("run") == 1
    assert list((cache / "nvcc").iterdir()) == []  # its folder and TMPDIR removed, nothing cached
