"""Embedded weights left on disk: read a model without them, write them back by streaming.

`onnx.load` of a model whose weights are embedded holds the whole file twice at its peak (the
file's bytes and the parsed message), and everything after it that serializes the model
(shape inference, saving) adds a copy each.  Here the protobuf wire format is walked instead, by
small reads: every field is parsed as usual except the `raw_data` of big initializers, which
becomes an external-data reference to its byte range in the .onnx file itself (`location` = the
file's own name).  The graph, the small constants and every other field are real; the weights
are never read.  `write_model` embeds such references again, copying each range inside the kernel
(`copy_file_range`) or through a small buffer, so a model is saved without ever being whole in
memory.  Raw protobuf, not onnx-graphsurgeon: the point is to never materialize the weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError

# Tensors with at least this many raw bytes stay on disk (onnx's own default threshold for
# external data): scalar scales and shape constants, which the matcher reads, are far smaller.
REFERENCE_THRESHOLD = 1024
_COPY_CHUNK = 64 << 20
_READ_CHUNK = 4 << 20

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_LENGTH_DELIMITED = 2


class MalformedModel(ValueError):
    """The file is not a well-formed protobuf message (the caller's onnx.load says why)."""


def load_referencing_embedded(path: Path) -> onnx.ModelProto:
    """The model at `path`, its big embedded tensors as references into the file itself."""
    with open(path, "rb") as stream:
        view = _File(stream.fileno())
        if len(view) == 0:
            raise MalformedModel("empty file")
        return _read_model(view, path.name)


class _File:
    """Byte ranges of a file by `pread`.  Not a memory map: mapped file pages count in the
    process's RSS and the kernel maps more than the page each fault touches; reading 636 field
    headers of an 853 MB model through a map raised peak RSS by 170 MB here (MADV_RANDOM too)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, span: slice) -> bytes:
        data = os.pread(self.fd, span.stop - span.start, span.start)
        if len(data) != span.stop - span.start:
            raise MalformedModel(f"the file ends inside bytes {span.start}..{span.stop}")
        return data


def references_to(model: onnx.ModelProto, location: str) -> bool:
    """Whether any initializer of `model` refers to bytes in the file named `location`."""
    return any(_self_reference(t, location) for t in model.graph.initializer)


def write_model(model: onnx.ModelProto, stream: BinaryIO, source: Path) -> None:
    """Serialize `model` into `stream`, embedding the tensors that reference `source`'s own bytes.

    `stream` must be unbuffered (`open(..., buffering=0)`): ranges are copied into its file
    descriptor directly.  Fields come out in a different order than `SerializeToString` writes
    them (the graph last, its initializers after its other fields), which parsers accept.
    """
    location = source.name
    top = onnx.ModelProto()
    top.CopyFrom(model)  # cheap: the weights are references
    top.ClearField("graph")
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    graph.ClearField("initializer")
    pieces = [_Piece.of(t, location) for t in model.graph.initializer]
    graph_bytes = graph.SerializeToString()
    graph_size = len(graph_bytes) + sum(p.framed_size for p in pieces)
    stream.write(top.SerializeToString())
    stream.write(_tag(_MODEL_GRAPH) + _varint(graph_size) + graph_bytes)
    with open(source, "rb") as data:
        for piece in pieces:
            piece.write(stream, data.fileno())


class _Piece:
    """One initializer as written: its serialized fields, then (if it was a reference) its bytes."""

    def __init__(self, head: bytes, offset: int = 0, length: int = 0, *, raw: bool = False):
        self.head, self.offset, self.length, self.raw = head, offset, length, raw
        raw_field = len(_tag(_TENSOR_RAW_DATA)) + len(_varint(length)) + length if raw else 0
        self.size = len(head) + raw_field
        self.framed_size = len(_tag(_GRAPH_INITIALIZER)) + len(_varint(self.size)) + self.size

    @classmethod
    def of(cls, tensor: onnx.TensorProto, location: str) -> _Piece:
        if not _self_reference(tensor, location):
            return cls(tensor.SerializeToString())
        info = {e.key: e.value for e in tensor.external_data}
        head = onnx.TensorProto()
        head.CopyFrom(tensor)
        head.ClearField("external_data")
        head.ClearField("data_location")
        return cls(
            head.SerializeToString(), int(info.get("offset", 0)), int(info["length"]), raw=True
        )

    def write(self, stream: BinaryIO, source_fd: int) -> None:
        stream.write(_tag(_GRAPH_INITIALIZER) + _varint(self.size) + self.head)
        if self.raw:
            stream.write(_tag(_TENSOR_RAW_DATA) + _varint(self.length))
            _copy_range(source_fd, stream.fileno(), self.offset, self.length)


def _self_reference(tensor: onnx.TensorProto, location: str) -> bool:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return False
    return any(e.key == "location" and e.value == location for e in tensor.external_data)


def _copy_range(source_fd: int, dest_fd: int, offset: int, length: int) -> None:
    end = offset + length
    copy_range = getattr(os, "copy_file_range", None)
    try:
        while copy_range is not None and offset < end:
            n = copy_range(source_fd, dest_fd, min(_COPY_CHUNK, end - offset), offset)
            if n == 0:
                break
            offset += n
    except OSError:
        pass  # not supported between these files: the buffered loop below copies the rest
    while offset < end:
        chunk = os.pread(source_fd, min(_READ_CHUNK, end - offset), offset)
        if not chunk:
            raise OSError(f"the source model ended {end - offset} bytes early")
        os.write(dest_fd, chunk)
        offset += len(chunk)


# --- reading ------------------------------------------------------------------------------------


def _read_model(view: _File, location: str) -> onnx.ModelProto:
    rest = _Ranges(view)
    graphs: list[tuple[int, int]] = []
    for number, wire, start, value, end in _fields(view, 0, len(view)):
        if number == _MODEL_GRAPH and wire == _LENGTH_DELIMITED:
            graphs.append((value, end))
        else:
            rest.add(start, end)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(rest.bytes())
        for start, end in graphs:  # protobuf merges repeated occurrences of a message field
            model.graph.MergeFrom(_read_graph(view, start, end, location))
    except DecodeError as exc:
        raise MalformedModel(str(exc)) from exc
    return model


def _read_graph(view: _File, start: int, end: int, location: str) -> onnx.GraphProto:
    rest = _Ranges(view)
    initializers: list[onnx.TensorProto] = []
    for number, wire, field_start, value, field_end in _fields(view, start, end):
        if number == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
            initializers.append(_read_tensor(view, value, field_end, location))
        else:
            rest.add(field_start, field_end)
    graph = onnx.GraphProto()
    graph.ParseFromString(rest.bytes())
    graph.initializer.extend(initializers)
    return graph


def _read_tensor(view: _File, start: int, end: int, location: str) -> onnx.TensorProto:
    tensor = onnx.TensorProto()
    raw: tuple[int, int] | None = None
    rest = _Ranges(view)
    for number, wire, field_start, value, field_end in _fields(view, start, end):
        if number == _TENSOR_RAW_DATA and wire == _LENGTH_DELIMITED:
            raw = (value, field_end)
        else:
            rest.add(field_start, field_end)
    if raw is None or raw[1] - raw[0] < REFERENCE_THRESHOLD:
        tensor.ParseFromString(view[start:end])
        return tensor
    tensor.ParseFromString(rest.bytes())
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, text in (("location", location), ("offset", raw[0]), ("length", raw[1] - raw[0])):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(text)
    return tensor


class _Ranges:
    """Byte ranges of the map, merged while they are contiguous, read out once."""

    def __init__(self, view: _File) -> None:
        self.view = view
        self.spans: list[list[int]] = []

    def add(self, start: int, end: int) -> None:
        if self.spans and self.spans[-1][1] == start:
            self.spans[-1][1] = end
        else:
            self.spans.append([start, end])

    def bytes(self) -> bytes:
        return b"".join(self.view[s:e] for s, e in self.spans)


def _fields(view: _File, position: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, field end) of each field."""
    while position < end:
        start = position
        key, position = _read_varint(view, position, end)
        number, wire = key >> 3, key & 7
        value = position
        if wire == 0:
            _, position = _read_varint(view, position, end)
        elif wire == 1:
            position += 8
        elif wire == _LENGTH_DELIMITED:
            length, value = _read_varint(view, position, end)
            position = value + length
        elif wire == 5:
            position += 4
        else:  # groups (3, 4) are not used by onnx.proto
            raise MalformedModel(f"unexpected wire type {wire} at byte {start}")
        if number == 0 or position > end:
            raise MalformedModel(f"field at byte {start} runs past its message")
        yield number, wire, start, value, position


def _read_varint(view: _File, position: int, end: int) -> tuple[int, int]:
    result = shift = 0
    for byte in view[position : min(position + 10, end)]:  # a varint has at most 10 bytes
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
    raise MalformedModel(f"malformed varint before byte {position}")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED)
