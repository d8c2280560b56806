"""What a newcomer hits first: bad paths, bad flags, missing optional packages.

Every case is one line on stderr with its exit code (2 input, 3 environment), no traceback, and
nothing written; each was found by running the commands as README.md and `--help` describe them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest
from qdq_graphs import residual_block

from graphfix.cli.main import main
from graphfix.examples import vit_example

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "vit.onnx"
    onnx.save(vit_example(), path)
    return path


@pytest.fixture
def quantized(tmp_path):
    path = tmp_path / "residual.int8.onnx"
    onnx.save(residual_block(qdq_on_conv=True, qdq_on_skip=True), path)
    return path


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a folder\n")
    return path


def _one_line_error(capsys, code: int, argv: list[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == code, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "graphfix: error: the following arguments are required: COMMAND"),
        (["fix", "m.onnx"], "graphfix fix: error: the following arguments are required: -o"),
        (["precision", "m.onnx", "-o", "x.onnx", "--to", "float64"], "invalid choice: 'float64'"),
        (["validate", "a.onnx", "b.onnx", "--rtol", "abc"], "invalid float value: 'abc'"),
        (["qdq"], "graphfix qdq: error: the following arguments are required"),
    ],
)
def test_bad_flags_are_one_line_not_a_usage_block(capsys, argv, expected):
    line = _one_line_error(capsys, 2, argv)
    assert expected in line and "--help`" in line


def test_output_inside_a_regular_file_is_refused_before_any_work(example, a_file, capsys):
    out = a_file / "fixed.onnx"
    line = _one_line_error(capsys, 2, ["fix", str(example), "-o", str(out)])
    assert f"{a_file} is a file, not a folder" in line
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize("command", ["fix", "precision"])
def test_empty_output_path_is_named_as_empty(command, example, capsys):
    line = _one_line_error(capsys, 2, [command, str(example), "-o", ""])
    assert "the output path is empty" in line


@pytest.mark.parametrize("command", ["locate", "qdq"])
def test_plot_folder_inside_a_regular_file_is_one_line(command, example, quantized, a_file, capsys):
    argv = (
        ["locate", str(example), "--precision", "float16"]
        if command == "locate"
        else ["qdq", "inspect", str(quantized)]
    )
    line = _one_line_error(capsys, 2, [*argv, "--plot", str(a_file / "plots")])
    assert "cannot create the plot folder" in line and "give --plot a folder" in line


@pytest.mark.parametrize("command", ["validate", "locate", "qdq"])
def test_plot_without_matplotlib_is_exit_3_before_running(
    command, example, quantized, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    argv = {
        "validate": ["validate", str(example), str(example)],
        "locate": ["locate", str(example), "--precision", "float16"],
        "qdq": ["qdq", "inspect", str(quantized)],
    }[command]
    line = _one_line_error(capsys, 3, [*argv, "--plot", str(tmp_path / "plots")])
    assert "matplotlib" in line and "pip install 'graphfix[plot]'" in line


def test_qdq_without_sympy_is_exit_3_not_a_traceback(quantized, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", None)
    line = _one_line_error(capsys, 3, ["qdq", "inspect", str(quantized)])
    assert "pip install sympy" in line


def test_sympy_is_a_runtime_dependency():
    """onnxruntime >= 1.20 no longer installs sympy, which its symbolic shape inference (the
    Q/DQ lint's FLOP counts) imports: `pip install -e .` alone must give a working `qdq`."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("sympy") for r in project["dependencies"])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max-trials", "0"], "--max-trials (max_trials) must be an integer >= 1, got 0"),
        (["--max-trials", "-3"], "must be an integer >= 1, got -3"),
        (["--chunk-mb", "0"], "--chunk-mb must be more than 0"),
        (["--chunk-mb", "-1"], "--chunk-mb must be more than 0"),
        (["--no-remedies", "--apply", "-o", "OUT"], "drop --no-remedies"),
    ],
)
def test_locate_out_of_range_and_conflicting_flags(example, tmp_path, capsys, flags, expected):
    flags = [str(tmp_path / "out.onnx") if f == "OUT" else f for f in flags]
    line = _one_line_error(capsys, 2, ["locate", str(example), "--precision", "float16", *flags])
    assert expected in line
    assert not (tmp_path / "out.onnx").exists()


