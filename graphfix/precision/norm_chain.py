"""Small checks the norm matchers share: a chain's private tensors, sole consumers, constants."""

from __future__ import annotations

import onnx

from graphfix.graph.index import GraphIndex

_DEFAULT_DOMAINS = ("", "ai.onnx")


def check_private(
    index: GraphIndex, nodes: list[onnx.NodeProto], end: str, problems: list[str]
) -> None:
    """Every tensor made inside the chain is read only inside it."""
    inside = {id(n) for n in nodes}
    for node in nodes:
        for out in node.output:
            if out == end or not out:
                continue
            if out in index.graph_outputs:
                problems.append(f"intermediate {out} is a graph output")
                return
            for user in index.consumers_of(out):
                if id(user) not in inside:
                    problems.append(f"intermediate {out} also feeds {user.name or user.op_type}")
                    return


def sole_consumer(index: GraphIndex, tensor: str, op_type: str) -> onnx.NodeProto | None:
    """The one consumer of `tensor` when it is an `op_type` and `tensor` is not a graph output."""
    users = index.consumers_of(tensor)
    if len(users) != 1 or tensor in index.graph_outputs:
        return None
    user = users[0]
    return user if user.op_type == op_type and user.domain in _DEFAULT_DOMAINS else None


def other_input(node: onnx.NodeProto, tensor: str) -> str:
    a, b = node.input
    return b if a == tensor else a


def scalar_constant(index: GraphIndex, name: str) -> float | None:
    value = index.constant_value(name)
    if value is None or value.size != 1 or value.dtype.kind not in "fiu":
        return None
    return float(value.reshape(()))


def int_attr(node: onnx.NodeProto, name: str, default: int | None = None) -> int | None:
    for attr in node.attribute:
        if attr.name == name:
            return attr.i
    return default
