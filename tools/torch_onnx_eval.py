"""Run converted ONNX models op by op through PyTorch: bfloat16 (and float16) checked on a GPU.

onnxruntime's CPU provider has no bfloat16 MatMul, and for float16 it inserts its own Casts
around ops that lack float16 kernels, so neither shows what a 16-bit engine computes.  This
minimal interpreter runs every node in the types the graph gives it, on torch's CUDA kernels
(bfloat16/float16 MatMul, Conv, …), for the ops the test corpus uses.

Two steps (the second needs only torch, onnx and numpy):

    python tools/torch_onnx_eval.py prepare .cache/precision-check   # CPU: the float32 corpus
        # models' float16 and bfloat16 conversions, one seeded input each, onnxruntime's float32
        # outputs, and the float32 models up to 1 MB (~40 MB in all)
    python tools/torch_onnx_eval.py check .cache/precision-check --device cuda

`check` first runs each stored float32 model through the interpreter and compares with
onnxruntime (tolerance fp32, TF32 off: proves the interpreter), then the float16 and bfloat16 conversions (tolerances
fp16 / bf16 of graphfix.validation.compare), and prints one line per model and a summary.
Exit 1 when a conversion disagrees.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parents[1]
TOLERANCES = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}


# --- the interpreter ---------------------------------------------------------------------------
def _torch():
    import torch

    return torch


def torch_dtype(elem: int):
    torch = _torch()
    return {
        onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.FLOAT16: torch.float16,
        onnx.TensorProto.BFLOAT16: torch.bfloat16, onnx.TensorProto.DOUBLE: torch.float64,
        onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
        onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8,
        onnx.TensorProto.BOOL: torch.bool,
    }[elem]  # fmt: skip


def tensor_of(proto: onnx.TensorProto, device: str):
    """A TensorProto as a torch tensor (bfloat16 decoded from its bits)."""
    torch = _torch()
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        if proto.raw_data:
            bits = np.frombuffer(proto.raw_data, dtype="<u2")
        else:
            bits = np.asarray(proto.int32_data, dtype=np.uint16)
        wide = (bits.astype(np.uint32) << 16).view(np.float32).reshape(tuple(proto.dims))
        return torch.from_numpy(wide.copy()).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.array(numpy_helper.to_array(proto))).to(device)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ints(t) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _reduce(fn: str) -> Callable:
    def run(xs, a, opset):
        torch = _torch()
        x = xs[0]
        axes = a.get("axes")
        if axes is None and len(xs) > 1 and xs[1] is not None:
            axes = _ints(xs[1])
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        if fn == "mean":
            return torch.mean(x, dim=axes, keepdim=keep)
        if fn == "sum":
            return torch.sum(x, dim=axes, keepdim=keep)
        out = x
        for axis in sorted((ax % x.dim() for ax in axes), reverse=True):
            out = (torch.amax if fn == "max" else torch.amin)(out, dim=axis, keepdim=keep)
        return out

    return run


def _slice(xs, a, opset):
    x, starts, ends = xs[0], _ints(xs[1]), _ints(xs[2])
    axes = _ints(xs[3]) if len(xs) > 3 and xs[3] is not None else list(range(len(starts)))
    steps = _ints(xs[4]) if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    torch = _torch()
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        n = x.shape[ax]
        if st > 0:
            index[ax] = slice(
                max(min(s if s >= 0 else s + n, n), 0), max(min(e if e >= 0 else e + n, n), 0), st
            )
        else:
            s = max(min(s if s >= 0 else s + n, n - 1), -1)
            e = max(min(e if e >= 0 else e + n, n - 1), -1)
            idx = torch.arange(s, e, st, device=x.device)
            x = x.index_select(ax, idx)
            continue
    return x[tuple(index)]


def _resize(xs, a, opset):
    torch = _torch()
    x = xs[0]
    scales = xs[2] if len(xs) > 2 and xs[2] is not None and xs[2].numel() else None
    sizes = xs[3] if len(xs) > 3 and xs[3] is not None else None
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if sizes is not None:
        size = _ints(sizes)[2:]
    else:
        size = [
            int(np.floor(d * float(s)))
            for d, s in zip(x.shape[2:], scales.tolist()[2:], strict=True)
        ]
    if mode == "nearest":
        return torch.nn.functional.interpolate(x, size=size, mode="nearest")
    align = a.get("coordinate_transformation_mode", b"half_pixel") in (
        b"align_corners",
        "align_corners",
    )
    kind = {3: "linear", 4: "bilinear", 5: "trilinear"}[x.dim()]
    return torch.nn.functional.interpolate(x, size=size, mode=kind, align_corners=align)


def _conv(xs, a, opset):
    torch = _torch()
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    dims = w.dim() - 2
    pads = a.get("pads", [0] * 2 * dims)
    strides, dil, group = (
        a.get("strides", [1] * dims),
        a.get("dilations", [1] * dims),
        a.get("group", 1),
    )
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError("Conv auto_pad")
    if list(pads[:dims]) != list(pads[dims:]):
        x = torch.nn.functional.pad(
            x, [p for i in reversed(range(dims)) for p in (pads[i], pads[i + dims])]
        )
        pads = [0] * 2 * dims
    fn = torch.nn.functional.conv1d if dims == 1 else torch.nn.functional.conv2d
    return fn(x, w, b, stride=strides, padding=list(pads[:dims]), dilation=dil, groups=group)


def _layer_norm(xs, a, opset):
    torch = _torch()
    x, scale = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    axis = a.get("axis", -1) % x.dim()
    dims = list(range(axis, x.dim()))
    work = x.float() if a.get("stash_type", 1) == 1 else x
    mean = work.mean(dim=dims, keepdim=True)
    var = ((work - mean) ** 2).mean(dim=dims, keepdim=True)
    y = ((work - mean) / torch.sqrt(var + a.get("epsilon", 1e-5))).to(x.dtype) * scale
    return y + bias if bias is not None else y


def _rms_norm(xs, a, opset):
    """RMSNormalization-23: x / sqrt(mean(x²) + ε) in stash_type (float32 by default), Cast
    back to x's type, times the scale."""
    torch = _torch()
    x, scale = xs
    axis = a.get("axis", -1) % x.dim()
    dims = list(range(axis, x.dim()))
    work = x.float() if a.get("stash_type", 1) == 1 else x
    rms = torch.sqrt((work * work).mean(dim=dims, keepdim=True) + a.get("epsilon", 1e-5))
    return (work / rms).to(x.dtype) * scale


