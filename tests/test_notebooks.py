"""Every notebook in notebooks/ runs top to bottom without a cell error, so none can rot.

Each notebook runs in a fresh kernel of this interpreter (whatever `python` a `python3` kernel spec
would find on PATH), with notebooks/ as its working directory.  The notebooks in the repository keep
their outputs for readers; to refresh them after a change, run

    python tests/test_notebooks.py            # every notebook, written back in place
    python tests/test_notebooks.py notebooks/explore.ipynb
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT_S = 300
# On 2 CPU cores a notebook must finish in a few minutes (explore.ipynb takes under 10 s).
NOTEBOOK_BUDGET_S = 240


def _kernel_manager():
    """A kernel manager that starts ipykernel on this very interpreter."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python ({sys.executable})",
                language="python",
                name=kernel_name,
            )

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter())


def execute(path: Path):
    """The notebook at `path`, executed; raises nbclient's CellExecutionError on a failing cell."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        km=_kernel_manager(),
        timeout=CELL_TIMEOUT_S,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return notebook


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert _notebooks(), f"no notebooks in {NOTEBOOKS}"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The notebooks' scratch folders (tempfile.mkdtemp in the kernel) land in the test's own.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    start = time.perf_counter()
    executed = execute(path)
    seconds = time.perf_counter() - start
    errors = [
        output
        for cell in executed.cells
        for output in cell.get("outputs", ())
        if output.get("output_type") == "error"
    ]
    assert not errors, errors
    assert seconds < NOTEBOOK_BUDGET_S, f"{path.name} took {seconds:.0f} s"


def main(argv: list[str]) -> int:
    for name in argv or [str(p) for p in _notebooks()]:
        path = Path(name)
        start = time.perf_counter()
        nbformat.write(execute(path), path)
        print(f"{path}: executed and written in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
