"""`graphfix qdq inspect|fix`: lint Q/DQ placement for TensorRT and repair what can be repaired."""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from graphfix.cli.options import print_json
from graphfix.errors import CheckFailed
from graphfix.model_io import check_output_path, load_model, save_model
from graphfix.progress import step
from graphfix.qdq.report import Finding, QdqReport
from graphfix.qdq.rules import RULES_BY_ID

_EXAMPLES = 3  # findings shown per rule without --all


def _mflops(flops: int) -> str:
    return f"{flops / 1e6:,.1f}"


def coverage_lines(report: QdqReport) -> list[str]:
    c = report.coverage
    lines = [
        f"coverage: {100 * c.fraction:.1f}% of {_mflops(c.flops_total)} MFLOPs run quantized "
        f"({c.nodes_quantized}/{c.nodes} Conv/ConvTranspose/MatMul/Gemm nodes"
        + (f"; {c.nodes_unknown_flops} with unknown shapes" if c.nodes_unknown_flops else "")
        + ")"
    ]
    width = max([len(b.block) for b in c.blocks] + [5])
    lines.append(f"  {'block':<{width}}  quantized   MFLOPs  nodes")
    for b in c.blocks:
        lines.append(
            f"  {b.block:<{width}}  {100 * b.fraction:8.1f}%  {_mflops(b.flops_total):>7}  "
            f"{b.nodes_quantized:>2}/{b.nodes}"
        )
    return lines


def finding_lines(findings: tuple[Finding, ...], *, show_all: bool) -> list[str]:
    if not findings:
        return ["no findings"]
    by_rule: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_rule[finding.rule].append(finding)
    lines = [f"findings: {len(findings)}"]
    for rule_id, group in by_rule.items():
        rule = RULES_BY_ID[rule_id]
        fixable = sum(1 for f in group if f.fixable)
        lines.append(
            f"  {rule_id} ({rule.severity.value}, {len(group)}; {fixable} fixable by `qdq fix`): "
            f"{rule.summary}"
        )
        shown = group if show_all else group[:_EXAMPLES]
        for finding in shown:
            lines.append(f"    {finding.node}: {finding.detail}")
        if len(group) > len(shown):
            lines.append(f"    … {len(group) - len(shown)} more (--all lists every one)")
    return lines


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graphfix.qdq.lint import inspect_qdq

    if args.plot:  # an unusable folder or a missing matplotlib fails before the lint runs
        from graphfix.validation.plot import prepare_plot_folder

        prepare_plot_folder(args.plot)
    report = inspect_qdq(args.model)
    plot = None
    if args.plot:
        from graphfix.qdq.plot import plot_coverage

        plot = plot_coverage(report, args.plot)
    if args.json:
        print_json(report, plot=plot)
    else:
        print(
            f"{args.model}: {report.coverage.nodes} compute nodes, {report.quantizers} Q/DQ "
            f"nodes, {report.attention_blocks} attention blocks"
        )
        print("\n".join(coverage_lines(report)))
        print("\n".join(finding_lines(report.findings, show_all=args.all)))
        if plot is not None:
            print(f"plot: {plot}")
    if args.fail_on_findings and report.findings:
        raise CheckFailed(f"{len(report.findings)} Q/DQ findings (--fail-on-findings)")
    return 0


def _cmd_fix(args: argparse.Namespace) -> int:
    from graphfix.qdq.fix import describe_error, fix_qdq

    source = Path(args.model)
    loaded = load_model(source, load_weights=False)
    check_output_path(loaded.model, args.output, source=loaded.path, overwrite=args.overwrite)
    result = fix_qdq(loaded.path, reference=args.reference, max_trials=args.max_trials)
    report = result.report
    saved = None
    if report.changes or args.always_write:
        step(f"writing {args.output}")
        saved = save_model(result.model, args.output, source=loaded.path, overwrite=args.overwrite)
    if args.json:
        print_json(report, saved=None if saved is None else saved.path)
    else:
        print(f"{len(report.changes)} changes")
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for change in report.changes:
            counts[(change.rule, change.action)] += 1
        for (rule, action), n in counts.items():
            print(f"  {rule}: {action} ×{n}")
        if args.all:
            for change in report.changes:
                print(f"    {change.node}: {change.detail}")
        before, after = report.before.coverage, report.after.coverage
        print(
            f"coverage: {100 * before.fraction:.1f}% → {100 * after.fraction:.1f}% of "
            f"{_mflops(after.flops_total)} MFLOPs"
        )
        if report.refused:
            print(
                f"left by the error guard ({len(report.refused)} fixable changes would have made "
                "the error against the float model worse):"
            )
            for change in report.refused if args.all else report.refused[:_EXAMPLES]:
                print(f"  {change.rule}: {change.node}")
            if not args.all and len(report.refused) > _EXAMPLES:
                print(f"  … {len(report.refused) - _EXAMPLES} more (--all lists every one)")
        print(f"left ({len(report.unfixed)}):")
        print("\n".join(finding_lines(report.unfixed, show_all=args.all)[1:] or ["  nothing"]))
        for note in report.notes:
            print(f"note: {note}")
        if report.error is not None:
            print(describe_error(report.error))
        else:
            print("error against the float model not measured (pass --reference FLOAT.onnx)")
        print(
            saved.describe()
            if saved is not None
            else f"nothing to change in {source}; wrote nothing (pass --always-write to write "
            "anyway)"
        )
    if report.error is not None and not report.error.passed:
        raise CheckFailed(describe_error(report.error))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `qdq inspect` and `qdq fix` to the graphfix command line."""
    qdq = subparsers.add_parser(
        "qdq", help="lint Q/DQ placement for TensorRT INT8/FP8 and repair it"
    )
    actions = qdq.add_subparsers(dest="qdq_command", required=True)

    inspect = actions.add_parser(
        "inspect",
        help="which Conv/MatMul FLOPs run quantized, and which rule keeps the rest in float",
    )
    inspect.add_argument("model", help="path to a Q/DQ .onnx file")
    inspect.add_argument("--json", action="store_true", help="print one JSON document")
    inspect.add_argument("--plot", metavar="DIR", help="write a per-block coverage bar chart PNG")
    inspect.add_argument("--all", action="store_true", help="list every finding")
    inspect.add_argument(
        "--fail-on-findings", action="store_true", help="exit 1 when there is any finding"
    )
    inspect.set_defaults(func=_cmd_inspect)

    fix = actions.add_parser("fix", help="move/merge/remove Q/DQ to the placement TensorRT fuses")
    fix.add_argument("model", help="path to a Q/DQ .onnx file")
    fix.add_argument("-o", "--output", required=True, help="where to write the fixed .onnx")
    fix.add_argument(
        "--reference",
        metavar="FLOAT.onnx",
        help="the float model: keep only changes that leave the error against it no worse",
    )
    fix.add_argument(
        "--max-trials",
        type=int,
        default=None,
        help="error evaluations the --reference guard may spend (default 48)",
    )
    fix.add_argument("--overwrite", action="store_true", default=None, help="replace OUT")
    fix.add_argument(
        "--always-write",
        action="store_true",
        help="write the model even when nothing was changed",
    )
    fix.add_argument("--all", action="store_true", help="list every change and what is left")
    fix.add_argument("--json", action="store_true", help="print the report as JSON")
    fix.set_defaults(func=_cmd_fix)
