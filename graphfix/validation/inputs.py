"""Inputs for validation: specs read from the model, `--shape`/`--range` parsing, seeded data, npz.

Both sides of a comparison get the same values, ones the model can mean.  Integer inputs are
drawn from a range the user gives or, when an input feeds a Gather (an embedding lookup), from the
indices that table accepts (token ids inside the vocabulary).  A mask (a bool or integer input
named like one, or one the graph turns into a large negative score bias) keeps every key: random
0/1 would block every key of some query rows of a causal model, whose outputs then mean nothing.
Every input records where its values came from and why, so a report says what was exercised.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graphfix.errors import UsageError
from graphfix.graph.index import GraphIndex

Dim = int | str | None

# Ops that pass an integer tensor's values through unchanged on their data input.
_VALUE_PRESERVING = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand"}
_DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
_DEFAULT_INT_RANGE = (0, 1)
_MASK_NAME = re.compile(r"mask", re.IGNORECASE)
_BLOCKING = -1e4  # a score bias at or below this blocks a key (finfo.min, -inf, -10000)
_MASK_TRACE_NODES = 64  # nodes followed from an input looking for what its values do
# Ops that carry a mask's values along (indexed, reshaped, combined) without changing their sense.
_MASK_CARRIERS = _VALUE_PRESERVING | {
    "Gather", "GatherND", "GatherElements", "Slice", "Transpose", "Tile", "Concat", "And", "Or",
}  # fmt: skip
# Random inputs larger than this are refused: a huge declared dimension, not a real workload.
_MAX_INPUT_BYTES = 4 << 30


class ValidationUsageError(UsageError):
    """`validate` was given options or inputs it cannot use; the CLI exits with code 2."""


@dataclass(frozen=True)
class InputSpec:
    """A graph input as the model declares it (`shape` is None when the rank is unknown)."""

    name: str
    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f" or self.elem_type == onnx.TensorProto.BFLOAT16

    @property
    def type_name(self) -> str:
        return onnx.TensorProto.DataType.Name(self.elem_type).lower()

    def describe_shape(self) -> str:
        if self.shape is None:
            return "[?]"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


@dataclass(frozen=True)
class ValueRange:
    """Values to draw: integers in [low, high] inclusive; floats uniform in [low, high)."""

    low: float
    high: float


@dataclass(frozen=True)
class InputSource:
    """Where one input's values came from, for the report."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    origin: str


@dataclass(frozen=True)
class InputData:
    """The arrays fed to both models, and how each was made."""

    feeds: Mapping[str, np.ndarray]
    sources: tuple[InputSource, ...]
    notes: tuple[str, ...] = ()


def input_specs(model: onnx.ModelProto) -> tuple[InputSpec, ...]:
    """The inputs a caller must feed (graph inputs that are not initializers)."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise ValidationUsageError(
                f"input '{value.name}' is not a tensor (sequence/map/optional inputs are not "
                "supported by validate); validate a model whose inputs are tensors"
            )
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            )
        specs.append(InputSpec(name=value.name, elem_type=tensor.elem_type, shape=shape))
    return tuple(specs)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`name:1x3x384x384` → ("name", (1, 3, 384, 384)); `name:` (nothing after) is a scalar."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise ValidationUsageError(
            f"--shape {text!r} is not NAME:DIMS; write it like pixel_values:1x3x384x384"
        )
    if dims.strip() == "":
        return name, ()
    parts = re.split(r"[x,]", dims.strip())
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ValidationUsageError(
            f"--shape {text!r}: dimensions {dims!r} are not integers separated by 'x'; "
            "write it like pixel_values:1x3x384x384"
        ) from None
    if any(v < 1 for v in values):
        raise ValidationUsageError(
            f"--shape {text!r}: every dimension must be at least 1, got {values}"
        )
    return name, values


def parse_range(text: str) -> tuple[str, ValueRange]:
    """`name:0:49407` → ("name", ValueRange(0, 49407)); integers inclusive, floats [low, high)."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValidationUsageError(
            f"--range {text!r} is not NAME:LOW:HIGH; write it like input_ids:0:49407"
        )
    name, low_text, high_text = parts
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ValidationUsageError(
            f"--range {text!r}: {low_text!r} and {high_text!r} must be numbers; "
            "write it like input_ids:0:49407"
        ) from None
    if not (np.isfinite(low) and np.isfinite(high)) or high < low:
        raise ValidationUsageError(
            f"--range {text!r}: need finite LOW <= HIGH, got {low} and {high}"
        )
    return name, ValueRange(low, high)


