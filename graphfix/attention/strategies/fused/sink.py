"""An attention sink as one more key of the GraphfixAttention node (no new node input).

GPT-OSS concatenates a per-head logit to the scores' key axis before the Softmax and slices its
probability off after it: the sink takes a share of the softmax mass and adds nothing to P·V.
The same is one more key whose score is the sink logit and whose value row is 0.  The node
computes a key's score as scale · q·k, so the logit is carried by extra head-dimension columns:

    Q' = [Q, t₁ … tₙ, 0 …]   (8 columns more: the head dim stays a multiple of 8)
    K' = [[K, 0 … 0], [0 … 0, 1 … 1, 0 …]]   (one key more, at the end)
    V' = [[V], [0 … 0]]   (Dv unchanged)

with t₁ + … + tₙ = sink / scale, tᵢ in Q's type: t₁ = round(sink / scale), t₂ = round(rest), …
(n = 1 for float32, 2 for float16, 3 for bfloat16), so the float32 accumulation of q'·k'_sink
gives sink / scale to ~2⁻²² and the node's scale · (…) gives the sink logit.  A real key's
extra columns are 0, so its score is unchanged exactly; the sink key's value row is 0, so P·V
is unchanged; only the softmax denominator sees the sink, as in the original.  The sink sits in
Q (per batch, head and query row, as the Concat has it), and K's sink row is the same constant
for every key/value head, so grouped heads (Hkv < Hq) need nothing more.

Why this form: the sink logit as an additive-mask column of a key with K = V = 0 is exact too,
but makes the mask per head ([B, H, S, T+1] where it was [B, 1, S, T]: 2 GB in float16 for
GPT-OSS's 64 heads at 4096 tokens); the sink in K's extra row (ones in Q) is per key/value head
and cannot hold a per-query-head logit under grouped heads.

The mask input gets one neutral column (0 or True) for the sink key; the node's `causal` flag
(top-left aligned, S == T only) is not used: the graph's causal mask stays a mask input.

Cost: Q', K', V' are copies (Pad/Concat) of Q, K and V per layer, and the head dim grows by 8.
A softcap before the Concat (the original does not cap the sink logit, the node caps every
score) is undone on a constant sink: its key carries cap·atanh(sink / cap) (|sink| ≤ 0.9·cap),
which the node's softcap turns back into the sink logit; a softcap after the Concat caps the
sink as the node does.  Not exact, so left to the GraphfixSoftmax fallback: a scale or mask
after the Concat (it would apply to the sink logit too); a Reshape of the scores; a constant
sink that is not finite or overflows Q's type once divided by the scale; a mask broadcast over
the keys; opsets below 13.  A sink computed at run time must be finite (a
-inf sink, "no sink", would give 0·inf = NaN on the real keys).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.attention.match_types import (
    AttentionMatch,
    BiasStep,
    CastStep,
    MaskStep,
    PassStep,
    ReshapeStep,
    ShiftStep,
    SoftcapStep,
)
from graphfix.attention.strategies.base import FallbackKind
from graphfix.attention.strategies.fused.mask import MaskPlan
from graphfix.attention.strategies.fused.nodes import node_adder
from graphfix.attention.strategies.fused.operands import Operands
from graphfix.attention.strategies.fused.unsupported import Unsupported, node_of
from graphfix.graph.edit import GraphEdit

PAD = 8  # extra head-dimension columns (the head dim stays a multiple of 8)
# Terms of the split sink / scale per element type: float32 1, float16 2, bfloat16 3.
_TERMS = {onnx.TensorProto.FLOAT: 1, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 3}
_MAX = {onnx.TensorProto.FLOAT: 3.4e38, onnx.TensorProto.FLOAT16: 65504.0}


def check_sink_steps(edit: GraphEdit, match: AttentionMatch, softcap: float) -> bool:
    """The sink column is treated as the node would treat it: only a max shift, casts, identities
    and a softcap come after the Concat.  True when a softcap comes before it: the node soft-caps
    every score, the original leaves the sink logit alone, so add_sink_key must pre-compensate."""
    assert match.sink is not None
    scores_in = match.sink.scores_input
    on_scores = list(match.score_steps)
    outputs = [s.output for s in on_scores]
    if scores_in == match.qk.node.output[0]:
        after = on_scores
    elif scores_in in outputs:
        after = on_scores[outputs.index(scores_in) + 1 :]
    else:
        raise Unsupported(
            FallbackKind.SINK,
            f"the sink Concat '{match.sink.concat}' does not read the scores' chain",
        )
    for step in match.steps:
        if isinstance(step, ReshapeStep):
            raise Unsupported(
                FallbackKind.RESHAPE,
                f"{step.op} '{step.node}' reshapes the scores of a chain with a sink",
            )
    for step in after:
        # a softcap of the whole row soft-caps the sink logit as the node does: cap·tanh(sink/cap)
        if not isinstance(step, (ShiftStep, CastStep, PassStep, SoftcapStep)):
            raise Unsupported(
                FallbackKind.SINK,
                f"'{node_of(step)}' comes after the sink Concat '{match.sink.concat}' and would "
                "apply to the sink logit as well",
            )
    return bool(softcap) and not any(isinstance(s, SoftcapStep) for s in after)


def add_sink_key(
    edit: GraphEdit,
    match: AttentionMatch,
    base: str,
    operands: Operands,
    mask: MaskPlan,
    *,
    uncap: float = 0.0,
) -> tuple[Operands, MaskPlan]:
    """Q', K', V' and the mask with the sink as one more key (see the module docstring).  With
    `uncap` (the chain's softcap, applied before the sink Concat), the sink key carries
    uncap·atanh(sink / uncap), which the node's softcap turns back into the sink logit."""
    assert match.sink is not None
    index = edit.index
    opset = next((o.version for o in edit.model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise Unsupported(
            FallbackKind.SINK, f"an attention sink in opset {opset} (the sink key needs Pad-13)"
        )
    if mask.causal:  # pragma: no cover - plan_mask is asked not to use the flag
        raise Unsupported(FallbackKind.SINK, "an attention sink with the node's causal flag")
    sink = match.sink.sink
    elem = index.elem_type(operands.q)
    sink_elem = index.elem_type(sink)
    if elem not in _TERMS or sink_elem is None:
        raise Unsupported(FallbackKind.TYPES, "the sink logits' or Q's element type is unknown")
    shape = _shapes(edit, operands)
    q_shape, sink_shape = shape(operands.q), index.shape(sink)
    rank = None if q_shape is None else len(q_shape)
    if rank is None or sink_shape is None or len(sink_shape) != rank:
        raise Unsupported(
            FallbackKind.SINK, "the sink logits' rank differs from Q's (or is unknown)"
        )
    if isinstance(sink_shape[-1], int) and sink_shape[-1] != 1:
        raise Unsupported(
            FallbackKind.SINK, f"the sink Concat adds {sink_shape[-1]} columns, not one"
        )
    for a, b in zip(sink_shape[:-1], q_shape[:-1], strict=True):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise Unsupported(
                FallbackKind.SINK,
                f"the sink logits {list(sink_shape)} do not line up with Q {list(q_shape)}",
            )
    value = index.constant_value(sink)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    if uncap:
        value, sink = _uncapped(edit, base, value, uncap, inits)
        sink_elem = onnx.TensorProto.FLOAT
    if value is not None:
        scaled = np.asarray(value, np.float64) / operands.scale
        if not np.isfinite(scaled).all() or np.abs(scaled).max(initial=0) > _MAX.get(elem, 3.3e38):
            raise Unsupported(
                FallbackKind.SINK,
                "a sink logit that is not finite or overflows Q's type over the scale",
            )

    add = node_adder(edit, base, nodes)

    def const(array: np.ndarray, what: str) -> str:
        name = edit.unique(f"{base}/{what}")
        inits.append(numpy_helper.from_array(array, name))
        return name

    def pads(rank: int, ends: dict[int, int]) -> str:
        value = [0] * (2 * rank)
        for axis, count in ends.items():
            value[rank + axis % rank] = count
        return const(np.array(value, np.int64), "sink_pads")

    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    zero = const(np.array(0, dtype), "sink_zero")

    if sink_shape[-1] != 1:  # one sink column, or a run-time error (not a wrong result)
        sink = add(
            "Reshape",
            [sink, const(np.array([0] * (rank - 1) + [1], np.int64), "sink_one_column")],
            "sink_column",
        )
    # Q' = [Q, t₁ … tₙ, 0 …]: the split sink / scale in Q's type.
    rest = (
        sink
        if sink_elem == onnx.TensorProto.FLOAT
        else add("Cast", [sink], "sink_f32", to=onnx.TensorProto.FLOAT)
    )
    rest = add(
        "Div", [rest, const(np.array(operands.scale, np.float32), "sink_scale")], "sink_over_scale"
    )
    terms = _TERMS[elem]
    columns: list[str] = []
    for i in range(terms):
        term = rest if elem == onnx.TensorProto.FLOAT else add("Cast", [rest], "sink_term", to=elem)
        columns.append(term)
        if i + 1 < terms:
            back = add("Cast", [term], "sink_term_f32", to=onnx.TensorProto.FLOAT)
            rest = add("Sub", [rest, back], "sink_rest")
    q = add("Concat", [operands.q, *columns], "q_sink", axis=-1)
    q = add("Pad", [q, pads(rank, {-1: PAD - terms}), zero], "q_sink_pad")

    # K' = K with 8 zero columns and one more key [0 … 0, 1 … 1, 0 …] (or Kᵀ's column).
    k_shape, v_shape = shape(operands.k), shape(operands.v)
    if k_shape is None or v_shape is None:
        raise Unsupported(FallbackKind.OPERANDS, "K's or V's rank is unknown")
    k_rank, v_rank = len(k_shape), len(v_shape)
    d_axis, t_axis = (-2, -1) if operands.k_transposed else (-1, -2)
    k = add("Pad", [operands.k, pads(k_rank, {d_axis: PAD}), zero], "k_sink_pad")
    d = k_shape[d_axis]
    if not isinstance(d, int):
        raise Unsupported(FallbackKind.OPERANDS, "K's head dimension is not static")
    row = np.zeros(d + PAD, dtype)
    row[d : d + terms] = 1
    row = row.reshape((1,) * (k_rank - 2) + ((1, d + PAD) if t_axis == -2 else (d + PAD, 1)))
    prefix = add(
        "Slice",
        [
            add("Shape", [operands.k], "k_shape"),
            const(np.array([0], np.int64), "sink_start"),
            const(np.array([-2], np.int64), "sink_end"),
        ],
        "k_prefix",
    )
    target = add(
        "Concat", [prefix, const(np.array([1, 1], np.int64), "sink_ones")], "sink_key_shape", axis=0
    )
    key = add("Expand", [const(row, "sink_key_row"), target], "sink_key")
    k = add("Concat", [k, key], "k_sink", axis=t_axis)

    # V' = V with one zero row.
    v = add("Pad", [operands.v, pads(v_rank, {-2: 1}), zero], "v_sink")

    note = f"attention sink as one more key (head dim +{PAD}: Q, K, V copied per layer)"
    operands = operands.read_through(q, k, v, nodes, inits, note)
    return operands, _pad_mask(edit, match, base, mask)


def _uncapped(
    edit: GraphEdit,
    base: str,
    value: np.ndarray | None,
    cap: float,
    inits: list[onnx.TensorProto],
) -> tuple[np.ndarray, str]:
    """cap·atanh(sink / cap) as a float32 constant (its value and name): the logit whose
    softcap is the sink logit.  Only for a constant sink well inside (-cap, cap)."""
    if value is None:
        raise Unsupported(
            FallbackKind.SINK,
            "a sink logit computed at run time after a softcap: the node soft-caps the sink, and "
            "undoing that (cap·atanh(sink / cap)) is exact only for |sink| < cap, which the graph "
            "does not say",
        )
    ratio = np.asarray(value, np.float64) / cap
    if not np.isfinite(ratio).all() or np.abs(ratio).max(initial=0) > 0.9:
        raise Unsupported(
            FallbackKind.SINK,
            f"a sink logit within 10% of the softcap {cap:g} (or beyond): the node soft-caps the "
            "sink, and undoing that (cap·atanh(sink / cap)) would lose precision",
        )
    uncapped = (cap * np.arctanh(ratio)).astype(np.float32)
    name = edit.unique(f"{base}/sink_uncapped")
    inits.append(numpy_helper.from_array(uncapped, name))
    return uncapped, name


def _shapes(edit: GraphEdit, operands: Operands):
    """Shapes of the operands, through the Transposes/Unsqueezes plan_operands added (Einsum
    layouts), which the graph's shape inference has not seen."""
    index = edit.index
    known: dict[str, tuple | None] = {}
    constants = {t.name: numpy_helper.to_array(t) for t in operands.initializers}
    for node in operands.nodes:
        source = known.get(node.input[0], index.shape(node.input[0]))
        out = None
        if source is not None and node.op_type == "Transpose":
            perm = next(helper_attr(node, "perm"), None)
            out = tuple(source[p] for p in perm) if perm is not None else None
        elif source is not None and node.op_type == "Unsqueeze" and node.input[1] in constants:
            axes = [int(a) for a in constants[node.input[1]].reshape(-1)]
            rank = len(source) + len(axes)
            dims = iter(source)
            axes = {a % rank for a in axes}
            out = tuple(1 if i in axes else next(dims) for i in range(rank))
        known[node.output[0]] = out

    def shape(name: str) -> tuple | None:
        return known[name] if name in known else index.shape(name)

    return shape


def helper_attr(node: onnx.NodeProto, name: str):
    return (onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _pad_mask(edit: GraphEdit, match: AttentionMatch, base: str, mask: MaskPlan) -> MaskPlan:
    """The mask with one neutral column for the sink key (0 additive, True boolean)."""
    if mask.tensor is None:
        return mask
    index = edit.index
    sources = [s.source for s in match.steps if isinstance(s, (MaskStep, BiasStep))]
    shapes = [index.shape(s) for s in sources]
    if not shapes or any(s is None for s in shapes):
        raise Unsupported(FallbackKind.SINK, "a mask of unknown shape with an attention sink")
    if all(len(s) == 0 or s[-1] == 1 for s in shapes):
        raise Unsupported(
            FallbackKind.SINK, "a mask broadcast over the keys with an attention sink"
        )
    rank = max(len(s) for s in shapes)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    add = node_adder(edit, base, nodes)

    pads = edit.unique(f"{base}/mask_sink_pads")
    inits.append(numpy_helper.from_array(np.array([0] * (2 * rank - 1) + [1], np.int64), pads))
    neutral = edit.unique(f"{base}/mask_sink_neutral")
    if mask.fill is not None:  # BOOL keep mask: TensorRT pads no BOOL, so through INT32
        inits.append(numpy_helper.from_array(np.array(1, np.int32), neutral))
        as_int = add("Cast", [mask.tensor], "mask_int", to=onnx.TensorProto.INT32)
        padded = add("Pad", [as_int, pads, neutral], "mask_sink_int")
        tensor = add("Cast", [padded], "mask_sink", to=onnx.TensorProto.BOOL)
    else:
        elem = _mask_elem(index, match)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        inits.append(numpy_helper.from_array(np.array(0, dtype), neutral))
        tensor = add("Pad", [mask.tensor, pads, neutral], "mask_sink")
    describe = f"{mask.describe}, a neutral column for the sink key" if mask.describe else ""
    return dataclasses.replace(
        mask,
        tensor=tensor,
        nodes=(*mask.nodes, *nodes),
        initializers=(*mask.initializers, *inits),
        describe=describe,
    )


def _mask_elem(index, match: AttentionMatch) -> int:
    biases = [s.source for s in match.steps if isinstance(s, BiasStep)]
    types = {index.elem_type(b) for b in biases}
    if len(types) != 1 or None in types:
        raise Unsupported(FallbackKind.TYPES, "the additive mask's element type is unknown")
    (elem,) = types
    return elem
