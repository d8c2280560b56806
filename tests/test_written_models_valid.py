"""Every model graphfix writes is valid ONNX: a property over the whole corpus, not a sample.

Each exported model of tests/model_corpus.py, matcher_corpus.py and fusion_corpus.py goes through every
`fix` strategy and `precision` to float16 and bfloat16; each quantized model of
tests/qdq_corpus.py and matcher_corpus.QUANTIZED through `qdq fix`.  Every result passes
`onnx.checker.check_model(full_check=True)` and strict shape inference, and onnxruntime loads it
(plugin nodes through their reference lowering).  `qdq fix` is also a fixpoint: a second run
changes nothing.  Models from transformers/timm/diffusers/open_clip are under the `slow` marker.
"""

from __future__ import annotations

import fusion_corpus
import matcher_corpus
import model_corpus
import onnx
import onnxruntime as ort
import pytest

from graphfix.attention.rewrite import fix_attention
from graphfix.attention.strategies import STRATEGIES
from graphfix.errors import UsageError
from graphfix.plugins.reference import has_plugin_ops, with_reference_ops
from graphfix.precision.census import is_float32_model
from graphfix.precision.convert import convert_precision
from graphfix.qdq.fix import fix_qdq

pytest.importorskip("torch", reason="exporting the corpus needs torch")
pytestmark = pytest.mark.corpus  # the model-corpus sweep, run by `pytest -m corpus`

WRITERS = (*STRATEGIES, "float16", "bfloat16")
CORPORA = {
    "model": model_corpus.CORPUS,
    "matcher": matcher_corpus.ENTRIES,
    "fusion": fusion_corpus.ENTRIES,
}


def _entries() -> list:
    params = []
    for corpus, entries in CORPORA.items():
        for entry in entries:
            if entry.export_error is not None:
                continue
            marks = [pytest.mark.slow] if entry.slow else []
            for writer in WRITERS:
                params.append(
                    pytest.param(corpus, entry, writer, id=f"{entry.name}-{writer}", marks=marks)
                )
    return params


def _export(corpus: str, entry: model_corpus.CorpusEntry) -> onnx.ModelProto:
    module = {"model": model_corpus, "matcher": matcher_corpus, "fusion": fusion_corpus}[corpus]
    return onnx.load(str(module.model_path(entry)))


def assert_valid(model: onnx.ModelProto) -> None:
    """ONNX's full check and strict shape inference pass; onnxruntime's CPU provider loads it
    (the checks ONNX tooling built on shape inference and onnxruntime make of a file)."""
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    runnable = with_reference_ops(model) if has_plugin_ops(model) else model
    if _has_bfloat16(runnable):
        return  # onnxruntime's CPU provider lacks most bfloat16 kernels (MatMul, ReduceMax …)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ort.InferenceSession(runnable.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _has_bfloat16(model: onnx.ModelProto) -> bool:
    bf16 = onnx.TensorProto.BFLOAT16
    graph = model.graph
    declared = (*graph.input, *graph.output, *graph.value_info)
    return (
        any(v.type.tensor_type.elem_type == bf16 for v in declared)
        or any(t.data_type == bf16 for t in graph.initializer)
        or any(a.name == "to" and a.i == bf16 for n in graph.node for a in n.attribute)
    )


@pytest.mark.parametrize(("corpus", "entry", "writer"), _entries())
def test_every_written_model_is_valid_onnx(
    corpus: str, entry: model_corpus.CorpusEntry, writer: str
) -> None:
    original = _export(corpus, entry)
    try:
        onnx.checker.check_model(original, full_check=True)
    except onnx.checker.ValidationError as exc:
        pytest.skip(f"the export itself fails ONNX's checker: {str(exc).splitlines()[0]}")
    if writer in STRATEGIES:
        written = fix_attention(original, strategy=writer).model
    elif not is_float32_model(original):
        with pytest.raises(UsageError, match="already in"):  # writes nothing
            convert_precision(original, to=writer)
        return
    else:
        written = convert_precision(original, to=writer).model
    assert_valid(written)


