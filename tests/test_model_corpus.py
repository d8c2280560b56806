"""Every corpus entry exports to a valid ONNX model that onnxruntime runs on random inputs."""

from __future__ import annotations

from pathlib import Path

import model_corpus
import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

SEED = 1


def _params(entries: tuple[model_corpus.CorpusEntry, ...]) -> list:
    return [pytest.param(e, id=e.name, marks=[pytest.mark.slow] if e.slow else []) for e in entries]


def _uses_bfloat16(model: onnx.ModelProto) -> bool:
    bf16 = onnx.TensorProto.BFLOAT16
    return any(init.data_type == bf16 for init in model.graph.initializer) or any(
        v.type.tensor_type.elem_type == bf16 for v in model.graph.input
    )


def _export_error(entry: model_corpus.CorpusEntry, directory: Path) -> str:
    try:
        model_corpus.model_path(entry, cache_dir=directory)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "(no error)"


@pytest.mark.parametrize("entry", _params(model_corpus.CORPUS))
def test_export_is_valid_and_runs(entry: model_corpus.CorpusEntry, corpus_dir: Path) -> None:
    if entry.export_error is not None:
        error = _export_error(entry, corpus_dir)
        assert entry.export_error in error, (
            f"{entry.name} was registered as failing to export with {entry.export_error!r}; "
            f"it now gives {error[:300]!r}: update its export_error in tests/model_corpus.py"
        )
        return
    path = model_corpus.model_path(entry, cache_dir=corpus_dir)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)

    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Softmax") == entry.expected.softmax_nodes
    assert ops.count("Attention") == entry.expected.attention_ops

    if _uses_bfloat16(model):
        pytest.skip("onnxruntime's CPU provider has no bfloat16 MatMul; the model is checked only")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    outputs = session.run(None, model_corpus.random_feed(model, np.random.default_rng(SEED)))
    for output in outputs:
        assert np.isfinite(output).all(), f"{entry.name} produced non-finite values"


def test_without_torch_corpus_tests_skip_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.metadata

    real_version = importlib.metadata.version

    def without_torch(name: str) -> str:
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_torch)
    entry = next(e for e in model_corpus.CORPUS if e.library == "transformers")
    with pytest.raises(pytest.skip.Exception, match=r"needs torch \(not installed\)"):
        model_corpus.model_path(entry, cache_dir=tmp_path)
    assert model_corpus.missing_exporters(entry) == ["torch"]
    assert list(tmp_path.iterdir()) == []
