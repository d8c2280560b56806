"""Pictures of one attention block, and of the same block before and after the rewrite.

The picture holds the block's chain as the matcher found it (Q·Kᵀ through P·V) plus one hop of
context: the nodes producing Q, K, V and the mask, and the nodes consuming the block's result.
In a rewritten model the block is found by tensor names, which every strategy keeps: walking up
from the block's result, through tensors the original chain produced or the rewrite added, up to
the tensors that entered the original chain. So inserted nodes, plugin nodes and a whole chain
replaced by one node all draw the same way.

The layered top-down layout is computed here (longest path, barycentre ordering, bends for long
edges), so no graphviz is needed. Like `graphfix.validation.plot`, only matplotlib's object API is used (no
pyplot, no backend switch): figures render in notebooks and save anywhere without a display.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import onnx

from graphfix.attention.match_types import AttentionMatch, BiasStep, KTransposedBy, MaskStep
from graphfix.attention.matcher import scan_attention
from graphfix.errors import GraphfixError, SelectionError, UnsupportedModelError
from graphfix.graph.index import GraphIndex, node_label
from graphfix.model_io import ModelArg, load_model
from graphfix.plugins.reference import with_reference_ops
from graphfix.plugins.spec import PLUGIN_DOMAIN

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch


__all__ = ["draw_attention_block", "draw_before_after"]

# Layout units: one box is _BOX_W wide; layers are _LAYER_GAP apart; one unit is _INCH inches.
_BOX_W, _BOX_H, _DUMMY_W, _GAP, _LAYER_GAP, _INCH = 2.3, 0.62, 0.3, 0.35, 1.05, 0.95
_MAX_NODES = 400  # a "block" bigger than this means the two models are not original and rewrite
_NAME_CHARS = 22

# role → (face, edge, text colour, line style, legend label)
_STYLE = {
    "chain": ("#dbe7f3", "#3a6ea5", "#10243e", "solid", "attention chain (what Myelin fuses)"),
    "softmax": ("#ffd166", "#a67c00", "#3d2c00", "solid", "Softmax"),
    "plugin": ("#d1495b", "#7a1f2b", "white", "solid", "plugin node (Myelin cannot fuse it)"),
    "added": ("#b7e4c7", "#2d6a4f", "#0b2e1f", "solid", "added by the rewrite"),
    "context": ("white", "#9aa0a6", "#5f6368", "dashed", "context (one hop)"),
    "io": ("#f1f3f4", "#9aa0a6", "#3c4043", "dotted", "graph input / output"),
}


@dataclass(frozen=True)
class _Box:
    key: str  # "n<position>" for a node, "in:<tensor>" / "out:<tensor>" for graph inputs/outputs
    title: str  # op type, or "input" / "output"
    name: str  # short node or tensor name
    role: str  # a key of _STYLE
    order: float  # where it sits in the graph, for the initial ordering within a layer


@dataclass(frozen=True)
class _Edge:
    src: str
    dst: str
    label: str  # "Q", "Kᵀ", "V", "mask", or ""


@dataclass(frozen=True)
class _BlockGraph:
    boxes: tuple[_Box, ...]
    edges: tuple[_Edge, ...]


@dataclass(frozen=True)
class _Block:
    """One matched block, described by tensor names so it can be found in a rewrite too."""

    match: AttentionMatch
    softmax: str  # the Softmax (or the node that replaced it) as named in the drawn model
    outputs: tuple[str, ...]  # the P·V result, then the outputs of a Cast right after it
    chain_tensors: frozenset[str]  # every tensor the chain's nodes produce
    known_tensors: frozenset[str]  # every tensor of the model the match was made on
    labels: Mapping[str, str]  # tensor → "Q" / "K" / "Kᵀ" / "V" / "mask"
    node_names: frozenset[str]  # node names of the model the match was made on


def draw_attention_block(
    model: ModelArg,
    *,
    block: int | str | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Draw one attention block of `model` (a ModelProto or a path) as a layered graph.

    `block`: the block's index (as `graphfix.find_attention` numbers them) or its Softmax node
    name; None means block 0.  A rewritten model works too: its plugin nodes are lowered to
    standard ops to find the block, then drawn as they are.  `ax`: draw into these axes instead of
    a new figure.  Returns the figure (save it with `figure.savefig("block.png")`).
    """
    loaded = load_model(model, load_weights=False).model
    found = _find_block(
        _matchable(loaded), block, drawn=loaded, hint_before_after=_has_plugins(loaded)
    )
    graph = _block_graph(loaded, found, new_nodes_are_added=False)
    layout = _layout(graph)
    handles = _legend_handles([graph])
    if ax is None:
        _, (ax,) = _new_figure([layout], legend=handles, titles=1)
    else:
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=3,
            fontsize=8,
            frameon=False,
        )
    _draw(ax, graph, layout)
    ax.set_title(title if title is not None else _describe(found), fontsize=10)
    return ax.figure


