"""Stream a model's intermediate tensors through onnxruntime, a bounded chunk at a time.

onnxruntime keeps every graph output alive until `run` returns (it does so even when `run` is asked
for a subset of them: measured, 500 MB held for 24 declared outputs of which 4 were fetched), so
all intermediates of a large model cannot be read in one run.  Instead the tensors are split, in
topological order, into chunks whose estimated size stays under a byte budget; each chunk is a
session over the pruned graph (only the nodes its tensors depend on) with those tensors as its
outputs.  The weights are written once to an external data file that every chunk's graph
references, so a chunk costs a small protobuf and a session, not a copy of the weights.

Peak memory of one side is therefore about: onnxruntime's own working set for the model (weights +
the activations live at once in a plain run) + one chunk (the budget), independent of how many
intermediates the model has.  `locate` holds both sides' chunk at once (2 × budget) plus the
float32 copies made for comparison of one tensor pair.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graphfix.model_io import LoadedModel
from graphfix.validation.backends import BackendError

DEFAULT_CHUNK_BYTES = 256 << 20
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}
_UNKNOWN = -1


@dataclass(frozen=True)
class TensorSite:
    """A tensor a node produces, where it sits in topological order, and what the node reads."""

    tensor: str
    node: str
    op_type: str
    position: int  # index of the producing node in topological order
    inputs: tuple[str, ...]  # the producing node's inputs (empty names dropped)


@dataclass(frozen=True)
class GraphPlan:
    """The float tensors of a model in topological order, with an estimated size each."""

    sites: tuple[TensorSite, ...]
    nbytes: Mapping[str, int]  # estimated bytes per tensor as float32 (-1: unknown)

    def site(self, tensor: str) -> TensorSite:
        return self._by_tensor()[tensor]

    def _by_tensor(self) -> dict[str, TensorSite]:
        cache = self.__dict__.get("_index")
        if cache is None:
            cache = {s.tensor: s for s in self.sites}
            object.__setattr__(self, "_index", cache)
        return cache


def node_label(node: onnx.NodeProto, position: int) -> str:
    """A node's name, or `#position op_type` for an unnamed node."""
    return node.name or f"#{position} {node.op_type}"


