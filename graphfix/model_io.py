"""Loading and saving ONNX models, external data included, with errors a user can act on.

Saving never loads weights that are still on disk: a model read with `load_weights=False` keeps
its initializers as references into the input's data file(s), and `save_model` either points the
new model at those files (same folder) or places them next to it by one streaming copy or a
copy-on-write clone (another folder).  Every file is written under a temporary name and moved into place, so a
failure never leaves a half-written output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import EncodeError, Message
from onnx.helper import tensor_dtype_to_np_dtype

from graphfix.embedded_weights import (
    MalformedModel,
    load_referencing_embedded,
    references_to,
    write_model,
)
from graphfix.errors import (
    GraphfixError,
    InvalidOutputError,
    ModelLoadError,
    OutputPathError,
    UnsupportedModelError,
)
from graphfix.progress import step

# What public functions accept as a model: the proto itself, or the path of an .onnx file.
ModelArg = onnx.ModelProto | str | os.PathLike[str]

WeightPlacement = Literal[
    "embedded",
    "referenced in place",
    "copied (streaming)",
    "cloned (copy-on-write)",
    "moved into place",
    "written as external data",
]

# A serialized protobuf message must stay below 2 GiB.
_PROTO_LIMIT = onnx.checker.MAXIMUM_PROTOBUF - 1
# Tensors at least this big move to the data file when a loaded model is too big to embed
# (onnx's own default for `save_as_external_data`).
_EXTERNAL_THRESHOLD = 1024
_COPY_CHUNK = 64 << 20  # bytes per copy_file_range call (kernel-side, never in our memory)
_COMPARE_CHUNK = 4 << 20
_PROTOBUF_SUFFIXES = {".onnx", ".pb", ""}  # onnx.load reads other suffixes as text formats
_COPY_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}


@dataclass(frozen=True)
class LoadedModel:
    """A model and where it came from.

    When `weights_loaded` is False, initializers stored as external data keep their
    `external_data` references (relative to `base_dir`) and hold no bytes in memory.
    """

    model: onnx.ModelProto
    path: Path | None
    weights_loaded: bool

    @property
    def base_dir(self) -> Path | None:
        return None if self.path is None else self.path.parent


@dataclass(frozen=True)
class SavedModel:
    """Where `save_model` put a model and how its weights got there."""

    path: Path
    weights: WeightPlacement
    data_files: tuple[Path, ...]
    data_bytes: int = 0
    created_folders: tuple[Path, ...] = ()  # folders that did not exist, outermost first

    def describe(self) -> str:
        """One line for the CLI: the output file and how the weights were placed."""
        created = (
            f"created the folder {self.created_folders[-1]}; "
            if len(self.created_folders) == 1
            else f"created the folders {', '.join(map(str, self.created_folders))}; "
            if self.created_folders
            else ""
        )
        return created + self._describe_weights()

    def _describe_weights(self) -> str:
        if not self.data_files:
            return f"saved {self.path} (weights embedded)"
        files = ", ".join(str(f) for f in self.data_files)
        size = _human_size(self.data_bytes)
        how = {
            "referenced in place": f"referenced in place from {files} ({size}, not copied)",
            "copied (streaming)": f"copied (streaming) to {files} ({size})",
            "cloned (copy-on-write)": f"cloned (copy-on-write) to {files} ({size}, sharing "
            "the input's disk blocks until either file changes)",
            "written as external data": f"written as external data to {files} ({size})",
        }.get(self.weights, f"{self.weights}: {files}")
        return f"saved {self.path}; weights {how}"


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Relative locations of the external data files that `model`'s initializers reference."""
    seen: dict[str, None] = {}
    for tensor in _all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            seen.setdefault(_external_info(tensor).get("location", ""), None)
    return list(seen)


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def _external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def load_model(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    load_weights: bool = True,
    reference_embedded: bool | None = None,
) -> LoadedModel:
    """Load `model` (a ModelProto or a LoadedModel is passed through untouched) or raise
    ModelLoadError.

    With `load_weights=False` the graph is read without pulling external data into memory, which
    is how models over 2 GB are inspected and rewritten; the data files are still checked to exist
    and to hold every byte range the model references.  With `reference_embedded` too, big
    *embedded* tensors are not read either: they become external-data references to their bytes
    in the .onnx file itself (see `graphfix.embedded_weights`), which `save_model` embeds again.
    """
    if isinstance(model, LoadedModel):
        if load_weights and not model.weights_loaded and model.path is not None:
            return load_model(model.path, load_weights=True)
        return model
    if isinstance(model, onnx.ModelProto):
        return LoadedModel(model=model, path=None, weights_loaded=True)
    if not isinstance(model, (str, os.PathLike)):
        raise ModelLoadError(
            f"expected an onnx.ModelProto or a path to a .onnx file, got {type(model).__name__}; "
            "pass onnx.load(path) or the path itself"
        )
    path = Path(model)
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}; check the path")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not an ONNX file; pass the .onnx file inside")
    try:
        proto = None
        if reference_embedded and not load_weights and path.suffix in _PROTOBUF_SUFFIXES:
            with contextlib.suppress(MalformedModel):  # onnx.load below says what is wrong
                proto = load_referencing_embedded(path)
        if proto is None:
            proto = onnx.load(str(path), load_external_data=False)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}; check its permissions") from exc
    except Exception as exc:  # protobuf, text and JSON parsers each raise their own types
        raise ModelLoadError(
            f"{path} is not a readable ONNX model (protobuf parse failed: {exc}); "
            "the file may be truncated or not ONNX — re-export it"
        ) from exc
    if not proto.HasField("graph") or not proto.opset_import:
        raise ModelLoadError(
            f"{path} parsed but is not a complete ONNX model (no graph or no opset_import); "
            "the file may be truncated or not ONNX — re-export it"
        )
    _check_external_data(proto, path)
    check_well_formed(proto, path)
    if load_weights and external_data_files(proto):
        try:
            onnx.load_external_data_for_model(proto, str(path.parent))
        except onnx.checker.ValidationError as exc:
            hint = (
                "onnx refuses data files with several hard links; replace the linked file by a "
                "copy of it, or load with load_weights=False"
                if "hard link" in str(exc)
                else "keep the data file(s) next to the model as they were when it was saved"
            )
            raise ModelLoadError(f"cannot read external data of {path}: {exc}; {hint}") from exc
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read external data of {path}: {exc}") from exc
    return LoadedModel(model=proto, path=path, weights_loaded=load_weights)


