"""How graphfix runs a float16/bfloat16 model on onnxruntime's CPU: every low-precision tensor
materialised in its type at the output of the node that produces it.

onnxruntime's CPU has no float16 kernel for most ops; it inserts Casts to float32 around them and
then removes the float32→float16→float32 pairs between neighbouring such ops, so a chain of them
runs entirely in float32: measured on onnxruntime 1.32, float16 `Mul(a, a)` of 905.2 gives
819387 (float16 overflows to inf) and `Sub` of two float16-cast inputs 905.2 − 904.1 gives 1.1
(in float16: 905 − 904 = 1).  Judged that way, a float16 model whose activations overflow
passes.

`emulate_low_precision` rewrites such a model so that every tensor the model stores in float16
(or bfloat16) is rounded to it explicitly — an explicit Cast pair after its producer, which
onnxruntime keeps at every optimisation level (also measured) — while each op computes in
float32, as GPU kernels accumulate in float32.  Tensor names are kept, so intermediates compare
by name; float16 weights stay stored as they are, widened by a Cast.  If/Loop/Scan bodies are
rewritten the same way.  This is the one semantics `validate`,
`locate`, its remedy search and `qdq fix`'s guard judge a low-precision candidate by
(`LowPrecision.MATERIALISE`, the default); `LowPrecision.AS_IS` runs onnxruntime as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import UsageError
from graphfix.graph.index import GraphIndex, all_graphs

_LOW = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}


class LowPrecision(str, Enum):
    """How a float16/bfloat16 candidate runs on onnxruntime's CPU (the CLI spells the values)."""

    MATERIALISE = "materialise"  # every low-precision tensor rounded at its producer's output
    AS_IS = "as-is"  # onnxruntime as it is: most float16 ops compute and keep float32


LOW_PRECISION_MODES = tuple(m.value for m in LowPrecision)


def low_precision_mode(value: str | LowPrecision | None) -> LowPrecision:
    """The mode `value` names; None means the default, materialise."""
    if value is None:
        return LowPrecision.MATERIALISE
    try:
        return LowPrecision(value)
    except ValueError:
        raise UsageError(
            f"--low-precision (low_precision) {value!r} is not one of "
            f"{', '.join(LOW_PRECISION_MODES)}; leave it unset to materialise every "
            "float16/bfloat16 tensor as an engine would"
        ) from None


def low_precision_types(model: onnx.ModelProto) -> tuple[str, ...]:
    """The low-precision types ("float16", "bfloat16") `model` stores anywhere, sorted."""
    found: set[int] = set()
    for graph in all_graphs(model.graph):
        found.update(t.data_type for t in graph.initializer)
        for value in (*graph.input, *graph.output, *graph.value_info):
            found.add(value.type.tensor_type.elem_type)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    found.add(attr.t.data_type)
                elif attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT:
                    found.add(attr.i)
    return tuple(sorted(_LOW[t] for t in found if t in _LOW))


def describe_low_precision(
    mode: LowPrecision, types: tuple[str, ...], *, untyped: tuple[str, ...] = ()
) -> str | None:
    """The line every report prints about it; None when the model stores no low precision.
    `untyped`: tensors `materialise` could not type, named so the claim stays true."""
    if not types:
        return None
    stored = " and ".join(types)
    if mode is LowPrecision.MATERIALISE:
        line = f"{stored} materialised at every node output (as an engine storing it would)"
        if untyped:
            listed = ", ".join(untyped[:5]) + (", ..." if len(untyped) > 5 else "")
            line += (
                f", except {len(untyped)} tensor(s) of unknown type (ops ONNX has no schema "
                f"for), run as onnxruntime computes them: {listed}"
            )
        return line
    return (
        f"{stored} run as onnxruntime's CPU runs it (as-is: most ops compute and keep float32, "
        "so float16 overflow and rounding can be hidden)"
    )


@dataclass(frozen=True)
class Materialised:
    """A model rewritten by `materialise`, and the node outputs whose type ONNX inference could
    not tell (ops outside its schemas): those are not rounded, and reports say so."""

    model: onnx.ModelProto
    untyped: tuple[str, ...]