def draw_before_after(
    original: ModelArg,
    fixed: ModelArg,
    *,
    block: int | str | None = None,
    title: str | None = None,
) -> Figure:
    """The same attention block in `original` (left) and in its rewrite `fixed` (right).

    `block` is chosen in the original (index or Softmax node name; None: block 0).  Nodes the
    rewrite added are green and plugin nodes red, so what changed is visible at a glance.
    """
    before_model = load_model(original, load_weights=False).model
    after_model = load_model(fixed, load_weights=False).model
    found = _find_block(before_model, block)
    graphs = [
        _block_graph(before_model, found, new_nodes_are_added=False),
        _block_graph(after_model, found, new_nodes_are_added=True),
    ]
    layouts = [_layout(g) for g in graphs]
    figure, axes = _new_figure(layouts, legend=_legend_handles(graphs), titles=2)
    for ax, graph, layout, side in zip(axes, graphs, layouts, ("before", "after"), strict=True):
        _draw(ax, graph, layout)
        note = "" if side == "before" else _after_note(*graphs)
        ax.set_title(side + note, fontsize=10)
    figure.suptitle(title if title is not None else _describe(found), fontsize=11)
    return figure


# --- finding the block ----------------------------------------------------------------------


def _has_plugins(model: onnx.ModelProto) -> bool:
    return any(node.domain == PLUGIN_DOMAIN for node in model.graph.node)