def check_well_formed(proto: onnx.ModelProto, path: Path | str) -> None:
    """Raise ModelLoadError unless `proto` obeys ONNX's structural rules: onnx.checker without
    shape inference (names defined before use, no cycles, attributes of their declared types,
    known element types, opsets, tensor data as long as its shape says).

    The checker runs on a copy holding the graph but not the weights (each initializer stands
    in as an empty tensor of its type), so it costs no memory however big the model; the bytes
    of each initializer held in memory are checked one tensor at a time, and those in external
    data files by `_check_external_data`.
    """
    check_opset(next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0))
    context = onnx.checker.C.CheckerContext()
    context.ir_version = proto.ir_version
    context.opset_imports = {o.domain: o.version for o in proto.opset_import}
    try:
        for tensor in _all_tensors(proto):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                onnx.checker.check_tensor(tensor, context)
            _check_data_length(tensor)
        onnx.checker.check_model(_without_weights(proto))
        _check_text(proto)
        _check_nodes(proto.graph)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise ModelLoadError(
            f"{path} is not a valid ONNX model: {str(exc).strip().splitlines()[0]}; "
            "re-export it, or repair it and check with onnx.checker.check_model"
        ) from exc


_PACKED_4BIT = {
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    getattr(onnx.TensorProto, "FLOAT4E2M1", -1),
}
_COMPLEX = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}