def plan_graph(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> GraphPlan:
    """Every node output that is (or may be) floating point, in the graph's topological order."""
    types, sizes = _infer(model, feeds)
    sites = []
    nbytes: dict[str, int] = {}
    for position, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue  # a constant has no error of its own: its consumers carry it
        label = node_label(node, position)
        inputs = tuple(i for i in node.input if i)
        for output in node.output:
            if not output or types.get(output, _UNKNOWN) not in (*_FLOAT_TYPES, _UNKNOWN):
                continue
            sites.append(TensorSite(output, label, node.op_type, position, inputs))
            nbytes[output] = sizes.get(output, _UNKNOWN)
    return GraphPlan(tuple(sites), nbytes)


def chunk_tensors(names: Sequence[str], nbytes: Mapping[str, int], budget: int) -> list[list[str]]:
    """`names` split in order into chunks whose estimated float32 bytes stay within `budget`.

    A tensor of unknown size counts as the largest known one; a tensor bigger than the budget gets
    a chunk of its own.
    """
    known = [b for b in nbytes.values() if b >= 0]
    unknown_size = max(known, default=1 << 20)
    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name in names:
        size = nbytes.get(name, _UNKNOWN)
        size = unknown_size if size < 0 else size
        if current and used + size > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current:
        chunks.append(current)
    return chunks


class TensorStreamer:
    """Runs `model` on `feeds` with onnxruntime (CPU, graph optimisations off), a chunk at a time.

    The weights go once into a temporary external data file; `fetch(names)` builds the pruned graph
    whose outputs are `names`, runs it and returns the arrays by name.
    """

    def __init__(self, model: LoadedModel, *, label: str) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.label = label
        self._folder = tempfile.TemporaryDirectory(prefix="graphfix-locate-")
        folder = Path(self._folder.name)
        proto = onnx.ModelProto()
        proto.CopyFrom(model.model)
        if not model.weights_loaded and model.base_dir is not None:
            onnx.load_external_data_for_model(proto, str(model.base_dir))
        onnx.save(
            proto,
            folder / "full.onnx",
            save_as_external_data=True,
            location="weights.data",
            size_threshold=1024,
        )
        del proto
        self.graph = onnx.load(str(folder / "full.onnx"), load_external_data=False)
        self._producers = {
            out: i for i, node in enumerate(self.graph.graph.node) for out in node.output if out
        }
        self._runs = 0

    @property
    def runs(self) -> int:
        return self._runs

    def close(self) -> None:
        self._folder.cleanup()

    def __enter__(self) -> TensorStreamer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The tensors `names` (node outputs or graph outputs) computed on `feeds`."""
        ort = self._ort
        chunk = self._pruned(names)
        path = Path(self._folder.name) / "chunk.onnx"
        onnx.save(chunk, path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
            wanted = {i.name for i in session.get_inputs()}
            values = session.run(list(names), {k: v for k, v in feeds.items() if k in wanted})
        except Exception as exc:  # onnxruntime raises its own pybind types; the message matters
            message = " ".join(str(exc).split()) or type(exc).__name__
            raise BackendError(
                f"onnxruntime cannot run {self.label}: {message}; check that onnxruntime "
                "supports every op and opset in it and that --shape/--range/--inputs fit it"
            ) from exc
        self._runs += 1
        return {
            name: value
            for name, value in zip(names, values, strict=True)
            if isinstance(value, np.ndarray)
        }

    def _pruned(self, names: Sequence[str]) -> onnx.ModelProto:
        graph = self.graph.graph
        needed: set[int] = set()
        stack = [self._producers[n] for n in names if n in self._producers]
        while stack:
            i = stack.pop()
            if i in needed:
                continue
            needed.add(i)
            for tensor in _node_reads(graph.node[i]):
                j = self._producers.get(tensor)
                if j is not None and j not in needed:
                    stack.append(j)
        reads = {t for i in needed for t in _node_reads(graph.node[i])} | set(names)
        pruned = onnx.ModelProto()
        pruned.CopyFrom(self.graph)
        g = pruned.graph
        del g.node[:]
        g.node.extend(graph.node[i] for i in sorted(needed))
        del g.initializer[:]
        g.initializer.extend(t for t in graph.initializer if t.name in reads)
        del g.output[:]
        for name in names:
            value = onnx.ValueInfoProto()
            value.name = name  # untyped: onnxruntime takes the type the graph gives it
            g.output.append(value)
        return pruned


def stream_pairs(
    reference: TensorStreamer,
    candidate: TensorStreamer,
    feeds_reference: Mapping[str, np.ndarray],
    feeds_candidate: Mapping[str, np.ndarray],
    chunks: Sequence[Sequence[str]],
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, reference array, candidate array) for every tensor, one chunk in memory at a time."""
    for chunk in chunks:
        ref = reference.fetch(chunk, feeds_reference)
        cand = candidate.fetch(chunk, feeds_candidate)
        for name in chunk:
            r, c = ref.pop(name, None), cand.pop(name, None)
            if r is not None and c is not None:
                yield name, r, c
        del ref, cand


def _node_reads(node: onnx.NodeProto) -> Iterator[str]:
    yield from (i for i in node.input if i)
    for attr in node.attribute:  # If/Loop/Scan bodies read outer-scope tensors
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for sub in graphs:
            for inner in sub.node:
                yield from _node_reads(inner)


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor onnx's shape inference can type (initializers included)."""
    return _infer(model, {})[0]


def _infer(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and float32 byte sizes of tensors, with the graph inputs fixed to `feeds`."""
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    for tensor in skeleton.graph.initializer:  # shapes and types only: drop the bytes
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.ByteSize() > 4096:
            name, dims, dtype = tensor.name, list(tensor.dims), tensor.data_type
            tensor.Clear()
            tensor.name, tensor.data_type = name, dtype
            tensor.dims[:] = dims
    for value in skeleton.graph.input:
        if value.name in feeds:
            shape = value.type.tensor_type.shape
            shape.Clear()
            for d in feeds[value.name].shape:
                shape.dim.add().dim_value = int(d)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # inference is an estimate only; unknown sizes fall back to the largest
        inferred = skeleton
    types: dict[str, int] = {}
    sizes: dict[str, int] = {}
    g = inferred.graph
    for value in (*g.input, *g.value_info, *g.output):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            continue
        types[value.name] = tensor.elem_type or _UNKNOWN
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.HasField("shape") and all(d is not None for d in dims):
            sizes[value.name] = 4 * int(np.prod(dims, dtype=np.int64))
    for tensor in model.graph.initializer:
        types[tensor.name] = tensor.data_type
    return types, sizes
