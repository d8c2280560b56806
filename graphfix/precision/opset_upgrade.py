"""Raise a model's default-domain opset when no op in it changes meaning between the versions.

onnx.version_converter rewrites every op it has an adapter for and fails (or guesses) on the
rest; here each op the model uses is compared between the two versions instead:
- unchanged schema (same since_version): nothing to do;
- crossing opset 18, ReduceMax/Min/Mean/Prod/L1/L2/LogSum/LogSumExp/SumSquare: their `axes`
  attribute becomes a constant input; Split without split sizes: gets `num_outputs` (the only
  rewrites done here);
- a new version that keeps every input, output and attribute (same type, same default) and
  only adds optional ones: kept as is, unless the op is listed in `_MEANING_CHANGED`, where a new
  attribute's default or a documented shape changes what existing nodes compute;
- anything else refuses the upgrade, naming the op and what changed.
An op whose version changes must also still load in onnxruntime (what `validate` runs the model
on): each such op is tried as a one-node model at both opsets, and one onnxruntime loads at the
model's opset but has no kernel for at the new one (RandomUniformLike-22 in onnxruntime 1.32,
whose registered kernel does not match that version's node) refuses the upgrade too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from graphfix.graph.index import all_graphs

# op → the versions at which an existing node's meaning changes with an unchanged interface.
_MEANING_CHANGED = {
    "RoiAlign": (16,),  # coordinate_transformation_mode added with default half_pixel
    "GroupNormalization": (21,),  # scale and bias per channel, not per group
    "GridSample": (20,),  # mode values renamed; align_corners semantics for 5-D
    "Softmax": (13,),  # one axis, no longer the flattened trailing dims
    "LogSoftmax": (13,),
    "Hardmax": (13,),
}
_AXES_TO_INPUT_AT_18 = {
    "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
}  # fmt: skip
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpsetUpgrade:
    """The upgraded model, or None with the reason it was not upgraded."""

    model: onnx.ModelProto | None
    reason: str | None = None


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 0)


def upgrade_opset(model: onnx.ModelProto, target: int) -> OpsetUpgrade:
    """A copy of `model` at default-domain opset `target`, or the reason that is not safe."""
    current = default_opset(model)
    if target <= current:
        return OpsetUpgrade(model)
    if target > defs.onnx_opset_version():
        return OpsetUpgrade(
            None, f"onnx {onnx.__version__} knows opsets up to {defs.onnx_opset_version()}"
        )
    op_types = {
        n.op_type for g in all_graphs(model.graph) for n in g.node if n.domain in _DEFAULT_DOMAINS
    }
    for op_type in sorted(op_types):
        reason = _change(op_type, current, target)
        if reason is not None:
            return OpsetUpgrade(
                None, f"{op_type} changes between opset {current} and {target}: {reason}"
            )
    reason = _runtime_refusal(model, sorted(op_types), current, target)
    if reason is not None:
        return OpsetUpgrade(None, reason)
    upgraded = onnx.ModelProto()
    upgraded.CopyFrom(model)
    if current < 18 <= target:
        for graph in all_graphs(upgraded.graph):
            _axes_to_input(graph)
            _split_count(graph)
    for entry in upgraded.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            entry.version = target
    needed = helper.find_min_ir_version_for([helper.make_opsetid("", target)], ignore_unknown=True)
    upgraded.ir_version = max(upgraded.ir_version, needed)
    problem = _invalid_node(upgraded)
    if problem is not None:
        return OpsetUpgrade(None, f"a node fails onnx.checker at opset {target}: {problem}")
    problem = _new_inference_error(model, upgraded)
    if problem is not None:
        return OpsetUpgrade(None, f"shape inference fails at opset {target}: {problem}")
    return OpsetUpgrade(upgraded)


def _change(op_type: str, current: int, target: int) -> str | None:
    """Why an `op_type` node written for `current` may not mean the same at `target` (None: it does)."""
    try:
        old = defs.get_schema(op_type, current, "")
    except defs.SchemaError:
        return f"no schema at opset {current}"
    try:
        new = defs.get_schema(op_type, target, "")
    except defs.SchemaError:
        return f"removed by opset {target}"
    if old.since_version == new.since_version:
        return None
    if new.deprecated:
        return f"deprecated at opset {new.since_version}"
    for version in _MEANING_CHANGED.get(op_type, ()):
        if current < version <= target:
            return f"version {version} computes something different for the same node"
    if op_type in _AXES_TO_INPUT_AT_18 and current < 18 <= target:
        old_attrs = {k: v for k, v in old.attributes.items() if k != "axes"}
        old_inputs = [*old.inputs, "axes"]
    else:
        old_attrs, old_inputs = dict(old.attributes), list(old.inputs)
    if len(new.inputs) < len(old_inputs) or len(new.outputs) != len(old.outputs):
        return "its inputs or outputs changed"
    for extra in new.inputs[len(old_inputs) :]:
        if extra.option != defs.OpSchema.FormalParameterOption.Optional:
            return f"new required input {extra.name!r}"
    for name, attr in old_attrs.items():
        changed = new.attributes.get(name)
        if changed is None:
            return f"attribute {name!r} removed"
        if changed.type != attr.type or changed.default_value != attr.default_value:
            return f"attribute {name!r} changed its type or default"
    for name, attr in new.attributes.items():
        if name not in old.attributes and attr.required:
            return f"new required attribute {name!r}"
    return None


def _runtime_refusal(
    model: onnx.ModelProto, op_types: list[str], current: int, target: int
) -> str | None:
    """Why onnxruntime could not load the model at `target` where it loads it at `current`: an
    op whose new version it has no kernel for (None: every changed op loads).  Each op whose
    version changes is tried as one node of the model, inputs typed as in the model, alone in a
    model at each opset; nodes with subgraphs and untyped inputs are not tried."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    changed = [
        op
        for op in op_types
        if defs.get_schema(op, current, "").since_version
        != defs.get_schema(op, target, "").since_version
    ]
    if not changed:
        return None
    types = _element_types(model)
    for op_type in changed:
        node = _typed_node(model, op_type, types)
        if node is None:
            continue
        if _loads(ort, node, types, current) and not _loads(ort, node, types, target):
            since = defs.get_schema(op_type, target, "").since_version
            return (
                f"onnxruntime {ort.__version__} has no kernel for {op_type} as of opset {since}, "
                "so the model would not load in it (nor could validate run it)"
            )
    return None


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type by tensor name, of the top graph (inputs, weights, inferred values)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except (onnx.shape_inference.InferenceError, ValueError):
        inferred = model.graph
    types = {t.name: t.data_type for t in inferred.initializer}
    for info in (*inferred.input, *inferred.value_info, *inferred.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    return types


def _typed_node(
    model: onnx.ModelProto, op_type: str, types: dict[str, int]
) -> onnx.NodeProto | None:
    """A top-graph `op_type` node without subgraphs whose inputs and outputs all have types."""
    for node in model.graph.node:
        if (
            node.op_type == op_type
            and node.domain in _DEFAULT_DOMAINS
            and not any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute
            )
            and all(name in types for name in (*node.input, *node.output) if name)
        ):
            return node
    return None


