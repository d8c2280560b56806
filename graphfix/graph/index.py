"""Read-only index over an ONNX graph: producers, consumers, constants and tensor types."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import weakref
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

_DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
}

# Ops whose output is constant when every input is; evaluated with onnx's reference runtime.
_FOLDABLE = {
    "Cast", "Sqrt", "Div", "Mul", "Reciprocal", "Pow", "Add", "Sub", "Neg", "Identity",
    "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose", "Slice",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or",
    "Range", "ConstantOfShape", "Trilu", "Where", "Concat", "Gather", "Abs",
    "QuantizeLinear", "DequantizeLinear",
}  # fmt: skip
_MAX_FOLD_ELEMENTS = 1 << 16


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph (If branches, Loop/Scan bodies) inside it, outer first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_graphs(sub)


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If branches, Loop/Scan bodies) read from enclosing scopes."""
    names: set[str] = set()
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            names |= _free_names(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for graph in attr.graphs:
                names |= _free_names(graph)
    return names


def _free_names(graph: onnx.GraphProto) -> set[str]:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    read: set[str] = set()
    for node in graph.node:
        read.update(i for i in node.input if i)
        read |= outer_reads(node)
        defined.update(o for o in node.output if o)
    read.update(v.name for v in graph.output)
    return read - defined


def node_label(node: onnx.NodeProto, position: int) -> str:
    """How graphfix shows a node: its name, or `<MatMul #12>` (its op type and position in
    graph.node) for an unnamed one; selectors accept that back (graphfix/selectors.py)."""
    return node.name or f"<{node.op_type} #{position}>"


def dtype_name(elem_type: int) -> str:
    return _DTYPE_NAMES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())


@dataclasses.dataclass(frozen=True)
class BoundNode:
    """One node of an indexed graph, bound by a match: `node` is the NodeProto itself (read it,
    never re-find it), `position` its index in graph.node (what a GraphEdit replaces), `name` how
    reports show it (the node's name, or `<OpType #position>` for an unnamed node)."""

    position: int
    name: str
    node: onnx.NodeProto = dataclasses.field(compare=False, repr=False)

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def __str__(self) -> str:
        return self.name