def check_same_inputs(
    reference: Sequence[InputSpec], candidate: Sequence[InputSpec]
) -> tuple[str, ...]:
    """Raise ValidationUsageError unless both models take the same inputs; return notes.

    Floating types may differ (a float16 conversion takes float16 where the original takes
    float32): the same values are then cast to each model's type, and a note says so.
    """
    ref = {s.name: s for s in reference}
    cand = {s.name: s for s in candidate}
    if set(ref) != set(cand):
        only_ref = sorted(set(ref) - set(cand))
        only_cand = sorted(set(cand) - set(ref))
        raise ValidationUsageError(
            "the two models take different inputs: only the original has "
            f"{only_ref or 'none'}, only the candidate has {only_cand or 'none'}; "
            "compare a model with its own rewrite or conversion"
        )
    notes = []
    for name, r in ref.items():
        c = cand[name]
        if r.elem_type != c.elem_type:
            if not (r.is_float and c.is_float):
                raise ValidationUsageError(
                    f"input '{name}' is {r.type_name} in the original but {c.type_name} in the "
                    "candidate; only floating types may differ between the two models"
                )
            notes.append(
                f"input '{name}': the same values are cast to {r.dtype} for the original "
                f"and {c.dtype} for the candidate"
            )
        if r.shape is not None and c.shape is not None:
            clash = len(r.shape) != len(c.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b
                for a, b in zip(r.shape, c.shape, strict=True)
            )
            if clash:
                raise ValidationUsageError(
                    f"input '{name}' has shape {r.describe_shape()} in the original but "
                    f"{c.describe_shape()} in the candidate; the models must take the same shapes"
                )
    return tuple(notes)


