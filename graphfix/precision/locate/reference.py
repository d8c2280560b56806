"""Stream a model's intermediate tensors through onnxruntime, a bounded chunk at a time.

onnxruntime keeps every graph output alive until `run` returns (it does so even when `run` is asked
for a subset of them: measured, 500 MB held for 24 declared outputs of which 4 were fetched), so
all intermediates of a large model cannot be read in one run.  Instead the tensors are split, in
topological order, into chunks whose estimated size stays under a byte budget; each chunk is a
session over the pruned graph (only the nodes its tensors depend on) with those tensors as its
outputs.  The tensors a later chunk reads (the frontier) are carried over and fed to the next
chunk's graph as inputs, so each node runs about once however many chunks there are.  The
weights are written once to an external data file that every chunk's graph references, so a
chunk costs a small protobuf and a session, not a copy of the weights.

Peak memory of one side is therefore about: onnxruntime's working set for the chunk's subgraph
+ the frontier (at most what a plain run keeps alive at that point) + the chunk's tensors twice
(onnxruntime's buffers and the returned arrays), independent of how many intermediates the model
has.  `locate` holds the reference's chunk while the candidate's runs: about 3 × the budget.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from graphfix.graph.index import node_label
from graphfix.model_io import LoadedModel, system_temporary_prefix
from graphfix.validation.backends import BackendError
from graphfix.validation.random_ops import seed_random_ops

DEFAULT_CHUNK_BYTES = 256 << 20
# Models up to this size go to onnxruntime as bytes; larger ones through one weight file.  Bytes
# cost the weights about four times per side (the proto, each chunk's copy, its serialisation,
# onnxruntime's copy): measured +300 MB peak on 64 MB of weights, so only small models do it.
IN_MEMORY_BYTES = 32 << 20
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

    A model larger than `in_memory_bytes` has its weights written once into a temporary
    external data file that every chunk's graph references (a chunk then costs a small protobuf,
    not a copy of the weights); a smaller one is handed to onnxruntime as bytes, which saves the
    file round trip that dominates on small models.
    """

    def __init__(
        self, model: LoadedModel, *, label: str, in_memory_bytes: int = IN_MEMORY_BYTES
    ) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.label = label
        # random nodes without a seed get one from their name: every chunk, and the other side,
        # draws alike (graphfix.validation.random_ops)
        proto = seed_random_ops(model.model)
        if proto is None:
            proto = onnx.ModelProto()
            proto.CopyFrom(model.model)
        if not model.weights_loaded and model.base_dir is not None:
            onnx.load_external_data_for_model(proto, str(model.base_dir))
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        if proto.ByteSize() > in_memory_bytes:
            self._folder = tempfile.TemporaryDirectory(prefix=system_temporary_prefix("locate"))
            folder = Path(self._folder.name)
            onnx.save(
                proto,
                folder / "full.onnx",
                save_as_external_data=True,
                location="weights.data",
                size_threshold=1024,
            )
            del proto
            self.graph = onnx.load(str(folder / "full.onnx"), load_external_data=False)
        else:
            self.graph = proto
        self._shell = onnx.ModelProto()  # the model without nodes, weights or outputs
        self._shell.CopyFrom(self.graph)
        for field in ("node", "initializer", "output", "value_info"):
            self._shell.graph.ClearField(field)
        self._producers = {
            out: i for i, node in enumerate(self.graph.graph.node) for out in node.output if out
        }
        self.runs = 0  # sessions run
        self.nodes_run = 0  # node executions over all runs (recomputation shows here)

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()

    def __enter__(self) -> TensorStreamer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The tensors `names` (node outputs or graph outputs) computed on `feeds`."""
        nodes = self._ancestors(names, set())
        values = self._run(nodes, list(names), {}, feeds)
        return {name: values[name] for name in names if name in values}

    def stream(
        self, chunks: Sequence[Sequence[str]], feeds: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]:
        """The tensors of each chunk in turn, each node computed about once over all chunks.

        Between chunks the streamer keeps the frontier: the tensors already computed that a
        later node reads.  The next chunk's graph takes them as inputs instead of recomputing its
        ancestors, so the whole stream costs about one run of the model plus a session per
        chunk; memory holds the frontier (the activations a plain run keeps alive at that point)
        and one chunk.
        """
        graph = self.graph.graph
        last_read: dict[str, int] = {}
        for i, node in enumerate(graph.node):
            for tensor in _node_reads(node):
                last_read[tensor] = i
        frontier: dict[str, np.ndarray] = {}
        for chunk in chunks:
            nodes = self._ancestors(chunk, set(frontier))
            horizon = max((self._producers.get(n, -1) for n in chunk), default=-1)
            produced = {o for i in nodes for o in graph.node[i].output if o}
            later = [t for t in produced if last_read.get(t, -1) > horizon and t not in chunk]
            values = self._run(nodes, [*chunk, *later], frontier, feeds)
            frontier = {t: a for t, a in frontier.items() if last_read.get(t, -1) > horizon}
            for tensor in (*later, *chunk):
                if tensor in values and last_read.get(tensor, -1) > horizon:
                    frontier[tensor] = values[tensor]
            yield {name: values[name] for name in chunk if name in values}
            del values

    def _run(
        self,
        nodes: set[int],
        outputs: Sequence[str],
        frontier: Mapping[str, np.ndarray],
        feeds: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        ort = self._ort
        pruned = self._pruned(nodes, outputs, frontier)
        if self._folder is not None:
            source: str | bytes = str(Path(self._folder.name) / "chunk.onnx")
            onnx.save(pruned, source)
        else:
            source = pruned.SerializeToString()
        del pruned
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(
                source, sess_options=options, providers=["CPUExecutionProvider"]
            )
            wanted = {i.name for i in session.get_inputs()}
            given = {**feeds, **frontier}
            values = session.run(list(outputs), {k: v for k, v in given.items() if k in wanted})
        except Exception as exc:  # onnxruntime raises its own pybind types; the message matters
            message = " ".join(str(exc).split()) or type(exc).__name__
            raise BackendError(
                f"onnxruntime cannot run {self.label}: {message}; check that onnxruntime "
                "supports every op and opset in it and that --shape/--range/--inputs fit it"
            ) from exc
        self.runs += 1
        self.nodes_run += len(nodes)
        return {
            name: value
            for name, value in zip(outputs, values, strict=True)
            if isinstance(value, np.ndarray)
        }

    def _ancestors(self, names: Sequence[str], available: set[str]) -> set[int]:
        """Nodes needed to compute `names`, stopping at tensors already `available`."""
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
                if j is not None and j not in needed and tensor not in available:
                    stack.append(j)
        return needed

    def _pruned(
        self, nodes: set[int], outputs: Sequence[str], frontier: Mapping[str, np.ndarray]
    ) -> onnx.ModelProto:
        graph = self.graph.graph
        reads = {t for i in nodes for t in _node_reads(graph.node[i])} | set(outputs)
        produced = {o for i in nodes for o in graph.node[i].output}
        pruned = onnx.ModelProto()
        pruned.CopyFrom(self._shell)
        g = pruned.graph
        g.node.extend(graph.node[i] for i in sorted(nodes))
        g.initializer.extend(t for t in graph.initializer if t.name in reads)
        for name, array in frontier.items():
            if name in reads and name not in produced:
                g.input.append(
                    onnx.helper.make_tensor_value_info(
                        name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
                    )
                )
        del g.output[:]
        for name in outputs:
            value = onnx.ValueInfoProto()
            value.name = name  # untyped: onnxruntime takes the type the graph gives it
            g.output.append(value)
        return pruned


class TensorStream(Protocol):
    """What streams a model's tensors chunk by chunk: a TensorStreamer, a candidate runner."""

    def stream(
        self, chunks: Sequence[Sequence[str]], feeds: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]: ...