def _check_data_length(tensor: onnx.TensorProto) -> None:
    """The tensor holds exactly as many values as its shape and type say: in memory (the checker
    accepts data longer than the shape, which numpy then cannot reshape) or, where the reference
    gives a length, on disk."""
    kind = tensor.data_type
    if kind not in onnx.TensorProto.DataType.values():
        raise onnx.checker.ValidationError(
            f"tensor {tensor.name!r} has element type {kind}, which ONNX does not define"
        )
    if kind == onnx.TensorProto.UNDEFINED:
        return
    count = math.prod(tensor.dims)
    if kind == onnx.TensorProto.STRING:  # one string_data entry an element
        if len(tensor.string_data) != count:
            raise onnx.checker.ValidationError(
                f"tensor {tensor.name!r} holds {len(tensor.string_data)} strings where its "
                f"shape {list(tensor.dims)} needs {count}"
            )
        return
    packed = kind in _PACKED_4BIT
    nbytes = (count + 1) // 2 if packed else count * tensor_dtype_to_np_dtype(kind).itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = _external_info(tensor)
        if "length" not in info:
            return  # the rest of the file from its offset: the runtime checks it
        unit, held, expected = "bytes", int(info["length"]), nbytes
    elif tensor.raw_data:
        unit, held, expected = "bytes", len(tensor.raw_data), nbytes
    else:
        values = (count + 1) // 2 if packed else count * (1 + (kind in _COMPLEX))
        field = onnx.helper.tensor_dtype_to_field(kind)
        unit, held, expected = "values", len(getattr(tensor, field)), values
    if held != expected:
        raise onnx.checker.ValidationError(
            f"tensor {tensor.name!r} holds {held} {unit} of data where its type "
            f"{onnx.helper.tensor_dtype_to_string(kind)} and shape {list(tensor.dims)} need "
            f"{expected}"
        )


def _check_text(proto: onnx.ModelProto) -> None:
    """The model's and graph's own string fields and the graph's tensor names are UTF-8 text
    (protobuf does not check proto2 strings; they come back as bytes)."""
    g = proto.graph
    values = (*g.input, *g.output, *g.value_info, *g.initializer)
    fields = [v for m in (proto, g) for _, v in m.ListFields()] + [v.name for v in values]
    if any(isinstance(v, bytes) for v in fields):
        raise onnx.checker.ValidationError("a name or text field is not UTF-8 text")


# Attributes of ai.onnx ops holding an element type (the checker sees only an INT there).
_TYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}
# Text attributes of ai.onnx ops are UTF-8 by the spec; a custom domain's may hold bytes.
_TEXT = (onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS)


def _check_nodes(graph: onnx.GraphProto) -> None:
    """Every declared tensor type and every type-valued attribute names an ONNX element type
    (the checker leaves both unchecked), ai.onnx ops' text attributes are UTF-8 (Einsum's
    equation is decoded), and every Split's `num_outputs` is its output count
    (fewer outputs abort the process in onnx's shape inference, onnx/onnx#8255), in `graph` and
    the bodies inside it."""
    defined = onnx.TensorProto.DataType.values()
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type not in defined:
            raise onnx.checker.ValidationError(
                f"tensor {value.name!r} is declared of element type "
                f"{value.type.tensor_type.elem_type}, which ONNX does not define"
            )
    for value in graph.input:  # what a runtime is fed must say its type
        if value.type.HasField("tensor_type") and not value.type.tensor_type.elem_type:
            raise onnx.checker.ValidationError(
                f"graph input {value.name!r} has no element type (UNDEFINED)"
            )
    for node in graph.node:
        names = (node.name, node.op_type, node.domain, *node.input, *node.output)
        if any(isinstance(name, bytes) for name in names):  # protobuf's proto2 strings unchecked
            raise onnx.checker.ValidationError(
                f"a {node.op_type!r} node has a name, type or tensor name that is not UTF-8 text"
            )
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _check_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    _check_nodes(body)
            elif attr.type in _TEXT and node.domain in ("", "ai.onnx"):
                for text in (attr.s,) if attr.type == onnx.AttributeProto.STRING else attr.strings:
                    try:
                        text.decode()
                    except UnicodeDecodeError:
                        raise onnx.checker.ValidationError(
                            f"node {node.name!r} ({node.op_type}) has attribute {attr.name!r} "
                            "whose text is not UTF-8"
                        ) from None
            elif (
                attr.name == "num_outputs"
                and node.op_type == "Split"
                and node.domain in ("", "ai.onnx")
                and attr.i != len(node.output)
            ):
                raise onnx.checker.ValidationError(
                    f"Split node {node.name!r} has num_outputs={attr.i} but "
                    f"{len(node.output)} outputs"
                )
            elif (
                attr.name in _TYPE_ATTRIBUTES
                and node.domain in ("", "ai.onnx")
                and attr.type == onnx.AttributeProto.INT
                and attr.i not in defined
            ):
                raise onnx.checker.ValidationError(
                    f"node {node.name!r} ({node.op_type}) has {attr.name}={attr.i}, which is "
                    "not an ONNX element type"
                )


