"""The matcher and the default rewrite on real exported models (tests/model_corpus.py).

For each corpus entry: `scan_attention` finds exactly the expected attention blocks, with the
expected kinds and element type, and leaves every other Softmax alone; `break_attention_fusion`
turns every attention Softmax, and nothing else, into a GraphfixSoftmax node, and the result
computes what the original did (checked with graphfix's reference ops in onnxruntime).

Where the matcher is known to get a model wrong, the test is an expected failure whose reason
points at notes/matcher_gaps.md; it is strict, so it fails as soon as the gap is closed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import model_corpus
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphfix
from graphfix.plugins.spec import PLUGIN_DOMAIN, SOFTMAX

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

SEED = 2

# Entry name → why the matcher gets it wrong (details in notes/matcher_gaps.md).  Empty: the four
# gaps found so far are fixed; add an entry (with a reason) when a new one turns up.
MATCH_GAPS: dict[str, str] = {}
# Entry name → why the rewritten model is wrong (fewer/more GraphfixSoftmax, or numbers differ).
REWRITE_GAPS: dict[str, str] = {}

# |rewritten - original| ≤ atol + rtol·|original|, per output element type.
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (2e-2, 2e-2)}


def _params(gaps: dict[str, str]) -> list:
    params = []
    for entry in model_corpus.CORPUS:
        if entry.export_error is not None:
            continue
        marks = [pytest.mark.slow] if entry.slow else []
        if entry.name in gaps:
            marks.append(pytest.mark.xfail(strict=True, reason=gaps[entry.name]))
        params.append(pytest.param(entry, id=entry.name, marks=marks))
    return params


def test_gap_lists_name_real_entries() -> None:
    names = {entry.name for entry in model_corpus.CORPUS}
    assert set(MATCH_GAPS) <= names
    assert set(REWRITE_GAPS) <= names


@pytest.mark.parametrize("entry", _params(MATCH_GAPS))
def test_matcher_finds_the_expected_blocks(
    entry: model_corpus.CorpusEntry, corpus_dir: Path
) -> None:
    expected = entry.expected
    scan = graphfix.scan_attention(model_corpus.model_path(entry, cache_dir=corpus_dir))

    kinds = Counter(match.kind for match in scan.matches)
    found = {
        "blocks": len(scan.matches),
        "self": kinds[graphfix.AttentionKind.SELF],
        "cross": kinds[graphfix.AttentionKind.CROSS],
        "causal": kinds[graphfix.AttentionKind.CAUSAL],
        "skipped softmax": len(scan.skipped),
        "attention ops": len(scan.attention_ops),
    }
    wanted = {
        "blocks": expected.blocks,
        "self": expected.self_attention,
        "cross": expected.cross_attention,
        "causal": expected.causal_attention,
        "skipped softmax": expected.other_softmax,
        "attention ops": expected.attention_ops,
    }
    assert found == wanted, [(m.softmax, m.kind.value) for m in scan.matches] + list(scan.skipped)
    assert {m.dtype for m in scan.matches} <= {expected.dtype}
    assert {m.cast_island for m in scan.matches} <= {expected.cast_island}
    assert all(m.causal == (m.kind is graphfix.AttentionKind.CAUSAL) for m in scan.matches)


@pytest.mark.parametrize("entry", _params(REWRITE_GAPS))
def test_rewrite_replaces_exactly_the_attention_softmax(
    entry: model_corpus.CorpusEntry, corpus_dir: Path
) -> None:
    path = model_corpus.model_path(entry, cache_dir=corpus_dir)
    original = onnx.load(str(path))
    fixed = graphfix.break_attention_fusion(original)

    plugin = [n for n in fixed.graph.node if n.op_type == SOFTMAX.op_type]
    assert len(plugin) == entry.expected.blocks
    assert all(n.domain == PLUGIN_DOMAIN for n in plugin)
    softmax_left = [n for n in fixed.graph.node if n.op_type == "Softmax"]
    assert len(softmax_left) == entry.expected.other_softmax
    if plugin:
        assert PLUGIN_DOMAIN in {opset.domain for opset in fixed.opset_import}

    if any(init.data_type == onnx.TensorProto.BFLOAT16 for init in original.graph.initializer):
        return  # onnxruntime's CPU provider has no bfloat16 MatMul
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    before = _run(original, feed)
    after = _run(graphfix.with_reference_ops(fixed), feed)
    for got, want in zip(after, before, strict=True):
        atol, rtol = TOLERANCE[want.dtype.type]
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)
