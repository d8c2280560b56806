"""Loading and saving ONNX models, external data included, with errors a user can act on."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from graphfix.errors import ModelLoadError

ModelLike = "onnx.ModelProto | str | os.PathLike[str]"


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


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Relative locations of the external data files that `model`'s initializers reference."""
    seen: dict[str, None] = {}
    for tensor in _all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    seen.setdefault(entry.value, None)
    return list(seen)


def _all_tensors(model: onnx.ModelProto):
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def load_model(
    model: onnx.ModelProto | str | os.PathLike[str], *, load_weights: bool = True
) -> LoadedModel:
    """Load `model` (a ModelProto is passed through untouched) or raise ModelLoadError.

    With `load_weights=False` the graph is read without pulling external data into memory, which
    is how models over 2 GB are inspected and rewritten; the data files are still checked to exist.
    """
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
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as exc:
        raise ModelLoadError(
            f"{path} is not a readable ONNX model (protobuf parse failed: {exc}); "
            "the file may be truncated or not ONNX — re-export it"
        ) from exc
    if not proto.HasField("graph") or (not proto.opset_import and not proto.graph.node):
        raise ModelLoadError(
            f"{path} parsed but holds no ONNX graph (no graph/opset_import); "
            "it is probably not an ONNX model — re-export it"
        )
    missing = [loc for loc in external_data_files(proto) if not (path.parent / loc).is_file()]
    if missing:
        raise ModelLoadError(
            f"{path} references external data file(s) that do not exist: "
            f"{', '.join(str(path.parent / m) for m in missing)}; keep the data file(s) next to "
            "the model as they were when it was saved"
        )
    if load_weights and external_data_files(proto):
        try:
            onnx.load_external_data_for_model(proto, str(path.parent))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read external data of {path}: {exc}") from exc
    return LoadedModel(model=proto, path=path, weights_loaded=load_weights)
