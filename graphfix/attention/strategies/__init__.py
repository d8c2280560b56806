"""The rewrite strategies, in one explicit table (nothing registers itself on import)."""

from __future__ import annotations

from graphfix.attention.strategies.base import Outcome, Strategy
from graphfix.attention.strategies.fp32_island import Fp32IslandStrategy
from graphfix.attention.strategies.fused_plugin import FusedPluginStrategy
from graphfix.attention.strategies.mark_output import MarkOutputStrategy
from graphfix.attention.strategies.max_subtract import MaxSubtractStrategy
from graphfix.attention.strategies.native_attention import NativeAttentionStrategy
from graphfix.attention.strategies.plugin import PluginStrategy
from graphfix.errors import GraphfixError

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        PluginStrategy(),
        FusedPluginStrategy(),
        MarkOutputStrategy(),
        MaxSubtractStrategy(),
        Fp32IslandStrategy(),
        NativeAttentionStrategy(),
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