MIN_OPSET = 7


def check_opset(version: int) -> None:
    """Raise UnsupportedModelError unless graphfix understands ai.onnx opset `version`."""
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= version <= newest:
        raise UnsupportedModelError(
            f"the model imports ai.onnx opset {version}; graphfix understands opsets "
            f"{MIN_OPSET}..{newest} (onnx {onnx.__version__}); convert it with "
            "onnx.version_converter.convert_version(model, 17) or upgrade onnx"
        )


def _without_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    g = proto.graph
    stubs = [
        onnx.TensorProto(name=t.name, data_type=t.data_type, dims=[0]) for t in g.initializer
    ]
    graph = onnx.GraphProto(
        name=g.name,
        node=g.node,
        input=g.input,
        output=g.output,
        value_info=g.value_info,
        sparse_initializer=g.sparse_initializer,
        initializer=stubs,
    )
    shell = onnx.ModelProto(
        ir_version=proto.ir_version,
        opset_import=proto.opset_import,
        functions=proto.functions,
        graph=graph,
    )
    for tensor in _all_tensors(shell):  # in If/Loop/Scan bodies: stubs too, where on disk
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.CopyFrom(onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=[0]))
    return shell


def _check_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Every referenced data file exists and is long enough for the ranges read from it."""
    ends: dict[str, tuple[int, str]] = {}
    for tensor in _all_tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = _external_info(tensor)
        location = info.get("location", "")
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", 0))
            if offset < 0 or length < 0:
                raise ValueError("a negative offset or length")
            end = offset + length
        except ValueError as exc:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} has a malformed external_data entry {info}; "
                "re-export the model"
            ) from exc
        if end > ends.get(location, (-1, ""))[0]:
            ends[location] = (end, tensor.name)
    missing = [loc for loc in ends if not loc or not (path.parent / loc).is_file()]
    if missing:
        raise ModelLoadError(
            f"{path} references external data file(s) that do not exist: "
            f"{', '.join(str(path.parent / m) for m in missing)}; keep the data file(s) next to "
            "the model as they were when it was saved"
        )
    for location, (end, tensor_name) in ends.items():
        size = (path.parent / location).stat().st_size
        if end > size:
            raise ModelLoadError(
                f"external data file {path.parent / location} is truncated: {size} bytes, but "
                f"tensor {tensor_name!r} of {path} needs {end}; copy the complete data file again"
            )


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    link_weights: bool | None = None,
    move_weights: bool | None = None,
    overwrite: bool | None = None,
) -> SavedModel:
    """Write `model` to `path` without loading weights that are still on disk.

    `source` is the .onnx file `model` was loaded from: its external data locations are relative
    to that file's folder.  In the same folder the new model references the existing data files
    unchanged; in another folder each data file is copied once by a streaming copy, or cloned
    (copy-on-write: no extra space, btrfs/XFS) when `link_weights`, or moved (renamed) when
    `move_weights` says the data files are the caller's own temporaries on the same filesystem.  Missing folders of `path` are
    created and listed in the result.  `path` equal to `source`, an existing output and a different existing
    data file at the destination are refused unless `overwrite`.  A model whose in-memory tensors
    would make the file exceed protobuf's 2 GB limit stores them in `<name>.data` next to it.
    Every file is written under a temporary name and moved into place once all are complete.
    """
    out = Path(path)
    _check_writable_model(model, out)
    src = None if source is None else Path(source)
    overwrite = bool(overwrite)
    locations = external_data_files(model)
    if locations and src is None:
        raise GraphfixError(
            f"the model references external data ({', '.join(locations)}) but no source was "
            "given; pass source=<the .onnx file it was loaded from>, or load it with its weights"
        )
    _check_output(out, src, locations, overwrite=overwrite)
    embed_from = src if src is not None and src.name in locations else None
    placements: list[_Placement] = []
    if src is not None:
        same_folder = out.parent.exists() and _same_folder(out.parent, src.parent)
        placements = [
            _plan_placement(src, loc, out, same_folder=same_folder, overwrite=overwrite)
            for loc in locations
            if loc != src.name  # the source's own embedded bytes: embedded again below
        ]
    created = _missing_folders(out.parent)
    try:
        with _Staging() as staging:
            for placement in placements:
                if placement.place:
                    _place(
                        placement,
                        staging.temp_for(placement.dest),
                        clone=bool(link_weights),
                        move=bool(move_weights),
                    )
            spilled = _stage_model(
                staging, model, out, overwrite=overwrite, taken=locations, embed_from=embed_from
            )
            staging.commit()
    except OSError as exc:
        _remove_empty(created)
        raise OutputPathError(
            f"cannot write {out} or its weights: {exc}; check free space and permissions"
        ) from exc
    except BaseException:
        _remove_empty(created)
        raise
    if spilled is not None:
        return dataclasses.replace(spilled, created_folders=created)
    if not placements:
        return SavedModel(out, "embedded", (), created_folders=created)
    weights: WeightPlacement = "referenced in place"
    if any(p.place for p in placements):
        weights = (
            "moved into place"
            if move_weights
            else "cloned (copy-on-write)"
            if link_weights
            else "copied (streaming)"
        )
    return SavedModel(
        out,
        weights,
        tuple(p.dest for p in placements),
        sum(p.dest.stat().st_size for p in placements),
        created_folders=created,
    )


def _check_writable_model(model: onnx.ModelProto, out: Path) -> None:
    """Every model graphfix writes passes ONNX's structural checker (run without the weights, as
    on load): one that does not is refused before anything is written."""
    try:
        onnx.checker.check_model(_without_weights(model))
    except onnx.checker.ValidationError as exc:
        raise InvalidOutputError(
            f"the model for {out} fails onnx.checker ({str(exc).strip().splitlines()[0]}); "
            "nothing was written. If its input passed the checker, this is a graphfix bug: "
            "please report it with the input model"
        ) from exc


def _missing_folders(folder: Path) -> tuple[Path, ...]:
    """`folder` and those of its parents that do not exist yet, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return tuple(reversed(missing))


