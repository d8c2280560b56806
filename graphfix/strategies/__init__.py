"""The rewrite strategies, in one explicit table (nothing registers itself on import)."""

from __future__ import annotations

from graphfix.errors import GraphfixError
from graphfix.strategies.base import Outcome, Strategy
from graphfix.strategies.fp32_island import Fp32IslandStrategy
from graphfix.strategies.fused_plugin import FusedPluginStrategy
from graphfix.strategies.mark_output import MarkOutputStrategy
from graphfix.strategies.max_subtract import MaxSubtractStrategy
from graphfix.strategies.plugin import PluginStrategy

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        PluginStrategy(),
        FusedPluginStrategy(),
        MarkOutputStrategy(),
        MaxSubtractStrategy(),
        Fp32IslandStrategy(),
    )
}
DEFAULT_STRATEGY = "plugin"


def get_strategy(name: str | None) -> Strategy:
    key = DEFAULT_STRATEGY if name is None else name
    if key not in STRATEGIES:
        raise GraphfixError(
            f"unknown strategy {key!r}; choose one of: {', '.join(STRATEGIES)} "
            f"(default {DEFAULT_STRATEGY!r})"
        )
    return STRATEGIES[key]


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "Outcome", "Strategy", "get_strategy"]
