"""onnxruntime on the CPU: the reference side, and a candidate that runs anywhere.

graphfix plugin nodes are lowered to standard ONNX ops (`graphfix.plugins.reference`) when present, so a
rewritten model runs here exactly as its plugin specifies.  A float16/bfloat16 model has every
low-precision tensor materialised at its producer's output (`graphfix.validation.low_precision`)
unless asked to run as is.  Graph optimisations stay at the basic (semantics-preserving) level,
so the reference is the model as written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from graphfix.attention.native.decompose import lower_trt_ops, trt_node_count
from graphfix.model_io import LoadedModel, fits_protobuf, system_temporary_prefix
from graphfix.plugins.reference import plugin_node_count, with_reference_ops
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.validation.backends import BackendError, InputsRejected
from graphfix.validation.inputs import cast_feeds, input_specs
from graphfix.validation.low_precision import (
    LowPrecision,
    describe_low_precision,
    low_precision_mode,
    low_precision_types,
    materialise,
)
from graphfix.validation.random_ops import seed_random_ops

_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
_ORT_ERRORS = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NotImplemented,
    ort_state.RuntimeException,
    ort_state.EPFail,
    RuntimeError,
    ValueError,
)


class OnnxRuntimeRunner:
    """`model` in an onnxruntime CPU session; `reference_ops=None` lowers plugin nodes if any;
    `low_precision=None` materialises float16/bfloat16 tensors (`LowPrecision`)."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        label: str,
        reference_ops: bool | None = None,
        low_precision: LowPrecision | str | None = None,
    ) -> None:
        plugin_nodes = plugin_node_count(model.model) + trt_node_count(model.model)
        lower = plugin_nodes > 0 if reference_ops is None else reference_ops
        mode = low_precision_mode(low_precision)
        self.label = label
        self.lowered_nodes = plugin_nodes if lower else 0
        self.low_precision = describe_low_precision(mode, low_precision_types(model.model))
        emulate = mode is LowPrecision.MATERIALISE and self.low_precision is not None
        self.description = f"onnxruntime {ort.__version__} on the CPU running {label}"
        if self.lowered_nodes:
            self.description += (
                f" with graphfix's reference implementation of its {self.lowered_nodes} "
                "plugin node(s)"
            )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.log_severity_level = 3
        # random nodes without a seed get one from their name: both sides draw alike (random_ops)
        seeded = seed_random_ops(model.model)
        rewritten = lower or emulate or seeded is not None
        proto = model.model if seeded is None else seeded
        proto = with_reference_ops(lower_trt_ops(proto)) if lower else proto
        if emulate:
            done = materialise(proto)
            proto = done.model
            self.low_precision = describe_low_precision(
                mode, low_precision_types(model.model), untyped=done.untyped
            )
        if rewritten and not model.weights_loaded and model.base_dir is not None:
            # the rewrite keeps the weights' external data references: onnxruntime reads them
            # from the model's folder, so nothing is loaded or copied here
            options.add_session_config_entry(_EXTERNAL_FOLDER, str(model.base_dir))
        self.specs = input_specs(proto)  # float16 inputs of an emulated model take float32
        half = onnx.TensorProto.FLOAT16
        self._half_outputs = (  # an emulated model's float16 outputs, given back in float16
            {o.name for o in model.model.graph.output if o.type.tensor_type.elem_type == half}
            if emulate
            else set()
        )
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        try:
            if not rewritten and model.path is not None:
                self.session = _session(str(model.path), options)
            elif fits_protobuf(proto):
                self.session = _session(proto.SerializeToString(), options)
            else:  # too large for one protobuf: onnxruntime reads it from a folder we keep
                self._folder = tempfile.TemporaryDirectory(prefix=system_temporary_prefix("ort"))
                path = Path(self._folder.name) / "model.onnx"
                onnx.save(proto, path, save_as_external_data=True, location="model.onnx.data")
                self.session = _session(str(path), options)
        except _ORT_ERRORS as exc:
            hint = (
                f"; it has {plugin_nodes} node(s) onnxruntime has no kernel for ({PLUGIN_DOMAIN} "
                "plugins, TRT_Attention/TRT_QuantizedAttention): pass reference_ops=None or True "
                "to lower them"
                if plugin_nodes and not lower
                else "; onnxruntime's CPU provider has no bfloat16 kernel for most ops: leave "
                "--low-precision at materialise (each op then computes in float32), run a "
                "bfloat16 model through PyTorch on a GPU (tools/torch_onnx_eval.py in the "
                "repository) or validate its float16 conversion"
                if _has_bfloat16(proto)
                else "; check that onnxruntime supports every op and opset in it"
            )
            raise BackendError(f"onnxruntime cannot load {label}: {_one_line(exc)}{hint}") from exc

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # the error is raised and reported below; ORT logs it too
        try:
            values = self.session.run(names, cast_feeds(feeds, self.specs), quiet)
        except _ORT_ERRORS as exc:
            shapes = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
            what = f"onnxruntime failed to run {self.label} on inputs {shapes}: {_one_line(exc)}"
            hint = "check --shape/--range/--inputs against what the model expects"
            if isinstance(exc, ort_state.InvalidArgument):
                raise InputsRejected(what, hint) from exc
            raise BackendError(f"{what}; {hint}") from exc
        outputs = {}
        for name, value in zip(names, values, strict=True):
            if not isinstance(value, np.ndarray):
                raise BackendError(
                    f"output '{name}' of {self.label} is a {type(value).__name__}, not a tensor; "
                    "validate compares tensor outputs only"
                )
            outputs[name] = value.astype(np.float16) if name in self._half_outputs else value
        return outputs


def _session(model: str | bytes, options: ort.SessionOptions) -> ort.InferenceSession:
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _has_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether the main graph holds bfloat16 weights or casts to bfloat16."""
    bf16 = onnx.TensorProto.BFLOAT16
    graph = model.graph
    return any(t.data_type == bf16 for t in graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == bf16 for a in n.attribute)
        for n in graph.node
    )