def stream_pairs(
    reference: TensorStream,
    candidate: TensorStream,
    feeds_reference: Mapping[str, np.ndarray],
    feeds_candidate: Mapping[str, np.ndarray],
    chunks: Sequence[Sequence[str]],
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, reference array, candidate array) for every tensor, one chunk in memory at a time."""
    for ref, cand in zip(
        reference.stream(chunks, feeds_reference),
        candidate.stream(chunks, feeds_candidate),
        strict=True,
    ):
        for name in list(ref):
            r, c = ref.pop(name), cand.pop(name, None)
            if c is not None:
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
    """Element type of every tensor onnx's shape inference can type (initializers included).

    When the model's own value_info already types every node output (converters write it), that
    is used as is: shape inference costs more than the rest of a small model's localisation.
    """
    g = model.graph
    declared = {
        v.name: v.type.tensor_type.elem_type
        for v in (*g.input, *g.value_info, *g.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }
    declared.update({t.name: t.data_type for t in g.initializer})
    if all(o in declared for node in g.node for o in node.output if o):
        return declared
    return _infer(model, {}, sizes=False)[0]


def _infer(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, sizes: bool = True
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
    nbytes: dict[str, int] = {}
    g = inferred.graph
    for value in (*g.input, *g.value_info, *g.output):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            continue
        types[value.name] = tensor.elem_type or _UNKNOWN
        if not sizes or not tensor.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if all(d is not None for d in dims):
            nbytes[value.name] = 4 * int(np.prod(dims, dtype=np.int64))
    for tensor in model.graph.initializer:
        types[tensor.name] = tensor.data_type
    return types, nbytes
