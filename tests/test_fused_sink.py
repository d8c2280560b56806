"""fused_plugin with attention sinks (GPT-OSS's Concat(scores, sink) → Softmax → Slice) on
minimal graphs: the sink becomes one more key of the GraphfixAttention node (fused/sink.py),
and the rewrite computes what the original did (the node's reference ops in onnxruntime).
The real GPT-OSS export is in tests/test_matcher_corpus.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matcher_corpus
import model_corpus
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import test_real_models as real_models
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.sink import PAD
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import ATTENTION, SOFTMAX

B, H, S, D = 2, 4, 6, 16
F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
SCALE = 0.3  # not a power of two: sink / scale is not exact in Q's type


@dataclass(frozen=True)
class Sink:
    dtype: int = F32
    mask: str | None = None  # None | add | where | causal
    sink: str = "const"  # const ([B,H,S,1] initializer) | expand (per-head logits, run time)
    sink_first: bool = False  # Concat(sink, scores), Slice off column 0
    scale_on_q: bool = False  # Mul(Q, scale) before the product instead of on the scores
    k_given_transposed: bool = False  # Kᵀ [B,H,D,T] is the graph input (k_transposed = 1)
    multi_query: bool = False  # Einsum bhid,bjd->bhij: one K/V head for all query heads
    float32_scores: bool = False  # Q, K, V in dtype; scores Cast to float32 before the sink
    softcap_before: float | None = None  # Div → Tanh → Mul before the Concat
    softcap_after: float | None = None  # Div → Tanh → Mul on the concatenated row
    mul_after_concat: bool = False  # a scale on the concatenated row (applies to the sink)
    reduce_axis: int = -1  # ReduceMax axis of the max shift
    sink_scale: float = 2.0  # spread of the per-head sink logits
    opset: int = 18


def sink_model(c: Sink, *, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(c.dtype)
    score_type = F32 if c.float32_scores else c.dtype
    score_np = helper.tensor_dtype_to_np_dtype(score_type)
    nodes, inits = [], []
    kv_heads = 1 if c.multi_query else H

    def node(op, ins, name, **kw):
        nodes.append(helper.make_node(op, ins, [name], name=f"{name}_node", **kw))
        return name

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    kv_shape = [B, S, D] if c.multi_query else [B, H, S, D]
    io = F32 if c.dtype == BF16 else c.dtype  # onnxruntime takes no bfloat16 feeds: Cast in
    inputs = [
        helper.make_tensor_value_info("q", io, [B, H, S, D]),
        helper.make_tensor_value_info("k", io, [B, H, D, S] if c.k_given_transposed else kv_shape),
        helper.make_tensor_value_info("v", io, kv_shape),
    ]
    name = {n: n if io == c.dtype else node("Cast", [n], f"{n}_typed", to=c.dtype) for n in "qkv"}
    q = name["q"]
    if c.scale_on_q:
        q = node("Mul", [q, init("scale", np.array(SCALE, np_dtype))], "q_scaled")
    if c.multi_query:
        scores = node("Einsum", [q, name["k"]], "scores", equation="bhid,bjd->bhij")
    else:
        k_t = name["k"]
        if not c.k_given_transposed:
            k_t = node("Transpose", [k_t], "k_t", perm=[0, 1, 3, 2])
        scores = node("MatMul", [q, k_t], "scores")
    if not c.scale_on_q:
        scores = node("Mul", [scores, init("scale", np.array(SCALE, np_dtype))], "scaled")
    if c.softcap_before:
        cap = init("cap", np.array(c.softcap_before, np_dtype))
        scores = node(
            "Mul", [node("Tanh", [node("Div", [scores, cap], "capped")], "tanh"), cap], "soft"
        )
    if c.mask == "add":
        inputs.append(helper.make_tensor_value_info("mask", io, [B, 1, S, S]))
        mask = "mask" if io == c.dtype else node("Cast", ["mask"], "mask_typed", to=c.dtype)
        scores = node("Add", [scores, mask], "masked")
    elif c.mask == "where":
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [B, 1, S, S]))
        fill = init("fill", np.array(-np.inf, np_dtype))
        scores = node("Where", ["keep", scores, fill], "masked")
    elif c.mask == "causal":
        future = np.triu(np.ones((S, S), bool), 1)
        causal = init("causal", np.where(future, -np.inf, 0).astype(np_dtype)[None, None])
        scores = node("Add", [scores, causal], "masked")
    if c.float32_scores:
        scores = node("Cast", [scores], "scores_f32", to=F32)
    logits = (rng.standard_normal(H) * c.sink_scale).astype(np.float32)
    if c.sink == "const":
        sink = init(
            "sink", np.broadcast_to(logits[None, :, None, None], (B, H, S, 1)).astype(score_np)
        )
    else:
        per_head = init("sinks", logits.reshape(1, H, 1, 1).astype(score_np))
        prefix = node(
            "Slice",
            [
                node("Shape", ["q"], "q_shape"),
                init("zero", np.array([0])),
                init("three", np.array([3])),
            ],
            "prefix",
        )
        shape = node("Concat", [prefix, init("one", np.array([1]))], "sink_shape", axis=0)
        sink = node("Expand", [per_head, shape], "sink")
    pair = [sink, scores] if c.sink_first else [scores, sink]
    row = node("Concat", pair, "with_sink", axis=-1)
    if c.softcap_after:
        cap = init("cap", np.array(c.softcap_after, score_np))
        row = node("Mul", [node("Tanh", [node("Div", [row, cap], "capped")], "tanh"), cap], "soft")
    if c.mul_after_concat:
        row = node("Mul", [row, init("half", np.array(0.5, score_np))], "row_scaled")
    if c.opset >= 18:
        peak = node("ReduceMax", [row, init("axis", np.array([c.reduce_axis]))], "peak", keepdims=1)
    else:
        peak = node("ReduceMax", [row], "peak", axes=[c.reduce_axis], keepdims=1)
    probs = node("Softmax", [node("Sub", [row, peak], "shifted")], "probs", axis=-1)
    start, end = (1, S + 1) if c.sink_first else (0, S)
    probs = node(
        "Slice",
        [
            probs,
            init("start", np.array([start])),
            init("end", np.array([end])),
            init("last", np.array([-1])),
        ],
        "dropped",
    )
    if c.float32_scores:
        probs = node("Cast", [probs], "probs_back", to=c.dtype)
    if c.multi_query:
        out = node("Einsum", [probs, name["v"]], "pv", equation="bhij,bjd->bhid")
    else:
        out = node("MatMul", [probs, name["v"]], "pv")
    node(
        "Identity" if io == c.dtype else "Cast",
        [out],
        "out",
        **({} if io == c.dtype else {"to": io}),
    )
    out = helper.make_tensor_value_info("out", io, [B, H, S, D])
    graph = helper.make_graph(nodes, "sink", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 9
    assert kv_heads in (1, H)
    return model


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        elem = value.type.tensor_type.elem_type
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if elem == TensorProto.BOOL:
            keep = rng.random(shape) > 0.3
            keep[0, 0, 1] = False  # a row with every real key blocked: the sink takes it all
            feeds[value.name] = keep
        elif value.name == "mask":
            mask = np.where(rng.random(shape) > 0.3, 0.0, -np.inf)
            mask[0, 0, 1] = -np.inf
            feeds[value.name] = mask.astype(helper.tensor_dtype_to_np_dtype(elem))
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(
                helper.tensor_dtype_to_np_dtype(elem)
            )
    return feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options)
    return session.run(None, feeds)[0]


def _fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.NodeProto, str]:
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.rewritten and block.fallback is None, block.detail
    (node,) = [n for n in result.model.graph.node if n.op_type == ATTENTION.op_type]
    onnx.checker.check_model(result.model)
    return result.model, node, block.detail


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


TOLERANCE = {F32: 1e-5, F16: 2e-3}


@pytest.mark.parametrize(
    "case",
    [
        Sink(),
        Sink(mask="add"),
        Sink(mask="where"),
        Sink(mask="causal"),
        Sink(sink="expand", mask="add"),
        Sink(sink_first=True, mask="where"),
        Sink(scale_on_q=True),
        Sink(k_given_transposed=True, mask="add"),
        Sink(multi_query=True, mask="add"),
        Sink(opset=17, mask="add"),
        Sink(dtype=F16, mask="add"),
        Sink(softcap_after=2.0, sink_scale=4.0),
        Sink(softcap_before=5.0, mask="causal", sink_scale=1.0),
        Sink(softcap_before=5.0, sink="expand", sink_scale=1.0),
        Sink(dtype=F16, float32_scores=True, sink_scale=40.0),
    ],
    ids=lambda c: (
        "-".join(f"{k}={v}" for k, v in c.__dict__.items() if v != getattr(Sink(), k)) or "plain"
    ),
)
def test_a_sink_fuses_and_computes_what_the_original_did(case: Sink) -> None:
    model = sink_model(case)
    fixed, node, detail = _fused(model)
    assert "attention sink as one more key" in detail and "copied per layer" in detail
    attrs = _attrs(node)
    assert attrs["causal"] == 0  # top-left aligned, S == T only: the causal mask stays a mask
    # a constant scale on Q is folded in too; float16 graphs hold it in float16
    assert attrs["scale"] == pytest.approx(SCALE, rel=1e-3)
    assert len(node.input) == (3 if case.mask is None else 4)
    ops = [n.op_type for n in fixed.graph.node]
    assert "Softmax" not in ops and "ReduceMax" not in ops and SOFTMAX.op_type not in ops
    feeds = _feeds(model)
    want = _run(model, feeds)
    got = _run(graphfix.with_reference_ops(fixed), feeds)
    assert np.isfinite(want).all()
    tol = TOLERANCE[case.dtype]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=tol, rtol=tol)


def test_the_node_inputs_grow_by_eight_columns_and_one_key() -> None:
    model = sink_model(Sink(multi_query=True, mask="add"))
    fixed, node, _ = _fused(model)
    index = GraphIndex(fixed)
    q, k, v, mask = (index.shape(n) for n in node.input)
    assert q == (B, H, S, D + PAD)
    # one key/value head for all query heads (Hkv = 1); S + 1 keys (the row count of the
    # Expand-ed sink key is known at run time only)
    assert (k[:2], k[3]) == ((B, 1), D + PAD)
    assert v == (B, 1, S + 1, D)
    assert mask == (B, 1, S, S + 1)


@pytest.mark.parametrize(("dtype", "terms"), [(F32, 1), (F16, 2), (BF16, 3)])
def test_the_sink_key_scores_the_float32_sink_logit(dtype: int, terms: int) -> None:
    """scale · q'·k'_sink, accumulated in float32 as the kernels do, gives the float32 sink
    logit to float32 precision: the split sink / scale in 1, 2 or 3 terms of Q's type.  One
    term alone would be off by float16's/bfloat16's rounding (the control)."""
    model = sink_model(Sink(dtype=dtype, float32_scores=dtype != F32, sink_scale=6.0))
    fixed, node, _ = _fused(model)
    fixed = graphfix.with_reference_ops(fixed)
    for i, tensor in enumerate(node.input[:2]):
        fixed.graph.node.append(helper.make_node("Cast", [tensor], [f"probe{i}"], to=F32))
        fixed.graph.output.append(helper.make_tensor_value_info(f"probe{i}", F32, None))
    session = ort.InferenceSession(_copies_through_float32(fixed).SerializeToString())
    feeds = _feeds(model)
    _, q, k = session.run(None, feeds)
    assert q.shape == (B, H, S, D + PAD) and k.shape == (B, H, S + 1, D + PAD)
    assert not q[..., D + terms :].any() and not k[:, :, :S, D:].any()
    sink = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "sink")
    key = k[:, :, -1, :]  # [0 … 0, 1 … 1, 0 …]
    assert (key[..., D : D + terms] == 1).all() and not np.delete(
        key, np.s_[D : D + terms], -1
    ).any()
    scale = np.float32(_attrs(node)["scale"])  # the graph's scale constant, in Q's type
    score = scale * np.einsum("bhsd,bhd->bhs", q, key, dtype=np.float32)
    np.testing.assert_allclose(score, sink[..., 0], rtol=3e-7, atol=0)
    if terms > 1:
        first = scale * q[..., D]
        assert np.abs(first - sink[..., 0]).max() > 1e-4


def _bf16_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The original's math in float64 (onnxruntime has no bfloat16 MatMul on CPU)."""
    sinks = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "sink")
    q, k, v = (np.asarray(feeds[n], np.float64) for n in "qkv")
    scores = q @ k.swapaxes(-1, -2) * SCALE + feeds["mask"].astype(np.float64)
    row = np.concatenate([scores, sinks.astype(np.float64)], axis=-1)
    p = np.exp(row - row.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p[..., :-1] @ v


def _copies_through_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's CPU Pad and Expand have no bfloat16: run them in float32 (exact copies)."""
    index = GraphIndex(model)
    nodes = []
    for node in model.graph.node:
        if node.op_type in ("Pad", "Expand") and index.elem_type(node.input[0]) == BF16:
            data = [0, 2] if node.op_type == "Pad" else [0]
            inputs = list(node.input)
            for i in data:
                inputs[i] = f"{node.output[0]}/in{i}_f32"
                nodes.append(helper.make_node("Cast", [node.input[i]], [inputs[i]], to=F32))
            wide = f"{node.output[0]}/f32"
            nodes.append(helper.make_node(node.op_type, inputs, [wide]))
            nodes.append(helper.make_node("Cast", [wide], [node.output[0]], to=BF16))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_bfloat16_sink_in_three_terms() -> None:
    """Sink logits of size ~40 over the scale 1/4 (~160): bfloat16 holds 160 to 1/2 only (a
    sink logit off by 1/8); three terms carry it to float32's precision."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    model = sink_model(Sink(dtype=BF16, mask="add", sink_scale=40.0))
    fixed, _, _ = _fused(model)
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in _feeds(model).items()}
    got = _run(_copies_through_float32(graphfix.with_reference_ops(fixed)), rounded)
    want = _bf16_reference(model, rounded)
    np.testing.assert_allclose(got.astype(np.float32), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("case", "kind", "words"),
    [
        (Sink(softcap_before=1.0, sink_scale=4.0), FallbackKind.SINK, "within 10% of the softcap"),
        (Sink(mul_after_concat=True), FallbackKind.SINK, "would apply to the sink logit as well"),
        (Sink(reduce_axis=1), FallbackKind.SHIFT, "not the row max over the key axis"),
        (Sink(sink_scale=np.inf), FallbackKind.SINK, "not finite"),
    ],
    ids=[
        "sink_near_the_cap",
        "scale_after_concat",
        "max_over_heads",
        "infinite_sink",
    ],
)
def test_not_exact_falls_back_with_the_reason(case: Sink, kind: FallbackKind, words: str) -> None:
    model = sink_model(case)
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.rewritten and block.fallback is not None, block.detail
    assert block.fallback.kind is kind and words in block.fallback.reason, block.fallback
    assert block.detail.startswith(
        f"fell back to Softmax → GraphfixSoftmax (axis -1) ({kind.value})"
    )
    assert not [n for n in result.model.graph.node if n.op_type == ATTENTION.op_type]


def _half(factory):
    def make():
        exportable = factory()
        return model_corpus.Exportable(
            exportable.module.half(), exportable.args, exportable.input_names
        )

    return make


@pytest.mark.slow
def test_gpt_oss_float16_export_fuses_and_computes_what_it_did(corpus_dir) -> None:
    """tests/matcher_corpus.py's GPT-OSS in float16 (cached next to it, keyed by that file):
    both sink blocks fuse and the rewrite agrees with the original to float16's tolerance.
    (In bfloat16 both fuse too, but onnxruntime's CPU provider runs neither graph.)"""
    entry = next(e for e in matcher_corpus.ENTRIES if e.name == "gpt_oss_eager-dynamo18")
    missing = model_corpus.missing_exporters(entry)
    if missing:
        pytest.skip(f"exporting GPT-OSS needs {' and '.join(missing)}")
    half = dataclasses.replace(entry, model="gpt_oss_eager_fp16", factory=_half(entry.factory))
    original = onnx.load(str(matcher_corpus.model_path(half, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(original, strategy="fused_plugin")
    assert [m.dtype for m in graphfix.find_attention(original)] == ["float16", "float16"]
    assert len(result.report.blocks) == 2
    for block in result.report.blocks:
        assert "attention sink as one more key" in block.detail, block.detail
    feed = model_corpus.random_feed(original, np.random.default_rng(real_models.SEED))
    want = real_models._run(original, feed)
    got = real_models._run(graphfix.with_reference_ops(result.model), feed)
    for a, b in zip(got, want, strict=True):
        atol, rtol = real_models.TOLERANCE[np.float16]
        np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)
