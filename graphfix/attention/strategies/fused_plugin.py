"""fused_plugin: the whole chain becomes one GraphfixAttention node (plugin_spec.ATTENTION).

Myelin cannot see inside a plugin, so the fusion is broken as surely as with the softmax plugin,
but the plugin is itself a fused kernel: no unfused MatMul→Softmax→MatMul chain at run time.
The node is built from the match's typed steps (match_types.ChainStep), read in order; a chain
with a step the node cannot express (a reshape of the scores other than Swin's windows or a view
of batch·heads, Q/DQ on the scores or probabilities, talking heads, probabilities used
elsewhere, ...) falls back to the GraphfixSoftmax plugin, and the report says why.

Masks and biases combine outside the node into its one mask input, with standard ONNX ops, where
that is exact: several biases are summed; several boolean masks with one fill are And-ed;
boolean masks with fill -inf and biases become Where(keep, Σ bias, -inf), with a finite fill
one float32 mask (fused/finite_fill.py); a bias before a scale is scaled by it.  Around the
node: views of batch·heads (fused/regroup.py), 5-D windows merged (fused/fold5.py), a run-time
scale moved onto Q (fused/runtime_scale.py), Shape readers of the scores recomputed
(fused/shape_readers.py).

An attention sink (GPT-OSS) becomes one more key with a zero value row, its logit carried by 8
extra head-dimension columns of Q and K (fused/sink.py): exact, at the cost of copying Q, K and V.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from graphfix.attention.match_types import (
    AttentionMatch,
    BiasStep,
    CastStep,
    HeadMixStep,
    MaskStep,
    NanGuardStep,
    PassStep,
    QdqStep,
    ReshapeStep,
    ScaleSide,
    ScaleStep,
    ShiftStep,
    SinkStep,
    SoftcapStep,
)
from graphfix.attention.strategies.base import Fallback, FallbackKind, Outcome
from graphfix.attention.strategies.fused.fold5 import fold_leading, unfold
from graphfix.attention.strategies.fused.mask import MaskPlan, plan_mask
from graphfix.attention.strategies.fused.operands import Operands, plan_operands
from graphfix.attention.strategies.fused.regroup import find_regroup, regroup_operands, view_back
from graphfix.attention.strategies.fused.shape_readers import recompute_shapes, shape_readers
from graphfix.attention.strategies.fused.sink import add_sink_key, check_sink_steps
from graphfix.attention.strategies.fused.speed import head_dims, speed_note
from graphfix.attention.strategies.fused.unsupported import Unsupported, node_of
from graphfix.attention.strategies.plugin import PluginStrategy
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.plugins.spec import (
    ATTENTION,
    ensure_plugin_opset,
    make_attention_node,
)


class FusedPluginStrategy:
    name = "fused_plugin"
    proven = True
    summary = (
        "replace the whole attention chain by one GraphfixAttention plugin node (a fused, "
        "float32-accumulating kernel); falls back to GraphfixSoftmax where the node cannot "
        "express the chain"
    )

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        index = edit.index
        base = match.softmax or f"graphfix_attention_{match.index}"
        try:
            softcap = _read_steps(match)
            uncap = match.sink is not None and check_sink_steps(edit, match, softcap)
            operands = plan_operands(edit, match, base)
            regroup = find_regroup(match)
            if regroup is not None:
                operands = regroup_operands(edit, base, regroup, operands)
            if index.rank(operands.q) == 5:
                operands = fold_leading(edit, match, base, operands)
            # the causal flag is top-left aligned for S == T: with the sink key T grows by one
            mask = plan_mask(
                edit, match, base, operands.q, allow_causal=match.sink is None, regroup=regroup
            )
            if match.sink is not None:
                operands, mask = add_sink_key(
                    edit, match, base, operands, mask, uncap=softcap if uncap else 0.0
                )
            readers = shape_readers(index, match)
            removed = _removed_positions(index, match, operands, mask, set(readers))
            # a reader that fed only the chain (a Reshape's shape) goes with it
            outside = {p: t for p, t in readers.items() if p not in removed}
            shapes = recompute_shapes(edit, base, operands, outside)
        except Unsupported as reason:
            instead = PluginStrategy().apply(edit, match)
            return Outcome(instead.rewritten, instead.detail, Fallback(reason.kind, str(reason)))
        pv = match.pv.node
        nodes = [*operands.nodes, *mask.nodes]
        for tensor in (*operands.initializers, *mask.initializers):
            edit.add_initializer(tensor)
        inputs = [operands.q, operands.k, operands.v]
        if mask.tensor is not None:
            inputs.append(mask.tensor)
        output = pv.output[0]
        node_output = output
        view_back_output = regroup is not None and regroup.probs is not None
        if (
            operands.cast_output_to is not None
            or operands.output_perm is not None
            or view_back_output
            or operands.unfold_like is not None
        ):
            node_output = edit.unique(f"{base}/out")
        if operands.output_perm is not None:
            transposed = output if operands.cast_output_to is None else edit.unique(f"{base}/out_t")
        nodes.append(
            make_attention_node(
                inputs,
                node_output,
                scale=operands.scale,
                k_transposed=operands.k_transposed,
                causal=mask.causal,
                softcap=softcap,
                mask_fill=-math.inf if mask.fill is None else mask.fill,
                nan_to_zero=match.nan_guard is not None,
                name=edit.unique(f"{base}/GraphfixAttention"),
            )
        )
        if view_back_output:  # (no output_perm: regroup_operands refuses Einsum layouts)
            folded = output if operands.cast_output_to is None else edit.unique(f"{base}/out_f")
            nodes += view_back(edit, base, node_output, folded)
            node_output = folded
        if operands.unfold_like is not None:  # (no output_perm either: fold_leading refuses)
            split = output if operands.cast_output_to is None else edit.unique(f"{base}/out_5d")
            nodes += unfold(edit, base, node_output, operands.unfold_like, split)
            node_output = split
        if operands.output_perm is not None:
            nodes.append(
                onnx.helper.make_node(
                    "Transpose",
                    [node_output],
                    [transposed],
                    name=edit.unique(f"{base}/to_graph_layout"),
                    perm=list(operands.output_perm),
                )
            )
            node_output = transposed
        if operands.cast_output_to is not None:
            nodes.append(
                onnx.helper.make_node(
                    "Cast",
                    [node_output],
                    [output],
                    name=edit.unique(f"{base}/to_graph_type"),
                    to=operands.cast_output_to,
                )
            )
        for position in removed:
            edit.replace(position, nodes if position == match.pv.position else [])
        for position, recomputed in shapes.items():
            edit.replace(position, recomputed)
        edit.drop_if_unused({i for p in removed for i in edit.node_at(p).input})
        edit.annotate(output)
        ensure_plugin_opset(edit.model)
        features = [f"scale {operands.scale:.6g}"]
        if mask.describe:
            features.append(mask.describe)
        features += [f for f, on in (("causal", mask.causal), ("softcap", softcap)) if on]
        if operands.cast_output_to is not None and not operands.v_widened:
            features.append("float16 V read before the exporter's float32 promotion")
        if operands.describe:
            features.append(operands.describe)
        detail = f"chain → {ATTENTION.op_type} ({', '.join(features)})"
        note = speed_note(index.elem_type(match.q), *head_dims(index, match), softcap=bool(softcap))
        if note:
            detail += f"; {note}"
        return Outcome(True, detail)


# The node computes scale → softcap → mask, in this order.
_STAGE = {ScaleStep: 0, SoftcapStep: 1, MaskStep: 2, BiasStep: 2}


def _read_steps(match: AttentionMatch) -> float:
    """Check that the steps fit the node's order and features; return the softcap (0: none).
    A scale after additive biases only (Falcon's (s + alibi)·c) is the node's scale, the biases
    scaled by it (plan_mask)."""
    stage, softcap = 0, 0.0
    only_biases = True  # every score step before this one is a bias (or a layout step)
    for step in match.steps:
        if isinstance(step, (MaskStep, SoftcapStep)):
            only_biases = False
        if isinstance(step, ScaleStep) and step.side is not ScaleSide.SCORES:
            continue  # on Q or K: read by plan_operands
        if isinstance(step, (CastStep, PassStep, ShiftStep)):
            continue
        if isinstance(step, ReshapeStep):
            continue  # Swin's window view (plan_mask) and batch·heads views (find_regroup)
        if isinstance(step, QdqStep):
            raise Unsupported(
                FallbackKind.QUANTIZED,
                f"the scores are quantized ({step.quantize} → {step.dequantize}); the node has "
                "no Q/DQ inside",
            )
        if isinstance(step, HeadMixStep):
            raise _head_mix(step, "Q·Kᵀ and the Softmax")
        if isinstance(step, SinkStep):  # not a score step today (match.sink); kept for safety
            raise Unsupported(FallbackKind.SINK, "an attention sink among the score steps")
        order = _STAGE[type(step)]
        if isinstance(step, ScaleStep) and only_biases and step.factor is not None:
            continue
        if order < stage:
            what = "scales" if order == 0 else "soft-caps"
            raise Unsupported(
                FallbackKind.ORDER, f"'{node_of(step)}' {what} the scores after the mask"
            )
        stage = order
        if isinstance(step, SoftcapStep):
            if step.cap is None:
                raise Unsupported(
                    FallbackKind.SOFTCAP, "a Tanh whose softcap value is not a constant"
                )
            if softcap:
                raise Unsupported(FallbackKind.SOFTCAP, "two softcaps")
            softcap = step.cap
    for step in match.after:
        if isinstance(step, (CastStep, PassStep, NanGuardStep, ReshapeStep)):
            continue  # a reshape: find_regroup reads it
        if isinstance(step, HeadMixStep):
            raise _head_mix(step, "the Softmax and P·V")
        if isinstance(step, QdqStep):
            raise Unsupported(
                FallbackKind.QUANTIZED,
                f"the probabilities are quantized ({step.quantize} → {step.dequantize}) before "
                "P·V; the node has no Q/DQ inside",
            )
        raise Unsupported(
            FallbackKind.RESHAPE, f"{step.op} '{step.node}' between the Softmax and P·V"
        )
    return softcap


def _head_mix(step: HeadMixStep, where: str) -> Unsupported:
    return Unsupported(
        FallbackKind.HEAD_MIX,
        f"a head-mixing projection (talking heads, '{step.weight}') between {where}: the node "
        "keeps heads apart; GraphfixSoftmax covers it under `plugin`",
    )


def _removed_positions(
    index: GraphIndex, match: AttentionMatch, operands: Operands, mask: MaskPlan, readers: set[int]
) -> list[int]:
    """The chain, its NaN guard's IsNaN, its max shift's ReduceMax, and what fed only the
    chain; nothing else may read a tensor inside the chain but the Shape `readers`
    (recomputed from Q and K)."""
    removed = {n.position for n in match.path}
    if match.nan_guard is not None:
        removed.add(match.nan_guard.is_nan.position)
    removed |= _shift_positions(index, match)
    probabilities = {n.position for n in match.path if n.position >= match.softmax_node.position}
    _check_nothing_escapes(index, removed, readers, probabilities, match.pv.node)
    sources = (s.source for s in match.steps if isinstance(s, (MaskStep, BiasStep)))
    added = (i for n in (*operands.nodes, *mask.nodes) for i in n.input)
    keep = {operands.q, operands.k, operands.v, mask.tensor, *sources, *added}
    removed |= _dead_ancestors(index, removed, keep)
    return sorted(removed)


def _shift_positions(index: GraphIndex, match: AttentionMatch) -> set[int]:
    """The ReduceMax of a Sub(s, ReduceMax(s)) max shift, beside the chain's path.
    The node's softmax shifts by the row max itself; dropping the shift is exact when the
    subtracted value is the row max (a ReduceMax over the key axis only, kept dims)."""
    positions: set[int] = set()
    for step in match.steps:
        if not isinstance(step, ShiftStep):
            continue
        sub, reduce = step.node.node, step.reduce_max.node
        if reduce.input[0] != sub.input[0]:
            raise Unsupported(
                FallbackKind.SHIFT, f"Sub '{step.node}' does not subtract the row max of its input"
            )
        if not _reduces_key_axis(index, reduce):
            raise Unsupported(
                FallbackKind.SHIFT,
                f"ReduceMax '{reduce.name}' is not the row max over the key axis alone "
                "(axes, keepdims)",
            )
        positions.add(step.reduce_max.position)
    return positions


def _reduces_key_axis(index: GraphIndex, reduce: onnx.NodeProto) -> bool:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in reduce.attribute}
    if not attrs.get("keepdims", 1):
        return False
    rank = index.rank(reduce.input[0])
    axes = attrs.get("axes")
    if axes is None and len(reduce.input) > 1 and reduce.input[1]:
        value = index.constant_value(reduce.input[1])
        if value is None:
            return False
        axes = [int(a) for a in np.asarray(value).reshape(-1)]
    # the row max only: a max over more axes is constant along the keys too, but can lie far
    # above a row's scores, and the original's exp would then underflow where the node's not
    return rank is not None and bool(axes) and {a % rank for a in axes} == {rank - 1}


def _check_nothing_escapes(
    index: GraphIndex,
    removed: set[int],
    readers: set[int],
    probabilities: set[int],
    pv: onnx.NodeProto,
) -> None:
    for position in removed:
        node = index.graph.node[position]
        if node is pv:
            continue
        for out in node.output:
            if out in index.graph_outputs and position in probabilities:
                raise Unsupported(
                    FallbackKind.RETURNS_PROBABILITIES,
                    f"the probabilities '{out}' are also a graph output (returned attention "
                    "weights), which the node does not produce; GraphfixSoftmax keeps them",
                )
            if out in index.graph_outputs:
                raise Unsupported(
                    FallbackKind.ESCAPES, f"'{out}' inside the chain is a graph output"
                )
            for consumer in index.consumers_of(out):
                if index.position(consumer) not in removed | readers:
                    raise Unsupported(
                        FallbackKind.ESCAPES,
                        f"'{out}' inside the chain is also used by {consumer.op_type} "
                        f"'{consumer.name}' (e.g. returned attention probabilities)",
                    )


def _dead_ancestors(index: GraphIndex, removed: set[int], keep: set[str | None]) -> set[int]:
    """Nodes feeding only the removed chain (K's Transpose, √scale Muls, in-graph scale math)."""
    dead: set[int] = set()
    gone = set(removed)
    frontier = [i for p in removed for i in index.graph.node[p].input if i]
    while frontier:
        tensor = frontier.pop()
        producer = index.producer_of(tensor)
        if producer is None:
            continue
        position = index.position(producer)
        if position in gone or keep.intersection(producer.output):
            continue
        outputs_dead = all(
            out not in index.graph_outputs
            and all(index.position(c) in gone for c in index.consumers_of(out))
            for out in producer.output
            if out
        )
        if outputs_dead:
            gone.add(position)
            dead.add(position)
            frontier.extend(i for i in producer.input if i)
    return dead
