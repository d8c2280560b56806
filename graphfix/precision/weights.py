"""Float32 tensor values in the target type: range checks and conversion, tensor by tensor.

Weights still on disk (external data) are read in fixed-size chunks and written to the new data
file as they are converted, so memory stays at one chunk whatever the model's size.  Raw
protobuf rather than onnx-graphsurgeon: gs loads every tensor's values to build its graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.errors import ModelLoadError

FLOAT = onnx.TensorProto.FLOAT
_CHUNK_ELEMENTS = 4 << 20  # 16 MB of float32 per read

TARGETS = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
# Largest finite value of each target type.
LIMITS = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


@dataclass(frozen=True)
class TensorSource:
    """Where a tensor's bytes are: in the proto, or a byte range of an external file."""

    file: Path | None
    offset: int
    length: int


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.HasField("raw_data")


def external_source(tensor: onnx.TensorProto, base_dir: Path | None) -> TensorSource:
    info = {e.key: e.value for e in tensor.external_data}
    if base_dir is None:
        raise ModelLoadError(
            f"initializer {tensor.name} is stored in external data ({info.get('location')}) "
            "but the model's folder is unknown; pass the model's path instead of a ModelProto"
        )
    file = base_dir / info["location"]
    offset = int(info.get("offset", 0))
    count = int(np.prod(tensor.dims, dtype=np.int64))
    length = int(info["length"]) if "length" in info else 4 * count
    return TensorSource(file, offset, length)


def max_abs(tensor: onnx.TensorProto, base_dir: Path | None) -> float:
    """Largest finite |x| of a float32 tensor (0.0 when empty); infinities and NaN are
    representable in the target types, so they do not count."""
    best = 0.0
    for chunk in _chunks(tensor, base_dir):
        finite = chunk[np.isfinite(chunk)]
        if finite.size:
            best = max(best, float(np.abs(finite).max()))
    return best


def convert_in_memory(tensor: onnx.TensorProto, to: str, name: str) -> onnx.TensorProto:
    """A copy of an in-memory float32 tensor in the target type, named `name`."""
    values = numpy_helper.to_array(tensor)
    out = onnx.TensorProto()
    out.name = name
    out.dims.extend(tensor.dims)
    out.data_type = TARGETS[to]
    out.raw_data = to_target_bytes(values, to)
    if tensor.doc_string:
        out.doc_string = tensor.doc_string
    return out


def to_target_bytes(values: np.ndarray, to: str) -> bytes:
    """Little-endian bytes of `values` in the target type, rounded to nearest even."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if to == "float16":
        return values.astype("<f2").tobytes()
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded.astype("<u2").tobytes()


def stream_tensor(
    tensor: onnx.TensorProto,
    out: onnx.TensorProto,
    *,
    base_dir: Path | None,
    to: str | None,
    stream: BinaryIO,
    location: str,
) -> None:
    """Write `tensor`'s values (converted to `to`, or as they are when None) to `stream` and
    make `out` reference them; `out` already has its name, dims and data type."""
    offset = stream.tell()
    if to is None:
        src = external_source(tensor, base_dir)
        with open(src.file, "rb") as fin:
            fin.seek(src.offset)
            remaining = src.length
            while remaining:
                block = fin.read(min(remaining, 4 * _CHUNK_ELEMENTS))
                if not block:
                    raise ModelLoadError(
                        f"external data of {tensor.name} in {src.file} is truncated"
                    )
                stream.write(block)
                remaining -= len(block)
    else:
        for chunk in _chunks(tensor, base_dir):
            stream.write(to_target_bytes(chunk, to))
    length = stream.tell() - offset
    del out.external_data[:]
    out.ClearField("raw_data")
    out.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = out.external_data.add()
        entry.key, entry.value = key, str(value)


def _chunks(tensor: onnx.TensorProto, base_dir: Path | None) -> Iterator[np.ndarray]:
    """A float32 tensor's values, flat, in chunks of at most `_CHUNK_ELEMENTS`."""
    if not is_external(tensor):
        yield numpy_helper.to_array(tensor).reshape(-1).astype(np.float32, copy=False)
        return
    src = external_source(tensor, base_dir)
    with open(src.file, "rb") as fin:
        fin.seek(src.offset)
        remaining = src.length // 4
        while remaining:
            count = min(remaining, _CHUNK_ELEMENTS)
            block = fin.read(4 * count)
            if len(block) != 4 * count:
                raise ModelLoadError(
                    f"external data of {tensor.name} in {src.file} is truncated: expected "
                    f"{src.length} bytes at offset {src.offset}"
                )
            yield np.frombuffer(block, dtype="<f4")
            remaining -= count