def make_inputs(
    model: onnx.ModelProto,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    ranges: Mapping[str, ValueRange | tuple[float, float]] | None = None,
    npz: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> InputData:
    """Arrays for every input of `model`: from `npz` (a file or a mapping), else seeded random.

    Dynamic dimensions must be given through `shapes` (or be fixed by another input's shape that
    names the same dimension); integer inputs come from `ranges`, else from the Gather they index,
    else 0..1.  Floats default to uniform [-1, 1).
    """
    specs = input_specs(model)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValidationUsageError(f"seed must be an integer >= 0, got {seed!r}")
    if npz is not None:
        if shapes or ranges:
            raise ValidationUsageError(
                "inputs from an npz cannot be combined with --shape/--range; drop one of them"
            )
        return _from_npz(npz, specs)
    shapes = dict(shapes or {})
    ranges = {
        k: v if isinstance(v, ValueRange) else ValueRange(*v) for k, v in (ranges or {}).items()
    }
    known = {s.name for s in specs}
    for option, given in (("--shape", shapes), ("--range", ranges)):
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValidationUsageError(
                f"{option} names {', '.join(unknown)}, which the model does not take as input; "
                f"its inputs are {', '.join(sorted(known)) or 'none'}"
            )
    resolved = _resolve_shapes(specs, shapes)
    index = GraphIndex(model)
    gather_limits = _gather_limits(index, [s.name for s in specs if s.dtype.kind in "iu"])
    masks = {
        s.name: keep
        for s in specs
        if s.name not in gather_limits
        and s.name not in ranges
        and (keep := _mask_keep_value(index, s)) is not None
    }
    feeds: dict[str, np.ndarray] = {}
    sources = []
    for spec in specs:
        shape = resolved[spec.name]
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
        if spec.name in masks:
            value, why = masks[spec.name]
            array = np.full(shape, value, dtype=spec.dtype)
            feeds[spec.name] = array
            sources.append(InputSource(spec.name, str(array.dtype), shape, why))
            continue
        array, origin = _draw(spec, shape, ranges.get(spec.name), gather_limits.get(spec.name), rng)
        feeds[spec.name] = array
        sources.append(InputSource(spec.name, str(array.dtype), shape, f"{origin}, seed {seed}"))
    return InputData(feeds=feeds, sources=tuple(sources))


def cast_feeds(
    feeds: Mapping[str, np.ndarray], specs: Sequence[InputSpec]
) -> dict[str, np.ndarray]:
    """`feeds` cast to the element types `specs` declare (floating types only differ)."""
    by_name = {s.name: s for s in specs}
    return {
        name: array if name not in by_name else array.astype(by_name[name].dtype, copy=False)
        for name, array in feeds.items()
    }


def _resolve_shapes(
    specs: Sequence[InputSpec], shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    symbols: dict[str, int] = {}
    for spec in specs:
        if spec.name not in shapes:
            continue
        given = tuple(shapes[spec.name])
        if not all(isinstance(g, (int, np.integer)) and g >= 1 for g in given):
            raise ValidationUsageError(f"shape {given} for '{spec.name}' must hold integers >= 1")
        if spec.shape is None:
            continue
        if len(given) != len(spec.shape) or any(
            isinstance(d, int) and d != g for d, g in zip(spec.shape, given, strict=True)
        ):
            raise ValidationUsageError(
                f"--shape {spec.name}:{'x'.join(map(str, given))} does not fit the model's "
                f"{spec.name} {spec.describe_shape()}; give {len(spec.shape)} dimension(s) that "
                "keep its fixed ones"
            )
        for d, g in zip(spec.shape, given, strict=True):
            if isinstance(d, str):
                symbols.setdefault(d, g)
    resolved: dict[str, tuple[int, ...]] = {}
    missing = []
    for spec in specs:
        if spec.name in shapes:
            resolved[spec.name] = tuple(int(g) for g in shapes[spec.name])
            continue
        if spec.shape is None:
            missing.append(spec)
            continue
        dims = [
            d if isinstance(d, int) else symbols.get(d) if isinstance(d, str) else None
            for d in spec.shape
        ]
        if any(d is None or d < 1 for d in dims):
            missing.append(spec)
            continue
        resolved[spec.name] = tuple(dims)
    if missing:
        listed = ", ".join(f"{s.name} {s.describe_shape()}" for s in missing)
        example = " ".join(
            f"--shape {s.name}:"
            + "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in (s.shape or ("N",)))
            for s in missing
        )
        raise ValidationUsageError(
            f"dynamic dimensions need values: {listed}; pass e.g. {example} with N replaced "
            "(a sequence length of 1 would make every attention softmax trivially 1)"
        )
    for spec in specs:
        # numpy draws float64 / int64 values and casts them: 8 bytes an element at the peak
        size = math.prod(resolved[spec.name]) * max(spec.dtype.itemsize, 8)
        if size > _MAX_INPUT_BYTES:
            raise ValidationUsageError(
                f"input '{spec.name}' {list(resolved[spec.name])} would take "
                f"{size / 2**30:.3g} GiB of random data (more than {_MAX_INPUT_BYTES >> 30} GiB); "
                "pass smaller dimensions with --shape, or real inputs with --inputs"
            )
    return resolved


def _draw(
    spec: InputSpec,
    shape: tuple[int, ...],
    given: ValueRange | None,
    gather_high: tuple[int, str] | None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, str]:
    dtype = spec.dtype
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool), "random booleans"
    if dtype.kind in "iu":
        if given is not None:
            low, high, why = int(np.ceil(given.low)), int(np.floor(given.high)), "given range"
        elif gather_high is not None:
            low, high, why = 0, gather_high[0], f"indices of Gather '{gather_high[1]}'"
        else:
            low, high = _DEFAULT_INT_RANGE
            why = "default range; pass --range NAME:LOW:HIGH for the valid values"
        if high < low:
            raise ValidationUsageError(
                f"--range for integer input '{spec.name}' holds no integer "
                f"({given.low}..{given.high})"
            )
        info = np.iinfo(dtype)
        if low < info.min or high > info.max:
            raise ValidationUsageError(
                f"--range {low}..{high} does not fit input '{spec.name}' of type {spec.type_name}"
            )
        array = rng.integers(low, high, size=shape, endpoint=True).astype(dtype)
        return array, f"random integers {low}..{high} ({why})"
    if spec.is_float:
        low, high = (given.low, given.high) if given is not None else _DEFAULT_FLOAT_RANGE
        why = "given range" if given is not None else "default range"
        array = rng.uniform(low, high, size=shape).astype(dtype)
        return array, f"uniform [{low:g}, {high:g}) ({why})"
    raise ValidationUsageError(
        f"input '{spec.name}' has type {spec.type_name}, which validate cannot generate; "
        "pass the values in an .npz (--inputs)"
    )


def _mask_keep_value(index: GraphIndex, spec: InputSpec) -> tuple[int, str] | None:
    """The value with which mask input `name` keeps every key, and why; None: not a mask.

    Its role decides where the graph shows it: followed through value-preserving ops, Cast, And/Or
    and the flips (Not, `1 - x`, `x == 0`) to a Where choosing a large negative score or to a Mul
    by one (a Where whose true branch blocks means 1 blocks); float inputs too (a float 0/1 mask
    scaled by -10000).  Otherwise, for bool and integer inputs, its name: "*mask*" keeps a key at
    1 (transformers' attention_mask), except a bool "*padding_mask*", where True marks padding
    (PyTorch's key_padding_mask).
    """
    name = spec.name
    blocks_at = _blocking_value(index, name)
    if blocks_at is not None:
        keep = 1 - blocks_at
        return keep, (
            f"all {keep} (a mask: the graph turns {blocks_at} into a blocking score bias, so "
            f"{keep} keeps every key; pass --range {name}:LOW:HIGH or --inputs for a pattern)"
        )
    if spec.dtype.kind not in "biu" or not _MASK_NAME.search(name):
        return None
    if spec.dtype.kind == "b" and "padding" in name.lower():
        return 0, (
            "all False (a key padding mask by its name: True marks padding, so False keeps every "
            f"key; pass --range {name}:LOW:HIGH or --inputs for a pattern)"
        )
    return 1, (
        "all 1 (a mask by its name: 1 keeps a key, so every key is kept, as random 0/1 would "
        f"block whole rows; pass --range {name}:LOW:HIGH or --inputs for a pattern)"
    )


def _blocking_value(index: GraphIndex, name: str) -> int | None:
    """0 or 1: the value of input `name` that the graph turns into a blocking score bias."""
    frontier = [(name, False)]  # (tensor, whether its polarity is flipped against the input)
    seen = {name}
    while frontier and len(seen) < _MASK_TRACE_NODES:
        tensor, flipped = frontier.pop(0)
        for node in index.consumers_of(tensor):
            op, others = node.op_type, [i for i in node.input if i and i != tensor]
            values = [index.constant_value(i) for i in others]
            constant = values[0] if len(values) == 1 and values[0] is not None else None
            step: bool | None = None  # the flip this node adds; None: the trail ends here
            if op == "Where" and node.input[0] == tensor:
                high, low = (index.constant_value(node.input[k]) for k in (1, 2))
                if high is not None and high.size and float(np.max(high)) <= _BLOCKING:
                    return 0 if flipped else 1  # true blocks
                if low is not None and low.size and float(np.max(low)) <= _BLOCKING:
                    return 1 if flipped else 0  # false blocks
            elif op == "Mul" and constant is not None and constant.size:
                if float(np.max(constant)) <= _BLOCKING:
                    return 0 if flipped else 1
            elif op in _MASK_CARRIERS and (
                op in ("Concat", "And", "Or") or node.input[0] == tensor
            ):
                step = False
            elif op == "Not":
                step = True
            elif op in ("Sub", "Equal") and constant is not None and constant.size == 1:
                one = float(constant.reshape(-1)[0])
                if op == "Sub" and node.input[1] == tensor and one == 1:
                    step = True
                elif op == "Equal" and one in (0, 1):
                    step = one == 0
            if step is None:
                continue
            for out in node.output:
                if out and out not in seen:
                    seen.add(out)
                    frontier.append((out, flipped != step))
    return None


def _gather_limits(index: GraphIndex, names: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Integer inputs that index a Gather table → (largest valid index, the Gather's name)."""
    model = index.model
    table_dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    table_dims[node.output[0]] = tuple(attr.t.dims)
    limits: dict[str, tuple[int, str]] = {}
    for name in names:
        frontier, seen = [name], {name}
        while frontier:
            tensor = frontier.pop()
            for node in index.consumers_of(tensor):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                    dims = table_dims.get(node.input[0])
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                        high = dims[axis] - 1
                        if name not in limits or high < limits[name][0]:
                            limits[name] = (high, node.name or node.output[0])
                elif node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                    for out in node.output:
                        if out and out not in seen:
                            seen.add(out)
                            frontier.append(out)
    return limits


def _from_npz(
    source: str | os.PathLike[str] | Mapping[str, np.ndarray], specs: Sequence[InputSpec]
) -> InputData:
    if isinstance(source, Mapping):
        arrays, label = {k: np.asarray(v) for k, v in source.items()}, "given array"
    else:
        path = Path(source)
        label = f"from {path.name}"
        if path.is_dir():
            raise ValidationUsageError(f"--inputs {path} is a folder; pass the .npz file")
        if not path.is_file():
            raise ValidationUsageError(f"inputs file not found: {path}; pass an existing .npz")
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # EOF: an empty file
            raise ValidationUsageError(
                f"{path} is not a readable .npz ({exc}); "
                "write it with numpy.savez(path, name=array)"
            ) from exc
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValidationUsageError(
                f"{path} holds one unnamed array (a .npy), not arrays by input name; write an "
                "npz with numpy.savez(path, name=array) naming each model input"
            )
        with loaded as data:
            arrays = {k: data[k] for k in data.files}
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise ValidationUsageError(
            f"the inputs lack {', '.join(missing)}; "
            f"they hold {', '.join(sorted(arrays)) or 'nothing'} "
            f"and the model takes {', '.join(s.name for s in specs)}"
        )
    feeds: dict[str, np.ndarray] = {}
    sources = []
    casts: list[str] = []
    for spec in specs:
        array = arrays[spec.name]
        if spec.shape is not None and (
            array.ndim != len(spec.shape)
            or any(
                isinstance(d, int) and d != a for d, a in zip(spec.shape, array.shape, strict=True)
            )
        ):
            raise ValidationUsageError(
                f"input '{spec.name}' has shape {list(array.shape)} in the npz but the model "
                f"takes {spec.describe_shape()}"
            )
        if spec.is_float:
            same_kind = array.dtype.kind in "fV"
        else:
            same_kind = array.dtype.kind == spec.dtype.kind or {
                array.dtype.kind,
                spec.dtype.kind,
            } <= {"i", "u"}
        if not same_kind:
            raise ValidationUsageError(
                f"input '{spec.name}' is {array.dtype} in the npz but the model takes "
                f"{spec.type_name}; save it with that type"
            )
        if array.dtype.kind in "iu" and spec.dtype.kind in "iu" and array.size:
            info = np.iinfo(spec.dtype)
            if array.min() < info.min or array.max() > info.max:
                raise ValidationUsageError(
                    f"input '{spec.name}' holds values outside {spec.type_name} in the npz"
                )
        if not np.can_cast(array.dtype, spec.dtype, "safe"):  # widening loses nothing
            casts.append(f"{spec.name} {array.dtype} → {spec.dtype}")
        feeds[spec.name] = array.astype(spec.dtype, copy=False)
        sources.append(InputSource(spec.name, str(spec.dtype), tuple(array.shape), label))
    extra = sorted(set(arrays) - {s.name for s in specs})
    notes = [f"npz arrays not used by the model: {', '.join(extra)}"] if extra else []
    if casts:
        notes.append(
            f"npz arrays cast to the model's narrower input types: {', '.join(casts)}; save "
            "them in those types to feed the exact values"
        )
    return InputData(feeds=feeds, sources=tuple(sources), notes=tuple(notes))
