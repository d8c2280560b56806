"""The fused_plugin strategy on real exported models: every block becomes GraphfixAttention or
falls back to GraphfixSoftmax with a reason, and the result computes what the original did."""

from __future__ import annotations

from pathlib import Path

import model_corpus
import numpy as np
import onnx
import pytest
from test_real_models import SEED, TOLERANCE, _params, _run

import graphfix
from graphfix.plugins.spec import ATTENTION, SOFTMAX

pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

# Entry name → blocks expected to fall back, and the reason's key words.  Everything else fuses.
FALLBACKS: dict[str, tuple[int, str]] = {}
# Entries whose fused output is compared at a looser tolerance, and why.
LOOSER: dict[str, tuple[float, float]] = {
    # the legacy exporter promotes V and all after Q·Kᵀ to float32; the node reads the float16 V
    # and computes in float16 I/O (as the dynamo export does), then Casts its output to float32
    "sdpa_fp16-legacy17": TOLERANCE[np.float16],
}


@pytest.mark.parametrize("entry", _params({}))
def test_fused_plugin_rewrites_or_explains(
    entry: model_corpus.CorpusEntry, corpus_dir: Path
) -> None:
    path = model_corpus.model_path(entry, cache_dir=corpus_dir)
    original = onnx.load(str(path))
    result = graphfix.fix_attention(original, strategy="fused_plugin")
    blocks = result.report.blocks
    assert len(blocks) == entry.expected.blocks and all(b.rewritten for b in blocks)
    fused = [n for n in result.model.graph.node if n.op_type == ATTENTION.op_type]
    softmax = [n for n in result.model.graph.node if n.op_type == SOFTMAX.op_type]
    fell_back = [b for b in blocks if b.detail.startswith("fell back")]
    assert len(fused) + len(softmax) == entry.expected.blocks
    assert len(softmax) == len(fell_back)
    expected_fallbacks, words = FALLBACKS.get(entry.name, (0, ""))
    assert len(fell_back) == expected_fallbacks, [b.detail for b in fell_back]
    assert all(words in b.detail for b in fell_back)
    onnx.checker.check_model(result.model)

    if any(init.data_type == onnx.TensorProto.BFLOAT16 for init in original.graph.initializer):
        return  # onnxruntime's CPU provider has no bfloat16 MatMul
    feed = model_corpus.random_feed(original, np.random.default_rng(SEED))
    before = _run(original, feed)
    after = _run(graphfix.with_reference_ops(result.model), feed)
    for got, want in zip(after, before, strict=True):
        atol, rtol = LOOSER.get(entry.name, TOLERANCE[want.dtype.type])
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)
