"""The README runs as written, and its pasted output is what graphfix prints.

Conventions (also noted at the top of README.md):
- ```console blocks are executed.  Each line starting with `$ ` is a `graphfix` command, run by
  bash in one scratch folder shared by all blocks, in README order; the lines after it, up to the
  next `$ `, are its expected output (stdout and stderr together).  A line `...` stands for
  output left out.  The expected lines must appear in the output in that order, each run of lines
  between two `...` contiguously.  An expected `graphfix: error:` line means the command must
  fail; otherwise it must succeed.
- ```python blocks are executed too, in the same folder, in README order; ```py blocks (code that
  needs TensorRT or a GPU) and ```bash / ```text blocks are shown, not run.
- Compared loosely: trailing spaces, the onnxruntime version, the plugin build folder's hash, and
  graphfix's cache folder (a fresh, empty one here, shown as ~/.cache/graphfix in the README).

Outside the blocks, the README must keep stating facts the code defines: the set-up commands
`.ci/run` runs, the strategies and which are proven, and which plugin library goes with which flag.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import budgets
import pytest

import graphfix
from graphfix.plugins.build import DYNAMIC_LIBRARY_NAME, STATIC_LIBRARY_NAME

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
COMMAND_TIMEOUT_S = 300
ELIDED = "..."


@dataclass(frozen=True)
class Step:
    kind: str  # "console" or "python"
    line: int  # where it starts in README.md, for messages
    code: str
    expected: tuple[str, ...] = ()


def _blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(info string, first line number, lines) of every fenced block."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        blocks.append((opening.group(1), i + 2, lines[i + 1 : end]))
        i = end + 1
    return blocks


def _steps(text: str) -> list[Step]:
    steps: list[Step] = []
    for info, first, lines in _blocks(text):
        if info == "python":
            steps.append(Step("python", first, "\n".join(lines)))
        elif info == "console":
            for offset, line in enumerate(lines):
                if not line.startswith("$ "):
                    continue
                rest = lines[offset + 1 :]
                stop = next((k for k, r in enumerate(rest) if r.startswith("$ ")), len(rest))
                steps.append(Step("console", first + offset, line[2:], tuple(rest[:stop])))
    return steps


def _normalise(text: str, cache: Path) -> list[str]:
    text = text.replace(str(cache), "~/.cache/graphfix")
    text = re.sub(r"plugins-build-[0-9a-f]{10}", "plugins-build-HASH", text)
    text = re.sub(r"onnxruntime \d+\.\d+\.\d+", "onnxruntime X.Y.Z", text)
    return [line.rstrip() for line in text.splitlines()]


def _missing(expected: list[str], actual: list[str]) -> list[str] | None:
    """The first run of expected lines not found (in order, contiguously), else None."""
    runs, current = [], []
    for line in expected:
        if line.strip() == ELIDED:
            runs.append(current)
            current = []
        else:
            current.append(line)
    runs.append(current)
    start = 0
    for run in (r for r in runs if r):
        found = next(
            (
                i
                for i in range(start, len(actual) - len(run) + 1)
                if actual[i : i + len(run)] == run
            ),
            None,
        )
        if found is None:
            return run
        start = found + len(run)
    return None


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_blocks_run_and_print_what_the_readme_shows(readme: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("the README's output was recorded where TensorRT is not installed")
    steps = _steps(readme)
    assert sum(s.kind == "console" for s in steps) >= 5, "the README lost its command examples"
    cache = tmp_path / "cache"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "MPLBACKEND")}
    env["GRAPHFIX_CACHE_DIR"] = str(cache)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for step in steps:
        where = f"README.md:{step.line}"
        if step.kind == "python":
            done = subprocess.run(
                [sys.executable, "-c", step.code], cwd=work, env=env, capture_output=True,
                text=True, timeout=COMMAND_TIMEOUT_S,
            )  # fmt: skip
            assert done.returncode == 0, f"{where}: python block failed:\n{done.stderr}"
            continue
        assert step.code.startswith("graphfix "), (
            f"{where}: console blocks run `graphfix` commands only; show {step.code!r} in a "
            "```bash block instead"
        )
        done = subprocess.run(
            ["bash", "-c", step.code], cwd=work, env=env, capture_output=True, text=True,
            timeout=COMMAND_TIMEOUT_S,
        )  # fmt: skip
        actual = _normalise(done.stdout + done.stderr, cache)
        expected = _normalise("\n".join(step.expected), cache)
        should_fail = any(line.startswith("graphfix: error:") for line in expected)
        assert (done.returncode != 0) == should_fail, (
            f"{where}: `{step.code}` exited {done.returncode}:\n" + "\n".join(actual)
        )
        missing = _missing(expected, actual)
        assert missing is None, (
            f"{where}: `{step.code}` no longer prints\n  "
            + "\n  ".join(missing or ())
            + "\nit printed:\n  "
            + "\n  ".join(actual)
        )


def test_setup_commands_are_the_ones_ci_runs(readme: str) -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    pytest_line = next(line.strip() for line in ci if "pytest" in line and "pip" not in line)
    install = next(line.strip() for line in ci if "-e '.[" in line)
    install = install.removeprefix("python -m ").replace(" -q ", " ")
    assert f"{install} && {pytest_line}" in readme, (
        f"the README's test command must be what .ci/run runs: {install} && {pytest_line}"
    )
    assert "pip install -e . && graphfix demo" in readme


def test_ci_and_the_readme_run_every_check_the_default_run_leaves_out(readme: str) -> None:
    left_out = set(budgets.BUDGETS)  # what tests/conftest.py leaves out of a run without -m
    loop = re.search(r"^for marker in (.*); do$", (REPO / ".ci" / "run").read_text(), re.M)
    assert loop is not None and set(loop.group(1).split()) == left_out
    for marker in left_out:
        assert f"`python -m pytest -m {marker}`" in readme, f"the README does not name -m {marker}"


def test_strategy_table_lists_every_strategy_and_what_is_proven(readme: str) -> None:
    section = readme.split("\n## Strategies", 1)[1].split("\n## ", 1)[0]
    rows = {
        m.group(1): line for line in section.splitlines() if (m := re.match(r"^\| `(\w+)`", line))
    }
    assert set(rows) == set(graphfix.STRATEGIES), "the README's strategy table is out of date"
    for name, strategy in graphfix.STRATEGIES.items():
        heuristic = "heuristic" in rows[name]
        assert heuristic != strategy.proven, f"README: strategy {name} proven={strategy.proven}"


def test_each_plugin_flag_names_its_own_library(readme: str) -> None:
    pairs = {
        "--staticPlugins": STATIC_LIBRARY_NAME,
        "--dynamicPlugins": DYNAMIC_LIBRARY_NAME,
        "trt_extra_plugin_lib_paths": STATIC_LIBRARY_NAME,
        "--plugins": STATIC_LIBRARY_NAME,
    }
    for flag, library in pairs.items():
        lines = [line for line in readme.splitlines() if flag in line and ".so" in line]
        assert lines, f"the README shows no {flag} with a library"
        for line in lines:
            named = set(re.findall(r"libgraphfix_plugins\w*\.so", line))
            assert named == {library}, f"README: {flag} goes with {library}: {line.strip()}"


def test_the_torchvision_recipe_makes_torchvision_importable(readme: str) -> None:
    """The ```py block that defines torchvision's operator schemas works where it is needed."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        pytest.skip("needs torch and torchvision installed")
    (recipe,) = [
        "\n".join(lines)
        for info, _, lines in _blocks(readme)
        if "torchvision::" in "\n".join(lines)
    ]
    assert recipe.rstrip().splitlines()[-1].startswith("import torchvision")
    done = subprocess.run(
        [sys.executable, "-c", recipe + "\nprint(torchvision.ops.nms)"],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
