"""The match as one bound description: every step holds the graph's own nodes, Q·Kᵀ and P·V are
named, the summaries are derived from the steps, a fallback is typed, and nothing outside
graphfix/attention/ re-finds chain nodes by position."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import matcher_corpus
import numpy as np
import onnx
import pytest
from graphs import Variant, attention_model
from test_matcher import _insert_after, _int64, _with_sink_concat
from test_subgraphs import _in_if_branch

import graphfix
from graphfix.attention.match_types import (
    AttentionMatch,
    NanGuardStep,
    QdqSite,
    QdqStep,
    ReshapeStep,
    ShiftStep,
    SinkStep,
    SoftcapStep,
)
from graphfix.attention.strategies.base import FallbackKind
from graphfix.graph.index import BoundNode
from graphfix.selectors import select_nodes

PACKAGE = Path(graphfix.__file__).parent


def _bound(match: AttentionMatch) -> list[BoundNode]:
    steps = (*match.steps, *match.after, *((match.sink,) if match.sink else ()))
    nodes = [match.qk, match.softmax_node, match.pv, *(n for s in steps for n in s.nodes)]
    nodes += [s.is_nan for s in match.after if isinstance(s, NanGuardStep)]
    nodes += [s.reduce_max for s in match.steps if isinstance(s, ShiftStep)]
    nodes += [n for s in match.operands_quantized for n in s.nodes]
    return nodes


def _assert_bound_to(model: onnx.ModelProto, match: AttentionMatch) -> None:
    """Every node the match names is the graph's own NodeProto, at its position, by its name."""
    graph = model.graph
    for bound in _bound(match):
        assert bound.node is graph.node[bound.position], bound
        assert bound.name == (bound.node.name or f"<{bound.op_type} #{bound.position}>")
    assert match.qk.op_type in ("MatMul", "Einsum") and match.pv.op_type in ("MatMul", "Einsum")
    assert match.softmax_node.op_type == "Softmax"
    # the path is one chain: each node reads what the one before it wrote, P·V reads V too
    for before, after in zip(match.path, match.path[1:], strict=False):
        assert before.node.output[0] in after.node.input, (before, after)
    assert match.pv.node.input[1] == match.v
    assert match.path[0] == match.qk and match.path[-1] == match.pv
    assert list(match.chain_positions) == sorted(match.chain_positions)


def _scores_quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array(0.05, np.float32), "s_scale"),
            onnx.numpy_helper.from_array(np.array(0, np.int8), "s_zero"),
        ]
    )
    _insert_after(model, "scaled", "QuantizeLinear", ["s_scale", "s_zero"], "q_scores")
    return _insert_after(
        model, "q_scores_out", "DequantizeLinear", ["s_scale", "s_zero"], "dq_scores"
    )


def _max_shift(model: onnx.ModelProto) -> onnx.ModelProto:
    _insert_after(model, "scaled", "Sub", ["row_max"], "shift")
    position = next(i for i, n in enumerate(model.graph.node) if n.name == "shift")
    reduce = onnx.helper.make_node(
        "ReduceMax", ["scaled"], ["row_max"], name="row_max_node", axes=[-1], keepdims=1
    )
    model.graph.node.insert(position, reduce)
    return model


def _probs_reshaped(model: onnx.ModelProto) -> onnx.ModelProto:
    _int64(model, "probs_shape", [0, 0, 0, -1])
    return _insert_after(model, "probs", "Reshape", ["probs_shape"], "probs_view")


def test_every_step_holds_the_graphs_own_nodes():
    model = attention_model(Variant(scale="sqrt_qk", mask="where", softcap=None, nan_guard=True))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    (guard,) = [s for s in match.after if isinstance(s, NanGuardStep)]
    assert (guard.node.name, guard.is_nan.name) == ("nan_guard", "isnan")
    assert match.nan_guard is guard and guard.is_nan not in match.path  # beside the path
    names = [n.name for n in match.path]
    assert names == ["qk", "mask_where", "softmax", "nan_guard", "pv"]


