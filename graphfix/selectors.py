"""The one selector language for every option that picks parts of a model.

`fix --select`, `precision --keep` and `locate`'s remedies all take the same forms:

    3               an attention block, numbered as `graphfix inspect` numbers it
    attention:3     the same, spelled out
    op:Softmax      every node of that op type
    name:/a/b/Mul   exactly that node name (for names that look like another form)
    re:attn\\.\\d+    a regex searched in node names
    #12             the node at position 12 of graph.node: how graphfix shows an unnamed node,
    <MatMul #12>    as `<MatMul #12>` (the op type is then checked)
    /a/b/Mul        a node name when one node has exactly that name, else a regex

An attention block selects every node of its chain (Q·Kᵀ through P·V).  An empty selector, an
invalid regex or a selector that matches nothing is a `SelectionError` that lists what exists.

The blocks are the caller's: `select_nodes` takes them (`graphfix.find_attention(model)`, or the
matches a command already has) and reads only what `Block` names, so this module sits below the
attention package and never imports it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

import onnx

from graphfix.errors import SelectionError
from graphfix.graph.index import BoundNode
from graphfix.model_io import LoadedModel

_SHOWN = 8
# How graphfix.graph.index.node_label shows an unnamed node, or its short form `#12`.
_POSITION = re.compile(r"<(?P<op>[A-Za-z_][\w.]*) #(?P<at>\d+)>|#(?P<short>\d+)")


class SelectorKind(str, Enum):
    BLOCK = "block"  # an attention block by index ("3" or "attention:3")
    OP = "op"  # every node of an op type ("op:Softmax")
    NAME = "name"  # an exact node name ("name:x", or plain text equal to a node name)
    REGEX = "regex"  # a regex searched in node names ("re:x", or plain text that names no node)
    TEXT = "text"  # plain text: an exact name if one node has it, else a regex
    POSITION = "position"  # a node by its position in graph.node ("#12" or "<MatMul #12>")


class Block(Protocol):
    """What a selector reads of an attention block (an `AttentionMatch` is one)."""

    @property
    def index(self) -> int: ...

    @property
    def location(self) -> str: ...  # "" for the top-level graph

    @property
    def softmax_node(self) -> BoundNode: ...

    @property
    def path(self) -> tuple[BoundNode, ...]: ...  # Q·Kᵀ through P·V


@dataclass(frozen=True)
class Selector:
    """One parsed selector; `text` is what the user wrote."""

    text: str
    kind: SelectorKind
    value: str | int


@dataclass(frozen=True)
class SelectorHit:
    """What one selector picked: node names and positions (in graph.node), attention blocks."""

    selector: Selector
    nodes: tuple[str, ...]
    positions: tuple[int, ...]
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Selection:
    """What a list of selectors picked, per selector and in total.

    `positions` identifies unnamed nodes too; `blocks` are the attention blocks named by index plus
    those whose Softmax node was selected (what `fix --select` rewrites).
    """

    hits: tuple[SelectorHit, ...]
    nodes: tuple[str, ...]
    positions: tuple[int, ...]
    blocks: tuple[int, ...]

    def __contains__(self, node_name: object) -> bool:
        return node_name in self.nodes


def parse_selector(text: str) -> Selector:
    """Parse one selector text; see the module docstring for the forms."""
    if not isinstance(text, str):
        raise SelectionError(
            f"selector {text!r} is a {type(text).__name__}; give text such as '3', "
            "'attention:3', 'op:Softmax', a node name or 're:<regex>'"
        )
    stripped = text.strip()
    if not stripped:
        raise SelectionError(
            "empty selector; give a block index ('3'), 'attention:3', 'op:Softmax', "
            "a node name or 're:<regex>'"
        )
    prefix, sep, rest = stripped.partition(":")
    if sep and prefix in ("attention", "block"):
        if not rest.strip().isdigit():
            raise SelectionError(
                f"selector {text!r}: expected a block index after '{prefix}:' such as "
                f"'{prefix}:0' (see `graphfix inspect` for the numbering)"
            )
        return Selector(text, SelectorKind.BLOCK, int(rest))
    if sep and prefix == "op":
        if not rest.strip():
            raise SelectionError(
                f"selector {text!r}: expected an op type after 'op:', e.g. 'op:Softmax'"
            )
        return Selector(text, SelectorKind.OP, rest.strip())
    if sep and prefix == "name":
        if not rest:
            raise SelectionError(f"selector {text!r}: expected a node name after 'name:'")
        return Selector(text, SelectorKind.NAME, rest)
    if sep and prefix == "re":
        return Selector(text, SelectorKind.REGEX, _compile(text, rest).pattern)
    if stripped.isdigit():
        return Selector(text, SelectorKind.BLOCK, int(stripped))
    position = _POSITION.fullmatch(stripped)
    if position is not None:
        return Selector(text, SelectorKind.POSITION, int(position["at"] or position["short"]))
    return Selector(text, SelectorKind.TEXT, text)


def parse_selectors(texts: str | Iterable[str]) -> tuple[Selector, ...]:
    """Parse selector texts (one string, or several); each empty text is an error."""
    if isinstance(texts, str):
        texts = [texts]
    return tuple(parse_selector(t) for t in texts)


def select_nodes(
    model_or_graph: onnx.ModelProto | onnx.GraphProto | LoadedModel | str | os.PathLike[str],
    selectors: Sequence[Selector | str],
    *,
    blocks: Sequence[Block] | None = None,
) -> Selection:
    """The nodes (top-level graph) each selector picks; a selector picking nothing is an error.

    `blocks` are the model's attention blocks, e.g. `graphfix.find_attention(model)`; None: the
    model has none to pick (a block selector is then an error saying to pass them).
    """
    graph = _graph_of(model_or_graph)
    parsed = tuple(s if isinstance(s, Selector) else parse_selector(s) for s in selectors)
    blocks_by_index = {b.index: b for b in blocks} if blocks is not None else None
    positions_by_name: dict[str, list[int]] = {}
    for position, node in enumerate(graph.node):
        positions_by_name.setdefault(node.name, []).append(position)
    hits = tuple(_resolve(graph, s, blocks_by_index, positions_by_name) for s in parsed)
    positions = sorted({p for hit in hits for p in hit.positions})
    chosen_blocks = {b for hit in hits for b in hit.blocks}
    selected = set(positions)
    chosen_blocks |= {
        b.index
        for b in (blocks_by_index or {}).values()
        if not b.location and b.softmax_node.position in selected
    }
    return Selection(
        hits=hits,
        nodes=tuple(dict.fromkeys(graph.node[p].name for p in positions if graph.node[p].name)),
        positions=tuple(positions),
        blocks=tuple(sorted(chosen_blocks)),
    )


def _graph_of(
    model_or_graph: onnx.ModelProto | onnx.GraphProto | LoadedModel | str | os.PathLike[str],
) -> onnx.GraphProto:
    if isinstance(model_or_graph, onnx.GraphProto):
        return model_or_graph
    if isinstance(model_or_graph, onnx.ModelProto):
        return model_or_graph.graph
    if isinstance(model_or_graph, LoadedModel):
        return model_or_graph.model.graph
    if isinstance(model_or_graph, (str, os.PathLike, Path)):
        from graphfix.model_io import load_model

        return load_model(model_or_graph, load_weights=False).model.graph
    raise SelectionError(
        f"cannot select nodes in a {type(model_or_graph).__name__}; pass a ModelProto, "
        "GraphProto or a path to an .onnx file"
    )


def _resolve(
    graph: onnx.GraphProto,
    selector: Selector,
    blocks: dict[int, Block] | None,
    positions_by_name: dict[str, list[int]],
) -> SelectorHit:
    kind, value = selector.kind, selector.value
    if kind is SelectorKind.BLOCK:
        if blocks is None:
            raise SelectionError(
                f"selector {selector.text!r} names an attention block, but no blocks were given "
                "to select from; pass blocks=graphfix.find_attention(model)"
            )
        block = blocks.get(int(value))
        if block is None:
            raise SelectionError(
                f"selector {selector.text!r} names attention block {value}, but "
                + _blocks_text(blocks)
                + " (see `graphfix inspect`)"
            )
        # a block inside an If/Loop body has no nodes in the top-level graph: picked by index
        path = () if block.location else block.path
        return SelectorHit(
            selector,
            tuple(dict.fromkeys(n.node.name for n in path if n.node.name)),
            tuple(n.position for n in path),
            (block.index,),
        )
    if kind is SelectorKind.POSITION:
        return _hit(graph, selector, (_position(graph, selector),))
    if kind is SelectorKind.OP:
        positions = tuple(p for p, n in enumerate(graph.node) if n.op_type == value)
        if not positions:
            ops = sorted({n.op_type for n in graph.node})
            raise SelectionError(
                f"selector {selector.text!r} matches no node: the model has no {value} node; "
                f"its op types are {_list(ops)}"
            )
        return _hit(graph, selector, positions)
    if kind is SelectorKind.NAME or (kind is SelectorKind.TEXT and value in positions_by_name):
        positions = tuple(positions_by_name.get(str(value), ()))
        if not positions:
            raise SelectionError(
                f"selector {selector.text!r} matches no node: no node is named {value!r}; "
                f"nodes are named e.g. {_list(_names(graph))}"
            )
        return _hit(graph, selector, positions)
    pattern = _compile(selector.text, str(value))
    positions = tuple(p for p, n in enumerate(graph.node) if pattern.search(n.name))
    if not positions:
        raise SelectionError(
            f"selector {selector.text!r} matches no node name (searched as the regex "
            f"{pattern.pattern!r}); nodes are named e.g. {_list(_names(graph))}"
            + (
                "; one selector per text: repeat the option (--keep 0 --keep 1) for several"
                if "," in selector.text
                else ""
            )
        )
    return _hit(graph, selector, positions)


def _position(graph: onnx.GraphProto, selector: Selector) -> int:
    position, nodes = int(selector.value), graph.node
    if position >= len(nodes):
        raise SelectionError(
            f"selector {selector.text!r} names node position {position}, but the model has "
            f"{len(nodes)} nodes (#0..#{len(nodes) - 1}); positions are graph.node's order, as "
            "graphfix prints unnamed nodes (`<MatMul #12>`)"
        )
    op = _POSITION.fullmatch(selector.text.strip())["op"]
    if op is not None and nodes[position].op_type != op:
        raise SelectionError(
            f"selector {selector.text!r}: node #{position} is a {nodes[position].op_type}, not "
            f"a {op}; positions change when a model is edited: take the name from a run on "
            "this very model"
        )
    return position


def _hit(graph: onnx.GraphProto, selector: Selector, positions: Sequence[int]) -> SelectorHit:
    names = tuple(dict.fromkeys(graph.node[p].name for p in positions if graph.node[p].name))
    return SelectorHit(selector, names, tuple(positions))


def _compile(text: str, pattern: str) -> re.Pattern[str]:
    if not pattern:
        raise SelectionError(f"selector {text!r}: expected a regex after 're:'")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError(
            f"selector {text!r} is neither a node name nor a valid regex ({exc}); "
            "use 'name:<exact name>' for names with regex characters"
        ) from exc


def _names(graph: onnx.GraphProto) -> list[str]:
    return [n.name for n in graph.node if n.name]


def _blocks_text(blocks: dict[int, Block]) -> str:
    if not blocks:
        return "the model has no attention block"
    ordered = sorted(blocks)
    return f"its blocks are numbered {ordered[0]}..{ordered[-1]}"


def _list(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (", …" if len(items) > _SHOWN else "") if items else "(none)"
