"""Fuse decomposed LayerNorm, RMSNorm and GroupNorm chains into single standard ONNX ops.

TensorRT warns that a LayerNorm written as Reduce/Pow overflows in float16 and recommends
LayerNormalization (its INormalizationLayer, float32 inside).  `fuse_norms` rewrites each
chain the matchers find (norm_patterns.py, group_norm.py) into LayerNormalization (opset ≥ 17),
RMSNormalization (≥ 23) or GroupNormalization (≥ 21).  A norm the model's opset cannot express
is kept, and the report lists its nodes so precision conversion can keep them in float32.
Only the top-level graph is searched; norms inside If/Loop/Scan bodies are left as they are.

Graph access goes through GraphIndex/GraphEdit, the package's own view over the protobuf: on the
corpus's largest export (a diffusers UNet at opset 14, 993 nodes) GraphIndex takes 45 ms where
onnx-graphsurgeon's import_onnx alone takes 111 ms, and it already folds the small constants
(ε, axes, Gemma's 1 + weight) the checks need.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix.errors import UsageError
from graphfix.graph.edit import GraphEdit, drop_initializers
from graphfix.graph.index import GraphIndex, all_graphs
from graphfix.model_io import LoadedModel, load_model
from graphfix.precision.group_norm import find_group_norms
from graphfix.precision.norm_patterns import find_reduce_norms
from graphfix.precision.norm_types import NormCandidate, NormKind
from graphfix.precision.opset_upgrade import default_opset, upgrade_opset

# Fused ops already in a model, counted as found (onnxruntime's contrib ops included).
_EXISTING = {
    ("", "LayerNormalization"): NormKind.LAYER_NORM,
    ("", "RMSNormalization"): NormKind.RMS_NORM,
    ("", "GroupNormalization"): NormKind.GROUP_NORM,
    ("com.microsoft", "SkipLayerNormalization"): NormKind.LAYER_NORM,
    ("com.microsoft", "SimplifiedLayerNormalization"): NormKind.RMS_NORM,
    ("", "SimplifiedLayerNormalization"): NormKind.RMS_NORM,
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): NormKind.RMS_NORM,
}
_LAYER_NORM_OPSET = NormKind.LAYER_NORM.min_opset


@dataclass(frozen=True)
class FusedNorm:
    """A chain replaced by one node (`node`, writing the chain's output tensor `output`)."""

    kind: NormKind
    node: str
    op_type: str
    replaced: tuple[str, ...]
    input: str
    output: str
    epsilon: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnfusedNorm:
    """A norm left as it was.  `nodes` is the float32 island that keeps it as precise as fusing
    would: its statistics, up to the normalisation (Casts included), which the fused op computes
    in float32 through stash_type; the scale and bias after them run in the input's type there.
    `chain` is every node of the norm, scale and bias included.  `overflow` is the part of `nodes`
    whose values overflow 16 bits (an RMSNorm's x², mean, + ε and root; () when it is all of
    `nodes`); `epsilon` the norm's ε (None when not a constant), which decides whether the
    normalising Div/Mul after the root may run in 16 bits."""

    kind: NormKind
    nodes: tuple[str, ...]
    input: str
    output: str
    reason: str
    chain: tuple[str, ...] = ()
    overflow: tuple[str, ...] = ()
    epsilon: float | None = None


@dataclass(frozen=True)
class ExistingNorm:
    """A norm the model already expresses as one op."""

    kind: NormKind
    node: str
    op_type: str


@dataclass(frozen=True)
class NormFusionReport:
    fused: tuple[FusedNorm, ...]
    unfused: tuple[UnfusedNorm, ...]
    existing: tuple[ExistingNorm, ...]
    opset_before: int
    opset_after: int
    opset_note: str | None = None  # why the opset was (or was not) raised

    def found(self, kind: NormKind | str | None = None) -> int:
        """Norms of `kind` (all kinds when None) in the model: fused, kept or already one op."""
        items = (*self.fused, *self.unfused, *self.existing)
        return sum(kind is None or item.kind == NormKind(kind) for item in items)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind: how many were fused, kept (unfused) and already one op."""
        table = {}
        for kind in NormKind:
            row = {
                "fused": sum(f.kind is kind for f in self.fused),
                "unfused": sum(u.kind is kind for u in self.unfused),
                "existing": sum(e.kind is kind for e in self.existing),
            }
            if any(row.values()):
                table[kind.value] = row
        return table

    def summary(self) -> str:
        opset = f"opset {self.opset_before}"
        if self.opset_after != self.opset_before:
            opset += f" → {self.opset_after}"
        rows = [
            f"{kind}: {row['fused']} fused, {row['unfused']} kept, {row['existing']} already fused"
            for kind, row in self.counts().items()
        ]
        lines = [f"norm fusion ({opset}): " + ("; ".join(rows) if rows else "no norms found")]
        if self.opset_note:
            lines.append(f"  opset: {self.opset_note}")
        for f in self.fused:
            extra = f" ({'; '.join(f.notes)})" if f.notes else ""
            lines.append(
                f"  fused {f.kind.value} → {f.op_type} {f.node}: {len(f.replaced)} nodes{extra}"
            )
        for u in self.unfused:
            where = u.chain[-1] if u.chain else u.output
            lines.append(f"  kept  {u.kind.value} {where} ({len(u.chain)} nodes): {u.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["counts"] = self.counts()
        return _plain(data)


@dataclass(frozen=True)
class NormFusionResult:
    """The model with its norms fused (a new ModelProto) and what was done."""

    model: onnx.ModelProto
    report: NormFusionReport


def fuse_norms(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    opset: int | None = None,
) -> NormFusionResult:
    """Fuse every decomposed LayerNorm/RMSNorm/GroupNorm of `model` that its opset can express.

    `opset`: the default-domain opset the result may use (None: the model's own, raised to 17
    when that lets decomposed LayerNorms fuse).  An opset is raised only when no op in the model
    changes meaning between the versions; the report says why when it is not.  The caller's
    model is not mutated; unnamed nodes get names in the result, so the report can name them.
    """
    loaded = load_model(model, load_weights=False)
    work = onnx.ModelProto()
    work.CopyFrom(loaded.model)
    _name_unnamed(work.graph)
    before = default_opset(work)
    if opset is not None and opset < before:
        raise UsageError(
            f"opset {opset} is below the model's opset {before}; fuse_norms never lowers an "
            f"opset: pass opset={before} or more, or None"
        )
    newest = onnx.defs.onnx_opset_version()
    if opset is not None and opset > newest:
        raise UsageError(
            f"opset {opset} is newer than any this onnx {onnx.__version__} knows (up to "
            f"{newest}); pass an opset from the model's {before} to {newest}, e.g. 23 for "
            "RMSNormalization, or None"
        )
    existing = _existing(work.graph)
    index = GraphIndex(work, base_dir=loaded.base_dir)
    candidates = _find(index)
    wanted, note = _wanted_opset(candidates, before, opset)
    if wanted is not None and wanted > before:
        upgraded = upgrade_opset(work, wanted)
        if upgraded.model is None:
            note = f"kept opset {before}, not {wanted}: {upgraded.reason}"
        else:
            work = upgraded.model
            index = GraphIndex(work, base_dir=loaded.base_dir)
            candidates = _find(index)
    after = default_opset(work)
    fused, unfused = _rewrite(work, index, candidates, after, note)
    report = NormFusionReport(
        fused=fused,
        unfused=unfused,
        existing=existing,
        opset_before=before,
        opset_after=after,
        opset_note=note,
    )
    return NormFusionResult(model=work, report=report)


def _wanted_opset(
    candidates: list[NormCandidate], before: int, opset: int | None
) -> tuple[int | None, str | None]:
    """The opset to raise to (None: keep it) and the note that says why."""
    if opset is not None:
        return opset, (f"raised to {opset} as asked" if opset > before else None)
    layer_norms = [c for c in candidates if c.kind is NormKind.LAYER_NORM and c.problem is None]
    if before < _LAYER_NORM_OPSET and layer_norms:
        return _LAYER_NORM_OPSET, f"raised to {_LAYER_NORM_OPSET} for LayerNormalization"
    return None, None


def _rewrite(
    work: onnx.ModelProto,
    index: GraphIndex,
    candidates: list[NormCandidate],
    opset: int,
    note: str | None,
) -> tuple[tuple[FusedNorm, ...], tuple[UnfusedNorm, ...]]:
    """Replace every candidate the opset can express by its fused op, in place in `work`."""
    edit = GraphEdit(work, index)
    fused: list[FusedNorm] = []
    unfused: list[UnfusedNorm] = []
    removed: list[onnx.NodeProto] = []
    for candidate in candidates:
        reason = candidate.problem or _opset_reason(candidate.kind, opset, note)
        if reason is not None:
            unfused.append(
                UnfusedNorm(
                    kind=candidate.kind,
                    nodes=tuple(n for n in candidate.statistics if n),
                    input=candidate.input,
                    output=candidate.output,
                    reason=reason,
                    chain=tuple(n for n in candidate.node_names if n),
                    overflow=tuple(n for n in candidate.overflow if n),
                    epsilon=None if candidate.problem else candidate.epsilon,
                )
            )
            continue
        new_nodes = _fused_nodes(edit, candidate)
        last = max(candidate.positions)
        for position in candidate.positions:
            removed.append(edit.node_at(position))
            edit.replace(position, new_nodes if position == last else [])
        fused.append(
            FusedNorm(
                kind=candidate.kind,
                node=new_nodes[-1].name,
                op_type=new_nodes[-1].op_type,
                replaced=candidate.node_names,
                input=candidate.input,
                output=candidate.output,
                epsilon=candidate.epsilon,
                notes=candidate.notes,
            )
        )
    upstream = {i for n in removed for i in n.input if i}
    edit.commit()
    _sweep(work.graph, upstream)
    return tuple(fused), tuple(unfused)


def _opset_reason(kind: NormKind, opset: int, note: str | None) -> str | None:
    if opset >= kind.min_opset:
        return None
    reason = (
        f"opset {opset} model: {kind.op_type} needs opset {kind.min_opset}; kept, "
        "convert_precision keeps it as a float32 island"
    )
    return f"{reason} ({note})" if note and note.startswith("kept opset") else reason


def _find(index: GraphIndex) -> list[NormCandidate]:
    """Every norm chain in graph order.  A chain that shares a node with an earlier one (only
    possible among chains that already failed a check) is kept as it is, with a reason."""
    taken: set[int] = set()
    found = []
    for candidate in sorted(
        find_reduce_norms(index) + find_group_norms(index), key=lambda c: max(c.positions)
    ):
        if taken.isdisjoint(candidate.positions):
            taken.update(candidate.positions)
            found.append(candidate)
        else:
            problem = candidate.problem or "shares nodes with another norm"
            found.append(dataclasses.replace(candidate, problem=problem))
    return found


def _fused_nodes(edit: GraphEdit, candidate: NormCandidate) -> list[onnx.NodeProto]:
    """The fused op (last), after the Reshape a GroupNorm may need first."""
    kind = candidate.kind
    scopes = {n.rpartition("/")[0] for n in candidate.node_names if "/" in n}
    scope = scopes.pop() if len(scopes) == 1 else None
    name = edit.unique(f"{scope}/{kind.op_type}" if scope else f"{candidate.output}_{kind.op_type}")
    np_type = helper.tensor_dtype_to_np_dtype(candidate.dtype or onnx.TensorProto.FLOAT)
    if kind is NormKind.GROUP_NORM:
        shape: tuple[int, ...] = (candidate.channels or 0,)
    else:
        shape = candidate.normalized_shape or ()

    def tensor(affine, fill: float, role: str) -> str:
        if affine is not None and affine.tensor is not None:
            return affine.tensor
        value = (
            np.full(shape, fill, dtype=np_type) if affine is None else affine.value.astype(np_type)
        )
        init_name = edit.unique(f"{name}.{role}")
        edit.add_initializer(numpy_helper.from_array(value, init_name))
        return init_name

    before: list[onnx.NodeProto] = []
    x = candidate.input
    if candidate.reshape_to is not None:
        x = edit.unique(f"{name}.input")
        reshape = helper.make_node("Reshape", [candidate.input, candidate.reshape_to], [x])
        reshape.name = edit.unique(f"{name}/Reshape")
        before.append(reshape)
    inputs = [x, tensor(candidate.scale, 1.0, "scale")]
    if kind is NormKind.GROUP_NORM:
        inputs.append(tensor(candidate.bias, 0.0, "bias"))
        attrs = {"epsilon": candidate.epsilon, "num_groups": candidate.num_groups}
    else:
        if candidate.bias is not None:
            inputs.append(tensor(candidate.bias, 0.0, "bias"))
        attrs = {"axis": candidate.axis, "epsilon": candidate.epsilon}
    return [*before, helper.make_node(kind.op_type, inputs, [candidate.output], name=name, **attrs)]


def _existing(graph: onnx.GraphProto) -> tuple[ExistingNorm, ...]:
    found = []
    for node in graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        kind = _EXISTING.get((domain, node.op_type))
        if kind is not None:
            found.append(ExistingNorm(kind, node.name, node.op_type))
    return tuple(found)


def _name_unnamed(graph: onnx.GraphProto) -> None:
    taken = {n.name for n in graph.node}
    for position, node in enumerate(graph.node):
        if not node.name:
            name, n = f"{node.op_type}_{position}", 1
            while name in taken:
                name, n = f"{node.op_type}_{position}_{n}", n + 1
            node.name = name
            taken.add(name)


def _sweep(graph: onnx.GraphProto, upstream: set[str]) -> None:
    """Remove what fed only the replaced chains: nodes whose outputs nothing reads any more
    (Constants for ε and axes, a Gemma `1 + weight`, a Shape), then such initializers, then
    the value_info of every tensor no longer in the graph."""
    suspects, touched = set(upstream), set(upstream)
    while suspects:
        used = _read_tensors(graph)
        dead = [
            n
            for n in graph.node
            if not suspects.isdisjoint(n.output) and not any(o in used for o in n.output if o)
        ]
        if not dead:
            break
        suspects = {i for n in dead for i in n.input if i}
        touched |= suspects
        dead_ids = {id(n) for n in dead}
        kept = [n for n in graph.node if id(n) not in dead_ids]
        del graph.node[:]
        graph.node.extend(kept)
    used = _read_tensors(graph)
    unused = {t.name for t in graph.initializer if t.name in touched and t.name not in used}
    if unused:
        drop_initializers(graph, unused)
    made = {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    made |= {t.name for t in graph.initializer}
    if any(v.name not in made for v in graph.value_info):
        infos = [v for v in graph.value_info if v.name in made]
        del graph.value_info[:]
        graph.value_info.extend(infos)


def _read_tensors(graph: onnx.GraphProto) -> set[str]:
    """Tensors read by a node (subgraphs included, which may read outer names) or the graph output."""
    used = {o.name for o in graph.output}
    for g in all_graphs(graph):
        for node in g.node:
            used.update(node.input)
    used.discard("")
    return used


def _plain(value):
    """A JSON-ready copy: enums as their values, tuples as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, NormKind):
        return value.value
    return value
