"""Replace native attention nodes of a model by their standard-op lowering, in place."""

from __future__ import annotations

from collections.abc import Collection

import onnx

from graphfix.attention.native.forms import NATIVE_OPS, NativeForm, is_native, read_form
from graphfix.attention.native.lowering import lower
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex


def lower_native_nodes(
    model: onnx.ModelProto, *, op_types: Collection[str] | None = None
) -> tuple[NativeForm, ...]:
    """Lower every native attention node of `model`'s main graph whose op type is in `op_types`
    (None: Attention, TRT_Attention, TRT_QuantizedAttention) in place; return their forms.

    Nodes of a form graphfix cannot lower (forms.NativeForm.unsupported) are left as they are
    and not returned; `lower` raises for them when asked directly.
    """
    wanted = set(NATIVE_OPS[:3] if op_types is None else op_types)
    index = GraphIndex(model)
    edit = GraphEdit(model, index)
    lowered = []
    for position, node in enumerate(model.graph.node):
        if not is_native(node) or node.op_type not in wanted:
            continue
        form = read_form(index, node)
        if form.unsupported is None:
            edit.replace(position, lower(edit, node, form))
            lowered.append(form)
    edit.commit()
    return tuple(lowered)


def native_forms(model: onnx.ModelProto) -> tuple[NativeForm, ...]:
    """Every native attention node of `model`'s main graph, read."""
    index = GraphIndex(model)
    return tuple(read_form(index, n) for n in index.graph.node if is_native(n))
