"""Apply a precision Plan to a model: Casts at island borders, retyped attributes and values.

Casts go only where a tensor crosses between precisions (one per tensor and direction, shared by
its readers); float32 values computed from out-of-range constants are clipped to the target's
range where they are cast down (reported); identity Casts left by the retyping are dropped.
Raw protobuf: the plan's node positions index `model.graph.node` as planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from graphfix.errors import GraphfixError
from graphfix.graph.index import GraphIndex
from graphfix.precision import policy, weights
from graphfix.precision.islands import FLOAT, Plan, Planner

# Ops whose output keeps an input's huge magnitude (a -3.4e38 mask stays huge through them);
# Softmax, MatMul, norms … bring values back into range.
_CARRY_RANGE = {"Add", "Sub", "Mul", "Div", "Min", "Max", "Neg", "Abs", "Sum"}
_RANDOM_DTYPE_DEFAULT_FLOAT = {"RandomNormal", "RandomUniform"}
_DTYPE_ATTR_OPS = {
    "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
}  # fmt: skip


@dataclass
class _Cast:
    source: str
    output: str
    to: int
    up: bool  # to float32
    producer: int | None  # position of the node making `source` (None: graph input/initializer)
    first_consumer: int


@dataclass
class PlanApplier:
    """Applies a Plan to `model` in place (the caller's copy)."""

    model: onnx.ModelProto
    index: GraphIndex
    planner: Planner
    plan: Plan
    to: str
    keep_io_types: bool
    out_of_range: set[str]
    casts: list[_Cast] = field(default_factory=list)
    low_initializers: dict[str, str] = field(default_factory=dict)  # float32 name → target name
    high_initializers: set[str] = field(default_factory=set)
    duplicated: int = 0
    removed_casts: int = 0
    saturated: list[str] = field(default_factory=list)
    _limits: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        self.target = weights.TARGETS[self.to]
        self.names = {n.name for n in self.model.graph.node}
        for node in self.model.graph.node:
            self.names.update(node.input)
            self.names.update(node.output)
        self.names.update(t.name for t in self.model.graph.initializer)
        self.names.update(v.name for v in self.model.graph.input)

    def unique(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def is_low(self, position: int) -> bool:
        return position in self.plan.float_nodes and position not in self.plan.high

    def apply(self) -> None:
        graph = self.model.graph
        self.tainted = self._taint(self.out_of_range)
        storage_low = self._storage()
        self._plan_initializers()
        output_casts = self._rename_outputs(storage_low)
        cache: dict[tuple[str, int], str] = {}
        new_nodes: list[onnx.NodeProto] = []
        for position, node in enumerate(graph.node):
            if position in self.plan.float_nodes:
                low = self.is_low(position)
                for slot, name in enumerate(node.input):
                    node.input[slot] = self._input_for(
                        name, low, position, storage_low, cache, new_nodes
                    )
                for name in self.plan.implicit_inputs.get(position, ()):
                    if self.planner.float_tensor(name):
                        renamed = self._input_for(
                            name, False, position, storage_low, cache, new_nodes
                        )
                        if renamed != name:
                            _rename_in_subgraphs(node, name, renamed)
                if low:
                    self._retype_attributes(node)
            new_nodes.append(node)
        new_nodes.extend(output_casts)
        del graph.node[:]
        graph.node.extend(new_nodes)
        self._retype_values(storage_low)
        self._drop_identity_casts(storage_low)

    def _storage(self) -> dict[str, bool]:
        """Float tensor → stored in the target type (True) or float32 (False)."""
        storage: dict[str, bool] = {}
        for vi in self.model.graph.input:
            if vi.name in self.index.graph_inputs and self.planner.float_tensor(vi.name):
                storage[vi.name] = not self.keep_io_types
        for position in self.plan.float_nodes:
            node = self.model.graph.node[position]
            stash = policy.FLOAT32_OUTPUT_SLOTS.get(node.op_type, frozenset())
            for slot, name in enumerate(node.output):
                if self.planner.float_tensor(name):
                    storage[name] = self.is_low(position) and slot not in stash
        return storage

    def _plan_initializers(self) -> None:
        users_low: set[str] = set()
        for position in self.plan.float_nodes:
            node = self.model.graph.node[position]
            reads = [*node.input, *self.plan.implicit_inputs.get(position, ())]
            for name in reads:
                if name in self.index.initializers and self.planner.float_tensor(name):
                    if self.is_low(position) and name in node.input:
                        users_low.add(name)
                    else:
                        self.high_initializers.add(name)
        graph_outputs = {o.name for o in self.model.graph.output}
        for name in users_low:
            if name in self.index.graph_inputs or name in self.out_of_range:
                continue
            keep_float = name in self.high_initializers or name in graph_outputs
            self.low_initializers[name] = self.unique(f"{name}_{self.to}") if keep_float else name
            self.duplicated += keep_float

    def _rename_outputs(self, storage_low: dict[str, bool]) -> list[onnx.NodeProto]:
        """Graph outputs stored in the other precision: the producer writes a renamed tensor and
        a Cast at the end writes the output's own name."""
        casts: list[onnx.NodeProto] = []
        renames: dict[str, str] = {}
        for vi in self.model.graph.output:
            name = vi.name
            if name not in storage_low or self.index.producer_of(name) is None:
                continue
            want_low = not self.keep_io_types
            if storage_low[name] == want_low:
                continue
            internal = self.unique(f"{name}_{self.to if storage_low[name] else 'float32'}")
            renames[name] = internal
            storage_low[internal] = storage_low[name]
            casts.append(
                self._cast(
                    internal,
                    name,
                    low=want_low,
                    node_name=self.unique(f"{name}_cast"),
                    producer=self.index.position(self.index.producer_of(name)),
                    first_consumer=len(self.model.graph.node),
                )
            )
        if renames:
            for node in self.model.graph.node:
                for slot, name in enumerate(node.output):
                    node.output[slot] = renames.get(name, name)
                for slot, name in enumerate(node.input):
                    node.input[slot] = renames.get(name, name)
                for old, new in renames.items():
                    _rename_in_subgraphs(node, old, new)
            for vi in self.model.graph.value_info:
                vi.name = renames.get(vi.name, vi.name)
        self._renamed_outputs = renames
        return casts

    def _input_for(
        self,
        name: str,
        low: bool,
        position: int,
        storage_low: dict[str, bool],
        cache: dict[tuple[str, int], str],
        new_nodes: list[onnx.NodeProto],
    ) -> str:
        if not self.planner.float_tensor(name) and not self._is_renamed_float(name, storage_low):
            return name
        if name in self.index.initializers:
            if low and name in self.low_initializers:
                return self.low_initializers[name]
            if not low:
                return name
            have_low = False  # an initializer that stays float32 (e.g. out of range)
        else:
            if name not in storage_low:
                return name
            have_low = storage_low[name]
        if have_low == low:
            return name
        to = self.target if low else FLOAT
        key = (name, to)
        if key not in cache:
            output = self.unique(f"{name}_to_{'float32' if not low else self.to}")
            cache[key] = output
            source = name
            if low and name in self.tainted:
                source = self._saturate(name, new_nodes)
            producer = self.index.producer_of(name)
            new_nodes.append(
                self._cast(
                    name,
                    output,
                    low=low,
                    node_name=self.unique(f"{output}_cast"),
                    producer=None if producer is None else self.index.position(producer),
                    first_consumer=position,
                    reads=source,
                )
            )
            storage_low[output] = low
        return cache[key]

    def _cast(
        self,
        source: str,
        output: str,
        *,
        low: bool,
        node_name: str,
        producer: int | None,
        first_consumer: int,
        reads: str | None = None,
    ) -> onnx.NodeProto:
        """A Cast of `source` (reading `reads`, its clipped copy, where given) to the target type
        (`low`) or to float32, recorded in `self.casts`."""
        to = self.target if low else FLOAT
        self.casts.append(_Cast(source, output, to, not low, producer, first_consumer))
        return helper.make_node("Cast", [reads or source], [output], name=node_name, to=to)

    def _saturate(self, name: str, new_nodes: list[onnx.NodeProto]) -> str:
        """Clip a float32 value derived from an out-of-range constant to the target's finite
        range before it is cast down: a -3.4e38 mask then reads -65504, as float16 exports
        write it, instead of -inf (a fully masked row would turn NaN).  Reported."""
        if self._limits is None:
            limit = weights.LIMITS[self.to]
            low_name, high_name = self.unique(f"{self.to}_lowest"), self.unique(f"{self.to}_max")
            self.model.graph.initializer.extend([
                onnx.numpy_helper.from_array(np.array(-limit, np.float32), low_name),
                onnx.numpy_helper.from_array(np.array(limit, np.float32), high_name),
            ])  # fmt: skip
            self._limits = (low_name, high_name)
        clipped = self.unique(f"{name}_saturated")
        new_nodes.append(
            helper.make_node(
                "Clip", [name, *self._limits], [clipped], name=self.unique(f"{clipped}_clip")
            )
        )
        self.saturated.append(name)
        info = onnx.ValueInfoProto()
        source_info = self.index.value_info.get(name)
        if source_info is not None:
            info.CopyFrom(source_info)
        info.name = clipped
        info.type.tensor_type.elem_type = FLOAT
        self.model.graph.value_info.append(info)
        return clipped

    def _taint(self, out_of_range: set[str]) -> set[str]:
        """Tensors that may hold values beyond the target's range: out-of-range constants and
        what float32 nodes compute from them."""
        tainted = set(out_of_range)
        for position, node in enumerate(self.model.graph.node):
            carries = node.op_type in policy.MOVEMENT_OPS or node.op_type in _CARRY_RANGE
            if carries and position in self.plan.float_nodes and not self.is_low(position):
                if any(i in tainted for i in node.input):
                    tainted.update(o for o in node.output if self.planner.float_tensor(o))
        return tainted

    def _is_renamed_float(self, name: str, storage_low: dict[str, bool]) -> bool:
        return name in storage_low

    def _retype_attributes(self, node: onnx.NodeProto) -> None:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == FLOAT:
                attr.i = self.target
            elif node.op_type in _DTYPE_ATTR_OPS and attr.name == "dtype" and attr.i == FLOAT:
                attr.i = self.target
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
                attr.t.CopyFrom(weights.convert_in_memory(attr.t, self.to, attr.t.name))
        if node.op_type in _RANDOM_DTYPE_DEFAULT_FLOAT and not any(
            a.name == "dtype" for a in node.attribute
        ):
            node.attribute.append(helper.make_attribute("dtype", self.target))
        if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
            # no `value`: float32 zeros (`torch.zeros`/`new_zeros` exports); zeros of the target
            zero = onnx.numpy_helper.from_array(np.zeros(1, np.float32))
            node.attribute.append(
                helper.make_attribute("value", weights.convert_in_memory(zero, self.to, ""))
            )
        if node.op_type == "Constant":
            for attr in list(node.attribute):
                if attr.name in ("value_float", "value_floats"):
                    values = np.asarray(helper.get_attribute_value(attr), dtype=np.float32)
                    node.attribute.remove(attr)
                    tensor = onnx.numpy_helper.from_array(values)
                    node.attribute.append(
                        helper.make_attribute(
                            "value", weights.convert_in_memory(tensor, self.to, "")
                        )
                    )

    def _retype_values(self, storage_low: dict[str, bool]) -> None:
        graph = self.model.graph
        low = {name for name, is_low in storage_low.items() if is_low}
        for vi in graph.value_info:
            if vi.name in low and vi.type.tensor_type.elem_type == FLOAT:
                vi.type.tensor_type.elem_type = self.target
        known = {vi.name for vi in graph.value_info}
        for cast in self.casts:
            source_info = self.index.value_info.get(cast.source) or self.index.value_info.get(
                next((k for k, v in self._renamed_outputs.items() if v == cast.source), cast.source)
            )
            if cast.output in known or cast.output in {o.name for o in graph.output}:
                continue
            info = onnx.ValueInfoProto()
            if source_info is not None:
                info.CopyFrom(source_info)
            info.name = cast.output
            info.type.tensor_type.elem_type = cast.to
            graph.value_info.append(info)
        for name, internal in self._renamed_outputs.items():
            original = self.index.value_info.get(name)
            if original is not None and internal not in known:
                info = onnx.ValueInfoProto()
                info.CopyFrom(original)
                info.name = internal
                info.type.tensor_type.elem_type = self.target if storage_low[internal] else FLOAT
                graph.value_info.append(info)
        if not self.keep_io_types:
            for vi in (*graph.input, *graph.output):
                if (
                    vi.type.tensor_type.elem_type == FLOAT
                    and vi.name not in self.index.initializers
                ):
                    vi.type.tensor_type.elem_type = self.target

    def _drop_identity_casts(self, storage_low: dict[str, bool]) -> None:
        """Original Casts that now cast a tensor to its own type (float32 → float32 became
        target → target) are removed; their consumers read the input directly."""
        graph = self.model.graph
        types = {vi.name: vi.type.tensor_type.elem_type for vi in (*graph.input, *graph.value_info)}
        types.update({t.name: t.data_type for t in graph.initializer})
        types.update({n: self.target if low else FLOAT for n, low in storage_low.items()})
        outputs = {o.name for o in graph.output}
        replace: dict[str, str] = {}
        kept: list[onnx.NodeProto] = []
        for node in graph.node:
            for slot, name in enumerate(node.input):
                node.input[slot] = replace.get(name, name)
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if (
                node.op_type == "Cast"
                and node.domain in ("", "ai.onnx")
                and types.get(node.input[0]) == to
                and to in (self.target, FLOAT)
                and node.output[0] not in outputs
            ):
                replace[node.output[0]] = node.input[0]
                self.removed_casts += 1
                continue
            kept.append(node)
        if replace:
            del graph.node[:]
            graph.node.extend(kept)
            for node in graph.node:
                for old, new in replace.items():
                    _rename_in_subgraphs(node, old, new)


def _rename_in_subgraphs(node: onnx.NodeProto, old: str, new: str) -> None:
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            if old in {i.name for i in graph.input} | {t.name for t in graph.initializer}:
                continue  # shadowed by the subgraph's own name
            for inner in graph.node:
                for slot, name in enumerate(inner.input):
                    if name == old:
                        inner.input[slot] = new
                _rename_in_subgraphs(inner, old, new)
            for vi in graph.output:
                if vi.name == old:
                    raise GraphfixError(
                        f"subgraph of {node.name or node.op_type} outputs outer tensor {old} "
                        "directly; graphfix cannot retype it — keep that node's inputs float32"
                    )
