"""Minimal LayerNorm/RMSNorm/GroupNorm graphs built with onnx.helper, one knob per variant,
for the norm-fusion tests (tests/test_norms.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
X_SHAPE = (2, 3, 8)


@dataclass
class NormGraph:
    """A norm chain of `kind` ("layer" or "rms") over x: [2, 3, 8], one option per exporter
    variant or near-miss."""

    kind: str = "layer"
    opset: int = 17
    dtype: int = F32
    square: str = "pow"  # pow | mul
    inverse: str = "div"  # div | reciprocal | div_one | pow_half
    scale: bool = True
    bias: bool = True
    casts: str | None = None  # None | "input" (Cast x up, Cast n back) | "legacy" (Cast x − mean)
    axes: tuple[int, ...] = (-1,)
    var_axes: tuple[int, ...] | None = None
    exponent: float = 2.0
    eps_shape: tuple[int, ...] = ()
    sub_reversed: bool = False
    keepdims: int = 1
    scale_shape: tuple[int, ...] | None = None
    gemma: bool = False  # scale = 1 + w, as an Add node on the weight
    numerator: str = "centred"  # centred | x: Div(x, Sqrt(...)) is not a norm
    expose: str | None = None  # an intermediate tensor also made a graph output
    tap: str | None = None  # an intermediate tensor also read by another node (Neg → output)
    mean_of: str = "x"  # "y": the mean subtracted is another input's
    bias_input: bool = False  # β is a graph input, not a constant
    x_shape: tuple[int | str, ...] = X_SHAPE
    epsilon: float = 1e-5
    nodes: list[onnx.NodeProto] = field(default_factory=list, init=False)
    inits: list[onnx.TensorProto] = field(default_factory=list, init=False)

    def _const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def _node(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n_{out}", **attrs))
        return out

    def _reduce(self, inp: str, out: str, axes: tuple[int, ...]) -> str:
        if self.opset >= 18:
            axes_name = self._const(f"{out}_axes", np.array(axes, dtype=np.int64))
            return self._node("ReduceMean", [inp, axes_name], out, keepdims=self.keepdims)
        return self._node("ReduceMean", [inp], out, axes=list(axes), keepdims=self.keepdims)

    def build(self) -> onnx.ModelProto:
        rng = np.random.default_rng(1)
        wide = F32 if self.casts else self.dtype
        np_wide = helper.tensor_dtype_to_np_dtype(wide)
        np_io = helper.tensor_dtype_to_np_dtype(self.dtype)
        channels = X_SHAPE[-1]
        x = "x"
        if self.casts == "input":
            x = self._node("Cast", [x], "x_wide", to=F32)
        core_x = x
        if self.kind == "layer":
            mean = self._reduce(x if self.mean_of == "x" else "y", "mean", self.axes)
            sub_in = [mean, x] if self.sub_reversed else [x, mean]
            centred = self._node("Sub", sub_in, "centred")
            if self.casts == "legacy":
                centred = self._node("Cast", [centred], "centred_wide", to=F32)
        else:
            centred = x
        if self.square == "pow":
            two = self._const("two", np.array(self.exponent, dtype=np_wide))
            sq = self._node("Pow", [centred, two], "sq")
        else:
            sq = self._node("Mul", [centred, centred], "sq")
        var = self._reduce(sq, "var", self.var_axes or self.axes)
        eps = self._const("eps", np.full(self.eps_shape, self.epsilon, dtype=np_wide))
        with_eps = self._node("Add", [var, eps], "with_eps")
        top = centred if self.numerator == "centred" else core_x
        if self.inverse == "pow_half":
            half = self._const("minus_half", np.array(-0.5, dtype=np_wide))
            inv = self._node("Pow", [with_eps, half], "inv")
            n = self._node("Mul", [top, inv], "normed")
        else:
            root = self._node("Sqrt", [with_eps], "root")
            if self.inverse == "div":
                n = self._node("Div", [top, root], "normed")
            else:
                if self.inverse == "reciprocal":
                    inv = self._node("Reciprocal", [root], "inv")
                else:
                    one = self._const("one", np.array(1.0, dtype=np_wide))
                    inv = self._node("Div", [one, root], "inv")
                n = self._node("Mul", [inv, top], "normed")
        if self.casts:
            n = self._node("Cast", [n], "normed_back", to=self.dtype)
        if self.scale:
            shape = self.scale_shape if self.scale_shape is not None else (channels,)
            weight = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np_io)
            if self.gemma:
                w = self._const("w", (weight - 1).astype(np_io))
                one = self._const("one_w", np.array(1.0, dtype=np_io))
                gamma = self._node("Add", [one, w], "gamma")
            else:
                gamma = self._const("gamma", weight)
            n = self._node("Mul", [n, gamma], "scaled")
        inputs = [helper.make_tensor_value_info("x", self.dtype, list(self.x_shape))]
        if self.bias and self.kind == "layer":
            if self.bias_input:
                beta = "beta"
                inputs.append(helper.make_tensor_value_info("beta", self.dtype, [channels]))
            else:
                beta = self._const("beta", (0.2 * rng.standard_normal(channels)).astype(np_io))
            n = self._node("Add", [beta, n], "shifted")
        unknown = [None] * len(self.x_shape)
        outputs = [helper.make_tensor_value_info(n, self.dtype, unknown)]
        if self.expose:
            outputs.append(helper.make_tensor_value_info(self.expose, wide, unknown))
        if self.tap:
            self._node("Neg", [self.tap], "tapped")
            outputs.append(helper.make_tensor_value_info("tapped", wide, unknown))
        if self.mean_of == "y":
            inputs.append(helper.make_tensor_value_info("y", self.dtype, list(self.x_shape)))
        graph = helper.make_graph(self.nodes, "norm", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model


def group_norm_graph(
    *,
    opset: int = 21,
    affine: bool = True,
    groups: int = 2,
    split: tuple[int, ...] | None = None,
    instance_scale: float = 1.0,
    gamma_shape: tuple[int, ...] | None = None,
    static_merge: bool = False,
    merge_to: tuple[int, ...] | None = None,
    allowzero: int = 0,
) -> onnx.ModelProto:
    """torch's GroupNorm export over x: [2, 8, 4, 4]."""
    rng = np.random.default_rng(2)
    x_shape = (2, 8, 4, 4)
    channels = x_shape[1]
    inits = [
        numpy_helper.from_array(np.array(split or (0, groups, -1), dtype=np.int64), "split"),
        numpy_helper.from_array(np.full(groups, instance_scale, dtype=np.float32), "in_scale"),
        numpy_helper.from_array(np.zeros(groups, dtype=np.float32), "in_bias"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["grouped"], name="split", allowzero=allowzero),
        helper.make_node(
            "InstanceNormalization",
            ["grouped", "in_scale", "in_bias"],
            ["normed"],
            name="inorm",
            epsilon=1e-5,
        ),
    ]
    if static_merge or merge_to:
        merged = merge_to or x_shape
        inits.append(numpy_helper.from_array(np.array(merged, dtype=np.int64), "x_shape"))
    else:
        nodes.append(helper.make_node("Shape", ["x"], ["x_shape"], name="shape"))
    nodes.append(helper.make_node("Reshape", ["normed", "x_shape"], ["merged"], name="merge"))
    out = "merged"
    if affine:
        per_channel = (channels,) + (1,) * (len(merge_to or x_shape) - 2)
        shape = gamma_shape or per_channel
        inits.append(
            numpy_helper.from_array(
                (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32), "gamma"
            )
        )
        inits.append(
            numpy_helper.from_array(
                (0.2 * rng.standard_normal(per_channel)).astype(np.float32), "beta"
            )
        )
        nodes.append(helper.make_node("Mul", ["merged", "gamma"], ["scaled"], name="scale"))
        nodes.append(helper.make_node("Add", ["scaled", "beta"], ["y"], name="shift"))
        out = "y"
    graph = helper.make_graph(
        nodes,
        "group_norm",
        [helper.make_tensor_value_info("x", F32, list(x_shape))],
        [helper.make_tensor_value_info(out, F32, [None] * len(merge_to or x_shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def seeded_feed(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 5 for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feed[value.name] = (1.5 * rng.standard_normal(shape) + 0.5).astype(dtype)
    return feed
