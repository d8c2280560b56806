"""The attention-block table that `graphfix inspect` and `graphfix demo` print."""

from __future__ import annotations

import re
from collections.abc import Sequence

from graphfix.attention.match_types import AttentionMatch, AttentionOpNode


def match_table(matches: Sequence[AttentionMatch]) -> str:
    header = ("#", "softmax", "kind", "heads", "q_len", "kv_len", "scale", "mask", "dtype")
    rows = [header]
    for m in matches:
        scale = (
            "none"
            if m.scale.form == "none"
            else (
                f"{m.scale.value:.6g} ({m.scale.form})"
                if m.scale.value is not None
                else f"computed ({m.scale.form})"
            )
        )
        mask = "/".join(dict.fromkeys(n.name.split("/")[-1] for n in m.mask_nodes)) or "-"
        rows.append(
            (
                str(m.index),
                (f"{m.location}/" if m.location else "") + m.softmax_node.name,
                m.kind.value,
                *(_dim(x) for x in (m.heads, m.q_len, m.kv_len)),
                scale,
                mask if len(mask) < 40 else mask[:37] + "...",
                m.dtype + (" (fp32 island)" if m.cast_island else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# onnx's shape inference names dimensions it cannot relate to any input `unk__<n>`.
_PLACEHOLDER = re.compile(r"unk__\d+")


def _dim(value: int | str | None) -> str:
    """A size, a model's own symbolic name for one (`seq`), or `?` when nothing names it."""
    if value is None or (isinstance(value, str) and _PLACEHOLDER.fullmatch(value)):
        return "?"
    return str(value)


def native_op_line(op: AttentionOpNode) -> str:
    """One native attention node as `inspect` lists it: its op, attributes and what fix does."""
    label = "ONNX Attention" if op.op_type == "Attention" else op.op_type
    written = ", ".join(f"{name}={value}" for name, value in op.attributes) or "no attributes"
    mask = f", mask {op.mask}" if op.mask else ""
    mask += "".join(f", output {extra}" for extra in op.extra_outputs)
    action = (
        f"left as is: {op.unsupported}"
        if op.unsupported
        else "already fused; `graphfix fix --decompose-attention` rewrites it"
    )
    return f"{label} op {op.node} ({written}{mask}): {action}"
