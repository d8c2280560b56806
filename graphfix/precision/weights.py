"""Float32 tensor values in the target type: range checks and conversion, tensor by tensor.

Weights still on disk (external data) are read in fixed-size chunks and written to the new data
file as they are converted, so memory stays at one chunk whatever the model's size.  Raw
protobuf rather than onnx-graphsurgeon: gs loads every tensor's values to build its graph.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import sys
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.errors import ModelLoadError

FLOAT = onnx.TensorProto.FLOAT
_CHUNK_ELEMENTS = 2 << 20  # 8 MB of float32 per read
# Weights on disk above this size are range-checked while they are converted (one read), not
# before: a weight beyond the target's range is then rare enough to redo the conversion.
DEFERRED_CHECK_BYTES = 1 << 20
# Chunks converted in parallel (numpy releases the GIL in its casts); bounds memory too.
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_INFINITY_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80}
_RESERVE_STEP = 256 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux
# Chunk tasks queued ahead of the one this thread waits for (a weight beyond range stops soon).
_IN_FLIGHT = 4 * _WORKERS


# float32 → float16 of big arrays through onnxruntime's Cast (MLAS, F16C): ~10× numpy's astype,
# bit-identical (round to nearest even, overflow to infinity).
_FAST_CAST_ELEMENTS = 1 << 16


_SESSION_LOCK = threading.Lock()


def _float16_cast():
    """The Cast session, made once (workers may ask for it at the same time)."""
    with _SESSION_LOCK:
        return _make_float16_cast()


@functools.cache
def _make_float16_cast():
    import onnxruntime as ort
    from onnx import helper

    node = helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT16)
    graph = helper.make_graph(
        [node],
        "float32_to_float16",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # chunks are spread over threads by the caller
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


class OutOfRangeWeight(Exception):
    """Internal: a weight converted while streaming holds values beyond the target's range."""

    def __init__(self, name: str, biggest: float) -> None:
        super().__init__(name)
        self.name, self.biggest = name, biggest


TARGETS = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
# Largest finite value of each target type.
LIMITS = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
# Smallest positive normal value of each target type (below it, precision falls off).
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126}


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
    count = math.prod(tensor.dims)
    length = int(info["length"]) if "length" in info else 4 * count
    return TensorSource(file, offset, length)


def max_abs(tensor: onnx.TensorProto, base_dir: Path | None) -> float:
    """Largest finite |x| of a float32 tensor (0.0 when empty); infinities and NaN are
    representable in the target types, so they do not count."""
    best = 0.0
    for chunk in _chunks(tensor, base_dir):
        if not chunk.size:
            continue
        quick = max(float(chunk.max()), -float(chunk.min()))
        if not np.isfinite(quick):  # inf or NaN present: look at the finite values only
            finite = chunk[np.isfinite(chunk)]
            quick = float(np.abs(finite).max()) if finite.size else 0.0
        best = max(best, quick)
    return best


