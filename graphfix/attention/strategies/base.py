"""What every rewrite strategy is: a name, a docstring that is honest about proof, an apply."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from graphfix.attention.match_types import AttentionMatch
from graphfix.graph.edit import GraphEdit


class FallbackKind(str, Enum):
    """Why a strategy could not express a block the way it meant to."""

    QUANTIZED = "quantized"  # Q/DQ on the scores or the probabilities
    ESCAPES = "escapes"  # a tensor inside the chain is read outside it, or is a graph output
    RETURNS_PROBABILITIES = "returns_probabilities"  # the probabilities are a graph output
    HEAD_MIX = "head_mix"  # talking heads: a projection across heads inside the chain
    RESHAPE = "reshape"  # a Reshape of the scores or probabilities the node cannot express
    MASK = "mask"  # masks and biases the node's one mask input cannot express exactly
    SCALE = "scale"  # a scale on the scores computed at run time
    SOFTCAP = "softcap"  # a softcap whose cap is not a constant, or two softcaps
    ORDER = "order"  # a scale or softcap applied after the mask
    SHIFT = "shift"  # a Sub before the Softmax that is not the row max
    SINK = "sink"  # an attention sink arranged so the node's sink key would not be exact
    OPERANDS = "operands"  # Q, K, V ranks, layouts or Einsum forms the node does not take
    TYPES = "types"  # Q, K, V element types mixed or unknown


@dataclass(frozen=True)
class Fallback:
    """A strategy fell back to a simpler one: why (`kind`, and `reason` for the user)."""

    kind: FallbackKind
    reason: str


@dataclass(frozen=True)
class Outcome:
    """What a strategy did to one attention block; `fallback` says why it did something
    simpler than it meant to (`detail` then describes what it did instead)."""

    rewritten: bool
    detail: str
    fallback: Fallback | None = None

    def describe(self) -> str:
        if self.fallback is None:
            return self.detail
        return f"fell back to {self.detail} ({self.fallback.kind.value}): {self.fallback.reason}"


class Strategy(Protocol):
    name: str
    proven: bool  # verified to stop Myelin's fusion (only the plugin, by construction)
    summary: str

    def apply(self, edit: GraphEdit, match: AttentionMatch) -> Outcome: ...