def _matchable(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with plugin nodes lowered to standard ops, which the matcher reads."""
    if not _has_plugins(model):
        return model
    try:
        return with_reference_ops(model)
    except UnsupportedModelError:
        return model  # no lowering for this plugin op: _find_block says what to do instead


def _find_block(
    model: onnx.ModelProto,
    block: int | str | None,
    *,
    drawn: onnx.ModelProto | None = None,
    hint_before_after: bool = False,
) -> _Block:
    """Block `block` as the matcher finds it in `model`; `drawn`: the model it will be drawn
    from when that differs (a rewrite whose plugin nodes were lowered into `model`)."""
    if isinstance(block, bool) or not isinstance(block, (int, str, type(None))):
        raise SelectionError(f"block {block!r} is not a block index or a Softmax node name")
    # blocks of the main graph (a subgraph's block is not drawn: positions refer to its body)
    matches = tuple(m for m in scan_attention(model).matches if not m.location)
    names = _softmax_names(model, model if drawn is None else drawn, matches)
    wanted = 0 if block is None else block
    chosen = next(
        (m for m in matches if m.index == wanted or wanted in (m.softmax, names[m.index])), None
    )
    if chosen is None:
        hint = (
            "; for a rewritten model whose plugin ops graphfix cannot lower, draw it next to its "
            "original with draw_before_after(original, fixed)"
            if hint_before_after
            else ""
        )
        if not matches:
            raise SelectionError(f"the model has no attention block to draw{hint}")
        listed = ", ".join(names[m.index] for m in matches[:6])
        raise SelectionError(
            f"block {block!r} is not an attention block of the model; blocks are numbered "
            f"0..{len(matches) - 1} and their Softmax nodes are {listed}"
            f"{', …' if len(matches) > 6 else ''}{hint}"
        )
    chain = [n.node for n in chosen.path]
    qk, pv = chosen.qk.node, chosen.pv.node
    labels = {s.source: "mask" for s in chosen.steps if isinstance(s, (MaskStep, BiasStep))}
    if chosen.sink is not None:
        labels[chosen.sink.sink] = "sink"
    labels.update({chosen.q: "Q", chosen.k: "K", chosen.v: "V"})
    # the tensors as the two products see them (after any scale or transpose) name the edges drawn
    labels[qk.input[0]] = "Q"
    if len(qk.input) > 1:
        einsum = chosen.k_transposed_by is KTransposedBy.EINSUM
        labels[qk.input[1]] = "K" if einsum else "Kᵀ"
    if len(pv.input) > 1:
        labels[pv.input[1]] = "V"
    return _Block(
        match=chosen,
        softmax=names[chosen.index],
        outputs=(pv.output[0], *_cast_outputs(model, pv.output[0])),
        chain_tensors=frozenset(t for node in chain for t in node.output if t),
        known_tensors=frozenset(_all_tensors(model)),
        labels=labels,
        node_names=frozenset(n.name for n in model.graph.node if n.name),
    )


def _softmax_names(
    model: onnx.ModelProto, drawn: onnx.ModelProto, matches: Sequence[AttentionMatch]
) -> dict[int, str]:
    """Each block's Softmax named as in `drawn`: the node there that produces the Softmax's
    output, or the output of the Cast right after it (a lowered float16 plugin node)."""
    producer = GraphIndex(drawn).producer
    names = {}
    for match in matches:
        out = match.softmax_node.node.output[0]
        candidates = [out, *_cast_outputs(model, out)]
        node = next((producer[t] for t in candidates if t in producer), None)
        names[match.index] = (node.name if node is not None else "") or match.softmax_node.name
    return names


def _cast_outputs(model: onnx.ModelProto, tensor: str) -> list[str]:
    """Outputs of the Casts reading `tensor`: where a lowered float16 plugin node's result is."""
    return [n.output[0] for n in model.graph.node if n.op_type == "Cast" and tensor in n.input]


def _all_tensors(model: onnx.ModelProto) -> Iterable[str]:
    graph = model.graph
    yield from (v.name for v in graph.input)
    yield from (t.name for t in graph.initializer)
    for node in graph.node:
        yield from (t for t in node.output if t)


def _block_graph(
    model: onnx.ModelProto, block: _Block, *, new_nodes_are_added: bool
) -> _BlockGraph:
    """The boxes and edges of `block` as it appears in `model` (the original or a rewrite)."""
    index = GraphIndex(model)
    nodes = model.graph.node
    graph_inputs, graph_outputs = index.graph_inputs, index.graph_outputs
    producer = {t: index.position(n) for t, n in index.producer.items()}
    consumers = {t: [index.position(n) for n in ns] for t, ns in index.consumers.items()}
    output = next((t for t in block.outputs if t in producer), None)
    if output is None:
        raise GraphfixError(
            f"the model has no node producing '{block.outputs[0]}', the result of attention "
            f"block {block.match.index}; pass the model `graphfix fix` wrote from this original"
        )

    def inside(tensor: str) -> bool:
        return tensor in block.chain_tensors or tensor not in block.known_tensors

    core: set[int] = set()
    stack = [producer[output]]
    while stack:
        position = stack.pop()
        if position in core:
            continue
        core.add(position)
        if len(core) > _MAX_NODES:
            raise GraphfixError(
                f"attention block {block.match.index} spans over {_MAX_NODES} nodes of the "
                "rewritten model; draw_before_after needs a model and its own rewrite"
            )
        stack += [producer[t] for t in nodes[position].input if t in producer and inside(t)]

    context: set[int] = set()
    io_inputs: list[str] = []
    io_outputs: list[str] = []
    for position in sorted(core):
        node = nodes[position]
        for tensor in node.input:
            if tensor in producer and producer[tensor] not in core:
                if nodes[producer[tensor]].op_type != "Constant":
                    context.add(producer[tensor])
            elif tensor in graph_inputs and tensor not in io_inputs:
                io_inputs.append(tensor)
        for tensor in node.output:
            context.update(c for c in consumers.get(tensor, ()) if c not in core)
            if tensor in graph_outputs:
                io_outputs.append(tensor)

    def role(position: int) -> str:
        node = nodes[position]
        if position not in core:
            return "context"
        if node.domain == PLUGIN_DOMAIN:
            return "plugin"
        if node.op_type == "Softmax":
            return "softmax"
        if new_nodes_are_added and node.name not in block.node_names:
            return "added"
        return "chain"

    drawn = sorted(core | context)
    boxes = [
        _Box(
            f"n{p}", nodes[p].op_type, _short(nodes[p].name) or node_label(nodes[p], p), role(p), p
        )
        for p in drawn
    ]
    edges: list[_Edge] = []
    first = min(drawn) - 0.5
    for tensor in io_inputs:
        boxes.append(_Box(f"in:{tensor}", "input", _short(tensor), "io", first))
    for position in drawn:
        for tensor in dict.fromkeys(t for t in nodes[position].input if t):
            label = block.labels.get(tensor, "")
            if tensor in producer and producer[tensor] in drawn:
                edges.append(_Edge(f"n{producer[tensor]}", f"n{position}", label))
            elif tensor in io_inputs:
                edges.append(_Edge(f"in:{tensor}", f"n{position}", label))
    for tensor in dict.fromkeys(io_outputs):
        boxes.append(_Box(f"out:{tensor}", "output", _short(tensor), "io", producer[tensor] + 0.5))
        edges.append(_Edge(f"n{producer[tensor]}", f"out:{tensor}", ""))
    return _BlockGraph(tuple(boxes), tuple(edges))


def _short(name: str) -> str:
    """The last two parts of a path-like name ("attn/Softmax"), cut to fit a box."""
    tail = "/".join(name.strip("/").split("/")[-2:])
    return tail if len(tail) <= _NAME_CHARS else "…" + tail[-(_NAME_CHARS - 1) :]


def _describe(block: _Block) -> str:
    return f"attention block {block.match.index} ({block.match.kind.value}): {block.softmax}"


def _after_note(before: _BlockGraph, after: _BlockGraph) -> str:
    """What changed, in a few words for the right-hand title."""
    roles = {box.role for box in after.boxes}
    outputs_before = {box.key for box in before.boxes if box.key.startswith("out:")}
    if "plugin" in roles:
        return ": plugin node"
    if "added" in roles:
        return ": nodes added"
    if any(b.key.startswith("out:") and b.key not in outputs_before for b in after.boxes):
        return ": new graph output"
    return ": unchanged"


# --- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    x: Mapping[str, float]
    y: Mapping[str, float]
    routes: Mapping[int, tuple[tuple[float, float], ...]]  # edge index → bend points

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, right, bottom, top) of the boxes, in layout units."""
        xs, ys = self.x.values(), self.y.values()
        return (
            min(xs) - _BOX_W / 2 - 0.15,
            max(xs) + _BOX_W / 2 + 0.15,
            min(ys) - _BOX_H / 2 - 0.15,
            max(ys) + _BOX_H / 2 + 0.15,
        )


def _layout(graph: _BlockGraph) -> _Layout:
    """Layers top-down, dummy points where an edge skips layers, rows ordered to limit
    crossings, then x positions pulled towards each box's neighbours without overlaps."""
    order = {box.key: box.order for box in graph.boxes}
    layer = _layers(graph, order)
    width = {key: _BOX_W for key in order}
    chains: dict[int, list[str]] = {}  # edge index → the keys it passes through, ends included
    for index, edge in enumerate(graph.edges):
        hops = [edge.src]
        for depth in range(layer[edge.src] + 1, layer[edge.dst]):
            dummy = f"dummy{index}:{depth}"
            layer[dummy], width[dummy] = depth, _DUMMY_W
            order[dummy] = (order[edge.src] + order[edge.dst]) / 2
            hops.append(dummy)
        chains[index] = [*hops, edge.dst]
    up: dict[str, list[str]] = defaultdict(list)
    down: dict[str, list[str]] = defaultdict(list)
    for hops in chains.values():
        for a, b in pairwise(hops):
            down[a].append(b)
            up[b].append(a)
    rows = _ordered_rows(layer, order, up, down)
    x = _positions(rows, width, up, down)
    y = {key: -layer[key] * _LAYER_GAP for key in layer}
    routes = {i: tuple((x[k], y[k]) for k in hops[1:-1]) for i, hops in chains.items()}
    return _Layout(x=x, y=y, routes=routes)


