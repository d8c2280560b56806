"""`convert_precision`: a float32 model in float16 or bfloat16, with float32 islands where needed.

Islands are planned by `islands.Planner` (why each node stays float32); this module applies the
plan: Casts only where a tensor crosses between precisions (one per tensor and direction,
shared by its consumers), initializers converted once (duplicated when both precisions read
them), typed attributes retyped, value_info and graph I/O updated, weights on disk streamed.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import helper

from graphfix.attention.matcher import scan_graph
from graphfix.errors import GraphfixError, UsageError
from graphfix.graph.index import GraphIndex
from graphfix.model_io import LoadedModel, load_model
from graphfix.precision import policy, weights
from graphfix.precision.census import precision_census
from graphfix.precision.islands import FLOAT, Forced, Plan, Planner, islands_of
from graphfix.precision.policy import Reason
from graphfix.precision.report import (
    Island,
    IslandReason,
    OutOfRange,
    PrecisionReport,
    PrecisionResult,
)
from graphfix.selectors import parse_selectors, select_nodes

TARGETS = tuple(weights.TARGETS)
# Ops whose output keeps an input's huge magnitude (a -3.4e38 mask stays huge through them);
# Softmax, MatMul, norms … bring values back into range.
_CARRY_RANGE = {"Add", "Sub", "Mul", "Div", "Min", "Max", "Neg", "Abs", "Sum"}
_RANDOM_DTYPE_DEFAULT_FLOAT = {"RandomNormal", "RandomUniform"}
_DTYPE_ATTR_OPS = {
    "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
}  # fmt: skip


def convert_precision(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    to: str | None = None,
    keep: Sequence[str] | None = None,
    keep_io_types: bool | None = None,
    fuse_norms: bool | None = None,
    attention_strategy: str | None = None,
    external_data: str | os.PathLike[str] | None = None,
) -> PrecisionResult:
    """Convert a float32 model to `to` ("float16", the default, or "bfloat16").

    `keep`: selector texts (`graphfix.selectors`) for nodes that stay float32.  `keep_io_types`
    (default True) keeps float32 graph inputs and outputs.  `fuse_norms` (default True) first
    fuses decomposed norms (`graphfix.precision.norms`); norms left unfused become float32
    islands.  An attention block that must stay float32 is kept whole, or, with
    `attention_strategy` (a `graphfix fix` strategy such as "plugin"), rewritten so its softmax
    computes in float32 inside a plugin and the rest runs in `to`.

    A path (or a model loaded without weights) has its weights streamed into a new data file,
    `external_data` (default: a temporary folder that lives as long as the result); save the
    result with `graphfix.save_model(result.model, path, source=result.source)`.
    The caller's model is not mutated.
    """
    to = "float16" if to is None else to
    if to not in weights.TARGETS:
        raise UsageError(f"to={to!r} is not a target type; choose one of {', '.join(TARGETS)}")
    options = _Options(
        to=to,
        keep=keep,
        keep_io_types=True if keep_io_types is None else keep_io_types,
        fuse_norms=True if fuse_norms is None else fuse_norms,
        attention_strategy=attention_strategy,
        external_data=None if external_data is None else Path(external_data),
    )
    loaded = load_model(model, load_weights=False)
    known: dict[str, float] = {}
    while True:  # a big weight found beyond range while streaming: plan again with it known
        try:
            return _convert(loaded, options, known)
        except weights.OutOfRangeWeight as found:
            known[found.name] = found.biggest


@dataclass(frozen=True)
class _Options:
    to: str
    keep: Sequence[str] | None
    keep_io_types: bool
    fuse_norms: bool
    attention_strategy: str | None
    external_data: Path | None


def _convert(loaded: LoadedModel, options: _Options, known: dict[str, float]) -> PrecisionResult:
    to, keep, keep_io_types = options.to, options.keep, options.keep_io_types
    attention_strategy, external_data = options.attention_strategy, options.external_data
    work = onnx.ModelProto()
    work.CopyFrom(loaded.model)
    base_dir = loaded.base_dir

    norms_note, unfused = ("not run (fuse_norms=False)", ())
    if options.fuse_norms:
        work, norms_note, unfused = _fuse_norms(work)

    index = GraphIndex(work, base_dir=base_dir)
    out_of_range = {**_out_of_range(index, base_dir, to), **known}
    scan = scan_graph(index)
    user_keys = _user_keep(work, keep, scan.matches)
    planner = Planner(index, scan.matches, inputs_float32=keep_io_types)
    plan = planner.plan(_forced(planner, index, out_of_range, unfused, user_keys))
    blocks_total = len(scan.matches)
    rewritten: tuple[int, ...] = ()
    if attention_strategy is not None and plan.blocks_high:
        work, rewritten, user_keys = _rewrite_blocks(
            work, loaded, scan.matches, plan.blocks_high, attention_strategy, user_keys
        )
        index = GraphIndex(work, base_dir=base_dir)
        planner = Planner(index, scan_graph(index).matches, inputs_float32=keep_io_types)
        plan = planner.plan(_forced(planner, index, out_of_range, unfused, user_keys))

    rewrite = _Rewrite(
        work,
        index,
        planner,
        plan,
        to=to,
        keep_io_types=keep_io_types,
        out_of_range=set(out_of_range),
    )
    before = _Snapshot.of(index, plan, out_of_range)
    rewrite.apply()
    source = _place_weights(rewrite, base_dir, external_data)
    report = _report(
        rewrite,
        before,
        out_of_range,
        blocks_total=blocks_total,
        blocks_high=tuple(b for b in plan.blocks_high if b not in rewritten),
        rewritten=rewritten,
        attention_strategy=attention_strategy,
        norms_note=norms_note,
    )
    result = PrecisionResult(model=work, report=report, source=source)
    if source is not None and external_data is None:
        weakref.finalize(result, shutil.rmtree, source.parent, True)
    return result


# --- inputs to the plan ------------------------------------------------------------------------
def _fuse_norms(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str, tuple[tuple[str, str], ...]]:
    """Fuse decomposed norms when `graphfix.precision.norms` is present; the norms it leaves
    unfused come back as (node name, reason) pairs and become float32 islands."""
    try:
        norms = importlib.import_module("graphfix.precision.norms")
    except ModuleNotFoundError as exc:  # the norms module is not in this build (yet)
        if exc.name != "graphfix.precision.norms":
            raise
        return model, "norm fusion not available in this build; decomposed norms kept float32", ()

    result = norms.fuse_norms(model)
    report = result.report
    unfused: list[tuple[str, str]] = []
    for entry in getattr(report, "unfused", ()):
        reason = str(getattr(entry, "reason", "not fused"))
        for name in getattr(entry, "nodes", ()):
            unfused.append((name, reason))
    summary = report.summary() if hasattr(report, "summary") else str(report)
    return result.model, summary.splitlines()[0] if summary else "fused", tuple(unfused)


def _out_of_range(index: GraphIndex, base_dir: Path | None, to: str) -> dict[str, float]:
    """Float32 constants (initializers, Constant and ConstantOfShape values) beyond `to`'s range.

    Large weights on disk are checked while they are streamed (`weights.deferred_check`);
    `known` holds those found beyond range by an earlier attempt."""
    limit = weights.LIMITS[to]
    found: dict[str, float] = {}
    for tensor in index.graph.initializer:
        if tensor.data_type == FLOAT and not weights.deferred_check(tensor):
            biggest = weights.max_abs(tensor, base_dir)
            if biggest > limit:
                found[tensor.name] = biggest
    for node in index.graph.node:
        if node.op_type not in ("Constant", "ConstantOfShape"):
            continue
        for attr in node.attribute:
            values = None
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
                values = onnx.numpy_helper.to_array(attr.t)
            elif attr.name in ("value_float", "value_floats"):
                values = onnx.helper.get_attribute_value(attr)
            if values is not None:
                import numpy as np

                array = np.asarray(values, dtype=np.float32)
                finite = np.abs(array[np.isfinite(array)])
                if finite.size and float(finite.max()) > limit:
                    found[node.output[0]] = float(finite.max())
    return found


def _user_keep(
    model: onnx.ModelProto, keep: Sequence[str] | None, matches: Sequence
) -> dict[str, str]:
    """Node keys (name, or first output for unnamed nodes) the user keeps → the selector text."""
    if not keep:
        return {}
    if isinstance(keep, str):
        keep = [keep]
    selection = select_nodes(model, parse_selectors(keep), matches=matches)
    keys: dict[str, str] = {}
    for hit in selection.hits:
        for position in hit.positions:
            keys.setdefault(_key(model.graph.node[position]), hit.selector.text)
    return keys


def _key(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def _forced(
    planner: Planner,
    index: GraphIndex,
    out_of_range: dict[str, float],
    unfused: Sequence[tuple[str, str]],
    user_keys: dict[str, str],
) -> dict[int, Forced]:
    forced = planner.default_reasons(out_of_range=out_of_range)
    by_name = {n.name: p for p, n in enumerate(index.graph.node) if n.name}
    for name, reason in unfused:
        if name in by_name:
            forced[by_name[name]] = Forced(Reason.NORM, f"norm not fused: {reason}")
    for position, node in enumerate(index.graph.node):
        text = user_keys.get(_key(node))
        if text is not None:
            forced[position] = Forced(Reason.KEEP, f"kept by selector {text!r}")
    return forced


def _rewrite_blocks(
    work: onnx.ModelProto,
    loaded: LoadedModel,
    matches: Sequence,
    blocks: Sequence[int],
    strategy: str,
    user_keys: dict[str, str],
) -> tuple[onnx.ModelProto, tuple[int, ...], dict[str, str]]:
    """Rewrite the float32 attention blocks with `strategy`; their plugin computes in float32,
    so the rewritten block runs in the target type (the user's keeps inside it are dropped)."""
    from graphfix.attention.rewrite import fix_attention

    fixed = fix_attention(
        LoadedModel(model=work, path=loaded.path, weights_loaded=loaded.weights_loaded),
        strategy=strategy,
        select=list(blocks),
    )
    done = tuple(b.index for b in fixed.report.blocks if b.rewritten)
    inside = {
        _key(work.graph.node[p]) for m in matches if m.index in done for p in m.chain_positions
    }
    return fixed.model, done, {k: v for k, v in user_keys.items() if k not in inside}


# --- applying the plan -------------------------------------------------------------------------
@dataclass
class _Cast:
    source: str
    output: str
    to: int
    up: bool  # to float32
    producer: int | None  # position of the node making `source` (None: graph input/initializer)
    first_consumer: int


@dataclass
class _Rewrite:
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
            to = self.target if want_low else FLOAT
            casts.append(
                helper.make_node(
                    "Cast", [internal], [name], name=self.unique(f"{name}_cast"), to=to
                )
            )
            producer = self.index.producer_of(name)
            self.casts.append(
                _Cast(
                    internal,
                    name,
                    to,
                    not want_low,
                    self.index.position(producer),
                    len(self.model.graph.node),
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
            new_nodes.append(
                helper.make_node(
                    "Cast", [source], [output], name=self.unique(f"{output}_cast"), to=to
                )
            )
            producer = self.index.producer_of(name)
            self.casts.append(
                _Cast(
                    name,
                    output,
                    to,
                    not low,
                    None if producer is None else self.index.position(producer),
                    position,
                )
            )
            storage_low[output] = low
        return cache[key]

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
        if node.op_type == "Constant":
            for attr in list(node.attribute):
                if attr.name in ("value_float", "value_floats"):
                    import numpy as np

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


# --- weights -----------------------------------------------------------------------------------
def _place_weights(
    rewrite: _Rewrite,
    base_dir: Path | None,
    external_data: Path | None,
) -> Path | None:
    """Convert initializers once each; weights on disk are streamed into a new data file.
    Returns the .onnx path the result's external data is relative to (None: all in memory)."""
    on_disk = any(weights.is_external(t) for t in _all_tensors(rewrite.model))
    if not on_disk:
        _write_initializers(rewrite, base_dir, None, None)
        return None
    folder = None
    if external_data is None:
        folder = Path(tempfile.mkdtemp(prefix="graphfix-precision-"))
        data_file = folder / "model.onnx.data"
    else:
        data_file = external_data
        data_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(data_file, "xb") as stream:
            _write_initializers(rewrite, base_dir, stream, data_file.name)
    except BaseException:
        data_file.unlink(missing_ok=True)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    name = data_file.name
    source = data_file.parent / (
        name.removesuffix(".data") if name.endswith(".onnx.data") else "model.onnx"
    )
    with open(source, "wb") as handle:
        handle.write(rewrite.model.SerializeToString())
    return source


def _write_initializers(
    rewrite: _Rewrite, base_dir: Path | None, stream: BinaryIO | None, location: str | None
) -> None:
    """Each initializer once: as it is (float32 readers), in the target type (low readers),
    or both; external ones streamed to `stream`, tensor by tensor."""
    if stream is None:
        _replace_initializers(rewrite, None)
        return
    with weights.Streamer(stream, location, base_dir) as streamer:
        _replace_initializers(rewrite, streamer)
        for tensor in _all_tensors(rewrite.model):  # tensors in subgraphs and attributes
            if weights.is_external(tensor) and _location(tensor) != location:
                copy = onnx.TensorProto()
                copy.CopyFrom(tensor)
                streamer.write(copy, tensor, None)


def _replace_initializers(rewrite: _Rewrite, streamer: weights.Streamer | None) -> None:
    graph = rewrite.model.graph
    new: list[onnx.TensorProto] = []
    for tensor in list(graph.initializer):
        low_name = rewrite.low_initializers.get(tensor.name)
        on_disk = streamer is not None and weights.is_external(tensor)
        if low_name is None or low_name != tensor.name:  # float32 readers keep it as it is
            if on_disk:
                copy = onnx.TensorProto()
                copy.CopyFrom(tensor)
                streamer.write(tensor, copy, None)
                new.append(copy)
            else:
                new.append(tensor)
        if low_name is not None:
            if on_disk:
                converted = onnx.TensorProto(
                    name=low_name, dims=tensor.dims, data_type=rewrite.target
                )
                streamer.write(tensor, converted, rewrite.to)
            else:
                converted = weights.convert_in_memory(tensor, rewrite.to, low_name)
            new.append(converted)
    del graph.initializer[:]
    graph.initializer.extend(new)


def _all_tensors(model: onnx.ModelProto):
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


# --- report ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Snapshot:
    """What the report needs from the graph as planned (positions change once Casts go in)."""

    labels: tuple[str, ...]
    op_types: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    consumers: dict[str, tuple[str, ...]]

    @staticmethod
    def of(index: GraphIndex, plan: Plan, out_of_range: dict[str, float]) -> _Snapshot:
        nodes = index.graph.node
        labels = tuple(n.name or f"#{p}" for p, n in enumerate(nodes))
        return _Snapshot(
            labels=labels,
            op_types=tuple(n.op_type for n in nodes),
            groups=tuple(tuple(g) for g in islands_of(plan, index)),
            consumers={
                name: tuple(labels[index.position(c)] for c in index.consumers_of(name))
                for name in out_of_range
            },
        )


def _report(
    rewrite: _Rewrite,
    before: _Snapshot,
    out_of_range: dict[str, float],
    *,
    blocks_total: int,
    blocks_high: tuple[int, ...],
    rewritten: tuple[int, ...],
    attention_strategy: str | None,
    norms_note: str,
) -> PrecisionReport:
    plan = rewrite.plan
    islands: list[Island] = []
    for number, group in enumerate(before.groups):
        members = set(group)
        by_reason: dict[tuple[Reason, str], list[str]] = {}
        for p in group:
            forced = plan.reasons[p]
            by_reason.setdefault((forced.reason, forced.detail), []).append(before.labels[p])
        reasons = sorted(by_reason.items(), key=lambda item: item[0][0] is Reason.MERGED)
        islands.append(
            Island(
                index=number,
                nodes=tuple(before.labels[p] for p in group),
                reasons=tuple(IslandReason(r, d, tuple(n)) for (r, d), n in reasons),
                casts_in=sum(c.up and c.first_consumer in members for c in rewrite.casts),
                casts_out=sum(not c.up and c.producer in members for c in rewrite.casts),
            )
        )
    census = precision_census(rewrite.model)
    return PrecisionReport(
        to=rewrite.to,
        keep_io_types=rewrite.keep_io_types,
        islands=tuple(islands),
        out_of_range=tuple(
            OutOfRange(name, value, weights.LIMITS[rewrite.to], before.consumers[name])
            for name, value in out_of_range.items()
        ),
        compute_nodes=census.compute - census.untyped,
        compute_nodes_low=census.compute - census.untyped - census.float32,
        casts_added=len(rewrite.casts),
        initializers_converted=len(rewrite.low_initializers),
        initializers_duplicated=rewrite.duplicated,
        attention_blocks=blocks_total,
        attention_blocks_float32=blocks_high,
        attention_blocks_rewritten=rewritten,
        attention_strategy=attention_strategy,
        norms=norms_note,
        saturated=tuple(rewrite.saturated),
    )
