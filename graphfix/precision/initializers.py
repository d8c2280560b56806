"""Write a converted model's initializers: each once, in float32, the target type or both.

Weights on disk go tensor by tensor into one new data file (`weights.Streamer`), never all in
memory; the result's external data is relative to the returned .onnx path.  The data file is
opened before the graph is planned (`WeightsOut`), so that the big float32 weights, which the
plan almost always puts in the target type, are converted while it runs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import onnx

from graphfix.model_io import system_temporary_prefix
from graphfix.precision import weights
from graphfix.precision.apply import PlanApplier


class WeightsOut:
    """The new data file of a model with weights on disk, and its Streamer.

    Opened (`open`) before planning: it starts converting the model's big float32 weights on
    worker threads at once.  Use as a context manager: leaving it on an error stops the
    workers and deletes the file (and the temporary folder it made)."""

    def __init__(self, data_file: Path, folder: Path | None, base_dir: Path | None) -> None:
        self.data_file, self.folder = data_file, folder
        self.stream: BinaryIO = open(data_file, "x+b")  # read back to compact
        self.streamer = weights.Streamer(self.stream, data_file.name, base_dir)
        self.kept = False

    @staticmethod
    def open(
        model: onnx.ModelProto, base_dir: Path | None, external_data: Path | None, to: str
    ) -> WeightsOut | None:
        """A data file for `model`'s converted weights when it has weights on disk (in
        `external_data`, else in a new temporary folder), already converting its big float32
        initializers to `to`; None when all its weights are in memory."""
        if not any(weights.is_external(t) for t in _all_tensors(model)):
            return None
        folder = None
        if external_data is None:
            folder = Path(tempfile.mkdtemp(prefix=system_temporary_prefix("precision")))
            data_file = folder / "model.onnx.data"
        else:
            data_file = external_data
            data_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            out = WeightsOut(data_file, folder, base_dir)
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        try:
            inputs = {i.name for i in model.graph.input}  # overridable: never converted
            out.streamer.convert_ahead(
                (t for t in model.graph.initializer if t.name not in inputs), to
            )
        except BaseException:
            out.__exit__(None, None, None)
            raise
        return out

    def __enter__(self) -> WeightsOut:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.streamer.close()
        self.stream.close()
        if not self.kept:
            self.data_file.unlink(missing_ok=True)
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)


def place_weights(
    rewrite: PlanApplier, base_dir: Path | None, out: WeightsOut | None
) -> Path | None:
    """Convert initializers once each; weights on disk are streamed into `out`'s data file.
    Returns the .onnx path the result's external data is relative to (None: all in memory);
    the caller writes the finished model there."""
    if out is None or not any(weights.is_external(t) for t in _all_tensors(rewrite.model)):
        _replace_initializers(rewrite, None)
        return None
    streamer = out.streamer
    location = out.data_file.name
    # Tensors in subgraphs and attributes first, copied as they are: once the top-level ones
    # reference the new file, an input data file of the same name could not be told from it.
    for tensor in _nested_tensors(rewrite.model):
        if weights.is_external(tensor):
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            streamer.write(copy, tensor, None)
    _replace_initializers(rewrite, streamer)
    moved = streamer.finish()
    if moved:  # a weight converted ahead was not used: the tensors after it moved down
        for tensor in _all_tensors(rewrite.model):
            if weights.is_external(tensor) and _location(tensor) == location:
                for entry in tensor.external_data:
                    if entry.key == "offset" and int(entry.value) in moved:
                        entry.value = str(moved[int(entry.value)])
    out.stream.close()
    name = out.data_file.name
    source = out.data_file.parent / (
        name.removesuffix(".data") if name.endswith(".onnx.data") else "model.onnx"
    )
    out.kept = True
    return source


def _replace_initializers(rewrite: PlanApplier, streamer: weights.Streamer | None) -> None:
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


def _nested_tensors(model: onnx.ModelProto):
    """Every tensor of `_all_tensors` but the main graph's initializers: subgraph initializers
    and attribute tensors (of the graph, its subgraphs and the model's functions)."""
    from onnx.external_data_helper import (
        _get_attribute_tensors,
        _get_initializer_tensors_from_graph,
        _recursive_attribute_processor,
    )

    for node in model.graph.node:
        for attribute in node.attribute:
            yield from _recursive_attribute_processor(
                attribute, _get_initializer_tensors_from_graph
            )
    yield from _get_attribute_tensors(model)


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")
