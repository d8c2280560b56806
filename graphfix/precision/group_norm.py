"""GroupNorm as torch exports it (legacy and dynamo alike):

    g = Reshape(x, [N|0, G, -1 | C·…/G])               x: [N, C, ...], C divisible by G
    g = InstanceNormalization(g, ones[G], zeros[G], ε)
    y = Reshape(g, Shape(x) | x's static shape | [N, C', ...])
    [y = Mul(y, γ)]  [y = Add(y, β)]                   γ, β: constants over the channel axis only

A last Reshape to another static [N, C', ...] of the same size is a flatten the dynamo exporter
folded in: the fused form Reshapes x to it first (grouping contiguous blocks is the same either
way).  GroupNormalization-21 takes γ and β per channel, so they become [C] initializers (18 took
them per group, and was deprecated for it).
"""

from __future__ import annotations

import numpy as np
import onnx

from graphfix.graph.index import GraphIndex
from graphfix.precision.norm_chain import check_private, other_input, sole_consumer
from graphfix.precision.norm_types import Affine, NormCandidate, NormKind


def find_group_norms(index: GraphIndex) -> list[NormCandidate]:
    """Every torch-style GroupNorm of the top-level graph, in graph order."""
    found = []
    for node in index.graph.node:
        if node.op_type == "InstanceNormalization" and node.domain in ("", "ai.onnx"):
            candidate = _match(index, node)
            if candidate is not None:
                found.append(candidate)
    return found


def _match(index: GraphIndex, norm: onnx.NodeProto) -> NormCandidate | None:
    split = index.producer_of(norm.input[0])
    merge = sole_consumer(index, norm.output[0], "Reshape")
    if split is None or split.op_type != "Reshape" or merge is None:
        return None
    x = split.input[0]
    nodes = [split, norm, merge]
    problems: list[str] = []
    shape = index.shape(x)
    merged, reshape_to = _merged_layout(index, merge, x, shape, nodes, problems)
    channels = merged[1] if merged is not None and len(merged) >= 3 else None
    groups = _groups(index, split, norm, shape, problems)
    if (
        not isinstance(channels, int)
        and merged is not None
        and len(merged) >= 3
        and groups
        and groups > 1
    ):
        channels = _channels_from_scale(index, merge.output[0], len(merged))
    if not isinstance(channels, int):
        problems.append(f"the channel count of {x} is not static")
    elif groups is not None and channels % groups:
        problems.append(f"{channels} channels do not split into {groups} groups")

    end = merge.output[0]
    scale = bias = None
    mul = sole_consumer(index, end, "Mul")
    if mul is not None and isinstance(channels, int):
        scale = _per_channel(index, other_input(mul, end), len(merged), channels)
        if scale is not None:
            nodes.append(mul)
            end = mul.output[0]
            add = sole_consumer(index, end, "Add")
            if add is not None:
                bias = _per_channel(index, other_input(add, end), len(merged), channels)
                if bias is not None:
                    nodes.append(add)
                    end = add.output[0]
    if not index.elem_type(x):
        problems.append(f"the element type of {x} is unknown")
    check_private(index, nodes, end, problems)
    epsilon = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
    return NormCandidate(
        kind=NormKind.GROUP_NORM,
        input=x,
        output=end,
        positions=tuple(index.position(n) for n in nodes),
        node_names=tuple(n.name for n in nodes),
        statistics=(norm.name,),
        epsilon=float(epsilon),
        num_groups=groups,
        channels=channels if isinstance(channels, int) else None,
        scale=scale,
        bias=bias,
        dtype=index.elem_type(x) or 0,
        reshape_to=reshape_to,
        problem=problems[0] if problems else None,
    )


