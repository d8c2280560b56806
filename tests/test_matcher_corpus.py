"""The chains of tests/matcher_corpus.py on real exports, and the corpus-wide fused count.

For each export: the matcher finds the expected blocks and describes the feature the entry is
about (sink, Q/DQ pairs, window view, Einsum layout, masks); `plugin` and `fused_plugin` rewrite
it and the result computes what the original did (graphfix's reference ops in onnxruntime);
`fused_plugin` falls back exactly where the node contract cannot express the chain, with the
reason.  Then one count over the three corpora (with tests/fusion_corpus.py): blocks fused by
`fused_plugin` vs fallen back.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import fusion_corpus
import matcher_corpus
import model_corpus
import numpy as np
import onnx
import pytest
from test_real_models import SEED, TOLERANCE, _run

import graphfix
from graphfix.attention.match_types import (
    BiasStep,
    MaskStep,
    QdqSite,
    QdqStep,
    ReshapeStep,
)
from graphfix.plugins.spec import ATTENTION, SOFTMAX

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

# Entry → (blocks expected to fall back from fused_plugin, words of the reason)
FALLBACKS: dict[str, tuple[int, str]] = {
    "sdpa_mask-dynamo18/ort_qdq": (1, "scores are quantized"),
    "bert_eager-legacy17/ort_qdq": (2, "scores are quantized"),
}
# The same for tests/fusion_corpus.py's exports (see test_fusion_corpus.py)
FUSION_FALLBACKS: dict[str, int] = {
    "returns_probabilities-legacy17": 1,
    "returns_probabilities-dynamo18": 1,
    "cait-legacy17": 2,
    "cait-dynamo18": 2,
}
# Fallbacks the node contract (plugins/spec.py ATTENTION, version 1) forces: no Q/DQ inside,
# one output (returned probabilities stay with GraphfixSoftmax), heads kept apart (talking
# heads).  The count below reports them apart from the rest.  (GPT-OSS's attention sinks fuse
# as one more key: fused/sink.py.)
CONTRACT_WORDS = (
    "scores are quantized",
    "probabilities are quantized",
    "are also a graph output (returned attention weights)",
    "a head-mixing projection (talking heads",
)


def _cases() -> list:
    cases = []
    for entry in matcher_corpus.ENTRIES:
        if entry.export_error is None:
            marks = [pytest.mark.slow] if entry.slow else []
            cases.append(pytest.param(entry.name, entry, id=entry.name, marks=marks))
    for source, tool in matcher_corpus.QUANTIZED:
        name = f"{source}/{tool}"
        marks = [pytest.mark.slow] if "bert" in source else []
        cases.append(pytest.param(name, source, id=name, marks=marks))
    return cases


def _path(case: model_corpus.CorpusEntry | str, corpus_dir: Path) -> Path:
    if isinstance(case, str):
        return matcher_corpus.quantized_path(case, cache_dir=corpus_dir)
    return matcher_corpus.model_path(case, cache_dir=corpus_dir)


def _expected(case: model_corpus.CorpusEntry | str) -> model_corpus.Expected:
    if isinstance(case, str):
        return next(e for e in model_corpus.CORPUS if e.name == case).expected
    return case.expected


@pytest.mark.parametrize(("name", "case"), _cases())
def test_matcher_describes_the_chain(name: str, case, corpus_dir: Path) -> None:
    scan = graphfix.scan_attention(_path(case, corpus_dir))
    expected = _expected(case)
    kinds = Counter(m.kind.value for m in scan.matches)
    assert (len(scan.matches), kinds["causal"], kinds["cross"]) == (
        expected.blocks,
        expected.causal_attention,
        expected.cross_attention,
    ), [(m.softmax, m.kind.value) for m in scan.matches]
    assert scan.skipped == ()
    for match in scan.matches:
        steps = match.steps
        if name.startswith("gpt_oss"):
            assert match.sink is not None and match.sink.scores_first
            assert isinstance(match.kv_len, int) and match.kv_len == model_corpus.SEQ
        else:
            assert match.sink is None
        if name.endswith("ort_qdq"):
            sites = {q.site for q in match.quantized}
            assert {QdqSite.Q, QdqSite.K, QdqSite.V, QdqSite.SCORES} <= sites, sites
            assert any(isinstance(s, QdqStep) for s in steps)
        else:
            assert match.quantized == ()
        if name.startswith("causal_fill_and_bool"):
            assert sum(isinstance(s, MaskStep) for s in steps) == 2
        if name.startswith(("causal_fill_and_padding", "causal_min_fill")):
            assert [type(s) for s in steps if isinstance(s, (MaskStep, BiasStep))] == [
                MaskStep,
                BiasStep,
            ]
        if name.startswith("einsum"):
            assert match.layout.qk_op == "Einsum" and match.layout.pv_op == "Einsum"
    if name.startswith("swin"):  # block 1 is the shifted one: viewed per window, mask, back
        reshapes = [s for s in scan.matches[1].steps if isinstance(s, ReshapeStep)]
        assert [len(s.target) for s in reshapes] == [5, 4]


@pytest.mark.parametrize("strategy", ["plugin", "fused_plugin"])
@pytest.mark.parametrize(("name", "case"), _cases())
def test_rewrite_computes_what_the_original_did(
    name: str, case, strategy: str, corpus_dir: Path
) -> None:
    original = onnx.load(str(_path(case, corpus_dir)))
    result = graphfix.fix_attention(original, strategy=strategy)
    blocks = result.report.blocks
    assert blocks and all(b.rewritten for b in blocks)
    nodes = Counter(n.op_type for n in result.model.graph.node)
    fell_back = [b for b in blocks if b.detail.startswith("fell back")]
    if strategy == "plugin":
        assert nodes[SOFTMAX.op_type] == len(blocks) and not fell_back
    else:
        expected, words = FALLBACKS.get(name, (0, ""))
        assert len(fell_back) == expected, [b.detail for b in fell_back]
        assert all(words in b.detail for b in fell_back)
        assert nodes[ATTENTION.op_type] == len(blocks) - expected
    onnx.checker.check_model(result.model)
    if name.endswith("ort_qdq"):  # the Q/DQ pairs around the rewritten nodes stay
        before = Counter(n.op_type for n in original.graph.node)
        assert nodes["QuantizeLinear"] == before["QuantizeLinear"]
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    want = _run(original, feed)
    got = _run(graphfix.with_reference_ops(result.model), feed)
    for a, b in zip(got, want, strict=True):
        atol, rtol = TOLERANCE[b.dtype.type]
        np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)


def _all_blocks(corpus_dir: Path) -> list[tuple[str, str]]:
    """(entry, detail) of every block `fused_plugin` rewrote, over both corpora."""
    paths = [
        (e.name, model_corpus.model_path(e, cache_dir=corpus_dir))
        for e in model_corpus.CORPUS
        if e.export_error is None
    ]
    paths += [(name, _path(case, corpus_dir)) for name, case in (p.values for p in _cases())]
    paths += [
        (e.name, fusion_corpus.model_path(e, cache_dir=corpus_dir))
        for e in fusion_corpus.ENTRIES
        if e.export_error is None
    ]
    blocks = []
    for name, path in paths:
        report = graphfix.fix_attention(path, strategy="fused_plugin").report
        blocks += [(name, b.detail) for b in report.blocks]
    return blocks


@pytest.mark.slow
def test_fused_plugin_expresses_97_percent_of_real_chains(corpus_dir: Path) -> None:
    blocks = _all_blocks(corpus_dir)
    fell_back = [(n, d) for n, d in blocks if d.startswith("fell back")]
    by_contract = [(n, d) for n, d in fell_back if any(w in d for w in CONTRACT_WORDS)]
    fused = len(blocks) - len(fell_back)
    expressible = len(blocks) - len(by_contract)
    print(
        f"fused_plugin: {fused} of {len(blocks)} blocks fused ({fused / len(blocks):.1%}); "
        f"{fused} of the {expressible} the node contract can express ({fused / expressible:.1%}); "
        f"{len(by_contract)} fall back by contract (Q/DQ inside the chain, returned "
        "probabilities, talking heads)"
    )
    assert fused / expressible >= 0.97, fell_back
    # Only the expected blocks fall back (the FALLBACKS table), for the reasons it gives.
    assert Counter(n for n, _ in fell_back) == Counter(
        {name: count for name, (count, _) in FALLBACKS.items()} | FUSION_FALLBACKS
    )
    assert len(by_contract) == 9


def test_onnx_attention_op_fuses(corpus_dir: Path) -> None:
    """Opset 23's Attention op with fused_plugin: one GraphfixAttention node directly, no
    decomposition (tests/test_native_ops.py covers the other exports and the decomposition)."""
    entry = next(e for e in model_corpus.CORPUS if e.opset == 23)
    original = onnx.load(str(model_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(original, strategy="fused_plugin", decompose_attention_ops=True)
    assert result.report.direct_attention_ops == 1 and result.report.blocks == ()
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    (want,) = _run(original, feed)
    (got,) = _run(graphfix.with_reference_ops(result.model), feed)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
