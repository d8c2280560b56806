"""Long commands say what they are doing on a terminal, end with one line on SIGTERM/SIGINT, and a
killed save's temporaries are removed by the next save in that folder (graphfix/progress.py,
graphfix/cli/main.py, graphfix/model_io.py)."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import pytest
from graphs import Variant, attention_model
from qdq_graphs import residual_block

from graphfix.attention.rewrite import fix_attention
from graphfix.cli.main import build_parser
from graphfix.model_io import (
    remove_stale_temporaries,
    system_temporary_prefix,
    temporary_name,
)
from graphfix.precision.locate import locate
from graphfix.progress import reporting, step
from graphfix.qdq.fix import PASSES, fix_qdq
from graphfix.validation.validate import validate

REPO = Path(__file__).resolve().parents[1]
CONVERSION_STEPS = [
    "fusing decomposed norms",
    "finding the attention blocks and the float32 islands",
    "rewriting the graph and its weights in float16",
]
# A stand-in for a long step: the staged save stops before moving its files into place, says so
# on stdout, and waits to be signalled.
HOLD_THE_SAVE = """
import sys, time
import graphfix.model_io as model_io

def hold(self):
    print("staged", flush=True)
    time.sleep(120)

model_io._Staging.commit = hold
from graphfix.cli.main import main
sys.exit(main())
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(attention_model(Variant(scale="div_after")), path)
    return path


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def _piped(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `graphfix ARGV` with stdout and stderr captured (pipes, not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "graphfix", *argv],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run `graphfix ARGV` with stderr on a pseudo-terminal; its exit code and what it showed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "graphfix", *argv],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=_env(),
    )
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            process.kill()
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return process.wait(timeout=60), shown.decode()


def test_progress_lines_show_on_a_terminal(model: Path, tmp_path: Path) -> None:
    code, shown = _on_a_terminal(["precision", str(model), "-o", str(tmp_path / "a.onnx")])
    assert code == 0, shown
    lines = [line for line in shown.splitlines() if line.startswith("graphfix: [")]
    assert [line.split("] ", 1)[1] for line in lines] == [
        f"converting {model.name} to float16",
        *CONVERSION_STEPS,
        f"writing {tmp_path / 'a.onnx'}",
    ], shown
    seconds = [float(line.split("[", 1)[1].split(" s]")[0]) for line in lines]
    assert seconds == sorted(seconds)  # the time since the command started


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_no_progress_with_quiet_or_json(model: Path, tmp_path: Path, flag: str) -> None:
    code, shown = _on_a_terminal(["precision", str(model), "-o", str(tmp_path / "a.onnx"), flag])
    assert code == 0 and "graphfix: [" not in shown, shown


def test_no_progress_when_piped(model: Path, tmp_path: Path) -> None:
    done = _piped(["precision", str(model), "-o", str(tmp_path / "a.onnx")])
    assert done.returncode == 0 and done.stderr == "", done.stderr


