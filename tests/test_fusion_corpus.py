"""The exports of tests/fusion_corpus.py (issue 21's families): the labels the matcher gives
their blocks, and `fused_plugin` making each block one GraphfixAttention node (`plugin` one
GraphfixSoftmax), the rewritten model computing what the original did (graphfix's reference ops
in onnxruntime)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import fusion_corpus
import model_corpus
import numpy as np
import onnx
import pytest
from test_real_models import SEED, TOLERANCE, _run

import graphfix
from graphfix.attention.match_types import AttentionKind
from graphfix.plugins.spec import ATTENTION, SOFTMAX

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

# model → blocks labelled `self (reduced keys)` (spatial-reduction attention), counted within
# Expected.self_attention
REDUCED_KEYS = {"pvt_v2": 1, "segformer": 1}
# model → (blocks falling back from fused_plugin, words of the reason)
FALLBACKS = {
    "returns_probabilities": (1, "are also a graph output (returned attention weights)"),
    "cait": (2, "a head-mixing projection (talking heads"),
}
# The original rounds the probabilities to float16 for P·V; the node keeps them in float32.
LOOSER = {"mixed_type_v": 1e-3}


def _cases() -> list:
    return [
        pytest.param(entry, id=entry.name, marks=[pytest.mark.slow] if entry.slow else [])
        for entry in fusion_corpus.ENTRIES
        if entry.export_error is None
    ]


@pytest.mark.parametrize("entry", _cases())
def test_blocks_and_labels(entry: model_corpus.CorpusEntry, corpus_dir: Path) -> None:
    scan = graphfix.scan_attention(fusion_corpus.model_path(entry, cache_dir=corpus_dir))
    expected = entry.expected
    kinds = Counter(m.kind for m in scan.matches)
    reduced = REDUCED_KEYS.get(entry.model, 0)
    assert kinds == Counter(
        {
            AttentionKind.SELF: expected.self_attention - reduced,
            AttentionKind.SELF_REDUCED_KEYS: reduced,
            AttentionKind.CAUSAL: expected.causal_attention,
            AttentionKind.CROSS: expected.cross_attention,
        }
    ), [(m.softmax, m.kind.value) for m in scan.matches]
    assert len(scan.skipped) == expected.other_softmax, scan.skipped
    assert {m.dtype for m in scan.matches} == {expected.dtype}
    assert {m.cast_island for m in scan.matches} == {expected.cast_island}


@pytest.mark.parametrize("strategy", ["plugin", "fused_plugin"])
@pytest.mark.parametrize("entry", _cases())
def test_rewrite_computes_what_the_original_did(
    entry: model_corpus.CorpusEntry, strategy: str, corpus_dir: Path
) -> None:
    original = onnx.load(str(fusion_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(original, strategy=strategy)
    blocks = result.report.blocks
    assert blocks and all(b.rewritten for b in blocks)
    fell_back = [b.detail for b in blocks if b.detail.startswith("fell back")]
    count, words = FALLBACKS.get(entry.model, (0, "")) if strategy == "fused_plugin" else (0, "")
    assert len(fell_back) == count and all(words in d for d in fell_back), fell_back
    nodes = Counter(n.op_type for n in result.model.graph.node)
    fused = nodes[ATTENTION.op_type]
    assert fused == (len(blocks) - count if strategy == "fused_plugin" else 0)
    assert nodes[SOFTMAX.op_type] == len(blocks) - fused
    onnx.checker.check_model(result.model)
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    want = _run(original, feed)
    got = _run(graphfix.with_reference_ops(result.model), feed)
    for a, b in zip(got, want, strict=True):
        atol, rtol = TOLERANCE[b.dtype.type]
        tolerance = LOOSER.get(entry.model)
        np.testing.assert_allclose(a, b, atol=tolerance or atol, rtol=tolerance or rtol)
