"""The Q/DQ lint and fixer on real diffusers exports quantized by onnxruntime's quantize_static
(tests/qdq_corpus.py; cached in the corpus dir): timing, coverage, planted violations."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import qdq_corpus
from onnx import helper, numpy_helper
from qdq_graphs import add_pair

from graphfix.qdq import inspect_qdq
from graphfix.qdq.error import ErrorGuard
from graphfix.qdq.fix import fix_qdq

pytestmark = pytest.mark.slow
pytest.importorskip(
    "diffusers", reason="diffusers is not installed (pip install 'graphfix[models]')"
)
pytest.importorskip("torch", reason="torch is not installed")

RESNET = "/unet/down_blocks.1/resnets.0"
PER_TENSOR_CONV = "/unet/mid_block/resnets.0/conv1/Conv"
CONCAT = "/unet/up_blocks.0/Concat"


@pytest.mark.parametrize("name", qdq_corpus.MODELS)
def test_inspect_is_fast_and_covers_every_flop_of_an_ort_quantized_model(name):
    path = qdq_corpus.ort_quantized_path(name)
    wall, cpu = time.perf_counter(), time.process_time()
    report = inspect_qdq(path)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    c = report.coverage
    print(
        f"{name}: {100 * c.fraction:.1f}% of {c.flops_total / 1e6:.1f} MFLOPs, {cpu:.1f}s CPU, {wall:.1f}s wall"
    )
    assert cpu < 10  # CPU time: on a shared machine the wall clock also counts other processes
    assert c.nodes_unknown_flops == 0 and c.flops_total > 0
    # quantize_static with per_channel=True quantizes every Conv/MatMul/Gemm, weights on the
    # right axis: nothing is left in float, but its Q/DQ on every Add and norm input is reported
    assert c.fraction == 1.0
    counts = report.rule_counts()
    assert counts["residual-qdq-on-conv-branch"] > 0 and counts["myelin-split"] > 0
    assert not {"input-not-quantized", "weight-not-quantized", "weight-axis"} & set(counts)


def _planted(clean: onnx.ModelProto) -> onnx.ModelProto:
    """Three violations in an otherwise fixed model: a Q/DQ pair between conv2 and its residual
    Add, per-tensor weights on one conv, and one Concat input requantized with its own scale."""
    m = onnx.ModelProto()
    m.CopyFrom(clean)
    g = m.graph
    conv2 = next(n for n in g.node if n.name == f"{RESNET}/conv2/Conv")
    add_pair(m, conv2.output[0], scale=0.05, consumers=(f"{RESNET}/Add_1",))
    nodes = {n.name: n for n in g.node}  # add_pair rebuilt the node list
    conv = nodes[PER_TENSOR_CONV]
    dq = next(n for n in g.node if n.output[0] == conv.input[1])
    inits = {t.name: t for t in g.initializer}
    q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float32)
    scales = numpy_helper.to_array(inits[dq.input[1]]).reshape(-1, 1, 1, 1)
    w = q * scales
    scale = np.float32(np.abs(w).max() / 127)
    g.initializer.extend(
        [
            numpy_helper.from_array(
                np.clip(np.round(w / scale), -127, 127).astype(np.int8), "pt_w"
            ),
            numpy_helper.from_array(np.array(scale, np.float32), "pt_scale"),
        ]
    )
    g.node.append(
        helper.make_node("DequantizeLinear", ["pt_w", "pt_scale"], ["pt_w_dq"], name="pt_DQ")
    )
    conv.input[1] = "pt_w_dq"
    concat = nodes[CONCAT]
    source = next(n for n in g.node if n.output[0] == concat.input[0])
    assert source.op_type == "DequantizeLinear"
    add_pair(m, concat.input[0], scale=0.37, consumers=(CONCAT,))
    return onnx.shape_inference.infer_shapes(_toposorted(m))


def _toposorted(m: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(m)
    graph.toposort()
    return gs.export_onnx(graph)


def test_planted_violations_are_reported_and_fixed_without_raising_the_error():
    float_path = qdq_corpus.float_path("unet")
    quantized = onnx.load(qdq_corpus.ort_quantized_path("unet"))
    feeds = qdq_corpus.calibration_feeds(float_path, count=1)
    clean = fix_qdq(quantized).model  # unguarded: every exact repair, as the base to plant into
    base = inspect_qdq(clean)
    assert (
        base.count("residual-qdq-on-conv-branch") == 0 and base.count("concat-scale-mismatch") == 0
    )

    planted = _planted(clean)
    report = inspect_qdq(planted)
    found = {(f.rule, f.node) for f in report.findings}
    assert ("residual-qdq-on-conv-branch", f"{RESNET}/Add_1") in found
    assert ("weight-per-tensor", PER_TENSOR_CONV) in found
    assert ("concat-scale-mismatch", CONCAT) in found

    result = fix_qdq(planted, reference=str(float_path), feeds=feeds, max_trials=12)
    after = {(f.rule, f.node) for f in result.report.after.findings}
    assert ("residual-qdq-on-conv-branch", f"{RESNET}/Add_1") not in after
    assert ("concat-scale-mismatch", CONCAT) not in after
    assert ("weight-per-tensor", PER_TENSOR_CONV) in after  # needs the float weights: left, said so
    error = result.report.error
    own = ErrorGuard(quantized, str(float_path), feeds=feeds).bound  # quantize_static's own error
    print(error, "quantizer's own (max, mean):", own)
    assert error.passed  # no worse than the planted model's error against the float model
    assert error.after_max_abs <= own[0] and error.after_mean_abs <= own[1]