def _held_save(model: Path, out: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_SAVE, "fix", str(model), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "staged\n", process.stderr.read()  # type: ignore[union-attr]
    return process


@pytest.mark.parametrize(
    ("signum", "line"),
    [(signal.SIGTERM, "graphfix: terminated (SIGTERM)\n"),
     (signal.SIGINT, "graphfix: interrupted (SIGINT)\n")],
)  # fmt: skip
def test_a_signal_mid_save_ends_with_one_line_and_leaves_nothing(
    model: Path, tmp_path: Path, signum: int, line: str
) -> None:
    out_dir = tmp_path / "out"
    process = _held_save(model, out_dir / "fixed.onnx")
    (staged,) = out_dir.iterdir()
    assert staged.name.endswith(".graphfix-tmp")  # staged, not moved into place
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert stderr == line
    assert not out_dir.exists()  # the temporary and the folder the save made are gone


def test_the_next_save_removes_what_a_killed_save_left(model: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    killed = _held_save(model, out_dir / "fixed.onnx")
    killed.kill()  # SIGKILL: no handler runs, the staged file stays
    killed.communicate(timeout=60)
    (left,) = out_dir.iterdir()
    assert left.name.startswith(f".fixed.onnx.{killed.pid}-") and left.stat().st_size > 0
    ours = temporary_name(out_dir / "other.onnx", "tmp")  # this live process's: not stale
    ours.write_bytes(b"in use")
    unrelated = out_dir / ".fixed.onnx.1234.graphfix-tmp"  # not a name graphfix makes
    unrelated.write_bytes(b"not ours")
    done = _piped(["fix", str(model), "-o", str(out_dir / "again.onnx")])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        ["again.onnx", ours.name, unrelated.name]
    )


def test_a_reused_process_id_does_not_protect_an_older_temporary(tmp_path: Path) -> None:
    """This process is alive, but a temporary carrying its id from before it started is stale."""
    stale = temporary_name(tmp_path / "m.onnx", "tmp")
    stale.write_bytes(b"x")
    long_ago = time.time() - 10 * 365 * 24 * 3600
    os.utime(stale, (long_ago, long_ago))
    fresh = temporary_name(tmp_path / "n.onnx", "stage")
    fresh.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    # A staging folder (`graphfix precision`'s converted weights) of a process that has ended.
    orphan = tmp_path / f".o.onnx.{int(gone.stdout)}-0123abcd.graphfix-stage"
    (orphan / "o.onnx.data").parent.mkdir()
    (orphan / "o.onnx.data").write_bytes(b"weights")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([stale, orphan])
    assert fresh.exists()


def test_system_temp_folders_of_killed_runs_are_removed(tmp_path: Path, monkeypatch) -> None:
    """validate, locate and precision keep intermediate models in the system temp folder; one a
    SIGKILLed run left is removed by the next run that makes one, a live run's is kept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    killed = tmp_path / f"graphfix-ort-{int(gone.stdout)}-k1ll_d0n"
    (killed / "model.onnx").parent.mkdir()
    (killed / "model.onnx").write_bytes(b"a big intermediate model")
    live = Path(tempfile.mkdtemp(prefix=system_temporary_prefix("locate")))
    others = [tmp_path / f"graphfix-fuzz-{int(gone.stdout)}-k1ll_d0n", tmp_path / "unrelated"]
    for folder in others:
        folder.mkdir()
    assert not killed.exists()
    assert live.exists() and all(folder.exists() for folder in others)
    assert live.name.startswith(f"graphfix-locate-{os.getpid()}-")


def _steps(run) -> list[str]:
    """What `run()` reports as its steps, the elapsed seconds left out."""
    shown = io.StringIO()
    with reporting(enabled=True, stream=shown):
        run()
    return [line.split("] ", 1)[1] for line in shown.getvalue().splitlines()]


def test_validate_and_locate_say_which_run_is_under_way() -> None:
    original = attention_model(Variant(scale="div_after"))
    fixed = fix_attention(original, strategy="plugin").model
    steps = _steps(lambda: validate(original, fixed, backend="onnxruntime"))
    assert [s.split(":")[0] for s in steps] == ["running the original", "running the candidate"]
    steps = _steps(lambda: locate(original, precision="float16"))
    assert steps[:4] == [
        "converting the model (in memory) to float16",
        *CONVERSION_STEPS,
    ]
    assert steps[4].startswith(
        "comparing every tensor of the model (in memory) converted to float16"
    )


def test_qdq_fix_says_which_pass_runs() -> None:
    steps = _steps(lambda: fix_qdq(residual_block(qdq_on_conv=True, qdq_on_skip=False)))
    passes = [p.__name__.replace("_", " ") for p in PASSES]
    rounds = len(steps) // len(passes)
    assert rounds >= 1 and steps == [
        f"Q/DQ fix, round {r}: {name}" for r in range(1, rounds + 1) for name in passes
    ]


def test_without_a_reporter_nothing_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    step("a step nobody asked to see")
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    "argv",
    [["inspect", "m.onnx"], ["fix", "m.onnx", "-o", "o.onnx"], ["demo"],
     ["precision", "m.onnx", "-o", "o.onnx"], ["validate", "m.onnx", "o.onnx"],
     ["locate", "m.onnx", "--precision", "float16"], ["plugins", "build"], ["plugins", "path"],
     ["qdq", "inspect", "m.onnx"], ["qdq", "fix", "m.onnx", "-o", "o.onnx"]],
)  # fmt: skip
def test_every_command_takes_quiet(argv: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args([*argv, "--quiet"]).quiet
    assert not parser.parse_args(argv).quiet