def _quantized() -> list:
    params = [
        pytest.param("qdq", name, id=f"{name}-ort_int8", marks=[pytest.mark.slow])
        for name in ("unet", "sdxl_unet", "svd_unet", "vae")
    ]
    for source, tool in matcher_corpus.QUANTIZED:
        marks = [pytest.mark.slow] if "bert" in source else []
        params.append(pytest.param("matcher", source, id=f"{source}-{tool}", marks=marks))
    return params


def _quantized_path(corpus: str, name: str):
    if corpus == "matcher":
        return matcher_corpus.quantized_path(name)
    qdq_corpus = pytest.importorskip("qdq_corpus")
    pytest.importorskip("diffusers", reason="the quantized UNets/VAE need diffusers")
    return qdq_corpus.ort_quantized_path(name)


@pytest.mark.parametrize(("corpus", "name"), _quantized())
def test_qdq_fix_writes_valid_onnx_and_reaches_its_fixpoint_in_one_run(
    corpus: str, name: str
) -> None:
    path = _quantized_path(corpus, name)
    first = fix_qdq(path)
    assert_valid(first.model)
    again = fix_qdq(first.model)
    assert [(c.rule, c.node) for c in again.report.changes] == []
    assert not any("stopped after" in note for note in first.report.notes)


@pytest.mark.parametrize(("corpus", "name"), _quantized())
def test_precision_refuses_a_quantized_model_naming_a_quantizer(corpus: str, name: str) -> None:
    path = _quantized_path(corpus, name)
    with pytest.raises(UsageError, match=r"the model is quantized \(\d+ QuantizeLinear.*"
                       r"convert the float32 model first"):  # fmt: skip
        convert_precision(path)


def _slot_attention() -> model_corpus.Exportable:
    """Slot attention (softmax over the slots) whose slots start as `new_zeros` and whose mask
    is `torch.zeros`: the dynamo exporter writes ConstantOfShape without a `value` (float32
    zeros) and annotates every tensor."""
    torch = model_corpus._seeded()

    class SlotAttention(torch.nn.Module):
        def __init__(self, dim: int = 32, slots: int = 4) -> None:
            super().__init__()
            self.slots, self.scale = slots, dim**-0.5
            self.mu = torch.nn.Parameter(torch.randn(1, 1, dim))
            self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
            self.norm = torch.nn.LayerNorm(dim)

        def forward(self, x):
            b, n, d = x.shape
            slots = x.new_zeros(b, self.slots, d) + self.mu
            mask = torch.zeros(b, self.slots, n, dtype=x.dtype)
            k, v = self.k(x), self.v(x)
            for _ in range(2):
                scores = torch.einsum("bid,bjd->bij", self.q(self.norm(slots)), k) * self.scale
                attn = (scores + mask).softmax(dim=1) + 1e-8
                attn = attn / attn.sum(-1, keepdim=True)
                slots = slots + torch.einsum("bjd,bij->bid", v, attn)
            return slots

    return model_corpus.Exportable(SlotAttention().eval(), (torch.randn(2, 6, 32),), ("x",))


def test_precision_of_a_dynamo_slot_attention_export_is_valid_and_runs(tmp_path) -> None:
    import numpy as np

    path = tmp_path / "slots.onnx"
    model_corpus._export(_slot_attention(), path, exporter="dynamo", opset=18)
    original = onnx.load(str(path))
    zeros = [n for n in original.graph.node if n.op_type == "ConstantOfShape"]
    assert zeros and not any(a.name == "value" for n in zeros for a in n.attribute)
    result = convert_precision(original).model
    assert_valid(result)
    feed = {"x": np.random.default_rng(0).standard_normal((2, 6, 32)).astype(np.float32)}
    runs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feed
        )[0]
        for m in (original, result)
    ]
    np.testing.assert_allclose(runs[1], runs[0], atol=2e-2, rtol=2e-2)
    assert_valid(convert_precision(original, to="bfloat16").model)
