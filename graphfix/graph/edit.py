"""Batched edits to one graph: node replacements, new outputs and initializers, fresh names."""

from __future__ import annotations

import onnx

from graphfix.graph.index import GraphIndex, outer_reads


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
        self._maybe_unused: set[str] = set()
        self._value_info: list[onnx.ValueInfoProto] = []
        self._names: set[str] = {n.name for n in model.graph.node}
        for node in model.graph.node:
            self._names.update(node.output)
            self._names.update(node.input)
        self._names.update(t.name for t in model.graph.initializer)
        self._names.update(v.name for v in model.graph.input)
        scope = index.outer
        while scope is not None:  # a subgraph's new names must not shadow enclosing ones
            self._names.update(scope.producer)
            self._names.update(scope.initializers)
            self._names.update(scope.graph_inputs)
            scope = scope.outer

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

    def annotate(self, tensor: str) -> None:
        """Record `tensor`'s known type and shape as value_info: shape inference cannot see
        through plugin nodes, and tools downstream (the reference lowering, ORT) need them."""
        graph = self.model.graph
        known = {v.name for v in (*graph.value_info, *graph.output, *graph.input)}
        info = self.index.value_info.get(tensor)
        if tensor not in known and info is not None and info.type.tensor_type.elem_type:
            self._value_info.append(info)

    def drop_if_unused(self, names: set[str]) -> None:
        """At commit, remove these initializers if no node or graph output still reads them."""
        self._maybe_unused |= names & set(self.index.initializers)

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
        graph.value_info.extend(self._value_info)
        if self._maybe_unused:
            used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
            used |= {name for n in graph.node for name in outer_reads(n)}  # If/Loop/Scan bodies
            unused = self._maybe_unused - used
            drop_initializers(graph, unused)
        self._replacements.clear()
        self._outputs.clear()
        self._initializers.clear()
        self._maybe_unused.clear()
        self._value_info.clear()


def drop_initializers(graph: onnx.GraphProto, names: set[str]) -> None:
    """Remove the initializers called `names` from `graph`, and the graph inputs of those names
    (models from IR < 4 list initializers as inputs too)."""
    kept = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    kept_inputs = [v for v in graph.input if v.name not in names]
    del graph.input[:]
    graph.input.extend(kept_inputs)
