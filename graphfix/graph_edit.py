"""Batched edits to one graph: node replacements, new outputs and initializers, fresh names."""

from __future__ import annotations

import onnx

from graphfix.graph_index import GraphIndex


class GraphEdit:
    """Collects edits against node positions of `index`, then applies them in one pass.

    Positions refer to the graph as indexed, so edits never shift one another; `commit` keeps
    every untouched node, initializer and attribute as it was.
    """

    def __init__(self, model: onnx.ModelProto, index: GraphIndex) -> None:
        self.model = model
        self.index = index
        self._replacements: dict[int, list[onnx.NodeProto]] = {}
        self._outputs: list[onnx.ValueInfoProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._names: set[str] = {n.name for n in model.graph.node}
        for node in model.graph.node:
            self._names.update(node.output)
            self._names.update(node.input)
        self._names.update(t.name for t in model.graph.initializer)
        self._names.update(v.name for v in model.graph.input)

    def node_at(self, position: int) -> onnx.NodeProto:
        return self.model.graph.node[position]

    def unique(self, base: str) -> str:
        name, n = base, 1
        while name in self._names:
            name = f"{base}_{n}"
            n += 1
        self._names.add(name)
        return name

    def replace(self, position: int, nodes: list[onnx.NodeProto]) -> None:
        if position in self._replacements:
            raise ValueError(f"node #{position} is already being replaced")
        self._replacements[position] = nodes

    def add_output(self, value_info: onnx.ValueInfoProto) -> None:
        self._outputs.append(value_info)

    def add_initializer(self, tensor: onnx.TensorProto) -> None:
        self._initializers.append(tensor)

    def commit(self) -> None:
        graph = self.model.graph
        if self._replacements:
            nodes: list[onnx.NodeProto] = []
            for position, node in enumerate(graph.node):
                nodes.extend(self._replacements.get(position, [node]))
            del graph.node[:]
            graph.node.extend(nodes)
        graph.output.extend(self._outputs)
        graph.initializer.extend(self._initializers)
        self._replacements.clear()
        self._outputs.clear()
        self._initializers.clear()
