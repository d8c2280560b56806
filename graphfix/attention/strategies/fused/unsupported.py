"""Why a chain cannot become one GraphfixAttention node."""

from __future__ import annotations

from graphfix.attention.match_types import ChainStep
from graphfix.attention.strategies.base import FallbackKind


class Unsupported(Exception):
    """Why this chain cannot become one GraphfixAttention node: `kind`, and the text."""

    def __init__(self, kind: FallbackKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def node_of(step: ChainStep) -> str:
    return "/".join(n.name for n in step.nodes)


def shape_text(shape: tuple | None) -> str:
    return (
        "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    )