def _remove_empty(folders: tuple[Path, ...]) -> None:
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


def check_output_path(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    overwrite: bool | None = None,
) -> None:
    """Raise OutputPathError now for an output `save_model` would refuse (before any work)."""
    if not os.fspath(path).strip():
        raise OutputPathError("the output path is empty; pass -o FILE.onnx")
    _check_output(
        Path(path),
        None if source is None else Path(source),
        external_data_files(model),
        overwrite=bool(overwrite),
    )


def _check_output(out: Path, src: Path | None, locations: list[str], *, overwrite: bool) -> None:
    if out.is_dir():
        raise OutputPathError(
            f"output {out} is a directory; pass a file path like {out}/model.onnx"
        )
    for folder in out.parents:
        if folder.exists():
            if not folder.is_dir():
                raise OutputPathError(
                    f"cannot write {out}: {folder} is a file, not a folder; choose an -o whose "
                    "folder is a folder (or does not exist yet)"
                )
            break
    if src is not None and (out == src or _same_file(out, src)):
        if not overwrite:
            raise OutputPathError(
                f"output {out} is the input model; choose another -o or pass --overwrite "
                "(overwrite=True) to replace the input"
            )
        return
    if src is not None:
        for loc in locations:
            if out == src.parent / loc or _same_file(out, src.parent / loc):
                raise OutputPathError(
                    f"output {out} is the input's external data file; choose another -o"
                )
    if out.exists() and not overwrite:
        raise OutputPathError(
            f"output {out} already exists; choose another -o or pass --overwrite "
            "(overwrite=True) to replace it"
        )


