"""What a fix did, as frozen records the CLI prints and `--json` serialises."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import onnx

from graphfix.attention.match_types import (
    AttentionKind,
    AttentionMatch,
    AttentionOpNode,
    SkippedSoftmax,
)
from graphfix.attention.strategies.base import Fallback
from graphfix.jsonable import plain


@dataclass(frozen=True)
class BlockOutcome:
    """One attention block: rewritten, or skipped and why; `fallback` when the strategy did
    something simpler than it meant to (its kind and reason; `detail` says it too)."""

    index: int
    softmax: str
    kind: AttentionKind
    rewritten: bool
    detail: str
    fallback: Fallback | None = None


@dataclass(frozen=True)
class FixReport:
    strategy: str
    strategy_proven: bool
    blocks: tuple[BlockOutcome, ...]
    not_attention: tuple[SkippedSoftmax, ...]
    attention_ops: tuple[AttentionOpNode, ...]
    decomposed_attention_ops: int
    matches: tuple[AttentionMatch, ...]  # as found before the rewrite (bound to that graph)

    @property
    def rewritten(self) -> int:
        return sum(b.rewritten for b in self.blocks)

    def to_dict(self) -> dict:
        data = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        data["rewritten"] = self.rewritten
        return data

    def summary(self) -> str:
        lines = [
            f"strategy {self.strategy}: rewrote {self.rewritten} of {len(self.matches)} attention "
            f"block(s)"
            + ("" if self.strategy_proven else " (heuristic: not verifiable without TensorRT)")
        ]
        for b in self.blocks:
            mark = "rewritten" if b.rewritten else "skipped  "
            lines.append(f"  [{b.index}] {mark} {b.softmax} ({b.kind.value}): {b.detail}")
        if self.decomposed_attention_ops:
            lines.append(f"  decomposed {self.decomposed_attention_ops} ONNX Attention op(s)")
        for op in self.attention_ops:
            lines.append(
                f"  ONNX Attention op {op.node} left as is: pass --decompose-attention "
                "(decompose_attention_ops=True) to rewrite it"
            )
        for s in self.not_attention:
            lines.append(f"  left alone: {s.softmax}: {s.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class FixResult:
    """The rewritten model and the report of what was done to it."""

    model: onnx.ModelProto
    report: FixReport
