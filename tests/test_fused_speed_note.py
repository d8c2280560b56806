"""The speed note fused_plugin prints: what is measured for that block's element type and head dim
(graphfix/attention/strategies/fused/speed.py), on minimal graphs and on exported models."""

from __future__ import annotations

from pathlib import Path

import model_corpus
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_fused_sink import D as SINK_D
from test_fused_sink import Sink, sink_model

import graphfix
from graphfix.attention.strategies.fused.speed import SPEEDS, speed_note

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _chain(d: int, dv: int, *, dtype: int = F32, softcap: float = 0.0, einsum: bool = False):
    """softmax(softcap(Q·Kᵀ / √d))·V on [1, 2, 8, d] inputs, as MatMuls or Einsums."""
    inits = [helper.make_tensor("scale", dtype, [], [1.0 / np.sqrt(d)])]
    if einsum:
        nodes = [helper.make_node("Einsum", ["q", "k"], ["s0"], "qk", equation="bhqd,bhkd->bhqk")]
    else:
        nodes = [
            helper.make_node("Transpose", ["k"], ["kt"], "k_t", perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s0"], "qk"),
        ]
    nodes.append(helper.make_node("Mul", ["s0", "scale"], ["s1"], "scale_mul"))
    scores = "s1"
    if softcap:
        inits.append(helper.make_tensor("cap", dtype, [], [softcap]))
        nodes += [
            helper.make_node("Div", ["s1", "cap"], ["s2"], "cap_div"),
            helper.make_node("Tanh", ["s2"], ["s3"], "cap_tanh"),
            helper.make_node("Mul", ["s3", "cap"], ["s4"], "cap_mul"),
        ]
        scores = "s4"
    nodes.append(helper.make_node("Softmax", [scores], ["p"], "softmax", axis=-1))
    if einsum:
        nodes.append(
            helper.make_node("Einsum", ["p", "v"], ["y"], "pv", equation="bhqk,bhkd->bhqd")
        )
    else:
        nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"], "pv"))
    inputs = [
        helper.make_tensor_value_info("q", dtype, [1, 2, 8, d]),
        helper.make_tensor_value_info("k", dtype, [1, 2, 8, d]),
        helper.make_tensor_value_info("v", dtype, [1, 2, 8, dv]),
    ]
    output = helper.make_tensor_value_info("y", dtype, [1, 2, 8, dv])
    graph = helper.make_graph(nodes, "chain", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _detail(model: onnx.ModelProto) -> str:
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.rewritten and not block.detail.startswith("fell back"), block.detail
    return block.detail


def _row(float32: bool, widest: int):
    return next(s for s in SPEEDS if s.float32 == float32 and widest <= s.widest)


@pytest.mark.parametrize("d", [64, 72, 128, 160, 256])
def test_float32_note_gives_the_measured_ratio_of_its_head_dims_kernel(d: int) -> None:
    detail = _detail(_chain(d, d))
    row = _row(True, d)
    assert f"float32 at head dim {d} runs on graphfix's {row.kernel}" in detail
    assert f"{row.low:.2f}" in detail and "the unfused chain's time on an H200" in detail
    assert "slower" not in detail


def test_dv_wider_than_d_picks_the_kernel_of_the_wider() -> None:
    detail = _detail(_chain(64, 128))
    assert f"head dim 128 runs on graphfix's {_row(True, 128).kernel}" in detail


@pytest.mark.parametrize("d", [320, 62])
def test_a_head_dim_no_fast_kernel_takes_is_said_to_be_slower(d: int) -> None:
    detail = _detail(_chain(d, d))
    assert f"at head dim {d} runs on graphfix's fallback kernel, slower than the unfused" in detail


def test_16_bit_softcap_note_and_no_note_where_cudnn_runs() -> None:
    capped = _detail(_chain(256, 256, dtype=F16, softcap=30.0))
    assert f"softcap at head dim 256 runs on graphfix's {_row(False, 256).kernel}" in capped
    assert "note:" not in _detail(_chain(256, 256, dtype=F16))


def test_einsum_head_dim_is_read_from_the_contracted_axis() -> None:
    detail = _detail(_chain(96, 96, einsum=True))
    assert "float32 at head dim 96 runs on" in detail


def test_unknown_head_dim_says_so() -> None:
    note = speed_note(F32, None, 64, softcap=False)
    assert "unknown here" in note
    assert speed_note(F16, 64, 64, softcap=False) == ""


@pytest.mark.parametrize("name", ["sdpa-dynamo18", "eager_einsum-legacy17", "sdpa_fp16-dynamo18"])
def test_exported_models_get_the_note_of_their_head_dim(name: str, corpus_dir: Path) -> None:
    entry = next(e for e in model_corpus.CORPUS if e.name == name)
    model = onnx.load(str(model_corpus.model_path(entry, cache_dir=corpus_dir)))
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    details = [b.detail for b in result.report.blocks]
    assert details
    for detail in details:
        if "fp16" in name:  # no softcap: cuDNN runs it where it loads, no note
            assert "note:" not in detail
        else:
            assert f"float32 at head dim {model_corpus.HEAD_DIM} runs on graphfix's" in detail


def test_a_sink_key_widens_the_head_dim_by_its_8_columns() -> None:
    """GPT-OSS's sink rides in 8 extra head-dim columns of Q and K (fused/sink.py): the kernel
    sees D + 8, and the note names that width."""
    detail = _detail(sink_model(Sink()))
    assert f"float32 at head dim {SINK_D + 8} runs on" in detail
