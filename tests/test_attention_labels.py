"""The kind the matcher gives a block, on minimal graphs: only a constant shaped like the scores'
mask decides causality, and keys from a strided conv of the query's own tokens are
`self (reduced keys)`, not `cross`.  (The real exports: tests/test_fusion_corpus.py.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphfix
from graphfix.attention.match_types import AttentionKind

F = onnx.TensorProto.FLOAT


def _attention(
    nodes: list, inits: list, inputs: list, kv: str, bias: str | None
) -> onnx.ModelProto:
    """x [1, 16, 8] → Q from x, K and V from `kv` → one head of attention (+ `bias`)."""
    rng = np.random.default_rng(0)
    inits = [*inits] + [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"W{n}")
        for n in "qkv"
    ]
    nodes = [
        *nodes,
        helper.make_node("MatMul", ["x", "Wq"], ["q"]),
        helper.make_node("MatMul", [kv, "Wk"], ["k"]),
        helper.make_node("MatMul", [kv, "Wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
    ]
    scores = "s"
    if bias is not None:
        nodes.append(helper.make_node("Add", ["s", bias], ["sb"]))
        scores = "sb"
    nodes += [
        helper.make_node("Softmax", [scores], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 16, 8]), *inputs],
        [helper.make_tensor_value_info("y", F, [1, 16, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kind(model: onnx.ModelProto) -> AttentionKind:
    (match,) = graphfix.find_attention(model)
    return match.kind


def test_a_triangular_weight_in_the_bias_slice_is_not_a_causal_mask() -> None:
    """Swin v2's position MLP: bias = MLP(table) with a [2, 16] weight whose top-left corner
    looks lower-triangular; the bias depends on it, but it is not shaped like a mask."""
    weight = np.zeros((2, 16), np.float32)
    weight[0, 0], weight[1, :2] = 1.0, 1.0  # strict upper triangle of the 2×2 corner: blocked
    weight -= 1.0
    table = np.random.default_rng(1).standard_normal((16, 2)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "mlp_w"), numpy_helper.from_array(table, "table")]
    nodes = [helper.make_node("MatMul", ["table", "mlp_w"], ["bias"])]  # [16, 16]
    assert _kind(_attention(nodes, inits, [], "x", "bias")) is AttentionKind.SELF


def test_a_triangular_constant_shaped_like_the_scores_is_causal() -> None:
    causal = np.triu(np.full((16, 16), -1e9, np.float32), 1)[None]
    inits = [numpy_helper.from_array(causal, "causal")]
    assert _kind(_attention([], inits, [], "x", "causal")) is AttentionKind.CAUSAL


def test_keys_from_a_strided_conv_of_the_same_tokens_are_reduced_self_attention() -> None:
    """PVT v2 / SegFormer: x [1, 16, 8] as a 4×4 image, a stride-2 conv, back to 4 tokens."""
    conv = np.random.default_rng(2).standard_normal((8, 8, 2, 2)).astype(np.float32)
    inits = [
        numpy_helper.from_array(conv, "sr_w"),
        numpy_helper.from_array(np.array([1, 4, 4, 8], np.int64), "image"),
        numpy_helper.from_array(np.array([1, 8, 4], np.int64), "tokens"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "image"], ["x_hw"]),
        helper.make_node("Transpose", ["x_hw"], ["x_chw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["x_chw", "sr_w"], ["reduced"], strides=[2, 2]),
        helper.make_node("Reshape", ["reduced", "tokens"], ["r_ct"]),
        helper.make_node("Transpose", ["r_ct"], ["kv"], perm=[0, 2, 1]),
    ]
    assert _kind(_attention(nodes, inits, [], "kv", None)) is AttentionKind.SELF_REDUCED_KEYS


def test_keys_from_another_input_are_cross_attention() -> None:
    memory = helper.make_tensor_value_info("memory", F, [1, 4, 8])
    assert _kind(_attention([], [], [memory], "memory", None)) is AttentionKind.CROSS


def test_keys_through_their_own_reshape_and_qdq_pair_are_still_self_attention() -> None:
    """A quantized export gives each projection its own Reshape and Q/DQ pair of the one input
    (onnxruntime's quant_pre_process turns MatMul + Add into Reshape → Gemm → Reshape)."""
    inits = [
        numpy_helper.from_array(np.array([1, 16, 8], np.int64), "same"),
        numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "same"], ["x_k"]),
        helper.make_node("QuantizeLinear", ["x_k", "scale"], ["x_kq"]),
        helper.make_node("DequantizeLinear", ["x_kq", "scale"], ["x_kd"]),
    ]
    assert _kind(_attention(nodes, inits, [], "x_kd", None)) is AttentionKind.SELF


@pytest.mark.parametrize("name", ["clip_vision_eager-legacy17", "whisper_eager-legacy17"])
def test_quantized_exports_keep_their_labels(name, tmp_path, corpus_dir) -> None:
    """transformers' CLIP vision tower and Whisper (model_corpus) through onnxruntime's
    documented flow, quant_pre_process then quantize_static (QDQ): the blocks keep the kinds of
    the float export (self-attention was labelled cross)."""
    import model_corpus
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    entry = next(e for e in model_corpus.CORPUS if e.name == name)
    source = model_corpus.model_path(entry, cache_dir=corpus_dir)
    model = onnx.load(str(source))
    feeds = iter([model_corpus.random_feed(model, np.random.default_rng(i)) for i in range(2)])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict | None:
            return next(feeds, None)

    pre, quantized = tmp_path / "pre.onnx", tmp_path / "q.onnx"
    quant_pre_process(str(source), str(pre))
    quantize_static(str(pre), str(quantized), Reader(), quant_format=QuantFormat.QDQ)
    kinds = sorted(m.kind.value for m in graphfix.find_attention(onnx.load(str(quantized))))
    assert kinds == sorted(m.kind.value for m in graphfix.find_attention(model))