class GraphIndex:
    """Producers, consumers, types and constant values of one graph: graphfix's one graph view
    (the matcher, the strategies, the drawing, input generation and tools/ all read it).

    Built once per scan; never mutates the model.  Initializers stored as external data whose
    bytes are not loaded are read from `base_dir` only when a small constant is needed.

    It indexes the protobuf directly rather than importing into onnx-graphsurgeon, measured
    (tools/graph_view_bench.py, two runs on a shared 2-core machine) on a 2,379-node SVD UNet
    export: these maps build in 0.017 s, 0.06-0.13 s with shape inference, while
    `gs.import_onnx` takes 0.21-0.36 s and `gs.export_onnx` 0.14-0.21 s more, per fix; and the
    protobuf keeps external data references untouched, where a gs round trip would have to load
    or re-link every weight of a > 2 GB model.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        *,
        base_dir: Path | None = None,
        outer: GraphIndex | None = None,
    ) -> None:
        self.model = model
        self.graph = model.graph
        self.base_dir = base_dir
        self.outer = outer  # the enclosing graph's index, for a subgraph (If/Loop/Scan body)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        self.node_order: dict[int, int] = {}
        for position, node in enumerate(self.graph.node):
            self.node_order[id(node)] = position
            for out in node.output:
                if out:
                    self.producer[out] = node
            # a subgraph reading an outer tensor makes its node a consumer of that tensor
            for inp in (*node.input, *sorted(outer_reads(node))):
                if inp:
                    self.consumers[inp].append(node)
        own = {t.name: t for t in self.graph.initializer}
        self.initializers = {**(outer.initializers if outer else {}), **own}
        self.graph_inputs = {v.name for v in self.graph.input} - set(own)
        self.graph_outputs = {v.name for v in self.graph.output}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self._const_cache: dict[str, np.ndarray | None] = {}

    @functools.cached_property
    def value_info(self) -> dict[str, onnx.ValueInfoProto]:
        """Types and shapes by tensor name, from ONNX shape inference (run on first use)."""
        return {**(self.outer.value_info if self.outer else {}), **self._infer_value_info()}

    @property
    def shape_inference_problem(self) -> str | None:
        """Why strict shape inference failed (None when it succeeded); runs it on first use."""
        _ = self.value_info
        return self._shape_inference_problem

    def subgraph_scopes(self) -> Iterator[tuple[str, onnx.GraphProto, GraphIndex]]:
        """(location, the subgraph as stored in this graph, its index), depth first: every
        If/Loop/Scan body inside this graph.  The index reads the subgraph through a copy
        (a wrapper model); edits made on that copy are written back with `target.CopyFrom`."""
        for node in self.graph.node:
            for attr in node.attribute:
                subgraphs = (
                    [attr.g]
                    if attr.type == onnx.AttributeProto.GRAPH
                    else list(attr.graphs)
                    if attr.type == onnx.AttributeProto.GRAPHS
                    else []
                )
                for number, subgraph in enumerate(subgraphs):
                    suffix = f"[{number}]" if attr.type == onnx.AttributeProto.GRAPHS else ""
                    location = f"{node.op_type} '{node.name}'/{attr.name}{suffix}"
                    wrapper = onnx.ModelProto()
                    wrapper.ir_version = self.model.ir_version
                    wrapper.opset_import.extend(self.model.opset_import)
                    wrapper.graph.CopyFrom(subgraph)
                    index = GraphIndex(wrapper, base_dir=self.base_dir, outer=self)
                    yield location, subgraph, index
                    for inner, target, inner_index in index.subgraph_scopes():
                        yield f"{location}/{inner}", target, inner_index

    def _infer_value_info(self) -> dict[str, onnx.ValueInfoProto]:
        infos: dict[str, onnx.ValueInfoProto] = {}
        self._shape_inference_problem: str | None = None
        model = self.inference_model()
        # strict first, for the reason when it fails (the user sees it); then lenient, which
        # keeps every shape it could infer
        try:
            graph = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
        except Exception as exc:  # onnx raises several types; the matcher works without shapes
            self._shape_inference_problem = _first_error(exc)
            try:
                graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
            except Exception:  # the strict run's reason is already recorded
                graph = self.graph
        for vi in (*graph.value_info, *graph.input, *graph.output):
            infos[vi.name] = vi
        return infos

    def inference_model(self) -> onnx.ModelProto:
        """What shape inference needs, and no more: small initializers (shape tensors, scales)
        with their values, read from disk if external; weights by type and dims only.

        Shape inference serializes its input and parses its output: over the weights that cost
        an 850 MB model 8 s and 2.5 GB, so they are left out (it reads no weight's values).
        """
        model = onnx.ModelProto()
        _copy_fields_except(self.model, model, "graph")
        _copy_fields_except(self.graph, model.graph, "initializer")
        model.graph.input.extend(self._outer_value_infos())  # a body's outer-scope reads, typed
        for tensor in self.graph.initializer:
            target = model.graph.initializer.add()
            count = math.prod(tensor.dims)  # np.prod costs ~10 µs a call
            if count > _MAX_FOLD_ELEMENTS:
                target.name, target.data_type = tensor.name, tensor.data_type
                target.dims.extend(tensor.dims)
                continue
            loaded = None
            if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.HasField(
                "raw_data"
            ):
                loaded = self.external_tensor(tensor)
            target.CopyFrom(tensor if loaded is None else loaded)
        return model

    def _outer_value_infos(self) -> list[onnx.ValueInfoProto]:
        if self.outer is None:
            return []
        infos = []
        for name in sorted(_free_names(self.graph)):
            if name in self.outer.initializers:
                tensor = self.outer.initializers[name]
                infos.append(
                    onnx.helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
                )
            elif name in self.outer.value_info:
                infos.append(self.outer.value_info[name])
        return infos

    # --- types and shapes -------------------------------------------------------------------
    def elem_type(self, name: str) -> int | None:
        if name in self.initializers:
            return self.initializers[name].data_type
        vi = self.value_info.get(name)
        if vi is not None and vi.type.HasField("tensor_type"):
            return vi.type.tensor_type.elem_type or None
        return None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        if name in self.initializers:
            return tuple(self.initializers[name].dims)
        vi = self.value_info.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        dims: list[int | str | None] = []
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return tuple(dims)

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)

    # --- structure ----------------------------------------------------------------------------
    def producer_of(self, name: str) -> onnx.NodeProto | None:
        return self.producer.get(name)

    def consumers_of(self, name: str) -> list[onnx.NodeProto]:
        return self.consumers.get(name, [])

    def position(self, node: onnx.NodeProto) -> int:
        return self.node_order[id(node)]

    def bind(self, node: onnx.NodeProto) -> BoundNode:
        """`node` (one of this graph's) as a BoundNode."""
        position = self.position(node)
        return BoundNode(position, node_label(node, position), node)

    # --- constants ----------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        return self.constant_value(name) is not None or self._is_structurally_constant(name, 0)

    def _is_structurally_constant(self, name: str, depth: int) -> bool:
        if name in self.initializers:
            return True
        node = self.producer.get(name)
        if node is None or depth > 8:
            return False
        if node.op_type == "Constant":
            return True
        if node.op_type in _FOLDABLE:
            return all(not i or self._is_structurally_constant(i, depth + 1) for i in node.input)
        return False

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of `name` if it is an initializer, a Constant, or folds from constants."""
        if name in self._const_cache:
            return self._const_cache[name]
        self._const_cache[name] = None  # cycle guard
        value = self._compute_constant(name)
        self._const_cache[name] = value
        return value

    def _compute_constant(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return self._initializer_value(self.initializers[name])
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name == "value_float":
                    return np.array(attr.f, dtype=np.float32)
                if attr.name == "value_int":
                    return np.array(attr.i, dtype=np.int64)
                if attr.name == "value_floats":
                    return np.array(list(attr.floats), dtype=np.float32)
                if attr.name == "value_ints":
                    return np.array(list(attr.ints), dtype=np.int64)
            return None
        if node.op_type == "Shape":
            return self._static_shape(node)
        if node.op_type in ("Slice", "Gather"):
            partial = self._slice_of_shape(node)
            if partial is not None:
                return partial
        if node.op_type == "CastLike":  # constant whenever its first input is
            value = self.constant_value(node.input[0])
            target = self.elem_type(node.input[1])
            if value is None or target is None:
                return None
            return value.astype(onnx.helper.tensor_dtype_to_np_dtype(target))
        if node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx"):
            return None
        inputs = []
        for inp in node.input:
            if not inp:
                inputs.append(None)
                continue
            value = self.constant_value(inp)
            if value is None or value.size > _MAX_FOLD_ELEMENTS:
                return None
            inputs.append(value)
        return _evaluate_node(node, inputs, self.opset)

    def _static_shape(self, node: onnx.NodeProto) -> np.ndarray | None:
        """Shape(x) when shape inference knows every dimension of x."""
        dims = self.shape(node.input[0])
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(dims))
        return np.array(dims[start:end] if "end" in attrs else dims[start:], dtype=np.int64)

    def _slice_of_shape(self, node: onnx.NodeProto) -> np.ndarray | None:
        """Slice/Gather of Shape(x) when the picked dimensions are known, even if others are not
        (e.g. the head size of a [batch, heads, seq, 64] tensor with dynamic batch and seq)."""
        shape_node = self.producer.get(node.input[0])
        if shape_node is None or shape_node.op_type != "Shape":
            return None
        dims = self.shape(shape_node.input[0])
        if dims is None:
            return None
        attrs = {a.name: a.i for a in shape_node.attribute}
        dims = dims[attrs.get("start", 0) : attrs.get("end", len(dims))]
        positions = np.arange(len(dims))
        rest = [self.constant_value(i) if i else None for i in node.input[1:]]
        if any(i and v is None for i, v in zip(node.input[1:], rest, strict=True)):
            return None
        picked = _evaluate_node(node, [positions, *rest], self.opset)
        if picked is None:
            return None
        values = [dims[int(i)] for i in np.atleast_1d(picked)]
        if not all(isinstance(v, int) for v in values):
            return None
        return np.array(values, dtype=np.int64).reshape(np.shape(picked))

    def _initializer_value(self, tensor: onnx.TensorProto) -> np.ndarray | None:
        count = math.prod(tensor.dims)  # np.prod costs ~10 µs a call
        if count > _MAX_FOLD_ELEMENTS:
            return None
        if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.HasField("raw_data"):
            loaded = self.external_tensor(tensor)
            return None if loaded is None else numpy_helper.to_array(loaded)
        return numpy_helper.to_array(tensor)

    def external_tensor(self, tensor: onnx.TensorProto) -> onnx.TensorProto | None:
        """`tensor` (external) with its values read in, or None when they cannot be read."""
        if self.base_dir is None:
            return None
        owner = self
        while owner.outer is not None:  # one reader for the model: a subgraph uses the top's
            owner = owner.outer
        if getattr(owner, "_reader", None) is None:
            owner._reader = _SmallReads(owner.base_dir)
        try:
            return owner._reader.read_proto(tensor)
        except (OSError, ValueError, onnx.checker.ValidationError):
            return None  # the load step reports unreadable data; here it is just "unknown"


class _SmallReads:
    """Small external tensors of one model, read through one open file per location.

    onnx's loader opens and checks the file again for each tensor (~0.1 ms each; a model has
    hundreds of small external tensors: biases, norm weights, shape tensors).  The first tensor
    of a location goes through it, so the location passes onnx's checks (relative, no links,
    inside the folder); the next ones are read from the file it opened with `os.pread`, their
    range checked against the file's size."""

    def __init__(self, base_dir: Path | None) -> None:
        self.base_dir = base_dir
        self.files: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self._closer = weakref.finalize(self, _close_all, self.files)

    def read_proto(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """A copy of `tensor` holding its values (raw_data) instead of the reference."""
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        fd = self.files.get(location)
        if fd is None or not set(info) <= {"location", "offset", "length"}:
            loaded = onnx.TensorProto()
            loaded.CopyFrom(tensor)
            onnx.external_data_helper.load_external_data_for_tensor(loaded, str(self.base_dir))
            loaded.data_location = onnx.TensorProto.DEFAULT
            del loaded.external_data[:]
            if fd is None and location:
                fd = self.files[location] = os.open(Path(self.base_dir, location), os.O_RDONLY)
                self.sizes[location] = os.fstat(fd).st_size
            return loaded
        offset = int(info.get("offset", 0))
        size = self.sizes[location]
        length = int(info["length"]) if "length" in info else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError(f"external data of {tensor.name} lies beyond its file's end")
        data = os.pread(fd, length, offset)
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        del copy.external_data[:]
        copy.data_location = onnx.TensorProto.DEFAULT
        copy.raw_data = data
        return copy


def _close_all(files: dict[str, int]) -> None:
    for fd in files.values():
        os.close(fd)
    files.clear()


def _copy_fields_except(source, target, skipped: str) -> None:
    """Copy every set field of the message `source` into `target` but `skipped`."""
    for field, value in source.ListFields():
        if field.name == skipped:
            continue
        if _is_repeated(field):
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _is_repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 5.28 (`label` is gone in 7)
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _first_error(exc: BaseException) -> str:
    """The first error onnx's shape inference reports, on one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    first = first.removeprefix("[ShapeInferenceError] Inference error(s): ")
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return first[:300] + more


def _evaluate_node(node: onnx.NodeProto, inputs: list, opset: int) -> np.ndarray | None:
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    clone = onnx.helper.make_node(node.op_type, names, ["out"], domain=node.domain)
    clone.attribute.extend(node.attribute)
    try:
        evaluator = ReferenceEvaluator(clone, opsets={"": opset})
        feeds = {n: v for n, v in zip(names, inputs, strict=True) if n}
        (result,) = evaluator.run(None, feeds)
    except Exception:  # a constant we cannot fold is simply "not constant" to the matcher
        return None
    return np.asarray(result)