@dataclass(frozen=True)
class _Placement:
    """One external data file of the input and where the output references it."""

    source: Path
    dest: Path
    place: bool  # False: `dest` already holds these bytes (or is `source` itself)


def _plan_placement(
    src: Path, location: str, out: Path, *, same_folder: bool, overwrite: bool
) -> _Placement:
    source_file = src.parent / location
    if not source_file.is_file():
        raise ModelLoadError(
            f"external data file {source_file} (referenced by {src}) does not exist; keep the "
            "data file(s) next to the model as they were when it was loaded"
        )
    if same_folder:
        return _Placement(source_file, source_file, place=False)
    relative = PurePosixPath(location.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ModelLoadError(
            f"external data location {location!r} of {src} is not a plain relative path inside "
            "the model's folder; onnx refuses to load it — re-export the model"
        )
    dest = out.parent.joinpath(*relative.parts)
    if dest == out:
        raise OutputPathError(
            f"output {out} has the name of the data file {location} that goes next to it; "
            "choose another -o name"
        )
    if not dest.exists():
        return _Placement(source_file, dest, place=True)
    if _same_file(source_file, dest) or _same_bytes(source_file, dest):
        return _Placement(source_file, dest, place=False)
    if overwrite:
        return _Placement(source_file, dest, place=True)
    raise OutputPathError(
        f"{dest} already exists and differs from the input's data file {source_file}; choose "
        "another -o folder or pass --overwrite (overwrite=True) to replace it"
    )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_folder(a: Path, b: Path) -> bool:
    return _same_file(a, b) or a.resolve() == b.resolve()


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            chunk = fa.read(_COMPARE_CHUNK)
            if chunk != fb.read(_COMPARE_CHUNK):
                return False
            if not chunk:
                return True


def _place(placement: _Placement, temp: Path, *, clone: bool, move: bool) -> None:
    if move:
        os.replace(placement.source, temp)
    elif clone:
        _clone(placement.source, temp, placement.dest)
    else:
        _stream_copy(placement.source, temp)


# Neither a hard link nor a symlink will do: onnx (1.23, checked) refuses external data reached
# through either ("multiple hard links … potential hardlink attack", "… is a symbolic link"), and
# a hard link makes the user's ORIGINAL model unloadable too.  A copy-on-write clone is a new
# inode sharing the source's blocks.
_FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h


def _clone(source_file: Path, temp: Path, dest: Path) -> None:
    with open(source_file, "rb") as fin, open(temp, "xb") as fout:
        os.chmod(fout.fileno(), stat.S_IMODE(os.fstat(fin.fileno()).st_mode))
        try:
            import fcntl

            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
        except (ImportError, OSError) as exc:
            reason = getattr(exc, "strerror", None) or "not available on this system"
            raise OutputPathError(
                f"cannot clone {source_file} as {dest} ({reason}): a copy-on-write clone needs "
                "both on one filesystem with reflinks (btrfs, XFS with reflink=1, bcachefs, "
                "ZFS 2.2+); drop --clone-weights (link_weights) to copy the weights instead"
            ) from exc


def _stream_copy(source_file: Path, dest: Path) -> None:
    """Copy sequentially inside the kernel (copy_file_range), else through a small buffer."""
    with open(source_file, "rb") as fin, open(dest, "xb") as fout:
        info = os.fstat(fin.fileno())
        os.chmod(fout.fileno(), stat.S_IMODE(info.st_mode))  # like cp: the source's mode bits
        size = info.st_size
        copied = 0
        copy_range = getattr(os, "copy_file_range", None)
        try:
            while copy_range is not None and copied < size:
                n = copy_range(fin.fileno(), fout.fileno(), min(_COPY_CHUNK, size - copied))
                if n == 0:
                    break
                copied += n
        except OSError as exc:
            if exc.errno not in _COPY_FALLBACK_ERRNOS:
                raise
        if copied < size:
            fin.seek(copied)
            fout.seek(copied)
            shutil.copyfileobj(fin, fout, _COMPARE_CHUNK)


# graphfix's own temporaries next to an output: `.NAME.PID-XXXXXXXX.graphfix-tmp` (a staged file)
# or `…graphfix-stage` (a folder `graphfix precision` stages converted weights in); and in the
# system temp folder, `graphfix-KIND-PID-XXXXXXXX` (`system_temporary_prefix`).
_TEMPORARY = re.compile(r"\..+\.(?P<pid>\d+)-[0-9a-f]{8}\.graphfix-(?:tmp|stage)")
_SYSTEM_KINDS = ("precision", "locate", "locate-trt", "ort", "trt")
_SYSTEM_TEMPORARY = re.compile(
    rf"graphfix-(?:{'|'.join(_SYSTEM_KINDS)})-(?P<pid>\d+)-[a-z0-9_]{{8}}"
)


def system_temporary_prefix(kind: str) -> str:
    """The name prefix of a `kind` folder this process makes in the system temp folder
    (`tempfile.mkdtemp(prefix=…)`): it carries the process id, so that a later run can tell
    the folder of a killed run (SIGKILL gives it no chance to clean up) and removes those first."""
    assert kind in _SYSTEM_KINDS, kind
    remove_stale_temporaries(Path(tempfile.gettempdir()))
    return f"graphfix-{kind}-{os.getpid()}-"


def temporary_name(final: Path, kind: Literal["tmp", "stage"]) -> Path:
    """A hidden sibling of `final` to write first, named so that a later run can tell whether the
    process that made it is gone (`remove_stale_temporaries`)."""
    return final.parent / f".{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.graphfix-{kind}"


def remove_stale_temporaries(folder: Path) -> tuple[Path, ...]:
    """Delete the temporaries in `folder` that a killed graphfix left (SIGKILL gives a save no
    chance to clean up): only names `temporary_name` and `system_temporary_prefix` make, and only
    those whose process is gone
    or is a newer process with a reused id.  Returns what was deleted."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            match = _TEMPORARY.fullmatch(entry.name) or _SYSTEM_TEMPORARY.fullmatch(entry.name)
            if match is None or not _maker_is_gone(int(match["pid"]), entry):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
    if removed:
        step(f"removed {len(removed)} temporary file(s) a killed run left in {folder}")
    return tuple(removed)


def _maker_is_gone(pid: int, entry: os.DirEntry) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    started = _process_start(pid)
    return started is not None and entry.stat(follow_symlinks=False).st_mtime < started


def _process_start(pid: int) -> float | None:
    """When process `pid` started (Linux /proc); None where that cannot be told."""
    try:
        stat_fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + int(stat_fields[19]) / os.sysconf("SC_CLK_TCK")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the shell's convention for "killed by signal N"


class _Staging:
    """Files written under temporary names; `commit` moves them into place in order.

    Whatever is not committed (an error on the way) is deleted on exit, so a failed save leaves
    neither a half-written file nor a stray temporary one.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []
        self._previous_handler: object = None

    def __enter__(self) -> _Staging:
        # SIGINT already unwinds (KeyboardInterrupt); make SIGTERM unwind too, so the `finally`
        # below deletes the temporary files.  A handler the application installed is kept.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            self._previous_handler = signal.signal(signal.SIGTERM, _exit_on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            for temp, _ in self._pending:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()
        finally:
            if self._previous_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_handler)  # type: ignore[arg-type]

    def temp_for(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        if not any(final.parent == f.parent for _, f in self._pending):
            remove_stale_temporaries(final.parent)
        temp = temporary_name(final, "tmp")
        self._pending.append((temp, final))
        return temp

    def commit(self) -> None:
        while self._pending:
            temp, final = self._pending[0]
            os.replace(temp, final)
            self._pending.pop(0)


def _stage_model(
    staging: _Staging,
    model: onnx.ModelProto,
    out: Path,
    *,
    overwrite: bool,
    taken: list[str],
    embed_from: Path | None = None,
) -> SavedModel | None:
    """Stage the serialized model; returns a SavedModel only when its tensors had to spill.

    Tensors that reference `embed_from`'s own bytes (`load_model(reference_embedded=True)`) are
    embedded again by streaming from it.  A model over protobuf's 2 GB limit in memory (weights
    loaded) writes its big raw tensors to `<name>.data`, one tensor at a time and without touching
    the caller's model (which `onnx.save_model(save_as_external_data=True)` would rewrite in place).
    """
    if embed_from is not None and references_to(model, embed_from.name):
        with open(staging.temp_for(out), "xb", buffering=0) as stream:
            write_model(model, stream, embed_from)
        return None
    if fits_protobuf(model):
        with open(staging.temp_for(out), "xb") as stream:
            stream.write(model.SerializeToString())
        return None
    data_name = f"{out.name}.data"
    data_file = out.parent / data_name
    if data_name in taken:
        raise OutputPathError(
            f"{out}: the model is over 2 GB in memory and its tensors would go to {data_file}, "
            "which the model already references; choose another -o name"
        )
    if data_file.exists() and not overwrite:
        raise OutputPathError(
            f"{data_file} already exists; choose another -o or pass --overwrite "
            "(overwrite=True) to replace it"
        )
    with open(staging.temp_for(data_file), "xb") as stream:
        light = onnx.ModelProto()
        _copy_spilling(model, light, stream, data_name)
        size = stream.tell()
    if not fits_protobuf(light):
        raise GraphfixError(
            f"{out}: the model is over protobuf's 2 GB limit even with its raw tensors stored "
            "as external data; it cannot be saved as an ONNX file"
        )
    with open(staging.temp_for(out), "xb") as stream:
        stream.write(light.SerializeToString())
    return SavedModel(out, "written as external data", (data_file,), size)


def fits_protobuf(model: onnx.ModelProto) -> bool:
    """Whether `model` serializes as one protobuf message (under 2 GiB)."""
    try:
        return model.ByteSize() <= _PROTO_LIMIT
    except EncodeError:  # upb refuses to even size a message over 2 GB
        return False


# Messages that can (transitively) hold tensors; everything else is copied whole.
_TENSOR_HOLDERS = (
    onnx.ModelProto,
    onnx.GraphProto,
    onnx.NodeProto,
    onnx.AttributeProto,
    onnx.FunctionProto,
)


def _copy_spilling(src: Message, dst: Message, stream: BinaryIO, location: str) -> None:
    """Copy `src` into `dst`, appending each big raw tensor's bytes to `stream` instead."""
    for field, value in src.ListFields():
        repeated = _is_repeated(field)
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            if repeated:
                getattr(dst, field.name).extend(value)
            else:
                setattr(dst, field.name, value)
            continue
        for item in value if repeated else [value]:
            target = getattr(dst, field.name).add() if repeated else getattr(dst, field.name)
            if isinstance(item, onnx.TensorProto) and _spills(item):
                _spill_tensor(item, target, stream, location)
            elif isinstance(item, _TENSOR_HOLDERS):
                target.SetInParent()
                _copy_spilling(item, target, stream, location)
            else:
                target.CopyFrom(item)


def _is_repeated(field: FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 5.28 (`label` is gone in 7)
        return field.is_repeated
    return field.label == FieldDescriptor.LABEL_REPEATED


def _spills(tensor: onnx.TensorProto) -> bool:
    return (
        tensor.HasField("raw_data")
        and tensor.data_location != onnx.TensorProto.EXTERNAL
        and tensor.ByteSize() >= _EXTERNAL_THRESHOLD
    )


def _spill_tensor(
    src: onnx.TensorProto, dst: onnx.TensorProto, stream: BinaryIO, location: str
) -> None:
    for field, value in src.ListFields():
        if field.name in ("raw_data", "external_data", "data_location"):
            continue
        if _is_repeated(field):
            getattr(dst, field.name).extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
    offset = stream.tell()
    length = stream.write(src.raw_data)
    dst.data_location = onnx.TensorProto.EXTERNAL
    for key, val in (("location", location), ("offset", offset), ("length", length)):
        entry = dst.external_data.add()
        entry.key, entry.value = key, str(val)


def _human_size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"
