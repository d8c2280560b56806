"""Native attention nodes through inspect → fix → validate: torch's opset-23 exports
(tests/native_corpus.py) and TRT_Attention / TRT_QuantizedAttention graphs built from
onnx-tensorrt's published attribute lists (tests/native_graphs.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import model_corpus
import native_corpus
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from native_graphs import HQ, B, D, S, attention_model, feeds, reference

import graphfix
from graphfix.attention.native.decompose import lower_trt_ops
from graphfix.cli.main import main
from graphfix.plugins.spec import ATTENTION


def _run(model: onnx.ModelProto, data: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, data)


def _cases() -> list:
    return [
        pytest.param(e, id=e.name, marks=[pytest.mark.slow] if e.slow else [])
        for e in native_corpus.ENTRIES
    ]


@pytest.mark.parametrize("entry", _cases())
def test_opset23_export_goes_through_inspect_fix_validate(entry, corpus_dir: Path) -> None:
    """Every Attention node is listed and becomes one GraphfixAttention node directly (no
    decomposition); the fixed model agrees with the original (onnxruntime running the Attention
    nodes itself, graphfix's reference ops the plugin nodes)."""
    path = native_corpus.model_path(entry, cache_dir=corpus_dir)
    original = onnx.load(str(path))
    scan = graphfix.scan_attention(original)
    assert [op.op_type for op in scan.attention_ops] == ["Attention"] * entry.expected.attention_ops
    assert all(op.unsupported is None for op in scan.attention_ops)
    result = graphfix.fix_attention(original, strategy="fused_plugin", decompose_attention_ops=True)
    assert result.report.direct_attention_ops == entry.expected.attention_ops
    assert result.report.decomposed_attention_ops == 0 and result.report.blocks == ()
    nodes = Counter(n.op_type for n in result.model.graph.node)
    assert nodes[ATTENTION.op_type] == entry.expected.attention_ops and not nodes["Attention"]
    onnx.checker.check_model(result.model, full_check=True)
    report = graphfix.validate(original, result.model)
    assert report.passed, report


@pytest.mark.parametrize("entry", _cases())
def test_opset23_export_decomposed_for_the_plugin_strategy(entry, corpus_dir: Path) -> None:
    """With a strategy other than fused_plugin the nodes are lowered to the chain, which the
    matcher finds and the strategy rewrites; the result agrees with the original."""
    original = onnx.load(str(native_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(original, decompose_attention_ops=True)
    assert result.report.decomposed_attention_ops == entry.expected.attention_ops
    assert len(result.report.blocks) == entry.expected.attention_ops
    assert all(b.rewritten for b in result.report.blocks)
    onnx.checker.check_model(result.model, full_check=True)
    feed = model_corpus.random_feed(original, np.random.default_rng(0))
    for got, want in zip(
        _run(graphfix.with_reference_ops(result.model), feed), _run(original, feed), strict=True
    ):
        low = got.dtype == np.float16
        np.testing.assert_allclose(
            got, want, rtol=2e-2 if low else 1e-5, atol=2e-2 if low else 1e-5
        )


@pytest.mark.parametrize(
    ("op_type", "kwargs"),
    [
        ("TRT_Attention", {"causal_kind": "upper_left", "t": 5}),
        ("TRT_Attention", {"mask": "bool", "hkv": 2}),
        ("TRT_QuantizedAttention", {"mask": "float", "scale": 0.3}),
    ],
)
def test_tensorrt_custom_ops_go_through_inspect_fix_validate(op_type, kwargs, tmp_path, capsys):
    model = attention_model(op_type, **kwargs)
    path = tmp_path / "native.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path)]) == 0
    listed = capsys.readouterr().out
    assert f"{op_type} op attn (" in listed and "--decompose-attention" in listed
    for name, value in kwargs.items():
        if name not in ("mask", "hkv", "t"):
            assert f"{name}={value}" in listed
    result = graphfix.fix_attention(model, strategy="fused_plugin", decompose_attention_ops=True)
    fused = Counter(n.op_type for n in result.model.graph.node)[ATTENTION.op_type]
    if op_type == "TRT_QuantizedAttention":  # no Q/DQ inside the node: decomposed, and the
        (block,) = result.report.blocks  # chain's Softmax becomes GraphfixSoftmax
        assert "probabilities are quantized" in block.detail
        assert "probabilities are quantized" in result.report.summary().split("decomposed")[1]
    else:
        assert fused == 1 and result.report.direct_attention_ops == 1
    onnx.checker.check_model(result.model, full_check=True)
    data = feeds(model)
    (want,) = reference(model, data)
    (got,) = _run(graphfix.with_reference_ops(result.model), data)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    report = graphfix.validate(model, result.model, inputs=data)
    assert report.passed, report


def test_packed_trt_attention_is_listed_left_alone_and_refused_by_validate(tmp_path, capsys):
    model = attention_model("TRT_Attention", query_form="packed_nhd")
    path = tmp_path / "packed.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path)]) == 0
    assert "left as is: packed (packed_nhd)" in capsys.readouterr().out
    result = graphfix.fix_attention(model, decompose_attention_ops=True)
    assert "TRT_Attention op attn left as is: packed" in result.report.summary()
    assert main(["validate", str(path), str(path)]) == 2
    assert "packed" in capsys.readouterr().err


def test_random_feed_of_an_export_is_what_validate_compares(corpus_dir: Path) -> None:
    """The corpus export agrees with its decomposition on model_corpus's random feed too
    (the plugin strategy: GraphfixSoftmax inside the decomposed chain)."""
    entry = next(e for e in native_corpus.ENTRIES if e.model == "sdpa_causal")
    original = onnx.load(str(native_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(original, decompose_attention_ops=True)
    (match,) = result.report.matches
    assert match.causal
    feed = model_corpus.random_feed(original, np.random.default_rng(0))
    (want,) = _run(original, feed)
    (got,) = _run(graphfix.with_reference_ops(result.model), feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("op_type", "kwargs", "why"),
    [
        ("Attention", {"mask": "bool", "hkv": 2, "softcap": 2.0}, None),
        ("Attention", {"is_causal": 1, "t": 5, "mask": "float"}, None),
        ("TRT_Attention", {"causal_kind": "lower_right", "t": 5}, None),
        ("Attention", {"rank": 3, "q_num_heads": 4, "kv_num_heads": 4}, "rank-3"),
        ("Attention", {"past": 2, "outputs": 3}, "KV cache"),
        ("Attention", {"is_causal": 1}, "not known equal"),
        ("Attention", {"outputs": 4}, "extra outputs"),
        ("Attention", {"mask": "bool", "mask_keys": 4}, "key length"),
        ("TRT_Attention", {"kv_lengths": True}, "kv_lengths"),
    ],
)
def test_fused_plugin_takes_native_nodes_directly_or_says_why_not(op_type, kwargs, why) -> None:
    model = attention_model(op_type, **kwargs)
    result = graphfix.fix_attention(model, strategy="fused_plugin", decompose_attention_ops=True)
    report = result.report
    if why is None:
        assert report.direct_attention_ops == 1 and report.decomposed_attention_ops == 0
        (node,) = [n for n in result.model.graph.node if n.op_type == ATTENTION.op_type]
        assert list(node.input) == [i for i in model.graph.node[0].input if i]
    else:
        assert report.direct_attention_ops == 0 and report.decomposed_attention_ops == 1
        (note,) = report.native_notes
        assert why in note and f"decomposed {note}" in report.summary()
    data = feeds(model)
    got = _run(graphfix.with_reference_ops(result.model), data)
    for a, b in zip(got, reference(model, data), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_inspect_json_lists_native_nodes_with_their_attributes(tmp_path, capsys) -> None:
    import json

    model = attention_model("TRT_Attention", causal_kind="upper_left", t=5)
    model.graph.node.append(
        onnx.helper.make_node("TRT_KVCacheUpdate", ["k", "v"], ["cache"], domain="trt")
    )
    path = tmp_path / "native.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path), "--json"]) == 0
    ops = json.loads(capsys.readouterr().out)["attention_ops"]
    assert [op["op_type"] for op in ops] == ["TRT_Attention", "TRT_KVCacheUpdate"]
    assert ["causal_kind", "upper_left"] in ops[0]["attributes"] and ops[0]["is_causal"]
    assert ops[0]["unsupported"] is None and "KV-cache update" in ops[1]["unsupported"]


def test_inspect_names_extra_outputs(tmp_path, capsys) -> None:
    path = tmp_path / "cache.onnx"
    onnx.save(attention_model(past=2, outputs=4, qk_matmul_output_mode=3), path)
    assert main(["inspect", str(path)]) == 0
    line = capsys.readouterr().out
    assert "qk_matmul_output_mode=3" in line
    assert "output present_key present_key, output present_value present_value" in line
    assert "output qk_matmul_output qk" in line


@pytest.mark.parametrize(
    "entry",
    [e for e in native_corpus.ENTRIES if e.model.startswith("sdpa_gqa")],
    ids=lambda e: e.name,
)
def test_native_attention_keeps_an_export_node_iattention_takes(entry, corpus_dir: Path) -> None:
    """An exported Attention node (grouped heads, a mask or is_causal) is already what
    native_attention writes: kept as it is, not decomposed and rebuilt."""
    original = onnx.load(str(native_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(
        original, strategy="native_attention", decompose_attention_ops=True
    )
    report = result.report
    assert report.rewritten == 0 and report.decomposed_attention_ops == 0
    (kept,) = report.native_kept
    assert f"op {kept} kept as it is: already the node native_attention writes" in (
        report.summary()
    )
    assert result.model.graph.node == original.graph.node


def test_native_attention_accumulates_an_export_node_in_float32(corpus_dir: Path) -> None:
    """The float16 export's Attention node, kept, with float32 Casts around it (TensorRT ≥ 11.3:
    the FP16 kernel accumulating in float32); agrees with the export within float16's rounding."""
    entry = next(e for e in native_corpus.ENTRIES if e.model == "sdpa_fp16")
    original = onnx.load(str(native_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(
        original,
        strategy="native_attention",
        decompose_attention_ops=True,
        accumulate="float32",
    )
    assert result.report.direct_attention_ops == 1 and result.report.rewritten == 1
    nodes = list(result.model.graph.node)
    (attention,) = [n for n in nodes if n.op_type == "Attention"]
    made = {o: n for n in nodes for o in n.output}
    assert all(made[i].op_type == "Cast" for i in attention.input[:3])
    (after,) = [n for n in nodes if attention.output[0] in n.input]
    assert after.op_type == "Cast" and after.attribute[0].i == onnx.TensorProto.FLOAT16
    onnx.checker.check_model(result.model, full_check=True)
    feed = model_corpus.random_feed(original, np.random.default_rng(0))
    feed = {k: np.ones_like(v) if v.dtype == np.bool_ else v for k, v in feed.items()}
    for got, want in zip(_run(result.model, feed), _run(original, feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "kwargs", [{"causal_kind": "upper_left", "t": 5}, {"mask": "float", "hkv": 2}], ids=str
)
def test_trt_attention_becomes_onnx_attention_for_tensorrt_10(kwargs) -> None:
    """TRT_Attention (TensorRT 11 only) → its chain → one ONNX Attention node (IAttention from
    TensorRT 10.14): scale 1, as TRT_Attention applies none."""
    model = attention_model("TRT_Attention", **kwargs)
    result = graphfix.fix_attention(
        model, strategy="native_attention", decompose_attention_ops=True
    )
    (node,) = [n for n in result.model.graph.node if n.op_type.endswith("Attention")]
    assert node.op_type == "Attention" and node.domain == ""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["scale"] == 1.0
    data = feeds(model)
    (want,) = reference(model, data)
    (got,) = _run(result.model, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _inside_if(op_type: str, **kwargs) -> onnx.ModelProto:
    """`attention_model(op_type)`'s node as the then-branch of an If on a boolean input."""
    inner = attention_model(op_type, **kwargs)
    body = onnx.helper.make_graph(list(inner.graph.node), "then", [], list(inner.graph.output))
    other = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["q"], ["y_else"])],
        "else",
        [],
        [onnx.helper.make_tensor_value_info("y_else", onnx.TensorProto.FLOAT, [B, HQ, S, D])],
    )
    cond = onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])
    branch = onnx.helper.make_node(
        "If", ["cond"], ["out"], name="branch", then_branch=body, else_branch=other
    )
    graph = onnx.helper.make_graph(
        [branch],
        "g",
        [cond, *inner.graph.input],
        [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [B, HQ, S, D])],
    )
    model = onnx.helper.make_model(graph, opset_imports=list(inner.opset_import))
    model.ir_version = 10
    return model


@pytest.mark.parametrize(
    ("op_type", "strategy"),
    [("Attention", "plugin"), ("Attention", "fused_plugin"), ("TRT_Attention", "fused_plugin")],
)
def test_native_node_inside_an_if_body_is_listed_and_rewritten(op_type, strategy) -> None:
    model = _inside_if(op_type, mask="bool")
    (op,) = graphfix.scan_attention(model).attention_ops
    assert op.node.startswith("If 'branch'/then_branch/") and op.op_type == op_type
    result = graphfix.fix_attention(model, strategy=strategy, decompose_attention_ops=True)
    report = result.report
    if strategy == "fused_plugin":
        assert report.direct_attention_ops == 1
    else:
        assert report.decomposed_attention_ops == 1 and report.blocks[0].rewritten
        assert "inside If 'branch'" in report.blocks[0].detail
    onnx.checker.check_model(result.model, full_check=True)
    data = {"cond": np.array(True), **feeds(attention_model(op_type, mask="bool"))}
    (want,) = reference(attention_model(op_type, mask="bool"), data)
    (got,) = _run(graphfix.with_reference_ops(result.model), data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if op_type == "TRT_Attention":  # validate lowers the TRT_ node inside the body too
        (original,) = _run(lower_trt_ops(model), data)
        np.testing.assert_allclose(original, want, rtol=1e-5, atol=1e-5)
