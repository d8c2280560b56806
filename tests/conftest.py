"""Fixtures and hooks shared by the test modules.

`corpus_dir`: where tests/model_corpus.py caches exported models ($GRAPHFIX_CORPUS_DIR, else
cache_dirs.root()/corpus: outside the source tree).  `torchvision_ops`: lets torchvision (imported
by transformers, timm, open_clip and diffusers) load next to a CPU-only torch; request it before
importing any of them.

Every module runs under `_leaves_the_source_tree_alone`: a file it adds to the checkout (seen by
`git status --ignored`) fails it.  Tests marked `compile` or `corpus` are left out of a run
without `-m` unless their file is named, and skip with the reason once their marker's time budget
is spent (tests/budgets.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import budgets
import cache_dirs
import model_corpus
import pytest

REPO = Path(__file__).resolve().parents[1]
# What Python, pytest and ruff write (bytecode, their caches), not the tests.
_NOT_THE_TESTS = ("__pycache__/", ".pytest_cache/", ".ruff_cache/")
_SOURCES = (".py", ".md", ".ipynb", ".cu", ".cuh", ".h", ".cpp", ".txt", ".toml")


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return model_corpus.corpus_dir()


@pytest.fixture(scope="session")
def torchvision_ops() -> None:
    model_corpus.define_torchvision_ops()


def _tree_entries() -> set[str] | None:
    """Untracked and ignored files of the checkout, one by one; None outside a git checkout."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        return None
    done = subprocess.run(
        [git, "status", "--porcelain", "--ignored", "--untracked-files=all", "--", ".",
         ":(exclude).ci-venv"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    entries = set()
    for line in done.stdout.splitlines():
        status, path = line[:2], line[3:]
        if any(part in path for part in _NOT_THE_TESTS):
            continue
        # Untracked sources are what a person writes while the tests run, not what a test writes.
        if status == "!!" or (status == "??" and not path.endswith(_SOURCES)):
            entries.add(path)
    return entries


@pytest.fixture(scope="module", autouse=True)
def _leaves_the_source_tree_alone():
    before = _tree_entries()
    yield
    after = _tree_entries()
    if before is not None and after is not None:
        added = sorted(after - before)
        assert not added, (
            f"new in the source tree while this module ran: {', '.join(added[:10])}; "
            "tests write under tmp_path or cache_dirs.root()"
        )


def pytest_configure(config: pytest.Config) -> None:
    # hypothesis (tests/test_fuzz.py) keeps its files in ./.hypothesis unless told otherwise.
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(cache_dirs.root() / "hypothesis")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without `-m`, leave the heavy checks (tests/budgets.py's markers) out, except in the test
    files named on the command line: `pytest` skips them, `pytest tests/test_real_models.py` runs
    that file whole, `pytest -m corpus` runs them all (`.ci/run` runs each marker)."""
    if config.option.markexpr:
        return
    named = {Path(arg.split("::", 1)[0]).resolve() for arg in config.args}
    heavy = [
        item
        for item in items
        if item.path not in named and any(item.get_closest_marker(m) for m in budgets.BUDGETS)
    ]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        left_out = set(map(id, heavy))
        items[:] = [item for item in items if id(item) not in left_out]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in budgets.BUDGETS:
        if item.get_closest_marker(marker) is not None:
            budgets.skip_when_spent(marker)
