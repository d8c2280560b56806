"""The lowering of native attention nodes to standard ops, against an independent NumPy float64
reference (native_graphs.reference) and, for ONNX Attention, onnxruntime's own kernel."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from native_graphs import HQ, attention_model, feeds, reference
from onnx.reference import ReferenceEvaluator

from graphfix.attention.native.decompose import lower_native_nodes, native_forms
from graphfix.errors import UnsupportedModelError


def _run(model: onnx.ModelProto, data: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in data.items() if k in names})


def _lowered(model: onnx.ModelProto) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    (form,) = lower_native_nodes(result)
    assert form.op_type == model.graph.node[0].op_type
    assert not any(n.op_type.endswith("Attention") for n in result.graph.node)
    onnx.checker.check_model(result)
    return result


ONNX_CASES = {
    "plain": {},
    "cross": {"t": 9},
    "scale": {"scale": 0.2},
    "bool mask": {"mask": "bool"},
    "float mask": {"mask": "float"},
    "causal": {"is_causal": 1, "t": 5},
    "causal cross": {"is_causal": 1},
    "causal with bool mask": {"is_causal": 1, "mask": "bool", "t": 5},
    "softcap": {"softcap": 2.0, "mask": "bool"},
    "grouped heads": {"hkv": 2, "mask": "float"},
    "multi-query": {"hkv": 1},
    "3-D": {"rank": 3, "hkv": 2, "q_num_heads": HQ, "kv_num_heads": 2},
    "3-D causal": {"rank": 3, "q_num_heads": HQ, "kv_num_heads": HQ, "is_causal": 1, "t": 5},
    "past cache, causal": {"past": 3, "is_causal": 1, "outputs": 3},
    "qk output mode 0": {"outputs": 4, "softcap": 3.0},
    "qk output mode 1": {"outputs": 4, "softcap": 3.0, "qk_matmul_output_mode": 1},
    "qk output mode 2": {"outputs": 4, "mask": "float", "qk_matmul_output_mode": 2},
    "qk output mode 3": {"outputs": 4, "mask": "bool", "qk_matmul_output_mode": 3},
    "softmax precision": {"softmax_precision": onnx.TensorProto.DOUBLE},
    "opset 24": {"opset": 24, "mask": "bool"},
    "opset 24 external cache": {"opset": 24, "nonpad": True},
    "opset 24 external cache, causal": {"opset": 24, "nonpad": True, "is_causal": 1, "s": 3},
    # batch 1 keeps 4 keys for 5 queries: offset −1, its first query row is empty (zeros)
    "opset 24 causal, an empty row": {"opset": 24, "nonpad": True, "is_causal": 1},
    "bool mask shorter than the keys": {"mask": "bool", "mask_keys": 4},
    "float mask shorter than the keys": {"mask": "float", "mask_keys": 5},
}


# onnxruntime 1.32's kernel refuses a mask shorter than the keys (the spec pads it): onnx's
# reference implementation is the second witness there.
ORT_REFUSES = {"bool mask shorter than the keys", "float mask shorter than the keys"}


@pytest.mark.parametrize("case", list(ONNX_CASES))
def test_onnx_attention_lowering_agrees_with_numpy_and_onnxruntime(case: str) -> None:
    model = attention_model(**ONNX_CASES[case])
    data = feeds(model)
    want = reference(model, data)
    lowered = _run(_lowered(model), data)
    if case in ORT_REFUSES:
        kernel = ReferenceEvaluator(model).run(None, data)
    else:
        kernel = _run(model, data)  # onnxruntime ≥ 1.23 runs Attention-23/24 itself
    assert len(lowered) == len(want) == len(kernel)
    for got, native, expected in zip(lowered, kernel, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(native, expected, rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_give_zeros_as_the_errata_says() -> None:
    model = attention_model(mask="bool")
    data = feeds(model)
    data["mask"][0, 0, 2, :] = False
    (got,) = _run(_lowered(model), data)
    (expected,) = reference(model, data)
    assert np.all(got[0, :, 2] == 0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


TRT_CASES = {
    "TRT_Attention plain": ("TRT_Attention", {}),
    "TRT_Attention upper_left": ("TRT_Attention", {"causal_kind": "upper_left"}),
    "TRT_Attention lower_right": ("TRT_Attention", {"causal_kind": "lower_right"}),
    "TRT_Attention bool mask": ("TRT_Attention", {"mask": "bool"}),
    "TRT_Attention float mask, grouped": ("TRT_Attention", {"mask": "float", "hkv": 2}),
    "TRT_Attention kv_lengths": ("TRT_Attention", {"kv_lengths": True, "TRT_decomposable": 1}),
    "TRT_Attention no normalization": ("TRT_Attention", {"TRT_normalization_op": "none"}),
    "TRT_QuantizedAttention fp8": ("TRT_QuantizedAttention", {"mask": "bool"}),
    "TRT_QuantizedAttention int8 causal": (
        "TRT_QuantizedAttention",
        {"normalization_quantize_to_type": onnx.TensorProto.INT8, "is_causal": 1, "t": 5},
    ),
}


@pytest.mark.parametrize("case", list(TRT_CASES))
def test_tensorrt_custom_op_lowering_agrees_with_numpy(case: str) -> None:
    op_type, kwargs = TRT_CASES[case]
    model = attention_model(op_type, **kwargs)
    data = feeds(model)
    (want,) = reference(model, data)
    (got,) = _run(_lowered(model), data)
    # FP8 rounding of a probability can flip one step between float32 and float64 inputs
    tolerance = 2e-2 if "fp8" in case else 1e-5
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("op_type", "kwargs", "words"),
    [
        ("TRT_Attention", {"query_form": "packed_nhd"}, "packed"),
        ("TRT_Attention", {"mask": "bool", "causal_kind": "upper_left"}, "does not allow"),
        ("TRT_QuantizedAttention", {"kv_form": "packed_nhd"}, "packed"),
        ("Attention", {"rank": 3}, "q_num_heads"),
    ],
)
def test_forms_graphfix_cannot_lower_are_left_alone_with_the_reason(op_type, kwargs, words):
    model = attention_model(op_type, **kwargs)
    (form,) = native_forms(model)
    assert words in form.unsupported
    assert lower_native_nodes(model) == ()
    assert model.graph.node[0].op_type == op_type


def test_kv_cache_update_is_read_and_left_alone() -> None:
    model = attention_model()
    model.graph.node.append(
        onnx.helper.make_node("TRT_KVCacheUpdate", ["k", "v"], ["cache"], domain="trt")
    )
    forms = native_forms(model)
    assert [f.op_type for f in forms] == ["Attention", "TRT_KVCacheUpdate"]
    assert "KV-cache update" in forms[1].unsupported
    (lowered,) = lower_native_nodes(model)
    assert lowered.op_type == "Attention"
    assert [n.op_type for n in model.graph.node][-1] == "TRT_KVCacheUpdate"


def test_lowering_an_unsupported_form_directly_raises() -> None:
    from graphfix.attention.native.lowering import lower
    from graphfix.graph.edit import GraphEdit
    from graphfix.graph.index import GraphIndex

    model = attention_model("TRT_Attention", query_form="packed_nhd")
    index = GraphIndex(model)
    (form,) = native_forms(model)
    with pytest.raises(UnsupportedModelError, match="packed"):
        lower(GraphEdit(model, index), model.graph.node[0], form)


def test_a_mask_of_unknown_type_is_refused_not_guessed() -> None:
    model = attention_model(mask="bool")
    model.graph.node.insert(
        0, onnx.helper.make_node("Opaque", ["mask"], ["opaque_mask"], domain="custom")
    )
    model.graph.node[1].input[3] = "opaque_mask"
    model.opset_import.append(onnx.helper.make_opsetid("custom", 1))
    with pytest.raises(UnsupportedModelError, match="element type of attn_mask"):
        lower_native_nodes(model)
