"""native_attention: the whole chain becomes one opset-23 ONNX `Attention` node, laid out as
TensorRT's ONNX parser maps it onto IAttention (TensorRT ≥ 10.14).

The layout the importer expects: Q [B, Hq, S, D], K and V [B, Hkv, T, D] (or 3-D with
q_num_heads/kv_num_heads), one output; `scale` always written (the importer applies √scale to Q
and to K, as the spec does); a boolean mask (True keeps) or an additive mask of Q's type;
`is_causal` only for a pure top-left causal mask with S == T.  Not expressible (the report says
why, the chain is left as it is): a softcap (the importer refuses it), a
boolean mask with a finite fill (IAttention blocks with -inf), Q/DQ inside the chain, and what
GraphfixAttention cannot express either (fused_plugin's planning is shared).  An attention
sink becomes one more key, exactly, as for fused_plugin (fused/sink.py).

`accumulate="float32"` (`--accumulate float32`) casts float16/bfloat16 Q, K and V to float32
around the node and its output back: TensorRT 11.3's release notes say such an IAttention keeps
the FP16 fused kernel and accumulates in float32.  None of this is run here (no TensorRT): the
rewrite is checked numerically on onnxruntime, which runs Attention-23 itself.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.strategies.base import FallbackKind, Outcome
from graphfix.attention.strategies.fused.fold5 import fold_leading, unfold
from graphfix.attention.strategies.fused.mask import MaskPlan, plan_mask
from graphfix.attention.strategies.fused.operands import Operands, plan_operands
from graphfix.attention.strategies.fused.regroup import find_regroup, regroup_operands, view_back
from graphfix.attention.strategies.fused.shape_readers import recompute_shapes, shape_readers
from graphfix.attention.strategies.fused.sink import add_sink_key, check_sink_steps
from graphfix.attention.strategies.fused.unsupported import Unsupported
from graphfix.attention.strategies.fused_plugin import _read_steps as read_steps
from graphfix.attention.strategies.fused_plugin import _removed_positions as removed_positions
from graphfix.graph.edit import GraphEdit

_LOW_PRECISION = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
# A float32 fill at or below this absorbs any score added to it (s + fill == fill for
# |s| < 1e31), so Where(keep, s, fill) == s + Where(keep, 0, fill): finfo(float32).min masks.
_ABSORBING = 1e30
ACCUMULATE_CHOICES = ("float32",)


class NativeAttentionStrategy:
    name = "native_attention"
    proven = False
    opset = 23
    summary = (
        "replace the whole attention chain by one opset-23 ONNX Attention node that TensorRT "
        "≥ 10.14 builds as IAttention (its fused kernel); --accumulate float32 casts Q, K, V "
        "to float32 around it (TensorRT ≥ 11.3: FP16 kernel, float32 accumulation)"
    )

    def __init__(self, *, accumulate: str | None = None) -> None:
        self.accumulate = accumulate

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome:
        base = match.softmax or f"graphfix_attention_{match.index}"
        try:
            operands, mask, removed, shapes, fold_heads = _plan(edit, match, base)
        except Unsupported as reason:
            return Outcome(False, f"left as is, not expressible as IAttention: {reason}")
        for tensor in (*operands.initializers, *mask.initializers):
            edit.add_initializer(tensor)
        nodes = _Nodes(edit, base, [*operands.nodes, *mask.nodes])
        elem = edit.index.elem_type(operands.q)
        widen = self.accumulate == "float32" and elem in _LOW_PRECISION
        y = nodes.attention(operands, mask, widen=widen)
        if widen:
            y = nodes.add("Cast", [y], to=elem)
        if fold_heads:
            y = nodes.extend(view_back(edit, base, y, edit.unique(f"{base}/out_folded")))
        if operands.unfold_like is not None:
            split = edit.unique(f"{base}/out_5d")
            y = nodes.extend(unfold(edit, base, y, operands.unfold_like, split))
        if operands.output_perm is not None:
            y = nodes.add("Transpose", [y], perm=list(operands.output_perm))
        if operands.cast_output_to is not None:
            y = nodes.add("Cast", [y], to=operands.cast_output_to)
        output = match.pv.node.output[0]
        nodes.list[-1].output[0] = output  # the last node writes the chain's output tensor
        for position in removed:
            edit.replace(position, nodes.list if position == match.pv.position else [])
        for position, recomputed in shapes.items():
            edit.replace(position, recomputed)
        edit.drop_if_unused({i for p in removed for i in edit.node_at(p).input})
        edit.annotate(output)
        features = [f"scale {operands.scale:.6g}"]
        features += [f for f in (mask.describe, "causal" * mask.causal, operands.describe) if f]
        if widen:
            features.append("Q, K, V cast to float32 around it, output cast back")
        elif self.accumulate:
            features.append(f"Q is {match.dtype}: no float32 casts needed")
        if mask.tensor is not None and match.nan_guard is None:
            features.append("a row with every key at -inf gives 0, where the chain gives NaN")
        return Outcome(True, f"chain → Attention ({', '.join(features)})")


def _plan(
    edit: GraphEdit, match: AttentionMatch, base: str
) -> tuple[Operands, MaskPlan, list[int], dict[int, list[onnx.NodeProto]], bool]:
    """The node's operands and mask as fused_plugin plans them, the chain positions removed,
    the Shape readers recomputed from Q and K, and whether the output is viewed back to
    batch·heads; raises Unsupported."""
    index = edit.index
    softcap = read_steps(match)
    if softcap:
        raise Unsupported(
            FallbackKind.SOFTCAP, "a softcap, which TensorRT's Attention importer refuses"
        )
    if match.sink is not None:
        check_sink_steps(edit, match, softcap)
    operands = plan_operands(edit, match, base)
    regroup = find_regroup(match)
    if regroup is not None:  # batch·heads viewed as batch, heads (BLOOM, DeBERTa v2)
        operands = regroup_operands(edit, base, regroup, operands)
    if index.rank(operands.q) == 5:  # windows folded into the batch (NesT)
        operands = fold_leading(edit, match, base, operands)
    mask = plan_mask(
        edit, match, base, operands.q, allow_causal=match.sink is None, regroup=regroup
    )
    if match.sink is not None:  # one more key, as for fused_plugin (fused/sink.py)
        operands, mask = add_sink_key(edit, match, base, operands, mask)
    if mask.fill is not None and -_ABSORBING < mask.fill < math.inf:
        raise Unsupported(
            FallbackKind.MASK,
            f"a boolean mask with the finite fill {mask.fill:g}; IAttention's boolean mask "
            f"blocks with -inf, and the fill as an additive mask is exact only at ≤ "
            f"-{_ABSORBING:g}",
        )
    readers = shape_readers(index, match)
    removed = removed_positions(index, match, operands, mask, set(readers))
    outside = {p: t for p, t in readers.items() if p not in removed}
    view_back = regroup is not None and regroup.probs is not None
    return operands, mask, removed, recompute_shapes(edit, base, operands, outside), view_back


class _Nodes:
    """The nodes replacing one chain, named under its Softmax."""

    def __init__(self, edit: GraphEdit, base: str, nodes: list[onnx.NodeProto]) -> None:
        self.edit, self.base, self.list = edit, base, nodes

    def add(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.edit.unique(f"{self.base}/{op.lower()}_out")
        name = self.edit.unique(f"{self.base}/{op}")
        self.list.append(onnx.helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def extend(self, nodes: list[onnx.NodeProto]) -> str:
        """Append `nodes` (the last writes the result); the result's name."""
        self.list.extend(nodes)
        return nodes[-1].output[0]

    def floats(self, suffix: str, value: float) -> str:
        name = self.edit.unique(f"{self.base}/{suffix}")
        self.edit.add_initializer(onnx.numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def ints(self, suffix: str, values: list[int]) -> str:
        name = self.edit.unique(f"{self.base}/{suffix}")
        self.edit.add_initializer(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def clamp_fill(self, tensor: str) -> str:
        """Finite mask values below -1e30 (HF's finfo.min fill) raised to -1e30, -inf kept.

        A row whose every key holds finfo.min is uniform in the chain and in Attention-23's
        reference, but onnxruntime's kernel zeroes a row whose maximum is the type's lowest
        value, and a kernel folding log2(e) into the scores overflows it to -inf (a NaN row).
        -1e30 still absorbs every score below 3.8e22 (s + -1e30 == -1e30), so rows with a kept
        key are unchanged and fully masked rows stay uniform.  Not for float16, whose lowest
        (-65504) is the only absorbing value it has."""
        floor = self.add("CastLike", [self.floats("fill_floor", -_ABSORBING), tensor])
        raised = self.add("Max", [tensor, floor])
        return self.add("Where", [self.add("IsInf", [tensor], detect_positive=0), tensor, raised])

    def attention(self, operands: Operands, mask: MaskPlan, *, widen: bool) -> str:
        """The Attention node in the importer's layout: K not transposed, float32 Q/K/V when
        `widen`, the mask of Q's type (or boolean) as [.., .., S, T]."""
        q, k, v = operands.q, operands.k, operands.v
        rank = self.edit.index.rank(q)
        if operands.k_transposed:
            k = self.add("Transpose", [k], perm=[*range(rank - 2), rank - 1, rank - 2])
        if widen:
            q, k, v = (self.add("Cast", [t], to=onnx.TensorProto.FLOAT) for t in (q, k, v))
        inputs = [q, k, v]
        if mask.tensor is not None:
            tensor = mask.tensor
            if mask.fill is not None and mask.fill != -math.inf:  # an absorbing fill: additive
                zero, blocked = self.floats("keep", 0.0), self.floats("blocked", mask.fill)
                tensor = self.add("Where", [tensor, zero, blocked])
            if mask.fill != -math.inf:  # additive: in Q's type, as IAttention takes it
                tensor = self.add("CastLike", [tensor, q])
                if self.edit.index.elem_type(q) != onnx.TensorProto.FLOAT16:
                    tensor = self.clamp_fill(tensor)
            if rank == 3:  # [N, S, T] or [S, T] against [N, 1, S, T]
                tensor = self.add("Unsqueeze", [tensor, self.ints("head_axis", [-3])])
            # IAttention (and onnxruntime's kernel) take a mask of [.., .., S, T], broadcast
            # over batch and heads only
            size = [self.add("Shape", [t], start=-2, end=-1) for t in (q, k)]
            target = self.add("Concat", [self.ints("ones", [1, 1]), *size], axis=0)
            inputs.append(self.add("Expand", [tensor, target]))
        heads = {"q_num_heads": 1, "kv_num_heads": 1} if rank == 3 else {}
        return self.add(
            "Attention", inputs, scale=float(operands.scale), is_causal=int(mask.causal), **heads
        )