def test_locate_help_states_the_default_trials_the_search_uses(capsys):
    from graphfix.precision.locate.plan import DEFAULT_MAX_TRIALS
    from graphfix.validation.validate import Backend

    with pytest.raises(SystemExit):
        main(["locate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    onnxruntime, tensorrt = (
        DEFAULT_MAX_TRIALS[Backend.ONNXRUNTIME],
        DEFAULT_MAX_TRIALS[Backend.TENSORRT],
    )
    assert (
        f"may make (default {onnxruntime} with onnxruntime, {tensorrt} with tensorrt)" in help_text
    )


def test_qdq_fix_max_trials_needs_reference_and_a_positive_value(quantized, tmp_path, capsys):
    out = str(tmp_path / "fixed.onnx")
    line = _one_line_error(
        capsys, 2, ["qdq", "fix", str(quantized), "-o", out, "--max-trials", "3"]
    )
    assert "needs --reference" in line
    float_model = tmp_path / "float.onnx"
    onnx.save(residual_block(qdq_on_conv=False, qdq_on_skip=False), float_model)
    argv = ["qdq", "fix", str(quantized), "-o", out, "--reference", str(float_model)]
    line = _one_line_error(capsys, 2, [*argv, "--max-trials", "0"])
    assert "must be an integer >= 1, got 0" in line
    assert not Path(out).exists()


def test_qdq_fix_reference_with_other_inputs_names_both(quantized, example, tmp_path, capsys):
    out = str(tmp_path / "fixed.onnx")
    argv = ["qdq", "fix", str(quantized), "-o", out, "--reference", str(example)]
    line = _one_line_error(capsys, 2, argv)
    assert "takes inputs ['pixels'], the quantized model" in line
    assert "pass the float model the quantized one was made from" in line


def test_plugins_build_rejects_bad_jobs_and_build_dir_before_compiling(a_file, tmp_path, capsys):
    # A scratch --build-dir: were the check to regress, nothing lands in ~/.cache/graphfix.
    argv = ["plugins", "build", "--jobs", "0", "--build-dir", str(tmp_path / "build")]
    line = _one_line_error(capsys, 2, argv)
    assert "--jobs (jobs) must be an integer >= 1, got 0" in line
    line = _one_line_error(capsys, 2, ["plugins", "build", "--build-dir", str(a_file / "b")])
    assert "cannot create the build folder" in line


def test_select_error_quotes_what_the_user_typed(example, tmp_path, capsys):
    out = str(tmp_path / "fixed.onnx")
    line = _one_line_error(capsys, 2, ["fix", str(example), "-o", out, "--select", "5"])
    assert "selector '5' names attention block 5" in line


def test_readme_validate_table_lists_every_validate_flag():
    """README's `graphfix validate` option table against the parser (prose is not executed)."""
    import re

    from graphfix.cli.main import build_parser

    readme = (ROOT / "README.md").read_text()
    table = readme.split("| option | what it does |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"`(--[a-z-]+)", table))
    subparsers = build_parser()._subparsers._group_actions[0].choices
    flags = {
        flag
        for action in subparsers["validate"]._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    assert flags - documented == set()


def test_locate_apply_without_divergence_says_nothing_was_written(example, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    argv = ["locate", str(example), "--precision", "float16", "--apply", "-o", str(out), "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["fixed"] is None
    assert f"nothing written to {out}" in captured.err and "graphfix precision" in captured.err
    assert not out.exists()


def test_validate_bfloat16_on_onnxruntime_materialises_it_and_as_is_says_what_to_do(
    example, tmp_path, capsys
):
    """README's `precision --to bfloat16` then `validate`: materialised, each op computes in
    float32 with bfloat16 rounding at every node output, so onnxruntime's CPU runs it; run as
    is, it cannot load it (no bfloat16 MatMul), and says what to do."""
    out = tmp_path / "vit.bf16.onnx"
    assert main(["precision", str(example), "-o", str(out), "--to", "bfloat16"]) == 0
    capsys.readouterr()
    assert main(["validate", str(example), str(out), "--backend", "onnxruntime"]) == 0
    report = capsys.readouterr().out
    assert "low precision: bfloat16 materialised at every node output" in report
    assert "default for bf16" in report
    rc = main(["validate", str(example), str(out), "--low-precision", "as-is"])
    captured = capsys.readouterr()
    assert rc == 3 and len(captured.err.strip().splitlines()) == 1
    assert "no bfloat16 kernel" in captured.err and "tools/torch_onnx_eval.py" in captured.err


def test_locate_takes_a_fixed_model_as_candidate_not_as_model(example, tmp_path, capsys):
    """`graphfix locate model.onnx model.fixed.onnx`: the plugin nodes run as reference ops (as
    validate does without TensorRT); a fixed model as MODEL is refused with what to pass."""
    fixed = tmp_path / "vit.fixed.onnx"
    assert main(["fix", str(example), "-o", str(fixed)]) == 0
    capsys.readouterr()
    assert main(["locate", str(example), str(fixed)]) == 0
    out = capsys.readouterr().out
    assert "plugin nodes run as graphfix's reference ops" in out and "no divergence" in out
    line = _one_line_error(capsys, 2, ["locate", str(fixed), "--precision", "float16"])
    assert "pass the original export as MODEL, and the fixed model as CANDIDATE" in line


def test_select_keeps_a_regex_quantifier_whole(example, tmp_path, capsys):
    """`--select` splits on commas, but not inside {}: re:blocks.[0-9]{1,2}/ is one regex."""
    out = tmp_path / "fixed.onnx"
    argv = ["fix", str(example), "-o", str(out), "--select", r"re:blocks\.[0-9]{1,2}/attn/Softmax"]
    assert main(argv) == 0
    assert "rewrote 2 of 2 attention block(s)" in capsys.readouterr().out


def test_keep_with_commas_says_to_repeat_the_option(example, tmp_path, capsys):
    out = str(tmp_path / "fp16.onnx")
    line = _one_line_error(capsys, 2, ["precision", str(example), "-o", out, "--keep", "0,1"])
    assert "repeat the option (--keep 0 --keep 1)" in line


@pytest.mark.parametrize("kind", ["empty", "folder"])
def test_validate_inputs_that_are_not_an_npz_are_one_line(kind, example, tmp_path, capsys):
    inputs = tmp_path / "inputs.npz"
    if kind == "empty":
        inputs.write_bytes(b"")
    else:
        inputs.mkdir()
    line = _one_line_error(
        capsys, 2, ["validate", str(example), str(example), "--inputs", str(inputs)]
    )
    assert ("is not a readable .npz" if kind == "empty" else "is a folder") in line
