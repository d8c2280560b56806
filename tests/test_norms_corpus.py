"""fuse_norms on real exports: the attention corpus (model_corpus.py) and the norm corpus
(norm_corpus.py: legacy opset-14 exports, where torch decomposes LayerNorm, and small modules).

The expected number of norms of each kind comes from the torch module the corpus builds, not
from the matcher: the calls of LayerNorm/RMSNorm/GroupNorm-like modules (by isinstance or class
name; an outer module that wraps one is not counted twice) while it runs its example inputs.  Every one must be found, fused or kept
with a reason, and the graph of a model without norms must come back untouched.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import model_corpus
import norm_corpus
import numpy as np
import onnx
import pytest
from norm_graphs import run

import graphfix
from graphfix.precision.norm_types import NormKind

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

SEED = 3
# Kept whatever the opset, and why (entry name → reasons, one per norm).
KEPT = {
    "manual_norms_fp32-legacy17": ["not the last 1 axes"],  # channels-first, ConvNeXt style
    "manual_norms_fp32-dynamo18": ["not the last 1 axes"],
    "manual_norms_fp16-legacy17": ["not the last 1 axes"],
    "manual_norms_fp16-dynamo18": ["not the last 1 axes"],
}
# |fused - original| ≤ atol + rtol·|original|.
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (4e-3, 4e-3)}


def _entries() -> list:
    params = []
    for entry in (*model_corpus.CORPUS, *norm_corpus.NORM_CORPUS):
        if entry.export_error is None:
            marks = [pytest.mark.slow] if entry.slow else []
            params.append(pytest.param(entry, id=entry.name, marks=marks))
    return params


@pytest.mark.parametrize("entry", _entries())
def test_finds_every_norm_of_the_module(
    entry: model_corpus.CorpusEntry, corpus_dir: Path, torchvision_ops
) -> None:
    pytest.importorskip("torch")
    path = model_corpus.model_path(entry, cache_dir=corpus_dir)
    report = graphfix.fuse_norms(path).report
    found = {kind: report.found(kind) for kind in NormKind}
    assert found == norm_corpus.expected_norms(f"_{entry.model}"), report.summary()
    reasons = [
        u.reason
        for u in report.unfused
        if not u.reason.startswith(f"opset {report.opset_after} model:")
    ]
    wanted = KEPT.get(entry.name, [])
    assert len(reasons) == len(wanted) and all(
        w in r for w, r in zip(wanted, reasons, strict=True)
    ), reasons


def _with_norms() -> list:
    return [p for p in _entries() if p.values[0].model not in _NO_NORMS]


_NO_NORMS = {
    e.model
    for e in model_corpus.CORPUS
    if e.library is None  # the hand-written attention and softmax modules have no norms
}


@pytest.mark.parametrize("entry", _with_norms())
def test_fused_model_computes_the_same(entry: model_corpus.CorpusEntry, corpus_dir: Path) -> None:
    """With opset 23 every norm can fuse; onnxruntime gives the same outputs before and after."""
    original = onnx.load(str(model_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fuse_norms(original, opset=23)
    report = result.report
    assert report.opset_after == 23, report.opset_note
    assert len(report.unfused) == len(KEPT.get(entry.name, [])), report.summary()
    fused_ops = Counter(n.op_type for n in result.model.graph.node)
    for kind in NormKind:
        existing = sum(e.kind is kind and e.op_type == kind.op_type for e in report.existing)
        fused = sum(f.kind is kind for f in report.fused)
        assert fused_ops[kind.op_type] == existing + fused
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    for got, want in zip(run(result.model, feed), run(original, feed), strict=True):
        atol, rtol = TOLERANCE[want.dtype.type]
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol
        )


@pytest.mark.parametrize("entry", [p for p in _entries() if p.values[0].model in _NO_NORMS])
def test_models_without_norms_come_back_unchanged(
    entry: model_corpus.CorpusEntry, corpus_dir: Path
) -> None:
    original = onnx.load(str(model_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fuse_norms(original)
    assert result.report.found() == 0
    assert result.model.graph == original.graph
