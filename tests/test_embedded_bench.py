"""benchmarks/embedded_model.py at toy size: generator, verification and judgement work.

The real run (853 MB embedded) is too big for CI; its figures are in benchmarks/README.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest

from graphfix.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "embedded_model", ROOT / "benchmarks" / "embedded_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["embedded_model"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["embedded_model"]


def test_generated_model_embeds_its_weights_and_the_fix_verifies(bench, tmp_path: Path) -> None:
    shape = bench.lm.ModelShape(blocks=2, hidden=64, heads=4, mlp=128)
    model = bench.generate_embedded(tmp_path, shape)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    loaded = onnx.load(model, load_external_data=False)
    assert not any(t.external_data for t in loaded.graph.initializer)
    assert model.stat().st_size > shape.weight_bytes
    fixed = tmp_path / "out" / "fixed.onnx"
    assert main(["fix", str(model), "-o", str(fixed)]) == 0
    assert all(check.ok for check in bench.verify(model, fixed, shape.blocks))
    assert not all(check.ok for check in bench.verify(model, fixed, shape.blocks + 1))


def test_judgement_uses_the_ratio_or_one_second_and_the_file_size(bench) -> None:
    def m(name: str, wall: float, rss: float):
        return bench.lm.Measurement(name, (wall,), int(rss), "")

    measured = {
        "load": m("onnx.load", 2.0, 2000),
        "inspect": m("graphfix inspect", 3.0, 1500),  # 1.5x: passes; RSS 1.5x: passes
        "fix": m("graphfix fix", 3.1, 1600),  # over both limits
    }
    results = [row.passed for row in bench.judge(measured, 1000) if row.passed is not None]
    assert results == [True, True, False, False]
    measured["load"] = m("onnx.load", 0.5, 2000)  # short loads get a second of slack
    measured["inspect"] = m("graphfix inspect", 1.5, 100)
    assert bench.judge(measured, 1000)[1].passed is True