def _merged_layout(
    index: GraphIndex,
    merge: onnx.NodeProto,
    x: str,
    shape: tuple[int | str | None, ...] | None,
    nodes: list[onnx.NodeProto],
    problems: list[str],
) -> tuple[tuple[int | str | None, ...] | None, str | None]:
    """The shape the norm's result takes, and the shape tensor x must be reshaped to first when
    that is not x's own: the dynamo exporter folds a following flatten into the last Reshape."""
    shape_node = index.producer_of(merge.input[1])
    if shape_node is not None and shape_node.op_type == "Shape" and list(shape_node.input) == [x]:
        if shape_node.attribute:
            problems.append(f"{shape_node.name or 'Shape'} takes part of the shape of {x}")
        elif all(u is merge for u in index.consumers_of(shape_node.output[0])):
            nodes.insert(2, shape_node)
        return shape, None
    value = index.constant_value(merge.input[1])
    target = None if value is None else tuple(int(d) for d in value.reshape(-1))
    static = shape is not None and all(isinstance(d, int) and d > 0 for d in shape)
    if static and target == tuple(shape):
        return shape, None
    if (
        static
        and target is not None
        and len(target) >= 3
        and all(d > 0 for d in target)
        and target[0] == shape[0]
        and int(np.prod(target)) == int(np.prod(shape))
        and not any(a.name == "allowzero" and a.i for a in merge.attribute)
    ):
        return target, merge.input[1]
    problems.append(f"{merge.name or 'Reshape'} does not restore the shape of {x}")
    return shape, None


def _groups(
    index: GraphIndex,
    split: onnx.NodeProto,
    norm: onnx.NodeProto,
    shape: tuple[int | str | None, ...] | None,
    problems: list[str],
) -> int | None:
    """G, when the Reshape makes [N, G, -1] and InstanceNormalization's affine is the identity."""
    target = index.constant_value(split.input[1])
    if (
        target is None
        or target.shape != (3,)
        or not _splits_groups([int(t) for t in target], shape)
    ):
        problems.append(f"{split.name or 'Reshape'} does not reshape to [N, groups, -1]")
        return None
    if int(target[0]) == 0 and any(a.name == "allowzero" and a.i for a in split.attribute):
        problems.append(f"{split.name or 'Reshape'} has allowzero=1: its 0 is a zero-sized dim")
        return None
    groups = int(target[1])
    ones, zeros = (index.constant_value(i) for i in norm.input[1:3])
    if ones is None or zeros is None or ones.shape != (groups,) or zeros.shape != (groups,):
        problems.append(
            f"{norm.name or 'InstanceNormalization'}'s scale and bias are not {groups} constants"
        )
    elif not (np.all(ones == 1) and np.all(zeros == 0)):
        problems.append(f"{norm.name or 'InstanceNormalization'} scales or shifts each group")
    return groups


def _splits_groups(target: list[int], shape: tuple[int | str | None, ...] | None) -> bool:
    """True when Reshape(x, target) is [N, G, C·spatial/G] (N as 0, or as x's static batch)."""
    batch, groups, rest = target
    if groups <= 0 or shape is None or len(shape) < 3:
        return False
    static = all(isinstance(d, int) for d in shape)
    batch_ok = batch == 0 or batch == shape[0] or (batch == -1 and static and rest != -1)
    rest_ok = rest == -1 or (static and rest * groups == int(np.prod(shape[1:])))
    return batch_ok and rest_ok


def _channels_from_scale(index: GraphIndex, merged: str, rank: int) -> int | None:
    """C read off the γ that scales the merged tensor, when shape inference lost x's dims: with
    more than one group, x's channel dim cannot be 1, so a [C, 1, …] γ that runs fixes it at C."""
    mul = sole_consumer(index, merged, "Mul")
    value = None if mul is None else index.constant_value(other_input(mul, merged))
    if value is None or value.ndim > rank:
        return None
    padded = (1,) * (rank - value.ndim) + value.shape
    return padded[1] if padded[1] > 1 else None


def _per_channel(index: GraphIndex, tensor: str, rank: int, channels: int) -> Affine | None:
    """`tensor` as a [C] scale/bias when it is a constant over the channel axis only."""
    value = index.constant_value(tensor)
    if value is None or value.ndim > rank:
        return None
    padded = (1,) * (rank - value.ndim) + value.shape
    if padded[0] != 1 or padded[1] not in (1, channels) or any(d != 1 for d in padded[2:]):
        return None
    flat = np.ascontiguousarray(np.broadcast_to(value.reshape(-1), (channels,)))
    return Affine(value=flat)
