"""Rewrite every matched attention chain (or the selected ones) with one strategy."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import onnx

from graphfix.attention.match_types import AttentionMatch
from graphfix.attention.matcher import graph_scopes, scan_graph
from graphfix.attention.native.decompose import (
    DirectRewrite,
    NativeRewrite,
    rewrite_native_nodes,
)
from graphfix.attention.native.to_iattention import to_iattention
from graphfix.attention.native.to_plugin import TO_PLUGIN
from graphfix.attention.report import BlockOutcome, FixReport, FixResult
from graphfix.attention.strategies import Outcome, Strategy, get_strategy
from graphfix.attention.strategies.fused_plugin import FusedPluginStrategy
from graphfix.attention.strategies.native_attention import (
    ACCUMULATE_CHOICES,
    NativeAttentionStrategy,
)
from graphfix.errors import SelectionError, UsageError
from graphfix.graph.edit import GraphEdit
from graphfix.graph.index import GraphIndex
from graphfix.graph.value_info import reconcile_value_info
from graphfix.model_io import LoadedModel, load_model
from graphfix.plugins.spec import PLUGIN_DOMAIN, ensure_plugin_opset
from graphfix.precision.opset_upgrade import default_opset, upgrade_opset
from graphfix.selectors import parse_selectors, select_nodes

Selector = int | str | re.Pattern[str]


def fix_attention(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    strategy: str | None = None,
    select: Sequence[Selector] | None = None,
    decompose_attention_ops: bool | None = None,
    accumulate: str | None = None,
) -> FixResult:
    """Rewrite attention chains in a copy of `model`; return it with a report.

    `model` may be a path (or a LoadedModel): its weights are then NOT loaded, and initializers keep their external
    data references (relative to the input's folder) — save it with `graphfix.save_model`.
    `select` picks blocks by index, exact Softmax node name, or regex (str or compiled) matched
    against the Softmax node name; None rewrites every block.
    `decompose_attention_ops`: native attention nodes (ONNX Attention, TRT_Attention,
    TRT_QuantizedAttention) are lowered to the explicit chain first; with fused_plugin, each the
    GraphfixAttention contract expresses becomes one such node directly instead, and with
    native_attention an Attention node IAttention takes is kept (Casts around it to accumulate).
    `accumulate="float32"` (native_attention only) casts float16/bfloat16 Q, K and V to
    float32 around each Attention node.  A strategy whose nodes need a newer opset (Attention:
    23) raises the model's opset first where no op changes meaning (precision/opset_upgrade.py).
    """
    loaded = load_model(model, load_weights=False)
    result = onnx.ModelProto()
    result.CopyFrom(loaded.model)
    chosen_strategy = _strategy(strategy, accumulate)
    direct = _direct_rewrite(chosen_strategy, accumulate)
    native = (
        rewrite_native_nodes(result, direct=direct)
        if decompose_attention_ops
        else NativeRewrite(())
    )
    result, blocked = _raise_opset(result, chosen_strategy.opset)
    index = GraphIndex(result, base_dir=loaded.base_dir)
    scopes = graph_scopes(index)
    scan = scan_graph(index, scopes=scopes)
    chosen = _select(result, scan.matches, select)
    outcomes: dict[int, BlockOutcome] = {}
    # Subgraphs first (reverse depth-first order): each is edited on its own copy and written
    # back into its parent before the parent's edit copies the parent's nodes.
    for location, target, scope in reversed(scopes):
        edit = GraphEdit(scope.model, scope)
        for match in scan.matches:
            if match.location != location:
                continue
            if match.index in chosen and blocked:
                outcome = Outcome(False, blocked)
            elif match.index in chosen:
                outcome = chosen_strategy.apply(edit, match)
            else:
                outcome = Outcome(False, "not selected")
            detail = outcome.describe()
            outcomes[match.index] = BlockOutcome(
                index=match.index,
                softmax=match.softmax_node.name,
                kind=match.kind,
                rewritten=outcome.rewritten,
                detail=detail if not location else f"{detail} (inside {location})",
                fallback=outcome.fallback,
            )
        edit.commit()
        if target is not None:
            target.CopyFrom(scope.model.graph)
    if any(_has_plugin_nodes(scope.model.graph) for _, _, scope in scopes):
        ensure_plugin_opset(result)
    reconcile_value_info(result, base_dir=loaded.base_dir)
    blocks = [outcomes[m.index] for m in scan.matches]
    report = FixReport(
        strategy=chosen_strategy.name,
        strategy_proven=chosen_strategy.proven,
        blocks=tuple(blocks),
        not_attention=scan.skipped,
        attention_ops=scan.attention_ops,
        decomposed_attention_ops=len(native.lowered),
        direct_attention_ops=len(native.direct),
        direct_target="" if direct is None else direct.target,
        native_notes=native.why_lowered,
        native_kept=tuple(form.node for form in native.kept),
        matches=scan.matches,
    )
    return FixResult(model=result, report=report)


def _strategy(name: str | None, accumulate: str | None) -> Strategy:
    chosen = get_strategy(name)
    if accumulate is None:
        return chosen
    if chosen.name != NativeAttentionStrategy.name or accumulate not in ACCUMULATE_CHOICES:
        raise UsageError(
            f"accumulate={accumulate!r} with strategy {chosen.name!r}: only strategy "
            f"{NativeAttentionStrategy.name!r} takes it, with {', '.join(ACCUMULATE_CHOICES)}; "
            f"pass --strategy {NativeAttentionStrategy.name} --accumulate float32"
        )
    return NativeAttentionStrategy(accumulate=accumulate)


def _direct_rewrite(strategy: Strategy, accumulate: str | None) -> DirectRewrite | None:
    """What the strategy makes of a native node without decomposing it (None: decompose)."""
    if strategy.name == FusedPluginStrategy.name:
        return TO_PLUGIN
    if strategy.name == NativeAttentionStrategy.name:
        return to_iattention(accumulate=accumulate is not None)
    return None


def _raise_opset(model: onnx.ModelProto, opset: int | None) -> tuple[onnx.ModelProto, str]:
    """`model` at `opset` or newer, or unchanged with why no block can be rewritten."""
    if opset is None or default_opset(model) >= opset:
        return model, ""
    upgrade = upgrade_opset(model, opset)
    if upgrade.model is None:
        return model, f"left as is: the model cannot move to opset {opset}: {upgrade.reason}"
    return upgrade.model, ""


def _has_plugin_nodes(graph: onnx.GraphProto) -> bool:
    return any(node.domain == PLUGIN_DOMAIN for node in graph.node)


def break_attention_fusion(
    model: onnx.ModelProto | str | os.PathLike[str],
    *,
    strategy: str | None = None,
    select: Sequence[Selector] | None = None,
    decompose_attention_ops: bool | None = None,
    accumulate: str | None = None,
) -> onnx.ModelProto:
    """A new ModelProto whose attention chains TensorRT cannot fuse (the input is not mutated).

    Drop-in form of `fix_attention`: a path is loaded with its weights, so the result is
    self-contained.  Use `fix_attention` for the report of what was done.
    """
    source = load_model(model, load_weights=True).model
    return fix_attention(
        source,
        strategy=strategy,
        select=select,
        decompose_attention_ops=decompose_attention_ops,
        accumulate=accumulate,
    ).model


def _select(
    model: onnx.ModelProto,
    matches: Sequence[AttentionMatch],
    select: Sequence[Selector] | Selector | None,
) -> set[int]:
    """Block indices picked by `select`, in graphfix's one selector language (selectors.py):
    an int is a block index, a compiled regex is `re:`, text is any selector form.  A selector
    that picks nodes but no attention block's Softmax is an error, like one that picks nothing."""
    if select is None:
        return {m.index for m in matches}
    if isinstance(select, (str, int, re.Pattern)):
        select = [select]
    if not select or any(isinstance(s, str) and not s.strip() for s in select):
        raise SelectionError(
            f"select {list(select)!r} is empty and would pick nothing; give block indices as "
            "`graphfix inspect` numbers them, Softmax node names or regexes (e.g. --select 0,2), "
            "or leave it out (None) to rewrite every block"
        )
    texts: list[str] = []
    for entry in select:
        if isinstance(entry, bool) or not isinstance(entry, (int, str, re.Pattern)):
            raise SelectionError(
                f"select entry {entry!r} is not a block index, a selector text or a regex"
            )
        if isinstance(entry, int):
            if entry < 0:
                raise SelectionError(
                    f"select entry {entry} is not a block index; blocks are numbered "
                    f"0..{len(matches) - 1} (see `graphfix inspect`)"
                )
            texts.append(str(entry))
        elif isinstance(entry, re.Pattern):
            texts.append(f"re:{entry.pattern}")
        else:
            texts.append(entry)
    selection = select_nodes(model, parse_selectors(texts), blocks=matches)
    softmax_at = {m.softmax_node.position: m.index for m in matches if not m.location}
    for hit in selection.hits:
        if not hit.blocks and not any(p in softmax_at for p in hit.positions):
            names = ", ".join(m.softmax_node.name for m in matches[:6])
            raise SelectionError(
                f"select entry {hit.selector.text!r} matches no attention block (it picks "
                f"{len(hit.positions)} node(s), none an attention Softmax); blocks are indexed "
                f"0..{len(matches) - 1} and named {names}{', …' if len(matches) > 6 else ''} "
                "(see `graphfix inspect`)"
            )
    # Positions name main-graph nodes; a block inside an If/Loop body is picked by index only.
    picked = {b for hit in selection.hits for b in hit.blocks}
    return picked | {softmax_at[p] for p in selection.positions if p in softmax_at}