def test_a_softcap_binds_its_three_nodes():
    model = attention_model(Variant(scale="mul_after", softcap=30.0))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    (cap,) = [s for s in match.steps if isinstance(s, SoftcapStep)]
    assert [n.name for n in cap.nodes] == ["cap_div", "cap_tanh", "cap_mul"]
    assert match.softcap == pytest.approx(30.0)


def test_a_max_shift_binds_its_reduce_max():
    model = _max_shift(attention_model(Variant()))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    (shift,) = [s for s in match.steps if isinstance(s, ShiftStep)]
    assert (shift.node.name, shift.reduce_max.name) == ("shift", "row_max_node")
    assert shift.reduce_max not in match.path
    fixed = graphfix.fix_attention(model, strategy="fused_plugin")
    assert fixed.report.blocks[0].fallback is None
    assert "row_max_node" not in {n.name for n in fixed.model.graph.node}  # removed with it


@pytest.mark.parametrize("einsum", [False, True], ids=["matmul", "einsum"])
def test_qk_and_pv_are_named_on_both_layouts(einsum):
    model = attention_model(Variant(einsum=einsum, mask="add"))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    assert (match.qk.name, match.pv.name) == ("qk", "pv")
    assert {match.qk.op_type, match.pv.op_type} == {"Einsum" if einsum else "MatMul"}


def test_qk_and_pv_with_a_sink_bind_concat_and_slice():
    model = _with_sink_concat(attention_model(Variant()))
    for name, value in (("starts", [0]), ("ends", [5]), ("axes", [-1])):
        _int64(model, name, value)
    _insert_after(model, "probs", "Slice", ["starts", "ends", "axes"], "drop_sink")
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    assert isinstance(match.sink, SinkStep)
    assert match.sink.concat.op_type == "Concat" and match.sink.slice.op_type == "Slice"
    assert match.sink.scores_input == "scaled"
    assert [n.name for n in match.path] == [
        "qk",
        "scale_div",
        "with_sink",
        "softmax",
        "drop_sink",
        "pv",
    ]


def test_quantized_scores_bind_the_pair_and_fall_back_typed():
    model = _scores_quantized(attention_model(Variant()))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    (pair,) = match.quantized
    assert pair.site is QdqSite.SCORES and pair in match.steps
    assert (pair.quantize.name, pair.dequantize.name) == ("q_scores", "dq_scores")
    result = graphfix.fix_attention(model, strategy="fused_plugin")
    (block,) = result.report.blocks
    assert block.rewritten and block.fallback.kind is FallbackKind.QUANTIZED
    assert "q_scores → dq_scores" in block.fallback.reason
    assert result.report.to_dict()["blocks"][0]["fallback"] == {
        "kind": "quantized",
        "reason": block.fallback.reason,
    }
    assert "(quantized)" in result.report.summary()


def test_a_reshape_after_the_softmax_is_bound():
    model = _probs_reshaped(attention_model(Variant()))
    (match,) = graphfix.find_attention(model)
    _assert_bound_to(model, match)
    (view,) = match.after
    assert isinstance(view, ReshapeStep) and view.node.name == "probs_view"
    assert [n.name for n in match.path] == ["qk", "scale_div", "softmax", "probs_view", "pv"]


def test_a_block_done_as_meant_has_no_fallback():
    model = attention_model(Variant(mask="add"))
    for strategy in ("fused_plugin", "plugin"):
        (block,) = graphfix.fix_attention(model, strategy=strategy).report.blocks
        assert block.rewritten and block.fallback is None, block.detail
        assert "fell back" not in block.detail


def test_inspect_json_keeps_the_summaries_by_name():
    model = attention_model(Variant(scale="sqrt_qk", mask="add", nan_guard=True))
    (match,) = graphfix.find_attention(model)
    data = match.to_dict()
    assert data["qk_matmul"] == "qk" and data["pv_matmul"] == "pv" and data["softmax"] == "softmax"
    assert data["chain_nodes"] == [n.name for n in match.path]
    assert data["chain_positions"] == [n.position for n in match.path]
    assert data["mask_nodes"] == ["mask_add"] and data["nan_guard"] == "nan_guard"
    assert data["scale"]["form"] == "sqrt_qk" and data["k_transposed_by"] == "transpose"
    assert data["steps"][0]["node"] == match.steps[0].node.name  # a bound node as its name