def deferred_check(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor`'s range is checked while it is streamed rather than before."""
    return is_external(tensor) and 4 * math.prod(tensor.dims) > DEFERRED_CHECK_BYTES


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
    return to_target_bits(values, to).tobytes()


def to_target_bits(values: np.ndarray, to: str) -> np.ndarray:
    """`values` in the target type as little-endian uint16 bit patterns (round to nearest even)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if to == "float16":
        if values.size >= _FAST_CAST_ELEMENTS:
            return (
                _float16_cast()
                .run(None, {"x": values.reshape(-1)})[0]
                .view("<u2")
                .reshape(values.shape)
            )
        with np.errstate(over="ignore"):  # overflow is detected by the caller, not warned
            return values.astype("<f2").view("<u2")
    bits = values.view(np.uint32)
    # round to nearest even on the 16 bits dropped; only NaN bit patterns could wrap around
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype("<u2")
    rounded[np.isnan(values)] = 0x7FC0
    return rounded


def _convert_chunk(
    chunk: np.ndarray, to: str, out: np.ndarray, scratch: np.ndarray
) -> tuple[np.ndarray, bool]:
    """The chunk in the target type (in `out` where it can), and whether a finite value
    overflowed to infinity."""
    n = chunk.size
    if to == "float16" and n >= _FAST_CAST_ELEMENTS:
        session = _float16_cast()
        binding = session.io_binding()
        binding.bind_cpu_input("x", np.ascontiguousarray(chunk))
        binding.bind_output("y", "cpu", 0, np.float16, [n], out.ctypes.data)
        session.run_with_iobinding(binding)
        data = out[:n]
    else:
        data = to_target_bits(chunk, to)
    # No bit pattern has magnitude >= infinity's: two reductions, no temporary (the largest
    # as int16 sees the positive patterns, the largest as uint16 the negative ones).
    infinity = _INFINITY_BITS[to]
    if (
        int(data.view("<i2").max(initial=0)) < infinity
        and int(data.max(initial=0)) < 0x8000 | infinity
    ):
        return data, False
    magnitude = np.bitwise_and(data, 0x7FFF, out=scratch[:n])
    overflowed = (magnitude >= infinity) & np.isfinite(chunk)
    return data, bool(overflowed.any())


# While weights convert on worker threads and this thread plans the graph (pure Python), a worker
# coming back from onnxruntime, numpy or a system call waits for the GIL until this thread is
# asked to let go, by default after 5 ms: a chunk needs about seven such hand-overs, so with the
# default the workers convert almost nothing while the graph is planned.  Streamers ask for
# hand-overs after 0.2 ms while they run, and put the interpreter's setting back when the last
# one closes.
_SWITCH_INTERVAL = 2e-4
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


def _fast_switching(on: bool) -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        if on:
            _switch_users += 1
            if _switch_users == 1:
                _switch_saved = sys.getswitchinterval()
                sys.setswitchinterval(min(_switch_saved, _SWITCH_INTERVAL))
        else:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


class Streamer:
    """Writes tensors one after another into one data file, converting float32 chunks.

    Each chunk is one task for a few worker threads (onnxruntime, numpy and the system calls
    release the GIL): map the chunk's bytes from the page cache (no copy into a buffer),
    convert them into the worker's own buffer, check for overflow, and write them at their
    offset in the data file (pwrite, one worker at a time: concurrent writes to one file
    spin on its inode lock), so no chunk is handed from thread to thread.  This thread only
    plans offsets and submits tasks.  Memory stays at a mapped chunk and two buffers per
    worker whatever the model's size; tensors kept as they are move inside the kernel
    (copy_file_range), like `cp`.

    `convert_ahead` starts converting big float32 weights before the plan says which ones
    the target type needs (almost all of them), so the conversion runs while the graph is
    planned; `write` then takes a weight converted ahead instead of converting it again, and
    `finish` closes the gaps that weights converted ahead but not wanted left in the file.
    """

    def __init__(self, stream: BinaryIO, location: str, base_dir: Path | None) -> None:
        self.stream, self.location, self.base_dir = stream, location, base_dir
        stream.flush()
        self.fileno = stream.fileno()
        self.start = self.position = stream.tell()  # where the next tensor goes
        self.pool = ThreadPoolExecutor(_WORKERS)
        self.local = threading.local()  # each worker's output and scratch buffers
        self.write_lock = threading.Lock()
        self.files: dict[Path, int] = {}
        self.sizes: dict[int, int] = {}  # of each input file, by descriptor
        self.pending: deque = deque()  # (tensor, future of a chunk task), in submission order
        self.allocated = self.position
        self.ahead: dict[TensorSource, _Ahead] = {}  # weights converted before they are asked
        self.ahead_end = self.position
        self.used: list[tuple[int, int]] = []  # (offset, length) of every tensor written
        self.closed = False
        self.switching = False

    def __enter__(self) -> Streamer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (queued chunks are dropped) and close the input files."""
        if self.closed:
            return
        self.closed = True
        try:
            self.pool.shutdown(cancel_futures=True)
        finally:
            if self.switching:
                _fast_switching(False)
        for fd in self.files.values():
            os.close(fd)

    def finish(self) -> dict[int, int]:
        """Wait for every chunk, close the gaps left by weights converted ahead and not used,
        and cut the file after the last tensor.  Returns old offset → new offset for each
        tensor that moved (none unless a weight converted ahead was not used)."""
        self._drain()
        for ahead in self.ahead.values():
            if not ahead.used:  # no chunk of it may land once tensors move into its place
                for future in ahead.futures:
                    if not future.cancel():
                        future.exception()
        moved = self._compact()
        os.ftruncate(self.fileno, self.position)
        self.stream.seek(self.position)
        self.close()
        return moved

    def convert_ahead(self, tensors: Iterator[onnx.TensorProto], to: str) -> None:
        """Queue the conversion of these float32 weights on disk now, each once, without
        waiting for any (their overflow check is collected when `write` takes them)."""
        if not self.switching:
            self.switching = True
            _fast_switching(True)
        for tensor in tensors:
            if not deferred_check(tensor) or tensor.data_type != FLOAT:
                continue
            src = external_source(tensor, self.base_dir)
            if src in self.ahead:
                continue
            offset = self.position
            self._reserve(offset + 2 * math.prod(tensor.dims))
            futures = [self._submit_task(chunk, to) for chunk in self._external_chunks(tensor)]
            self.ahead[src] = _Ahead(to, offset, self.position - offset, futures)
        self.ahead_end = self.position

    def restart(self) -> None:
        """Forget what was written after the weights converted ahead (a new attempt writes
        them again); those stay, for the next attempt to take."""
        while self.pending:
            self.pending.popleft()[1].exception()  # wait; its overflow no longer matters
        for ahead in self.ahead.values():
            ahead.used = False
        self.used.clear()
        self.position = self.ahead_end

    def write(self, tensor: onnx.TensorProto, out: onnx.TensorProto, to: str | None) -> None:
        """Queue `tensor`'s values (converted to `to`, or as they are when None) and make `out`
        reference them; `out` already has its name, dims and data type."""
        ahead = None
        if to is not None and is_external(tensor):
            ahead = self.ahead.get(external_source(tensor, self.base_dir))
        if ahead is not None and ahead.to == to and not ahead.used:
            ahead.used = True
            for future in ahead.futures:
                self.pending.append((tensor, future))
            offset, length = ahead.offset, ahead.length
        else:
            offset = self.position
            if to is None:
                self._reserve(offset + external_source(tensor, self.base_dir).length)
                self._copy(tensor)
            else:
                self._reserve(offset + 2 * math.prod(tensor.dims))
                self._convert(tensor, to)
            length = self.position - offset
        self.used.append((offset, length))
        del out.external_data[:]
        out.ClearField("raw_data")
        out.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset), ("length", length)):
            entry = out.external_data.add()
            entry.key, entry.value = key, str(value)

    def _reserve(self, end: int) -> None:
        """Allocate the data file ahead in big steps: writing into allocated blocks is about
        three times faster than growing the file write by write (ext4, xfs)."""
        if end <= self.allocated:
            return
        target = max(end, self.allocated + _RESERVE_STEP)
        try:
            os.posix_fallocate(self.fileno, self.allocated, target - self.allocated)
        except (OSError, AttributeError):  # a filesystem without fallocate: grow as we write
            self.allocated = 1 << 62
            return
        self.allocated = target

    def _convert(self, tensor: onnx.TensorProto, to: str) -> None:
        """Submit `tensor`'s chunks; each task reads, converts and writes one chunk."""
        if not is_external(tensor):
            values = numpy_helper.to_array(tensor).reshape(-1).astype(np.float32, copy=False)
            for start in range(0, values.size, _CHUNK_ELEMENTS):
                chunk = values[start : start + _CHUNK_ELEMENTS]
                self._submit(tensor, _Chunk(None, -1, chunk.size, chunk), to)
            return
        for chunk in self._external_chunks(tensor):
            self._submit(tensor, chunk, to)

    def _external_chunks(self, tensor: onnx.TensorProto) -> Iterator[_Chunk]:
        src = external_source(tensor, self.base_dir)
        fd = self._fd(src.file)
        if src.offset + 4 * (src.length // 4) > self.sizes[fd]:
            raise ModelLoadError(
                f"external data of {tensor.name} in {src.file} is truncated: "
                f"expected {src.length} bytes at offset {src.offset}"
            )
        offset, remaining = src.offset, src.length // 4
        while remaining:
            count = min(remaining, _CHUNK_ELEMENTS)
            yield _Chunk(fd, offset, count, None)
            offset += 4 * count
            remaining -= count

    def _submit_task(self, chunk: _Chunk, to: str):
        future = self.pool.submit(self._task, chunk, to, self.position)
        self.position += 2 * chunk.count
        return future

    def _submit(self, tensor: onnx.TensorProto, chunk: _Chunk, to: str) -> None:
        self.pending.append((tensor, self._submit_task(chunk, to)))
        while self.pending and (self.pending[0][1].done() or len(self.pending) > _IN_FLIGHT):
            self._finish(*self.pending.popleft())

    def _finish(self, tensor: onnx.TensorProto, future) -> None:
        if future.result():
            raise OutOfRangeWeight(tensor.name, max_abs(tensor, self.base_dir))

    def _drain(self) -> None:
        while self.pending:
            self._finish(*self.pending.popleft())

    def _task(self, chunk: _Chunk, to: str, at: int) -> bool:
        """Read, convert and write one chunk; whether a finite value overflowed."""
        local = self.local
        if not hasattr(local, "out"):
            local.out = np.empty(_CHUNK_ELEMENTS, "<u2")
            local.scratch = np.empty(_CHUNK_ELEMENTS, "<u2")
        values = chunk.values
        if values is None:
            values = _read_chunk(chunk, local)
        data, overflowed = _convert_chunk(values, to, local.out, local.scratch)
        del values
        view, done = memoryview(data).cast("B"), 0
        with self.write_lock:
            while done < len(view):
                done += os.pwrite(self.fileno, view[done:], at + done)
        return overflowed

    def _fd(self, file: Path) -> int:
        if file not in self.files:
            fd = self.files[file] = os.open(file, os.O_RDONLY)
            self.sizes[fd] = os.fstat(fd).st_size
        return self.files[file]

    def _copy(self, tensor: onnx.TensorProto) -> None:
        src = external_source(tensor, self.base_dir)
        fd, start = self._fd(src.file), self.position
        if not _copy_range(fd, src.offset, self.fileno, start, src.length):
            raise ModelLoadError(f"external data of {tensor.name} in {src.file} is truncated")
        self.position = start + src.length

    def _compact(self) -> dict[int, int]:
        """Move the tensors written after a gap (a weight converted ahead that no tensor
        uses) down to close it; old offset → new offset of those moved."""
        moved: dict[int, int] = {}
        cursor = self.start
        for offset, length in sorted(self.used):
            if offset > cursor:
                done = 0
                while done < length:  # in steps no longer than the gap: never overlapping
                    step = min(length - done, offset - cursor, 4 * _CHUNK_ELEMENTS)
                    _copy_range(self.fileno, offset + done, self.fileno, cursor + done, step)
                    done += step
                moved[offset] = cursor
            cursor += length
        self.position = cursor
        return moved


def _copy_range(fd_in: int, offset_in: int, fd_out: int, offset_out: int, length: int) -> bool:
    """Copy `length` bytes inside the kernel where it can (copy_file_range), else through a
    buffer; False when the source ends first."""
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    try:
        while copy_range is not None and done < length:
            n = copy_range(fd_in, fd_out, length - done, offset_in + done, offset_out + done)
            if n == 0:
                break
            done += n
    except OSError:
        pass  # another filesystem or an old kernel: the buffered copy below finishes
    while done < length:
        block = os.pread(fd_in, min(length - done, 4 * _CHUNK_ELEMENTS), offset_in + done)
        if not block:
            return False
        view = memoryview(block)
        while view:
            n = os.pwrite(fd_out, view, offset_out + done)
            view, done = view[n:], done + n
    return True


@dataclass
class _Ahead:
    """A weight converted ahead: its place in the data file and its chunks' tasks."""

    to: str
    offset: int
    length: int
    futures: list
    used: bool = False


@dataclass(frozen=True)
class _Chunk:
    """One chunk of a float32 tensor: `count` values at `offset` of file `fd`, or `values`."""

    fd: int | None
    offset: int
    count: int
    values: np.ndarray | None


def _read_chunk(chunk: _Chunk, local: threading.local) -> np.ndarray:
    """The chunk's float32 values.  Mapped from the page cache where the offset allows (the
    converting thread reads them in place: one memory copy fewer than pread, ~0.3 s of 2 GB),
    all its pages at once (MAP_POPULATE: one system call instead of a fault every 64 KB);
    the mapping goes with the returned array, so at most one per worker is resident."""
    if chunk.offset % 4 == 0:
        start = chunk.offset - chunk.offset % mmap.ALLOCATIONGRANULARITY
        window = mmap.mmap(
            chunk.fd,
            chunk.offset + 4 * chunk.count - start,
            flags=mmap.MAP_SHARED | _POPULATE,
            prot=mmap.PROT_READ,
            offset=start,
        )
        return np.frombuffer(window, np.float32, chunk.count, chunk.offset - start)
    if not hasattr(local, "values"):
        local.values = np.empty(_CHUNK_ELEMENTS, np.float32)
    view, got = memoryview(local.values)[: chunk.count].cast("B"), 0
    while got < len(view):
        n = os.preadv(chunk.fd, [view[got:]], chunk.offset + got)
        if not n:
            raise ModelLoadError("external data file is truncated")
        got += n
    return local.values[: chunk.count]


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