def emulate_low_precision(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 copy of `model` in which every float16/bfloat16 tensor is rounded explicitly
    (`materialise`'s model)."""
    return materialise(model).model


def materialise(model: onnx.ModelProto) -> Materialised:
    """A float32 copy of `model` in which every float16/bfloat16 tensor is rounded explicitly.

    Weights keep their storage, loaded or external data references (run such a copy with the
    original's folder as onnxruntime's external-initializer folder, as `OnnxRuntimeRunner` does).
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graphs = list(all_graphs(result.graph))
    for graph in graphs:  # types come from inference, not from annotations a converter left stale
        del graph.value_info[:]
    main = GraphIndex(result)
    scopes = [(result.graph, main), *((body, index) for _, body, index in main.subgraph_scopes())]
    types = [  # per graph, in `all_graphs` order (outer first, depth first)
        {
            out: t
            for node in graph.node
            for out in node.output
            if out and (t := index.elem_type(out))
        }
        for graph, index in scopes
    ]
    untyped = tuple(
        out
        for (graph, _), graph_types in zip(scopes, types, strict=True)
        for node in graph.node
        if node.op_type != "Cast"  # its type is its `to`
        for out in node.output
        if out and out not in graph_types
    )
    renames: dict[str, str] = {}  # float16 graph inputs: fed as float32, rounded on entry
    entry: list[onnx.NodeProto] = []
    initializers = {t.name for t in result.graph.initializer}
    for value in result.graph.input:
        low = value.type.tensor_type.elem_type
        if low in _LOW and value.name not in initializers:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
            renames[value.name] = f"{value.name}/graphfix_input"
            entry += _round(value.name, renames[value.name], low)
    for graph, graph_types in reversed(list(zip(graphs, types, strict=True))):
        _emulate_graph(graph, graph_types, renames)  # bodies before the graphs holding them
    _replace_nodes(result.graph, [*entry, *result.graph.node])
    return Materialised(result, untyped)


def _emulate_graph(graph: onnx.GraphProto, types: dict[str, int], renames: dict[str, str]) -> None:
    """Rewrite one graph's own nodes (its subgraphs are visited by the caller).

    A float16 weight stays stored as it is (its bytes, loaded or external, untouched) under a new
    name, widened exactly by a Cast that onnxruntime folds when it loads the model."""
    stored = {t.name: f"{t.name}/graphfix_stored" for t in graph.initializer if t.data_type in _LOW}
    nodes: list[onnx.NodeProto] = []
    for init in graph.initializer:
        if init.name in stored:
            name, init.name = init.name, stored[init.name]
            nodes.append(
                helper.make_node(
                    "Cast", [init.name], [name], to=TensorProto.FLOAT, name=f"{name}/graphfix_widen"
                )
            )
    for value in graph.input:  # a body's formal inputs; initializers listed as inputs (IR < 4)
        if value.name in stored:
            value.name = stored[value.name]  # keeps its type, as its initializer does
        elif value.type.tensor_type.elem_type in _LOW:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for value in graph.output:
        if value.type.tensor_type.elem_type in _LOW:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for node in graph.node:
        low_outputs = []
        for k, out in enumerate(node.output):
            low = types.get(out)
            if node.op_type == "Cast":
                low = next((a.i for a in node.attribute if a.name == "to"), None)
            if out and low in _LOW:
                low_outputs.append((k, out, low))
        for attr in node.attribute:
            if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT:
                if attr.i in _LOW:
                    attr.i = TensorProto.FLOAT
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _LOW:
                attr.t.CopyFrom(
                    numpy_helper.from_array(
                        numpy_helper.to_array(attr.t).astype("float32"), attr.t.name
                    )
                )
        node.input[:] = [renames.get(i, i) for i in node.input]
        nodes.append(node)
        for k, out, low in low_outputs:
            raw = f"{out}/graphfix_unrounded"
            node.output[k] = raw
            nodes += _round(raw, out, low)
    _replace_nodes(graph, nodes)


def _replace_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    copies = [onnx.NodeProto() for _ in nodes]  # the originals are the graph's own messages
    for copy, node in zip(copies, nodes, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def _round(source: str, target: str, low: int) -> list[onnx.NodeProto]:
    middle = f"{target}/graphfix_rounded"
    return [
        helper.make_node("Cast", [source], [middle], to=low, name=f"{target}/graphfix_round"),
        helper.make_node(
            "Cast", [middle], [target], to=TensorProto.FLOAT, name=f"{target}/graphfix_widen"
        ),
    ]
