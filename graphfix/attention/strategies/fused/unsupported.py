"""Why a chain cannot become one GraphfixAttention node."""

from __future__ import annotations


class Unsupported(Exception):
    """Why this chain cannot become one GraphfixAttention node."""


def node_of(step: object) -> str:
    return getattr(step, "node", "") or "/".join(getattr(step, "nodes", ()))


def shape_text(shape: tuple | None) -> str:
    return (
        "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    )
