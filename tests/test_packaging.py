"""pyproject.toml: a build backend that reads its license string, and no test tool unused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Distribution name → what using it looks like in the repository.
_USED_AS = {
    "pytest": r"^import pytest",
    "ruff": r"^ruff check",
    "matplotlib": r"from matplotlib",
    "nbclient": r"^import nbclient",
    "nbformat": r"^import nbformat",
    "ipykernel": r"ipykernel_launcher",
    "onnxscript": r"\"onnxscript\"|import onnxscript",
    "polygraphy": r"from polygraphy|import polygraphy",
    "onnx-graphsurgeon": r"import onnx_graphsurgeon",
    "hypothesis": r"^from hypothesis import",
}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_setuptools_reads_the_spdx_license_string() -> None:
    assert isinstance(PROJECT["project"]["license"], str)  # PEP 639 needs setuptools >= 77
    (setuptools,) = [r for r in PROJECT["build-system"]["requires"] if _name(r) == "setuptools"]
    minimum = re.search(r">=\s*(\d+)", setuptools)
    assert minimum is not None and int(minimum.group(1)) >= 77


def test_ruff_is_pinned_exactly() -> None:
    (ruff,) = [r for r in PROJECT["project"]["optional-dependencies"]["test"] if _name(r) == "ruff"]
    assert re.fullmatch(r"ruff==\d+\.\d+\.\d+", ruff)


def test_every_test_dependency_is_used() -> None:
    sources = [
        p.read_text(errors="replace")
        for folder in ("graphfix", "tests", "benchmarks", "notebooks", ".ci")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in (".py", ".ipynb", "") and p.name != "test_packaging.py"
    ]
    unused = []
    for requirement in PROJECT["project"]["optional-dependencies"]["test"]:
        name = _name(requirement)
        assert name in _USED_AS, f"say in tests/test_packaging.py how {name} is used"
        if not any(re.search(_USED_AS[name], text, re.MULTILINE) for text in sources):
            unused.append(name)
    assert unused == []