def _instance_norm(xs, a, opset):
    torch = _torch()
    x, scale, bias = xs
    dims = list(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
    shape = [1, -1] + [1] * len(dims)
    return (x - mean) / torch.sqrt(var + a.get("epsilon", 1e-5)) * scale.reshape(
        shape
    ) + bias.reshape(shape)


def _expand(xs, a, opset):
    torch = _torch()
    shape = torch.broadcast_shapes(tuple(xs[0].shape), tuple(_ints(xs[1])))
    return xs[0].expand(shape)


def _reshape(xs, a, opset):
    shape = _ints(xs[1])
    if not a.get("allowzero", 0):
        shape = [xs[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return xs[0].reshape(shape)


def _split(xs, a, opset):
    torch = _torch()
    axis = a.get("axis", 0)
    if len(xs) > 1 and xs[1] is not None:
        sizes = _ints(xs[1])
    elif "split" in a:
        sizes = list(a["split"])
    else:
        n = a["num_outputs"]
        size = -(-xs[0].shape[axis] // n)
        sizes = [min(size, xs[0].shape[axis] - i * size) for i in range(n)]
    return tuple(torch.split(xs[0], sizes, dim=axis))


def _gather(xs, a, opset):
    axis = a.get("axis", 0) % xs[0].dim()
    idx = xs[1].long()
    idx = idx.where(idx >= 0, idx + xs[0].shape[axis])
    out = xs[0].index_select(axis, idx.reshape(-1))
    return out.reshape((*xs[0].shape[:axis], *idx.shape, *xs[0].shape[axis + 1 :]))


def _softmax(xs, a, opset, *, wide: bool = False):
    torch = _torch()
    x = xs[0]
    work = x.float() if wide else x
    return torch.softmax(work, dim=a.get("axis", -1)).to(x.dtype)


def _pad(xs, a, opset):
    torch = _torch()
    x = xs[0]
    pads = _ints(xs[1]) if len(xs) > 1 else list(a["pads"])
    value = float(xs[2].item()) if len(xs) > 2 and xs[2] is not None and xs[2].numel() else 0.0
    n = x.dim()
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    flat = [p for i in reversed(range(n)) for p in (pads[i], pads[i + n])]
    return (
        torch.nn.functional.pad(x, flat, mode=mode, value=value)
        if mode == "constant"
        else torch.nn.functional.pad(x, flat, mode=mode)
    )


def _ops() -> dict[str, Callable]:
    torch = _torch()

    def binary(fn):
        return lambda xs, a, o: fn(xs[0], xs[1])

    def unary(fn):
        return lambda xs, a, o: fn(xs[0])

    def div(x, y):
        if x.dtype.is_floating_point:
            return x / y
        return torch.div(x, y, rounding_mode="trunc")

    def variadic(fn):
        def run(xs, a, o):
            out = xs[0]
            for x in xs[1:]:
                out = fn(out, x)
            return out

        return run

    def cast(xs, a, o):
        return xs[0].to(torch_dtype(a["to"]))

    def constant(xs, a, o):
        if "value" in a:
            return tensor_of(a["value"], DEVICE[0])
        for key, dtype in (
            ("value_float", torch.float32),
            ("value_floats", torch.float32),
            ("value_int", torch.int64),
            ("value_ints", torch.int64),
        ):
            if key in a:
                return torch.tensor(a[key], dtype=dtype, device=DEVICE[0])
        raise NotImplementedError(f"Constant {list(a)}")

    def constant_of_shape(xs, a, o):
        value = (
            tensor_of(a["value"], DEVICE[0]) if "value" in a else torch.zeros(1, device=DEVICE[0])
        )
        return value.reshape(()).expand(_ints(xs[0])).clone()

    def shape(xs, a, o):
        dims = list(xs[0].shape)[a.get("start", 0) : a.get("end", None)]
        return torch.tensor(dims, dtype=torch.int64, device=DEVICE[0])

    def squeeze(xs, a, o):
        axes = a.get("axes") or (_ints(xs[1]) if len(xs) > 1 else None)
        if axes is None:
            return xs[0].squeeze()
        out = xs[0]
        for axis in sorted((ax % out.dim() for ax in axes), reverse=True):
            out = out.squeeze(axis)
        return out

    def unsqueeze(xs, a, o):
        axes = a.get("axes") or _ints(xs[1])
        out = xs[0]
        rank = out.dim() + len(axes)
        for axis in sorted(ax % rank for ax in axes):
            out = out.unsqueeze(axis)
        return out

    def gemm(xs, a, o):
        x, w = xs[0], xs[1]
        x = x.t() if a.get("transA", 0) else x
        w = w.t() if a.get("transB", 0) else w
        y = a.get("alpha", 1.0) * (x @ w)
        if len(xs) > 2 and xs[2] is not None:
            y = y + a.get("beta", 1.0) * xs[2]
        return y

    def where(xs, a, o):
        return torch.where(xs[0], xs[1], xs[2])

    def trilu(xs, a, o):
        k = int(xs[1].item()) if len(xs) > 1 and xs[1] is not None else 0
        return torch.triu(xs[0], k) if a.get("upper", 1) else torch.tril(xs[0], k)

    def rng(xs, a, o):
        return torch.arange(xs[0].item(), xs[1].item(), xs[2].item(), device=DEVICE[0]).to(
            xs[0].dtype
        )

    def pow_(xs, a, o):
        return torch.pow(
            xs[0], xs[1].to(xs[0].dtype) if xs[1].dtype.is_floating_point else xs[1]
        ).to(xs[0].dtype)

    def topk(xs, a, o):
        values, indices = torch.topk(
            xs[0],
            int(xs[1].item()),
            dim=a.get("axis", -1),
            largest=bool(a.get("largest", 1)),
            sorted=bool(a.get("sorted", 1)),
        )
        return values, indices

    def argmax(xs, a, o):
        return torch.argmax(xs[0], dim=a.get("axis", 0), keepdim=bool(a.get("keepdims", 1)))

    def gather_elements(xs, a, o):
        return torch.gather(xs[0], a.get("axis", 0), xs[1].long())

    def gather_nd(xs, a, o):
        data, idx = xs[0], xs[1].long()
        if a.get("batch_dims", 0):
            raise NotImplementedError("GatherND batch_dims")
        return data[tuple(idx[..., i] for i in range(idx.shape[-1]))]

    def clip(xs, a, o):
        low = xs[1] if len(xs) > 1 and xs[1] is not None else a.get("min")
        high = xs[2] if len(xs) > 2 and xs[2] is not None else a.get("max")
        return torch.clamp(xs[0], min=low, max=high)

    def tile(xs, a, o):
        return xs[0].repeat(_ints(xs[1]))

    def mod(xs, a, o):
        return torch.fmod(xs[0], xs[1]) if a.get("fmod", 0) else torch.remainder(xs[0], xs[1])

    def flatten(xs, a, o):
        axis = a.get("axis", 1)
        axis = axis + xs[0].dim() if axis < 0 else axis
        return xs[0].reshape(int(np.prod(xs[0].shape[:axis])), int(np.prod(xs[0].shape[axis:])))

    return {
        "Add": binary(torch.add), "Sub": binary(torch.sub), "Mul": binary(torch.mul),
        "Div": binary(div), "Pow": pow_, "Sqrt": unary(torch.sqrt),
        "Reciprocal": unary(torch.reciprocal), "Neg": unary(torch.neg), "Abs": unary(torch.abs),
        "Exp": unary(torch.exp), "Log": unary(torch.log), "Sin": unary(torch.sin),
        "Cos": unary(torch.cos), "Tanh": unary(torch.tanh), "Sigmoid": unary(torch.sigmoid),
        "Erf": unary(torch.erf), "Relu": unary(torch.relu), "Not": unary(torch.logical_not),
        "IsNaN": unary(torch.isnan), "Identity": unary(lambda x: x), "Dropout": unary(lambda x: x),
        "Min": variadic(torch.minimum), "Max": variadic(torch.maximum), "Mod": mod,
        "Equal": binary(torch.eq), "Less": binary(torch.lt), "LessOrEqual": binary(torch.le),
        "Greater": binary(torch.gt), "GreaterOrEqual": binary(torch.ge),
        "And": binary(torch.logical_and), "Or": binary(torch.logical_or), "Where": where,
        "Cast": cast, "CastLike": lambda xs, a, o: xs[0].to(xs[1].dtype), "Constant": constant,
        "ConstantOfShape": constant_of_shape, "Shape": shape,
        "Size": lambda xs, a, o: torch.tensor(xs[0].numel(), device=DEVICE[0]),
        "Reshape": _reshape, "Flatten": flatten,
        "Transpose": lambda xs, a, o: xs[0].permute(*(a.get("perm") or reversed(range(xs[0].dim())))),
        "Squeeze": squeeze, "Unsqueeze": unsqueeze,
        "Concat": lambda xs, a, o: torch.cat([x for x in xs if x is not None], dim=a["axis"]),
        "Split": _split, "Slice": _slice, "Gather": _gather, "GatherElements": gather_elements,
        "GatherND": gather_nd, "Expand": _expand, "Tile": tile, "Pad": _pad, "Trilu": trilu,
        "Range": rng, "MatMul": binary(torch.matmul), "Gemm": gemm,
        "Einsum": lambda xs, a, o: torch.einsum(a["equation"].decode() if isinstance(a["equation"], bytes) else a["equation"], *xs),
        "Conv": _conv, "Softmax": _softmax,
        "GraphfixSoftmax": lambda xs, a, o: _softmax(xs, a, o, wide=True),
        "LayerNormalization": _layer_norm, "InstanceNormalization": _instance_norm,
        "RMSNormalization": _rms_norm,
        "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("max"),
        "ReduceMin": _reduce("min"), "ArgMax": argmax, "Clip": clip, "TopK": topk, "Resize": _resize,
    }  # fmt: skip


DEVICE = ["cpu"]


def run_model(model: onnx.ModelProto, feed: dict[str, np.ndarray], device: str) -> list[np.ndarray]:
    """Outputs of `model` on `feed`, every node run by torch in the graph's own types."""
    torch = _torch()
    DEVICE[0] = device
    ops = _ops()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = {t.name: tensor_of(t, device) for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in feed:
            values[vi.name] = torch.from_numpy(np.asarray(feed[vi.name])).to(device)
    with torch.no_grad():
        for node in model.graph.node:
            if node.op_type not in ops:
                raise NotImplementedError(
                    f"op {node.domain or 'ai.onnx'}::{node.op_type} ({node.name})"
                )
            inputs = [values[i] if i else None for i in node.input]
            out = ops[node.op_type](inputs, _attrs(node), opset)
            outs = out if isinstance(out, tuple) else (out,)
            for name, value in zip(node.output, outs, strict=False):
                if name:
                    values[name] = value
    return [
        values[o.name].float().cpu().numpy()
        if values[o.name].dtype.is_floating_point
        else values[o.name].cpu().numpy()
        for o in model.graph.output
    ]


# --- prepare (here) and check (on the GPU) -----------------------------------------------------
def prepare(out: Path, only: list[str], float32_max_bytes: int = 1 << 20) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    import onnxruntime as ort
    from model_corpus import entries, model_path, random_feed

    from graphfix.precision.census import is_float32_model
    from graphfix.precision.convert import convert_precision

    out.mkdir(parents=True, exist_ok=True)
    listed = []
    for entry in entries(only=only):
        if entry.export_error:
            continue
        path = model_path(entry)
        model = onnx.load(str(path))
        if not is_float32_model(model):
            continue
        folder = out / entry.name
        folder.mkdir(exist_ok=True)
        if path.stat().st_size <= float32_max_bytes:  # the interpreter's own check; keeps the
            onnx.save(model, folder / "float32.onnx")  # folder small enough to carry to a GPU
        for to in ("float16", "bfloat16"):
            onnx.save(convert_precision(model, to=to).model, folder / f"{to}.onnx")
        feed = random_feed(model, np.random.default_rng(0))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        expected = session.run(None, feed)
        np.savez(folder / "inputs.npz", **feed)
        np.savez(folder / "expected.npz", *expected)
        listed.append(entry.name)
    (out / "models.json").write_text(json.dumps(listed, indent=1))
    print(f"prepared {len(listed)} models in {out}")


def _agrees(reference: np.ndarray, candidate: np.ndarray, kind: str) -> tuple[bool, float]:
    if reference.dtype.kind != "f":
        return bool(np.array_equal(reference, candidate)), 0.0
    atol, rtol = TOLERANCES[kind]
    ref, got = reference.astype(np.float64), candidate.astype(np.float64)
    diff = np.abs(ref - got)
    ok = bool(
        np.all((diff <= atol) | (diff <= rtol * np.abs(ref)) | (np.isnan(ref) & np.isnan(got)))
    )
    return ok, float(np.nanmax(diff)) if diff.size else 0.0


def check(folder: Path, device: str) -> int:
    torch = _torch()
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            print(f"no CUDA device for --device {device}", file=sys.stderr)
            return 3
        # float32 means float32: no TF32 in MatMul or Conv (cuDNN allows it by default)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    names = json.loads((folder / "models.json").read_text())
    failures = 0
    counts = {k: [0, 0] for k in TOLERANCES}
    for name in names:
        here = folder / name
        feed = dict(np.load(here / "inputs.npz"))
        stored = np.load(here / "expected.npz")
        expected = [stored[f"arr_{i}"] for i in range(len(stored.files))]
        line = [f"{name:40s}"]
        for kind in TOLERANCES:
            if not (here / f"{kind}.onnx").exists():
                line.append(f"{kind}: not prepared")
                continue
            model = onnx.load(str(here / f"{kind}.onnx"))
            try:
                got = run_model(model, feed, device)
            except NotImplementedError as exc:
                line.append(f"{kind}: skipped ({exc})")
                continue
            except Exception as exc:
                line.append(f"{kind}: ERROR {type(exc).__name__}: {str(exc)[:80]}")
                failures += 1
                continue
            results = [_agrees(r, g, kind) for r, g in zip(expected, got, strict=True)]
            ok = all(r[0] for r in results)
            worst = max(r[1] for r in results)
            counts[kind][0] += ok
            counts[kind][1] += 1
            failures += not ok
            line.append(f"{kind}: {'ok ' if ok else 'FAIL'} max|err| {worst:.2e}")
        print("  ".join(line))
    print(
        "summary: "
        + ", ".join(f"{k} {a}/{b} agree" for k, (a, b) in counts.items())
        + f" (device {device})"
    )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out", type=Path)
    p.add_argument("--only", action="append", default=[])
    p.add_argument(
        "--float32-max-mb", type=float, default=1.0,
        help="store the float32 model (the interpreter's own check) only up to this size",
    )  # fmt: skip
    c = sub.add_parser("check")
    c.add_argument("folder", type=Path)
    c.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out, args.only, int(args.float32_max_mb * (1 << 20)))
        return 0
    return check(args.folder, args.device)


if __name__ == "__main__":
    sys.exit(main())