@pytest.mark.parametrize(
    "case",
    [
        "swin-dynamo18",
        "einsum_letters-legacy17",
        "gpt_oss_eager-dynamo18",
        "padding_min_fill_and_causal_bias-dynamo18",
        "sdpa_mask-dynamo18/ort_qdq",
    ],
)
def test_real_exports_are_bound_to_their_own_nodes(case, corpus_dir):
    if case.endswith("/ort_qdq"):
        path = matcher_corpus.quantized_path(case.split("/")[0], cache_dir=corpus_dir)
    else:
        entry = next(e for e in matcher_corpus.ENTRIES if e.name == case)
        path = matcher_corpus.model_path(entry, cache_dir=corpus_dir)
    model = onnx.load(str(path), load_external_data=False)
    matches = graphfix.find_attention(model)
    assert matches
    for match in matches:
        _assert_bound_to(model, match)
    if case.startswith("swin"):
        assert any(isinstance(s, ReshapeStep) for m in matches for s in m.steps)
    if case.startswith("gpt_oss"):
        assert all(m.sink is not None for m in matches)
    if case.endswith("ort_qdq"):
        sites = {q.site for m in matches for q in m.quantized}
        assert {QdqSite.Q, QdqSite.K, QdqSite.SCORES} <= sites
        assert all(isinstance(q, QdqStep) for m in matches for q in m.quantized)


def test_a_block_in_an_if_body_is_bound_to_the_body_and_picks_no_main_graph_node():
    """Positions are the body's: the same position in the main graph is another node, so a
    selector picks the body's block by index only, and the main Softmax picks only its own."""
    model = _in_if_branch(main_attention=True)
    main, inside = graphfix.find_attention(model)
    branch = next(n for n in model.graph.node if n.op_type == "If")
    body = next(a.g for a in branch.attribute if a.name == "then_branch")
    assert inside.location and inside.softmax_node.position == main.softmax_node.position
    for bound in (inside.qk, inside.softmax_node, inside.pv):
        assert bound.node == body.node[bound.position] and bound.name == bound.node.name
    picked = select_nodes(model, ["1"], blocks=(main, inside))
    assert (picked.positions, picked.blocks) == ((), (1,))
    assert select_nodes(model, ["op:Softmax"], blocks=(main, inside)).blocks == (0,)


# --- the package reads the match, never positions ---------------------------------------------
_POSITIONAL = re.compile(r"\.(chain_positions|chain_nodes|softmax_position)\b")


def test_no_consumer_outside_attention_reads_chain_positions():
    """Outside graphfix/attention/, chain nodes come from the match's bound nodes (`path`,
    `qk`, `pv`, the steps), never from `chain_positions`/`chain_nodes` (kept for the JSON) or
    a Softmax position; inside it, nothing indexes `chain_positions`."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        inside = relative.startswith("attention/")
        for number, line in enumerate(text.splitlines(), 1):
            if (not inside and _POSITIONAL.search(line)) or "chain_positions[" in line:
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, offenders


def _imports(path: Path) -> set[str]:
    """graphfix modules `path` imports, at the top or inside a function."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + [node.module])
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("graphfix")}


def test_selectors_do_not_import_attention():
    assert not any(n.startswith("graphfix.attention") for n in _imports(PACKAGE / "selectors.py"))


def test_nothing_attention_imports_imports_attention_back():
    """No module that graphfix/attention/ imports (directly or through others, at the top or
    in a function) imports graphfix/attention/ back: the package sits above what it uses."""
    files = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    edges = {m: {n for n in _imports(p) if n in files and n != m} for m, p in files.items()}

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            m = stack.pop()
            if m not in seen:
                seen.add(m)
                stack.extend(edges[m])
        return seen

    def in_attention(module: str) -> bool:
        return module.startswith("graphfix.attention")

    below = {m for a in files if in_attention(a) for m in reachable(a) if not in_attention(m)}
    back = sorted(
        f"{m} -> {n}" for m in below if m != "graphfix" for n in edges[m] if in_attention(n)
    )
    assert not back, back