def _layers(graph: _BlockGraph, order: Mapping[str, float]) -> dict[str, int]:
    """Longest path from the top; a box fed by nothing drawn sits just above its first use."""
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for edge in graph.edges:
        preds[edge.dst].append(edge.src)
        succs[edge.src].append(edge.dst)
    layer: dict[str, int] = {}
    for key in _topological(order, preds, succs):
        layer[key] = max((layer[p] + 1 for p in preds[key]), default=0)
    for key in order:
        if not preds[key] and succs[key]:
            layer[key] = min(layer[s] for s in succs[key]) - 1
    return layer


def _sweeps(
    depth: int, up: Mapping[str, list[str]], down: Mapping[str, list[str]], count: int
) -> Iterator[tuple[Mapping[str, list[str]], range]]:
    """(neighbours to follow, rows to visit) for alternating downward and upward sweeps."""
    for sweep in range(count):
        if sweep % 2 == 0:
            yield up, range(1, depth)
        else:
            yield down, range(depth - 2, -1, -1)


def _ordered_rows(
    layer: Mapping[str, int],
    order: Mapping[str, float],
    up: Mapping[str, list[str]],
    down: Mapping[str, list[str]],
) -> list[list[str]]:
    """Each layer's keys left to right: graph order first, then barycentre sweeps."""
    depth = max(layer.values()) + 1
    rows = [
        sorted((k for k in layer if layer[k] == d), key=order.__getitem__) for d in range(depth)
    ]
    index = {key: float(i) for row in rows for i, key in enumerate(row)}
    for neighbours, span in _sweeps(depth, up, down, 8):
        for d in span:
            rows[d].sort(key=lambda k: _mean([index[n] for n in neighbours[k]], index[k]))
            index.update((key, float(i)) for i, key in enumerate(rows[d]))
    return rows