def _loads(ort, node: onnx.NodeProto, types: dict[str, int], opset: int) -> bool:
    """Whether onnxruntime finds a kernel for `node` alone at `opset` (a failure other than
    NOT_IMPLEMENTED says nothing about the kernel and counts as found)."""
    inputs = list(dict.fromkeys(name for name in node.input if name))
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info(name, types[name], None) for name in inputs],
        [helper.make_tensor_value_info(name, types[name], None) for name in node.output if name],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    probe.ir_version = helper.find_min_ir_version_for(
        [helper.make_opsetid("", opset)], ignore_unknown=True
    )
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own, unexported exception types
        return "NOT_IMPLEMENTED" not in str(exc)
    return True


def _invalid_node(model: onnx.ModelProto) -> str | None:
    """The first default-domain node the checker refuses at the model's opsets.  Nodes are
    checked one by one, not the whole model: that would read external data from the current
    folder.  If/Loop/Scan are not checked themselves; the nodes of their bodies are."""
    context = onnx.checker.C.CheckerContext()
    context.ir_version = model.ir_version
    context.opset_imports = {o.domain: o.version for o in model.opset_import}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.domain not in _DEFAULT_DOMAINS or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute
            ):
                continue
            try:
                onnx.checker.check_node(node, context)
            except onnx.checker.ValidationError as exc:
                return f"{node.name or node.op_type}: {str(exc).strip().splitlines()[0]}"
    return None


def _new_inference_error(model: onnx.ModelProto, upgraded: onnx.ModelProto) -> str | None:
    """An error strict shape inference raises on the upgraded model and not on the original:
    rules a schema comparison cannot see (Split-18 wants split sizes or num_outputs)."""
    try:
        onnx.shape_inference.infer_shapes(upgraded, strict_mode=True)
        return None
    except onnx.shape_inference.InferenceError as exc:
        error = str(exc).strip().splitlines()[0]
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError:
        return None  # the original fails too (external data, custom ops): nothing new to blame
    return error


def _split_count(graph: onnx.GraphProto) -> None:
    """Split-18 needs `num_outputs` where Split-13 split evenly by its output count."""
    for node in graph.node:
        if node.op_type != "Split" or node.domain not in _DEFAULT_DOMAINS:
            continue
        has_sizes = len(node.input) > 1 and node.input[1]
        if not has_sizes and not any(a.name == "num_outputs" for a in node.attribute):
            node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))


def _axes_to_input(graph: onnx.GraphProto) -> None:
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type not in _AXES_TO_INPUT_AT_18 or node.domain not in _DEFAULT_DOMAINS:
            continue
        axes = next((a for a in node.attribute if a.name == "axes"), None)
        if axes is None:
            continue
        name = _fresh(taken, f"{node.name or node.op_type}_axes")
        axes_value = np.array(list(axes.ints), dtype=np.int64)
        graph.initializer.append(numpy_helper.from_array(axes_value, name))
        kept = [a for a in node.attribute if a.name != "axes"]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.input.append(name)


def _fresh(taken: set[str], base: str) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
