"""What every rewrite strategy is: a name, a docstring that is honest about proof, an apply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from graphfix.attention.match_types import AttentionMatch
from graphfix.graph.edit import GraphEdit


@dataclass(frozen=True)
class Outcome:
    """What a strategy did to one attention block."""

    rewritten: bool
    detail: str


class Strategy(Protocol):
    name: str
    proven: bool  # verified to stop Myelin's fusion (only the plugin, by construction)
    summary: str
    opset: int | None  # the default-domain opset its nodes need (None: any)

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome: ...
