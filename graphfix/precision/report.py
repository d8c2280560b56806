"""What a precision conversion did, as frozen records the CLI prints and `--json` serialises."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphfix.precision.mask_fill import MaskFill
from graphfix.precision.policy import Reason


@dataclass(frozen=True)
class IslandReason:
    """One reason a node of an island is float32: the rule and what triggered it."""

    reason: Reason
    detail: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Island:
    """A connected group of float32 nodes, the reasons it exists and the Casts it costs."""

    index: int
    nodes: tuple[str, ...]  # node names (or `<Op #position>` for unnamed nodes), in graph order
    reasons: tuple[IslandReason, ...]
    casts_in: int  # Casts from the target type up to float32 at the island's inputs
    casts_out: int  # Casts back down to the target type at its outputs

    @property
    def casts(self) -> int:
        return self.casts_in + self.casts_out


@dataclass(frozen=True)
class OutOfRange:
    """A constant whose values the target type cannot hold; its consumers stay float32."""

    tensor: str
    max_abs: float
    limit: float
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class PrecisionReport:
    to: str
    keep_io_types: bool
    islands: tuple[Island, ...]
    out_of_range: tuple[OutOfRange, ...]
    compute_nodes: int  # nodes doing float arithmetic in the result (graphfix.precision.census)
    compute_nodes_low: int  # of those, how many run in a 16-bit type
    casts_added: int  # every Cast the conversion inserted (islands, graph inputs and outputs)
    initializers_converted: int
    initializers_duplicated: int  # used in both precisions: a target-type copy was added
    attention_blocks: int
    attention_blocks_float32: tuple[int, ...]  # kept whole in float32
    attention_blocks_rewritten: tuple[int, ...]  # rewritten with `attention_strategy`
    attention_strategy: str | None
    norms: str  # what norm fusion did (or why it did not run)
    # float32 tensors computed from out-of-range constants (masks), clipped to the target's
    # finite range where they are cast down
    saturated: tuple[str, ...] = ()
    # attention mask constants whose float32-lowest fill was lowered to the target's lowest value
    # (graphfix.precision.mask_fill); not in `out_of_range`: their chains run in the target type
    mask_fills: tuple[MaskFill, ...] = ()

    @property
    def low_fraction(self) -> float:
        return self.compute_nodes_low / self.compute_nodes if self.compute_nodes else 1.0

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["low_fraction"] = round(self.low_fraction, 4)
        for island, record in zip(self.islands, data["islands"], strict=True):
            record["casts"] = island.casts
        return data

    def summary(self) -> str:
        lines = [
            f"{self.to}: {self.compute_nodes_low} of {self.compute_nodes} compute nodes in "
            f"{self.to} ({100 * self.low_fraction:.1f}%), {len(self.islands)} float32 "
            f"island(s), {self.casts_added} Cast(s) added, {self.initializers_converted} "
            f"initializer(s) converted"
            + (
                f" ({self.initializers_duplicated} duplicated: used in both precisions)"
                if self.initializers_duplicated
                else ""
            ),
            f"  norms: {self.norms}",
        ]
        if self.attention_blocks:
            rewritten = (
                f", rewritten with {self.attention_strategy}: {list(self.attention_blocks_rewritten)}"
                if self.attention_blocks_rewritten
                else ""
            )
            lines.append(
                f"  attention: {self.attention_blocks} block(s), float32 whole: "
                f"{list(self.attention_blocks_float32) or 'none'}{rewritten}"
            )
        for item in self.out_of_range:
            lines.append(
                f"  out of {self.to} range: {item.tensor} (max |x| {item.max_abs:.4g} > "
                f"{item.limit:.6g}); kept float32 in {', '.join(item.consumers[:4])}"
                + (", …" if len(item.consumers) > 4 else "")
            )
        for fill in self.mask_fills:
            lines.append(
                f"  mask fill lowered: {fill.tensor} ({fill.fill:.4g} → {fill.lowered_to:.6g}), "
                f"added to the scores of attention block(s) {list(fill.blocks)} by "
                f"{', '.join(fill.readers[:4])}" + (", …" if len(fill.readers) > 4 else "")
            )
        if self.saturated:
            lines.append(
                f"  saturating Casts (clipped to ±{_limit(self.to):.6g} before the Cast down, as "
                f"{self.to} exports write masks): {', '.join(self.saturated[:4])}"
                + (", …" if len(self.saturated) > 4 else "")
            )
        for island in self.islands:
            why = "; ".join(f"{r.reason.value}: {r.detail}" for r in island.reasons[:3])
            more = f" (+{len(island.reasons) - 3} more)" if len(island.reasons) > 3 else ""
            head = ", ".join(island.nodes[:3]) + (", …" if len(island.nodes) > 3 else "")
            lines.append(
                f"  island {island.index}: {len(island.nodes)} node(s) [{head}], "
                f"{island.casts} Cast(s): {why}{more}"
            )
        return "\n".join(lines)


def _limit(to: str) -> float:
    from graphfix.precision.weights import LIMITS

    return LIMITS[to]


@dataclass(frozen=True)
class PrecisionResult:
    """The converted model and the report of what was done to it.

    When the input kept its weights on disk, `model`'s initializers reference the converted data
    file written next to `source`: save it with `graphfix.save_model(result.model, path,
    source=result.source)`.
    """

    model: onnx.ModelProto
    report: PrecisionReport
    source: Path | None = None
