"""Why a chain cannot become one GraphfixAttention node."""

from __future__ import annotations

from graphfix.attention.match_types import ChainStep


class Unsupported(Exception):
    """Why this chain cannot become one GraphfixAttention node."""


def node_of(step: ChainStep) -> str:
    return "/".join(n.name for n in step.nodes)


def shape_text(shape: tuple | None) -> str:
    return (
        "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    )
