"""Make a rewritten model's declared types agree with its nodes (value_info and graph outputs).

Exporters (torch's dynamo exporter above all) annotate most tensors with `value_info`, and a
rewrite that changes a tensor's type (float32 → float16, a new producer) leaves the old
annotation behind: `onnx.checker.check_model(full_check=True)`, strict shape inference and
onnxruntime then refuse the model ("Inferred elem type differs from existing elem type").  Every
writer (`fix`, `precision`, `locate --apply`, `qdq fix`) runs `reconcile_value_info` on the model
it made: each annotation is checked against what ONNX shape inference infers from the nodes
alone, and is retyped where the two disagree, or dropped where inference cannot tell, unless a node
inference cannot see through (a custom op) produces it, for which it is the only type there is.
graphfix's own plugin nodes are seen through: inference runs on their reference lowering
(`graphfix.plugins.reference`), whose tensors keep the plugin's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import defs

from graphfix.errors import UnsupportedModelError
from graphfix.graph.index import GraphIndex, all_graphs


@dataclass(frozen=True)
class ValueInfoRepair:
    """What `reconcile_value_info` changed (tensor names)."""

    retyped: tuple[str, ...] = ()  # value_info whose element type or shape now matches its node
    dropped: tuple[str, ...] = ()  # value_info inference could not confirm, removed
    outputs_retyped: tuple[str, ...] = ()  # graph outputs declared with another element type

    @property
    def modified(self) -> bool:
        return bool(self.retyped or self.dropped or self.outputs_retyped)


def reconcile_value_info(
    model: onnx.ModelProto, *, base_dir: str | Path | None = None
) -> ValueInfoRepair:
    """Retype or drop, in place, the `value_info` entries (every graph and subgraph) and graph
    output types of `model` that disagree with what its nodes compute.

    `base_dir`: the folder external data is relative to (small constants such as shapes are read
    from it; weights are never loaded).
    """
    inferred = _inferred_types(model, None if base_dir is None else Path(base_dir))
    retyped: list[str] = []
    dropped: list[str] = []
    for graph in all_graphs(model.graph):
        producers = {o: n for n in graph.node for o in n.output if o}
        initializers = {t.name: t for t in graph.initializer}
        kept: list[onnx.ValueInfoProto] = []
        for info in graph.value_info:
            name = info.name
            if name in initializers:
                if _agree_with_tensor(info, initializers[name]):
                    kept.append(info)
                else:
                    dropped.append(name)  # the initializer itself says its type
                continue
            truth = inferred.get(name)
            if truth is None or not truth.tensor_type.elem_type:
                if _opaque(producers.get(name), model):
                    kept.append(info)
                else:
                    dropped.append(name)
                continue
            if _retype(info.type, truth):
                retyped.append(name)
            kept.append(info)
        if len(kept) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(kept)
    outputs_retyped = []
    for output in model.graph.output:
        truth = inferred.get(output.name)
        if truth is not None and truth.tensor_type.elem_type and _retype(output.type, truth):
            outputs_retyped.append(output.name)
    return ValueInfoRepair(tuple(retyped), tuple(dropped), tuple(outputs_retyped))


def _inferred_types(model: onnx.ModelProto, base_dir: Path | None) -> dict[str, onnx.TypeProto]:
    """Tensor name → the type shape inference gives it from the nodes alone (no annotations but
    those of tensors made by nodes it cannot see through)."""
    light = GraphIndex(model, base_dir=base_dir).inference_model()
    _keep_opaque_annotations(light)
    for output in light.graph.output:
        output.type.tensor_type.ClearField("elem_type")
        output.type.tensor_type.ClearField("shape")
    light = _lowered(light)
    _keep_opaque_annotations(light)  # a lowered plugin's outputs are inferred now
    try:
        light = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, MemoryError):
        # inference cannot run at all (or would need more memory than there is, for sizes an
        # attribute declares): only the opaque nodes' annotations can stay
        return {}
    types: dict[str, onnx.TypeProto] = {}
    for graph in all_graphs(light.graph):
        for info in (*graph.value_info, *graph.output):
            if info.type.HasField("tensor_type"):
                types[info.name] = info.type
    return types


def _keep_opaque_annotations(model: onnx.ModelProto) -> None:
    """Drop every annotation but those of tensors made by nodes inference cannot see through."""
    for graph in all_graphs(model.graph):
        producers = {o: n for n in graph.node for o in n.output if o}
        kept = [i for i in graph.value_info if _opaque(producers.get(i.name), model)]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _lowered(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with graphfix's plugin nodes lowered to standard ops (same tensor names), so
    inference sees through them; as it is when a lowering needs a type nobody knows."""
    from graphfix.plugins.reference import has_plugin_ops, with_reference_ops

    if not has_plugin_ops(model):
        return model
    try:
        return with_reference_ops(model)
    except UnsupportedModelError:
        return model  # their annotations stay the seeds (`_opaque`)


def _opaque(node: onnx.NodeProto | None, model: onnx.ModelProto) -> bool:
    """A node ONNX shape inference has no schema for (a custom domain's op)."""
    if node is None:
        return False
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = next((o.version for o in model.opset_import if o.domain == node.domain), None)
    if version is None:
        return True
    return not defs.has(node.op_type, max_inclusive_version=version, domain=domain)


def _agree_with_tensor(info: onnx.ValueInfoProto, tensor: onnx.TensorProto) -> bool:
    tensor_type = info.type.tensor_type
    if tensor_type.elem_type != tensor.data_type:
        return False
    if not tensor_type.HasField("shape"):
        return True
    dims = tensor_type.shape.dim
    return len(dims) == len(tensor.dims) and all(
        not d.HasField("dim_value") or d.dim_value == n
        for d, n in zip(dims, tensor.dims, strict=True)
    )


def _retype(declared: onnx.TypeProto, truth: onnx.TypeProto) -> bool:
    """Give `declared` the inferred element type, and the inferred shape where the two shapes
    contradict each other; True when anything changed."""
    have, want = declared.tensor_type, truth.tensor_type
    changed = False
    if have.elem_type != want.elem_type:
        have.elem_type = want.elem_type
        changed = True
    if have.HasField("shape") and want.HasField("shape") and _contradict(have.shape, want.shape):
        have.shape.CopyFrom(want.shape)
        changed = True
    return changed


def _contradict(a: onnx.TensorShapeProto, b: onnx.TensorShapeProto) -> bool:
    if len(a.dim) != len(b.dim):
        return True
    return any(
        x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value != y.dim_value
        for x, y in zip(a.dim, b.dim, strict=True)
    )
