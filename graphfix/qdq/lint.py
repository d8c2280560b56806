"""`inspect_qdq`: which conv/matmul FLOPs run quantized in TensorRT, and which rule stops the rest."""

from __future__ import annotations

import os
from collections import defaultdict

import onnx

from graphfix.attention.matcher import scan_graph
from graphfix.model_io import LoadedModel, load_model
from graphfix.qdq import rules
from graphfix.qdq.flops import node_flops
from graphfix.qdq.report import BlockCoverage, Coverage, Finding, NodeCoverage, QdqReport, Severity
from graphfix.qdq.rules import AttentionSite, LintContext
from graphfix.qdq.view import QdqView, block_of


def inspect_qdq(model: LoadedModel | onnx.ModelProto | str | os.PathLike[str]) -> QdqReport:
    """Lint a Q/DQ model's placement against TensorRT's rules and measure quantized FLOPs.

    Never modifies `model`.  Weights stored as external data are not loaded.
    """
    loaded = load_model(model, load_weights=False)
    view = QdqView(loaded.model, base_dir=loaded.base_dir)
    return lint_view(view)


def lint_view(view: QdqView, *, sites: tuple[AttentionSite, ...] | None = None) -> QdqReport:
    attention = attention_sites(view) if sites is None else sites
    ctx = LintContext(view, attention)
    findings: list[Finding] = []
    findings += rules.check_operands(ctx)
    findings += rules.check_attention(ctx)
    findings += rules.check_residual(ctx)
    findings += rules.check_alignment(ctx)
    findings += rules.check_concat(ctx)
    findings += rules.check_duplicates(ctx)
    split = list(rules.check_myelin_split(ctx))
    findings += split
    residual_qs = {
        view.label(view.pair_source(dq))
        for _, _, _, dq in rules.residual_adds(ctx)
        if dq is not None
    }
    findings += rules.check_reformat(ctx, skip={f.node for f in split} | residual_qs)
    nodes = _node_coverage(ctx, findings)
    quantizers = sum(1 for n in view.nodes if view.is_q(n) or view.is_dq(n))
    return QdqReport(
        findings=tuple(findings),
        nodes=nodes,
        coverage=_coverage(nodes),
        quantizers=quantizers,
        attention_blocks=len(attention),
    )


def attention_sites(view: QdqView) -> tuple[AttentionSite, ...]:
    """Attention chains as the matcher binds them in the graph `view` indexes (it reads the
    Q/DQ pairs on Q, K, V, the scores and the probabilities as steps of the chain), named as
    the view labels nodes."""
    return tuple(
        AttentionSite(
            qk=match.qk.name,
            pv=match.pv.name,
            softmax=match.softmax_node.name,
            chain=frozenset(n.name for n in match.score_path),
        )
        for match in scan_graph(view.index).matches
        if not match.location  # the lint reads the main graph's nodes
    )


def _node_coverage(ctx: LintContext, findings: list[Finding]) -> tuple[NodeCoverage, ...]:
    blocking: dict[str, list[str]] = defaultdict(list)
    for finding in findings:
        if finding.severity is Severity.FLOAT:
            blocking[finding.node].append(finding.rule)
    view = ctx.view
    result = []
    for node in ctx.compute:
        name = view.label(node)
        quantized = name in ctx.quantized
        ops = ctx.operands[name]
        precision = "float"
        if quantized and ops.activations and ops.activations[0].quantizer is not None:
            precision = ops.activations[0].quantizer.dtype
        result.append(
            NodeCoverage(
                node=name,
                op_type=node.op_type,
                block=block_of(name),
                flops=node_flops(view, node),
                quantized=quantized,
                precision=precision,
                blocking_rules=tuple(dict.fromkeys(blocking.get(name, ()))),
            )
        )
    return tuple(result)


def _coverage(nodes: tuple[NodeCoverage, ...]) -> Coverage:
    by_block: dict[str, list[NodeCoverage]] = defaultdict(list)
    for node in nodes:
        by_block[node.block].append(node)
    blocks = tuple(
        BlockCoverage(
            block=block,
            flops_quantized=sum(n.flops or 0 for n in members if n.quantized),
            flops_total=sum(n.flops or 0 for n in members),
            nodes=len(members),
            nodes_quantized=sum(1 for n in members if n.quantized),
        )
        for block, members in by_block.items()
    )
    return Coverage(
        flops_quantized=sum(b.flops_quantized for b in blocks),
        flops_total=sum(b.flops_total for b in blocks),
        nodes=len(nodes),
        nodes_quantized=sum(1 for n in nodes if n.quantized),
        nodes_unknown_flops=sum(1 for n in nodes if n.flops is None),
        blocks=blocks,
    )
