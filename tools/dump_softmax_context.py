"""Print the graph neighbourhood of every Softmax node of ONNX models.

For each Softmax: the nodes upstream (following non-constant inputs, up to --up hops) as an
indented tree, and the nodes downstream (up to --down hops).  Constant inputs are shown inline
(`c=0.125`, `init[4,4] f32`) instead of being followed; a node already printed is shown once and
then referred to as `(seen #id)`.  Shapes come from ONNX shape inference where it can tell.

    python tools/dump_softmax_context.py model.onnx [more.onnx ...] [--up 10] [--down 4]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.graph.index import GraphIndex

SMALL_CONSTANT = 8  # constants with at most this many elements are printed by value
SHOWN_ATTRIBUTES = (
    "axis",
    "axes",
    "perm",
    "to",
    "equation",
    "keepdims",
    "upper",
    "split",
    "transA",
    "transB",
    "direction",
    "mode",
)


class ContextIndex(GraphIndex):
    """graphfix's GraphIndex, plus what this tool prints: node labels, inline constants, types."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model)
        self.nodes = list(self.graph.node)
        self.constants: dict[str, np.ndarray] = {}
        for name in (*self.initializers, *self.producer):
            producer = self.producer.get(name)
            if name in self.initializers or (
                producer is not None and producer.op_type == "Constant"
            ):
                value = self._literal(name)
                if value is not None:
                    self.constants[name] = value
        self.types = {name: _describe_type(vi.type) for name, vi in self.value_info.items()}

    def _literal(self, name: str) -> np.ndarray | None:
        if name in self.initializers:  # any size: printed as init[shape] with distinct values
            return numpy_helper.to_array(self.initializers[name])
        return self.constant_value(name)

    def label(self, node: onnx.NodeProto) -> str:
        return f"#{self.position(node)} {node.op_type}"


def _describe_type(type_proto: onnx.TypeProto) -> str:
    tensor = type_proto.tensor_type
    if not tensor.elem_type:
        return "?"
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    if not tensor.HasField("shape"):
        return dtype
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
        for d in tensor.shape.dim
    ]
    return f"{dtype}[{','.join(dims)}]"


def _describe_constant(value: np.ndarray) -> str:
    if value.size <= SMALL_CONSTANT:
        flat = value.reshape(-1).tolist()
        shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat)
        return f"c[{shown}]" if value.ndim else f"c={shown}"
    text = f"init{list(value.shape)} {value.dtype.name}"
    distinct = np.unique(value)
    if distinct.size <= 3:
        text += (
            " ∈{"
            + ", ".join(f"{v:.6g}" if value.dtype.kind == "f" else str(v) for v in distinct)
            + "}"
        )
        text += _triangle(value)
    return text


def _triangle(value: np.ndarray) -> str:
    """' upper' / ' lower' when the last two axes hold a square mask that differs from its
    diagonal value only strictly above / below the diagonal (a causal mask or its complement)."""
    if value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
        return ""
    square = value.reshape(-1, *value.shape[-2:])[0]
    diagonal = square[0, 0]
    upper = np.triu(np.ones(square.shape, dtype=bool), 1)
    lower = upper.T
    off = square != diagonal
    if np.array_equal(off, upper):
        return " (differs above the diagonal)"
    if np.array_equal(off, lower):
        return " (differs below the diagonal)"
    return ""


def _describe_attributes(node: onnx.NodeProto) -> str:
    parts = []
    for attr in node.attribute:
        if attr.name in SHOWN_ATTRIBUTES:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                value = value.decode()
            if attr.name == "to":
                value = onnx.helper.tensor_dtype_to_np_dtype(value).name
            parts.append(f"{attr.name}={value}")
    return " ".join(parts)


def _describe_node(index: ContextIndex, node: onnx.NodeProto) -> str:
    inputs = []
    for name in node.input:
        if not name:
            inputs.append("∅")
        elif name in index.constants:
            inputs.append(_describe_constant(index.constants[name]))
        elif name in index.graph_inputs:
            inputs.append(f"in:{name}")
        else:
            inputs.append("·")
    attributes = _describe_attributes(node)
    out_type = index.types.get(node.output[0], "?") if node.output else "?"
    text = f"{index.label(node)}({', '.join(inputs)})"
    if attributes:
        text += f" {attributes}"
    return f"{text} -> {out_type}  [{node.name}]"


def upstream_lines(index: ContextIndex, start: onnx.NodeProto, hops: int) -> list[str]:
    """The producers of `start`'s non-constant inputs, depth first, as indented lines."""
    lines: list[str] = []
    seen: set[int] = {id(start)}

    def visit(node: onnx.NodeProto, depth: int) -> None:
        for name in node.input:
            producer = index.producer.get(name)
            if producer is None or name in index.constants:
                continue
            pad = "  " * depth
            if id(producer) in seen:
                lines.append(f"{pad}↑ (seen {index.label(producer)})")
                continue
            seen.add(id(producer))
            lines.append(f"{pad}↑ {_describe_node(index, producer)}")
            if depth < hops:
                visit(producer, depth + 1)

    visit(start, 1)
    return lines


def downstream_lines(index: ContextIndex, start: onnx.NodeProto, hops: int) -> list[str]:
    """The consumers of `start`'s outputs, breadth first per branch, as indented lines."""
    lines: list[str] = []
    seen: set[int] = {id(start)}

    def visit(node: onnx.NodeProto, depth: int) -> None:
        for name in node.output:
            for consumer in index.consumers.get(name, []):
                pad = "  " * depth
                if id(consumer) in seen:
                    lines.append(f"{pad}↓ (seen {index.label(consumer)})")
                    continue
                seen.add(id(consumer))
                lines.append(f"{pad}↓ {_describe_node(index, consumer)}")
                if depth < hops:
                    visit(consumer, depth + 1)

    visit(start, 1)
    return lines


def softmax_context(model: onnx.ModelProto, *, up: int = 10, down: int = 4) -> str:
    """The report for every Softmax node of `model`, as text."""
    index = ContextIndex(model)
    blocks = []
    for node in index.nodes:
        if node.op_type != "Softmax":
            continue
        lines = [f"== {_describe_node(index, node)} {_describe_attributes(node) or 'axis=default'}"]
        lines += upstream_lines(index, node, up)
        lines.append("  --")
        lines += downstream_lines(index, node, down)
        blocks.append("\n".join(lines))
    header = f"{len(blocks)} Softmax node(s), {len(index.nodes)} nodes"
    return "\n\n".join([header, *blocks])


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--up", type=int, default=10, help="upstream hops (default 10)")
    parser.add_argument("--down", type=int, default=4, help="downstream hops (default 4)")
    parser.add_argument(
        "--first", type=int, default=None, help="print only the first N Softmax nodes per model"
    )
    args = parser.parse_args(None if argv is None else list(argv))
    for path in args.models:
        model = onnx.load(str(path))
        text = softmax_context(model, up=args.up, down=args.down)
        if args.first is not None:
            header, *blocks = text.split("\n\n")
            text = "\n\n".join([header, *blocks[: args.first]])
        print(f"##### {path}\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