def _positions(
    rows: Sequence[Sequence[str]],
    width: Mapping[str, float],
    up: Mapping[str, list[str]],
    down: Mapping[str, list[str]],
) -> dict[str, float]:
    """x of every key: rows packed and centred, then pulled towards their neighbours."""
    x: dict[str, float] = {}
    for row in rows:
        _place(row, [0.0] * len(row), width, x)
    for neighbours, span in _sweeps(len(rows), up, down, 6):
        for d in span:
            row = rows[d]
            _place(row, [_mean([x[n] for n in neighbours[k]], x[k]) for k in row], width, x)
    return x


def _topological(
    order: Mapping[str, float], preds: Mapping[str, list[str]], succs: Mapping[str, list[str]]
) -> list[str]:
    remaining = {key: len(preds[key]) for key in order}
    ready = sorted((k for k, n in remaining.items() if n == 0), key=order.__getitem__)
    result: list[str] = []
    while ready:
        key = ready.pop(0)
        result.append(key)
        for s in succs[key]:
            remaining[s] -= 1
            if remaining[s] == 0:
                ready.append(s)
                ready.sort(key=order.__getitem__)
    return result


def _mean(values: Sequence[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _place(
    row: Sequence[str], wanted: Sequence[float], width: Mapping[str, float], x: dict[str, float]
) -> None:
    """Positions for `row` in order, as close to `wanted` as spacing allows, centred on it."""
    placed = list(wanted)
    for i in range(1, len(row)):
        need = (width[row[i - 1]] + width[row[i]]) / 2 + _GAP
        placed[i] = max(placed[i], placed[i - 1] + need)
    shift = _mean([w - p for w, p in zip(wanted, placed, strict=True)], 0.0)
    for key, value in zip(row, placed, strict=True):
        x[key] = value + shift


# --- drawing --------------------------------------------------------------------------------


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise GraphfixError(
            f"drawing needs matplotlib ({exc}); install it with pip install 'graphfix[plot]'"
        ) from exc
    return Figure


def _new_figure(
    layouts: Sequence[_Layout], *, legend: Sequence[Patch], titles: int
) -> tuple[Figure, list[Axes]]:
    """A figure sized so that one layout unit is _INCH inches, one axes per layout, a legend."""
    bounds = [layout.bounds for layout in layouts]
    widths = [max(right - left, 2 * _BOX_W) for left, right, _, _ in bounds]
    height = max(top - bottom for _, _, bottom, top in bounds) * _INCH
    width = max(sum(widths) * _INCH + 0.3 * len(layouts), 6.0)
    columns = len(legend) if width >= 9.0 else 3
    legend_in = 0.28 * -(-len(legend) // columns) + 0.1
    title_in = 0.3 * titles + 0.1
    figure = _figure_class()(figsize=(width, height + legend_in + title_in))
    total = height + legend_in + title_in
    grid = figure.add_gridspec(
        1,
        len(layouts),
        width_ratios=widths,
        left=0.01,
        right=0.99,
        wspace=0.04,
        top=1 - title_in / total,
        bottom=legend_in / total,
    )
    axes = [figure.add_subplot(spec) for spec in grid]
    figure.legend(
        handles=legend,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=columns,
        fontsize=8,
        frameon=False,
    )
    return figure, axes


def _draw(axes: Axes, graph: _BlockGraph, layout: _Layout) -> None:
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    boxes = {b.key: b for b in graph.boxes}
    ports_out = _ports(graph.edges, layout, outgoing=True)
    ports_in = _ports(graph.edges, layout, outgoing=False)
    for index, edge in enumerate(graph.edges):
        start = (ports_out[index], layout.y[edge.src] - _BOX_H / 2)
        end = (ports_in[index], layout.y[edge.dst] + _BOX_H / 2)
        points = [start, *layout.routes[index], end]
        faint = "context" in (boxes[edge.src].role, boxes[edge.dst].role)
        colour = "#9aa0a6" if faint else "#3c4043"
        if len(points) > 2:
            xs, ys = zip(*points[:-1], strict=True)
            axes.plot(xs, ys, color=colour, linewidth=1.1, solid_capstyle="round", zorder=1)
        axes.add_patch(
            FancyArrowPatch(
                points[-2],
                end,
                arrowstyle="-|>",
                mutation_scale=11,
                color=colour,
                linewidth=1.1,
                shrinkA=0,
                shrinkB=1,
                zorder=1,
            )
        )
        if edge.label:
            (x0, y0), (x1, y1) = points[-2], end
            axes.text(
                (x0 + x1) / 2,
                (y0 + y1) / 2,
                edge.label,
                ha="center",
                va="center",
                fontsize=8,
                fontweight="bold",
                color="#1a4b8c",
                zorder=3,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
            )
    for box in graph.boxes:
        face, edge_colour, text, style, _ = _STYLE[box.role]
        cx, cy = layout.x[box.key], layout.y[box.key]
        axes.add_patch(
            FancyBboxPatch(
                (cx - _BOX_W / 2, cy - _BOX_H / 2),
                _BOX_W,
                _BOX_H,
                boxstyle="round,pad=0,rounding_size=0.12",
                facecolor=face,
                edgecolor=edge_colour,
                linestyle=style,
                linewidth=2.0 if box.role == "plugin" else 1.2,
                zorder=2,
            )
        )
        axes.text(
            cx,
            cy + 0.11,
            box.title,
            ha="center",
            va="center",
            fontsize=9,
            fontweight="bold",
            color=text,
            zorder=3,
        )
        axes.text(
            cx, cy - 0.14, box.name, ha="center", va="center", fontsize=7, color=text, zorder=3
        )
    _fit_limits(axes, layout.bounds)
    axes.set_axis_off()


def _fit_limits(axes: Axes, bounds: tuple[float, float, float, float]) -> None:
    """Equal scale on both axes: the graph centred left to right, its top at the top."""
    left, right, bottom, top = bounds
    figure_w, figure_h = axes.figure.get_size_inches()
    box = axes.get_position()
    width_in, height_in = box.width * figure_w, box.height * figure_h
    per_inch = max((right - left) / width_in, (top - bottom) / height_in)
    middle = (left + right) / 2
    axes.set_xlim(middle - width_in * per_inch / 2, middle + width_in * per_inch / 2)
    axes.set_ylim(top - height_in * per_inch, top)


def _ports(edges: Sequence[_Edge], layout: _Layout, *, outgoing: bool) -> dict[int, float]:
    """x of each edge's end on its box, spread along the box's side in the order they go."""
    by_box: dict[str, list[int]] = defaultdict(list)
    for index, edge in enumerate(edges):
        by_box[edge.src if outgoing else edge.dst].append(index)
    ports: dict[int, float] = {}
    for key, indices in by_box.items():

        def towards(index: int) -> float:
            edge, route = edges[index], layout.routes[index]
            if route:
                return route[0][0] if outgoing else route[-1][0]
            return layout.x[edge.dst if outgoing else edge.src]

        indices.sort(key=towards)
        spread = min(_BOX_W * 0.6, 0.45 * (len(indices) - 1))
        for i, index in enumerate(indices):
            offset = 0.0 if len(indices) == 1 else spread * (i / (len(indices) - 1) - 0.5)
            ports[index] = layout.x[key] + offset
    return ports


def _legend_handles(graphs: Sequence[_BlockGraph]) -> list[Patch]:
    from matplotlib.patches import Patch

    present = {box.role for g in graphs for box in g.boxes}
    return [
        Patch(facecolor=face, edgecolor=edge, linestyle=style, label=label)
        for role, (face, edge, _, style, label) in _STYLE.items()
        if role in present
    ]
