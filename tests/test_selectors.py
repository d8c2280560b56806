"""Selectors: every form on a minimal attention graph, positive and negative; what graphfix
prints for an unnamed node selects it back."""

from __future__ import annotations

import onnx
import pytest
from graphs import Variant, attention_model

import graphfix
from graphfix.errors import SelectionError
from graphfix.graph.index import node_label
from graphfix.selectors import (
    Selector,
    SelectorKind,
    parse_selector,
    parse_selectors,
    select_nodes,
)


@pytest.fixture(scope="module")
def model():
    return attention_model(Variant(scale="div_after"))


@pytest.fixture(scope="module")
def blocks(model):
    return graphfix.find_attention(model)


def test_forms_parse_to_their_kind():
    assert parse_selector("3").kind is SelectorKind.BLOCK
    assert parse_selector("attention:3").value == 3
    assert parse_selector("op:Softmax").value == "Softmax"
    assert parse_selector("name:3").kind is SelectorKind.NAME
    assert parse_selector("re:q_.*").kind is SelectorKind.REGEX
    assert parse_selector("q_proj").kind is SelectorKind.TEXT


@pytest.mark.parametrize("text", ["", "  ", "attention:x", "op:", "name:", "re:", "re:(("])
def test_malformed_selectors_are_errors(text):
    with pytest.raises(SelectionError):
        parse_selectors([text])


def test_block_selects_the_whole_chain(model, blocks):
    selection = select_nodes(model, parse_selectors(["0"]), blocks=blocks)
    assert selection.blocks == (0,)
    picked = [model.graph.node[p] for p in selection.positions]
    assert [n.name for n in picked] == ["qk", "scale_div", "softmax", "pv"]
    assert "q_proj" not in selection  # projections are outside the chain
    assert select_nodes(model, ["attention:0"], blocks=blocks).positions == selection.positions


def test_a_block_selector_without_blocks_says_to_pass_them(model):
    with pytest.raises(SelectionError, match="find_attention"):
        select_nodes(model, ["0"])
    assert select_nodes(model, ["op:Softmax"]).blocks == ()  # no blocks given: none picked


def test_op_name_and_regex(model, blocks):
    assert select_nodes(model, ["op:Softmax"]).nodes == ("softmax",)
    exact = select_nodes(model, ["q_proj"])
    assert exact.nodes == ("q_proj",) and exact.blocks == ()
    regex = select_nodes(model, ["re:_proj$"])
    assert set(regex.nodes) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    # plain text naming no node is a regex
    assert set(select_nodes(model, ["[qk]_proj"]).nodes) == {"q_proj", "k_proj"}
    # selecting the Softmax selects its block
    assert select_nodes(model, ["op:Softmax"], blocks=blocks).blocks == (0,)


@pytest.mark.parametrize(
    ("text", "listed"),
    [("7", "numbered 0..0"), ("op:Conv", "MatMul"), ("name:nope", "q_proj"), ("re:^zzz", "q_proj")],
)
def test_unmatched_selector_lists_what_exists(model, blocks, text, listed):
    with pytest.raises(SelectionError, match=listed):
        select_nodes(model, [text], blocks=blocks)


def test_position_forms_parse():
    assert parse_selector("#12") == Selector("#12", SelectorKind.POSITION, 12)
    assert parse_selector("<MatMul #3>").value == 3
    assert parse_selector("name:#12").kind is SelectorKind.NAME  # a node really named "#12"


def test_what_graphfix_prints_for_an_unnamed_node_selects_that_node(model):
    unnamed = onnx.ModelProto()
    unnamed.CopyFrom(model)
    for node in unnamed.graph.node:
        node.name = ""
    for position, node in enumerate(unnamed.graph.node):
        label = node_label(node, position)
        assert label == f"<{node.op_type} #{position}>"
        assert select_nodes(unnamed, [label]).positions == (position,)
        assert select_nodes(unnamed, [f"#{position}"]).positions == (position,)
    # `fix`'s report names the unnamed Softmax that way; given back, it selects its block.
    (block,) = graphfix.fix_attention(unnamed, strategy="plugin").report.blocks
    softmax = next(p for p, n in enumerate(unnamed.graph.node) if n.op_type == "Softmax")
    assert block.softmax == f"<Softmax #{softmax}>"
    blocks = graphfix.find_attention(unnamed)
    assert select_nodes(unnamed, [block.softmax], blocks=blocks).blocks == (0,)


@pytest.mark.parametrize(
    ("text", "says"),
    [("#999", r"has \d+ nodes \(#0\.\.#\d+\)"), ("<Conv #0>", r"node #0 is a \w+, not a Conv")],
)
def test_a_position_the_model_does_not_have_is_an_error(model, text, says):
    with pytest.raises(SelectionError, match=says):
        select_nodes(model, [text])
