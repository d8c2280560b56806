"""Write a converted model's initializers: each once, in float32, the target type or both.

Weights on disk go tensor by tensor into one new data file (`weights.Streamer`), never all in
memory; the result's external data is relative to the returned .onnx path.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import onnx

from graphfix.precision import weights
from graphfix.precision.apply import PlanApplier


def place_weights(
    rewrite: PlanApplier,
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
    rewrite: PlanApplier, base_dir: Path | None, stream: BinaryIO | None, location: str | None
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


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")
