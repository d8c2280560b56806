"""`graphfix qdq inspect|fix`: JSON contract, plot, exit codes."""

from __future__ import annotations

import json

import onnx
import pytest
from qdq_graphs import residual_block

from graphfix.cli.main import main


@pytest.fixture
def planted(tmp_path):
    path = tmp_path / "residual.onnx"
    onnx.save(residual_block(qdq_on_conv=True, qdq_on_skip=True), path)
    return path


def test_inspect_json_is_one_document_with_findings_and_coverage(planted, capsys):
    assert main(["qdq", "inspect", str(planted), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in document["findings"] if f["rule"] == "residual-qdq-on-conv-branch"]
    assert {"node", "rule", "detail"} <= set(finding) and finding["node"] == "add"
    coverage = document["coverage"]
    assert coverage["flops_quantized"] == coverage["flops_total"] == 2 * 32 * 64 * 32 * 9
    assert coverage["blocks"][0]["block"] == "(unscoped)"


def test_inspect_text_and_plot(planted, tmp_path, capsys):
    assert main(["qdq", "inspect", str(planted), "--plot", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "coverage: 100.0% of 1.2 MFLOPs run quantized" in out
    assert "residual-qdq-on-conv-branch (slow, 1; 1 fixable" in out
    png = tmp_path / "plots" / "qdq_coverage.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fail_on_findings_exits_1_with_one_line(planted, capsys):
    assert main(["qdq", "inspect", str(planted), "--fail-on-findings"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fail-on-findings" in err[0]


def test_missing_model_exits_2(tmp_path, capsys):
    assert main(["qdq", "inspect", str(tmp_path / "nope.onnx")]) == 2
    assert "not found" in capsys.readouterr().err


def test_fix_writes_the_model_and_refuses_to_overwrite(planted, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    reference = tmp_path / "float.onnx"
    onnx.save(residual_block(qdq_on_conv=False, qdq_on_skip=False), reference)
    assert (
        main(["qdq", "fix", str(planted), "-o", str(out), "--reference", str(reference), "--json"])
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["error"]["passed"] is True
    assert document["error"]["after_max_abs"] < document["error"]["before_max_abs"]
    assert [c["rule"] for c in document["changes"]] == ["residual-qdq-on-conv-branch"]
    assert "residual-qdq-on-conv-branch" not in document["after"]["rule_counts"]
    assert onnx.load(out).graph.node
    assert main(["qdq", "fix", str(planted), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_fix_of_a_fixed_model_changes_nothing_and_writes_nothing(planted, tmp_path, capsys):
    fixed = tmp_path / "fixed.onnx"
    assert main(["qdq", "fix", str(planted), "-o", str(fixed)]) == 0
    assert "1 changes" in capsys.readouterr().out
    again = tmp_path / "again.onnx"
    assert main(["qdq", "fix", str(fixed), "-o", str(again)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0 changes")
    assert f"nothing to change in {fixed}; wrote nothing (pass --always-write" in out
    assert not again.exists()
    assert main(["qdq", "fix", str(fixed), "-o", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["saved"] is None and not again.exists()
    assert main(["qdq", "fix", str(fixed), "-o", str(again), "--always-write"]) == 0
    assert f"saved {again}" in capsys.readouterr().out
    assert onnx.load(again).graph.node == onnx.load(fixed).graph.node
