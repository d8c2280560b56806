"""The `graphfix` command line: tables, JSON, exit codes, and no half-written outputs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from graphs import Variant, attention_model, non_attention_models

import graphfix
from graphfix.attention.table import match_table
from graphfix.cli import main
from graphfix.errors import SelectionError
from graphfix.examples import vit_example


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "vit.onnx"
    onnx.save(vit_example(), path)
    return path


def test_inspect_table(example, capsys):
    assert main(["inspect", str(example)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "#",
        "softmax",
        "kind",
        "heads",
        "q_len",
        "kv_len",
        "scale",
        "mask",
        "dtype",
    ]
    assert "/blocks.0/attn/Softmax  self  4      16     16      0.25 (sqrt_qk)" in out
    assert "skipped /Softmax: softmax output is only a graph output" in out


def test_inspect_json(example, capsys):
    assert main(["inspect", str(example), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["softmax"] for m in data["matches"]] == [
        "/blocks.0/attn/Softmax",
        "/blocks.1/attn/Softmax",
    ]
    assert data["matches"][0]["scale"]["value"] == pytest.approx(0.25)
    assert data["skipped"][0]["softmax"] == "/Softmax"


def test_inspect_json_is_strict_json_with_typed_steps(tmp_path, capsys):
    """A -inf mask fill is written as the string "-inf" (strict parsers reject -Infinity), and
    each step names its type."""
    model = attention_model(Variant(mask="where"))
    fill = next(t for t in model.graph.initializer if t.name == "neg")
    fill.CopyFrom(onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "neg"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path), "--json"]) == 0

    def reject(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    data = json.loads(capsys.readouterr().out, parse_constant=reject)
    (match,) = data["matches"]
    assert [s["step"] for s in match["steps"]] == ["scale", "mask"]
    assert match["steps"][1]["fill"] == "-inf" and match["steps"][1]["kind"] == "keep"
    assert match["k_transposed_by"] == "transpose" and match["layout"]["qk_op"] == "MatMul"


def test_fix_writes_model_and_prints_trtexec(example, tmp_path, capsys):
    out = tmp_path / "out" / "vit.fixed.onnx"
    out.parent.mkdir()
    assert main(["fix", str(example), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rewrote 2 of 2 attention block(s)" in text
    assert "trtexec" in text and str(out) in text
    fixed = onnx.load(out)
    assert sum(n.op_type == "GraphfixSoftmax" for n in fixed.graph.node) == 2


def test_fix_select_and_strategy(example, tmp_path, capsys):
    out = tmp_path / "sel.onnx"
    assert main(["fix", str(example), "-o", str(out), "--select", "1", "-s", "max_subtract"]) == 0
    fixed = onnx.load(out)
    assert sum(n.op_type == "ReduceMax" for n in fixed.graph.node) == 1
    assert "trtexec" not in capsys.readouterr().out


def test_no_attention_writes_nothing(tmp_path, capsys):
    src = tmp_path / "clf.onnx"
    onnx.save(non_attention_models()["classifier"], src)
    out = tmp_path / "clf.fixed.onnx"
    assert main(["fix", str(src), "-o", str(out)]) == 0
    assert "wrote nothing" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "not found"),
        (lambda p: p.write_bytes(b"\x00\xffnot onnx at all" * 10), "not a readable ONNX model"),
        (
            lambda p: p.write_bytes(
                onnx.load_model_from_string(vit_example().SerializeToString()).SerializeToString()[
                    :5000
                ]
            ),
            "truncated",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, setup, message):
    path = tmp_path / "in.onnx"
    setup(path)
    out = tmp_path / "o.onnx"
    assert main(["fix", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphfix: error: ") and message in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_missing_external_data(tmp_path, capsys):
    path = tmp_path / "ext.onnx"
    onnx.save(
        vit_example(), path, save_as_external_data=True, location="ext.data", size_threshold=0
    )
    (tmp_path / "ext.data").unlink()
    assert main(["inspect", str(path)]) == 2
    assert "ext.data" in capsys.readouterr().err


def test_output_equal_to_input_is_refused(example, capsys):
    before = example.read_bytes()
    assert main(["fix", str(example), "-o", str(example)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert example.read_bytes() == before
    assert main(["fix", str(example), "-o", str(example), "--overwrite"]) == 0
    assert sum(n.op_type == "GraphfixSoftmax" for n in onnx.load(example).graph.node) == 2


def test_attention_op_needs_decompose_flag(tmp_path, capsys):
    from test_attention_op import attention_op_model

    src = tmp_path / "attn23.onnx"
    onnx.save(attention_op_model(is_causal=True), src)
    assert main(["inspect", str(src)]) == 0
    assert "--decompose-attention" in capsys.readouterr().out
    out = tmp_path / "attn23.fixed.onnx"
    assert main(["fix", str(src), "-o", str(out), "--decompose-attention"]) == 0
    assert any(n.op_type == "GraphfixSoftmax" for n in onnx.load(out).graph.node)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.opset_import[0].__setattr__("version", 99), "opset 99"),
        (  # as onnxruntime's transformer optimizer leaves a model: the domain imported
            lambda m: (
                m.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1)),
                m.graph.node.append(
                    onnx.helper.make_node(
                        "MultiHeadAttention", ["pixels"], ["y2"], name="mha", domain="com.microsoft"
                    )
                ),
            ),
            "com.microsoft::MultiHeadAttention",
        ),
    ],
)
def test_unsupported_opset_or_op_is_one_line_exit_2(tmp_path, capsys, mutate, message):
    model = vit_example()
    mutate(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_fix_json_is_one_document(example, tmp_path, capsys):
    out = tmp_path / "j.onnx"
    assert main(["fix", str(example), "-o", str(out), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["report"]["rewritten"] == 2
    assert document["saved"] == str(out) and document["weights"] == "embedded"
    assert "trtexec" in document["trtexec"]


def test_fix_reads_a_scale_stored_as_external_data(tmp_path, capsys):
    src = tmp_path / "ext.onnx"
    onnx.save(vit_example(), src, save_as_external_data=True, location="ext.data", size_threshold=0)
    assert main(["inspect", str(src)]) == 0
    assert "0.25 (sqrt_qk)" in capsys.readouterr().out
    out = tmp_path / "ext.fixed.onnx"
    assert main(["fix", str(src), "-o", str(out), "-s", "fused_plugin"]) == 0
    assert "GraphfixAttention (scale 0.25" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphfix {graphfix.__version__}"


def test_python_dash_m_runs_the_command_line(example):
    done = subprocess.run(
        [sys.executable, "-m", "graphfix", "inspect", str(example)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "/blocks.0/attn/Softmax" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "graphfix", "inspect", str(example) + ".missing"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert missing.returncode == 2 and missing.stderr.startswith("graphfix: error: model file")


@pytest.mark.parametrize("select", ["", " , "])
def test_empty_select_is_an_error(example, tmp_path, capsys, select):
    out = tmp_path / "o.onnx"
    assert main(["fix", str(example), "-o", str(out), "--select", select]) == 2
    err = capsys.readouterr().err
    assert f"--select {select!r} names no block" in err and not out.exists()
    with pytest.raises(SelectionError, match="empty and would pick nothing"):
        graphfix.fix_attention(example, select=[])


def test_fix_says_which_folders_it_created(example, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "vit.fixed.onnx"
    assert main(["fix", str(example), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"created the folders {tmp_path / 'a'}, {tmp_path / 'a' / 'b'}; saved {out}" in text
    assert main(["fix", str(example), "-o", str(out.with_name("again.onnx"))]) == 0
    assert "created the folder" not in capsys.readouterr().out
    assert main(["fix", str(example), "-o", str(tmp_path / "c" / "x.onnx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created_folders"] == [str(tmp_path / "c")]


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_demo_dir_that_cannot_hold_the_files_is_one_line(tmp_path, capsys, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    folder = blocker if where == "a file" else blocker / "demo"
    assert main(["demo", "--dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphfix: error: ") and "--dir" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_demo_dir_read_only_is_one_line(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert main(["demo", "--dir", str(folder)]) == 2
    finally:
        folder.chmod(0o755)
    assert "cannot write the demo's files into" in capsys.readouterr().err


def test_table_shows_placeholder_dims_as_unknown(example):
    match = graphfix.find_attention(example)[0]
    table = match_table([dataclasses.replace(match, q_len="unk__78", kv_len="seq", heads=None)])
    row = table.splitlines()[2].split()
    assert row[3:6] == ["?", "?", "seq"]
    assert "unk__" not in table


def test_exit_codes_are_documented_where_users_look(capsys):
    from pathlib import Path

    from graphfix.errors import CheckFailed, EnvironmentProblem, GraphfixError, UsageError

    assert (CheckFailed.exit_code, UsageError.exit_code, EnvironmentProblem.exit_code) == (1, 2, 3)
    assert GraphfixError.exit_code == 2
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit codes (every command): 0 success; 1 the check ran and failed" in text
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert (
        "Exit codes, the same for every `graphfix` command: 0 success (the check passed), 1 the "
        "check ran and failed, 2 your input or options are wrong"
    ) in readme and "3 the environment cannot do it" in readme
