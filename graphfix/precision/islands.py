"""Decide which nodes run in float32 (the islands) and which in the target type.

Every node that reads or writes a float32 tensor gets one precision.  The rules, in order:
forced float32 nodes (the user's `keep`, the default op list, out-of-range constants, norm
statistics, angle arguments, control flow, unknown custom ops); then, to a fixed point, data
movement follows its producers (so two islands joined by a Reshape merge and no Cast pair is
created), nodes without float outputs (Shape, comparisons) follow their inputs, sources
(Constant, Cast from integers …) follow their consumers, and an attention chain takes one
precision as a whole.  Works on raw protobuf through `GraphIndex`: a 2,000-node UNet plans in
well under a second that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.graph.index import GraphIndex, node_label
from graphfix.precision import policy
from graphfix.precision.policy import Reason

FLOAT = onnx.TensorProto.FLOAT
_ANGLE_OPS = {"Sin", "Cos", "Exp"}
_ANGLE_PATH = {
    "Mul", "Div", "Add", "Sub", "MatMul", "Concat", "Unsqueeze", "Reshape", "Transpose", "Expand",
    "Cast", "Gather", "Slice", "Identity", "Neg", "Exp", "Squeeze", "Where", "Range",
}  # fmt: skip
_MAX_ANGLE_NODES = 40
_NORM_FORWARD = {"Add", "Sqrt", "Cast"}


@dataclass(frozen=True)
class Forced:
    """A node that must run in float32, and why."""

    reason: Reason
    detail: str


@dataclass(frozen=True)
class Plan:
    """Which node positions run in float32 and why; everything else float runs low."""

    float_nodes: frozenset[int]  # nodes touching float32 tensors
    high: frozenset[int]
    reasons: dict[int, Forced]
    blocks_high: tuple[int, ...]
    implicit_inputs: dict[int, tuple[str, ...]]  # outer-scope tensors read by subgraphs


class Planner:
    """Plans one top-level graph; `float_tensor(name)` says whether a tensor is float32."""

    def __init__(
        self, index: GraphIndex, matches: Sequence[AttentionMatch], *, inputs_float32: bool
    ) -> None:
        self.index = index
        self.inputs_float32 = inputs_float32
        self.graph = index.graph
        self.matches = tuple(m for m in matches if not m.location)  # the top-level graph's
        self._float: dict[str, bool] = {}
        self.implicit = {
            p: _implicit_inputs(n)
            for p, n in enumerate(self.graph.node)
            if any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in n.attribute
            )
        }

    def float_tensor(self, name: str) -> bool:
        # asked ~10 times per tensor while planning and applying; the index does not change
        known = self._float.get(name)
        if known is None:
            known = self._float[name] = self._is_float(name)
        return known

    def _is_float(self, name: str) -> bool:
        if not name:
            return False
        if self.index.elem_type(name) == FLOAT:
            return True
        producer = self.index.producer_of(name)
        # Plugin outputs are typed like their first input when shape inference cannot see them.
        return (
            producer is not None
            and producer.domain in policy.PLUGIN_DOMAINS
            and self.index.elem_type(name) is None
            and self.float_tensor(producer.input[0])
        )

    def float_inputs(self, position: int) -> list[str]:
        node = self.graph.node[position]
        names = [*node.input, *self.implicit.get(position, ())]
        return [i for i in names if self.float_tensor(i)]

    def float_outputs(self, position: int) -> list[str]:
        return [o for o in self.graph.node[position].output if self.float_tensor(o)]

    # --- forced float32 ---------------------------------------------------------------------
    def default_reasons(self, *, out_of_range: dict[str, float]) -> dict[int, Forced]:
        """Forced float32 nodes that follow from the graph alone (not from the user)."""
        reasons: dict[int, Forced] = {}
        for position, node in enumerate(self.graph.node):
            if not (self.float_inputs(position) or self.float_outputs(position)):
                continue
            if node.op_type in policy.CONTROL_FLOW_OPS or position in self.implicit:
                reasons[position] = Forced(
                    Reason.CONTROL_FLOW, f"{node.op_type} runs its subgraphs in float32"
                )
            elif node.domain not in ("", "ai.onnx") and node.domain not in policy.PLUGIN_DOMAINS:
                reasons[position] = Forced(
                    Reason.CUSTOM_OP, f"{node.domain}::{node.op_type}: float16 support unknown"
                )
            elif node.op_type in policy.FLOAT32_OPS:
                reasons[position] = Forced(
                    Reason.OP_DEFAULT, f"{node.op_type}: {policy.FLOAT32_OPS[node.op_type]}"
                )
            bad = [i for i in node.input if i in out_of_range]
            if bad and node.op_type != "Constant":
                reasons.setdefault(
                    position,
                    Forced(
                        Reason.OUT_OF_RANGE, f"reads {bad[0]} (max |x| {out_of_range[bad[0]]:.4g})"
                    ),
                )
        for position, detail in self.norm_statistics().items():
            reasons.setdefault(position, Forced(Reason.NORM, detail))
        for position, detail in self.angle_arguments(reasons).items():
            reasons.setdefault(position, Forced(Reason.ANGLE, detail))
        return reasons

    def norm_statistics(self) -> dict[int, str]:
        """Decomposed LayerNorm/RMSNorm statistics: the mean, x - mean, the square, the mean of
        squares, + eps and Sqrt (float16 sums of squares overflow).  The normalising Div/Mul
        stays low: its operands are in range."""
        found: dict[int, str] = {}
        index = self.index
        for position, node in enumerate(self.graph.node):
            if node.op_type != "ReduceMean" or not node.input:
                continue
            square = index.producer_of(node.input[0])
            if square is None or not _is_square(square, index):
                continue
            label = f"statistics of the norm around {node_label(node, position)}"
            members = [square, node]
            centred = index.producer_of(square.input[0])
            if centred is not None and centred.op_type == "Sub" and len(centred.input) == 2:
                mean = index.producer_of(centred.input[1])
                if mean is not None and mean.op_type == "ReduceMean":
                    members += [mean, centred]  # one island: x is cast up once
            members += self._norm_tail(node)
            for member in members:
                found.setdefault(index.position(member), label)
        return found

    def _norm_tail(self, variance: onnx.NodeProto) -> list[onnx.NodeProto]:
        """From the variance through + eps and Sqrt (single-consumer steps): a mean of squares
        overflows float16, its square root does not, so Reciprocal and the normalising
        Div/Mul stay low."""
        tail: list[onnx.NodeProto] = []
        current = variance
        for _ in range(4):
            consumers = self.index.consumers_of(current.output[0])
            if len(consumers) != 1 or consumers[0].op_type not in _NORM_FORWARD:
                break
            tail.append(consumers[0])
            current = consumers[0]
            if current.op_type == "Sqrt":
                break
        return tail

    def angle_arguments(self, reasons: dict[int, Forced]) -> dict[int, str]:
        """Nodes computing the argument of a float32 Sin/Cos/Exp from positions or timesteps
        (integer casts, ranges, constants, graph inputs of rank ≤ 1): rotary and timestep
        embeddings."""
        found: dict[int, str] = {}
        for position, node in enumerate(self.graph.node):
            if node.op_type not in _ANGLE_OPS or position not in reasons:
                continue
            members = self._angle_sources(node)
            label = f"computes the argument of {node_label(node, position)}"
            for member in members:
                found.setdefault(member, label)
        return found

    def _angle_sources(self, node: onnx.NodeProto) -> set[int]:
        index = self.index
        seen: set[int] = set()
        stack = [i for i in node.input if self.float_tensor(i)]
        while stack:
            name = stack.pop()
            producer = index.producer_of(name)
            if producer is None:
                rank = index.rank(name)
                if name in index.graph_inputs and (rank is None or rank > 1):
                    return set()  # activations, not a timestep or scalar
                continue  # an initializer, a timestep: a source
            position = index.position(producer)
            if position in seen:
                continue
            if producer.op_type not in _ANGLE_PATH or len(seen) >= _MAX_ANGLE_NODES:
                return set()  # fed by activations: not an embedding argument
            seen.add(position)
            stack += [i for i in producer.input if self.float_tensor(i)]
        return seen

    # --- propagation --------------------------------------------------------------------------
    def plan(self, forced: dict[int, Forced]) -> Plan:
        nodes = self.graph.node
        float_nodes = frozenset(
            p for p in range(len(nodes)) if self.float_inputs(p) or self.float_outputs(p)
        )
        high = set(forced) & float_nodes
        reasons = {p: r for p, r in forced.items() if p in float_nodes}
        blocks_high: set[int] = set()
        chains = [(m, frozenset(n.position for n in m.path) & float_nodes) for m in self.matches]
        sources = {p for p in float_nodes if not self._non_free_inputs(p) and self.float_outputs(p)}
        for _ in range(50):
            before = len(high)
            for match, chain in chains:
                inside = chain & high
                if inside and chain - high:
                    first = min(inside)
                    why = reasons.get(first, Forced(Reason.MERGED, "data movement"))
                    for p in chain - high:
                        reasons[p] = Forced(
                            Reason.ATTENTION,
                            f"attention block {match.index} kept whole ({why.reason.value}: {why.detail})",
                        )
                    high |= chain
                if chain and chain <= high:
                    blocks_high.add(match.index)
            for p in self._movement_between_islands(float_nodes, high, sources):
                high.add(p)
                reasons[p] = Forced(Reason.MERGED, "data movement between float32 nodes")
            for p in sorted(float_nodes - high - sources):
                inputs = self._non_free_inputs(p)
                if (
                    inputs
                    and not self.float_outputs(p)
                    and any(self._stored_high(i, high) for i in inputs)
                ):
                    high.add(p)  # Shape, comparisons: read float32 as it is
                    reasons[p] = Forced(Reason.MERGED, "reads a float32 tensor")
            for p in sorted(sources - high):
                consumers = {
                    self.index.position(c)
                    for o in self.float_outputs(p)
                    for c in self.index.consumers_of(o)
                }
                # Values made from integers or attributes go float32 for any float32 reader
                # (positions, masks: rounding them first would change them); data gathered from
                # a weight follows its readers only when all of them are float32.
                makes = nodes[p].op_type in policy.SOURCE_OPS or nodes[p].op_type == "Cast"
                if (consumers & high) if makes else (consumers and consumers <= high):
                    high.add(p)
                    reasons[p] = Forced(Reason.MERGED, "makes a value a float32 node reads")
            if len(high) == before:
                break
        return Plan(
            float_nodes=float_nodes,
            high=frozenset(high),
            reasons={p: reasons[p] for p in high},
            blocks_high=tuple(sorted(blocks_high)),
            implicit_inputs=self.implicit,
        )

    def _movement_between_islands(
        self, float_nodes: frozenset[int], high: set[int], sources: set[int]
    ) -> set[int]:
        """Data-movement nodes all of whose float producers and consumers are float32 (or
        float32 graph I/O), taking chains of them (Reshape → Transpose) as one."""
        nodes = self.graph.node
        kept_outputs = self.index.graph_outputs if self.inputs_float32 else set()
        candidates = {
            p for p in float_nodes - high - sources
            if nodes[p].op_type in policy.MOVEMENT_OPS and self.float_outputs(p)
        }  # fmt: skip
        changed = True
        while changed and candidates:
            changed = False
            for p in sorted(candidates):
                ok = (
                    all(
                        self._stored_high(i, high) or self._producer_in(i, candidates)
                        for i in self._non_free_inputs(p)
                    )
                    and all(
                        self.index.position(c) in high or self.index.position(c) in candidates
                        for o in self.float_outputs(p)
                        for c in self.index.consumers_of(o)
                    )
                    and all(
                        self.index.consumers_of(o) or o in kept_outputs
                        for o in self.float_outputs(p)
                    )
                    and all(
                        o in kept_outputs
                        for o in self.float_outputs(p)
                        if o in self.index.graph_outputs
                    )
                )
                if not ok:
                    candidates.discard(p)
                    changed = True
        return candidates

    def _producer_in(self, name: str, positions: set[int]) -> bool:
        producer = self.index.producer_of(name)
        return producer is not None and self.index.position(producer) in positions

    def _non_free_inputs(self, position: int) -> list[str]:
        """Float inputs made by other nodes or graph inputs (initializers adapt to consumers)."""
        free = self.index.initializers  # a dict by name: no set built per call (2,000 nodes)
        return [i for i in self.float_inputs(position) if i not in free]

    def _stored_high(self, name: str, high: set[int]) -> bool:
        producer = self.index.producer_of(name)
        if producer is None:
            return name in self.index.graph_inputs and self.inputs_float32
        return self.index.position(producer) in high


def islands_of(plan: Plan, index: GraphIndex) -> list[list[int]]:
    """Connected groups of float32 nodes (joined by the float tensors they share)."""
    parent = {p: p for p in plan.high}

    def find(p: int) -> int:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    for p in plan.high:
        node = index.graph.node[p]
        for name in node.input:
            producer = index.producer_of(name)
            if producer is not None:
                q = index.position(producer)
                if q in parent:
                    parent[find(p)] = find(q)
    groups: dict[int, list[int]] = {}
    for p in sorted(plan.high):
        groups.setdefault(find(p), []).append(p)
    return sorted(groups.values(), key=lambda g: g[0])


def _is_square(node: onnx.NodeProto, index: GraphIndex) -> bool:
    if node.op_type == "Mul":
        return len(node.input) == 2 and node.input[0] == node.input[1]
    if node.op_type == "Pow" and len(node.input) == 2:
        exponent = index.constant_value(node.input[1])
        return exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0
    return False


def _implicit_inputs(node: onnx.NodeProto) -> tuple[str, ...]:
    """Outer-scope tensor names that `node`'s subgraphs read."""
    found: dict[str, None] = {}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for name in _outer_names(graph, set()):
                found.setdefault(name, None)
    return tuple(found)


def _outer_names(graph: onnx.GraphProto, bound: set[str]) -> Iterable[str]:
    local = set(bound) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.input:
            if name and name not in local:
                yield name
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                for name in _outer_names(sub, local):
                    if name not in local:
                        yield name
        local.update(node.output)
