"""`fix_qdq`: move, merge or remove Q/DQ nodes to the placement TensorRT fuses.

Only edits that are exact, or that can only lower the error against the float model, are made:

- merge: Q (or DQ) nodes on one tensor with identical parameters become one (exact);
- residual: a Q/DQ pair between a Conv/GEMM and its residual Add is bypassed for the Add (the
  Add reads the float value; the pair stays for any other consumer);
- myelin-split / qdq-reformat: a pair that splits an attention or norm fusion, or that feeds only
  float ops, is bypassed for all its consumers (they read the float value);
- concat: the inputs of a Concat whose output is read only by one Q's parameters are quantized
  with that Q's parameters: Q(concat(DQ(Q(x)))) becomes Q(x), one rounding instead of two.

Everything else (missing Q/DQ, per-tensor or wrongly-axed weights, channel alignment) needs a
calibration or re-quantization and is reported as left, with the reason.

The graph is edited as raw protobuf on a copy (bypassing a pair is renaming a consumer's input),
not through onnx-graphsurgeon: the error guard copies the model once per trial, and on the
5,474-node SVD UNet a graphsurgeon import/cleanup/export costs 0.43 s of CPU against 0.004 s for
a protobuf copy (measured; up to 48 trials per fix).  GraphIndex, the shared view, is rebuilt
between passes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from graphfix.errors import UsageError
from graphfix.graph.value_info import reconcile_value_info
from graphfix.model_io import LoadedModel, load_model
from graphfix.progress import step as report_step
from graphfix.qdq import rules
from graphfix.qdq.lint import attention_sites, lint_view
from graphfix.qdq.report import ErrorCheck, QdqChange, QdqFixReport, QdqFixResult
from graphfix.qdq.rules import LintContext
from graphfix.qdq.view import QdqView

Allow = Callable[[str], bool]
_MAX_ROUNDS = 16  # rounds of all passes; every quantized model of the corpus settles in one
Pass = Callable[[QdqView, LintContext, Allow], list[QdqChange]]


def _everything(_: str) -> bool:
    return True


def fix_qdq(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    reference: LoadedModel | onnx.ModelProto | str | os.PathLike[str] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    max_trials: int | None = None,
) -> QdqFixResult:
    """Repair the Q/DQ placement of `model` where that is exact; report every change.

    Each change is exact for the tensor it touches, but removing one rounding can still raise
    the output error where roundings happened to cancel.  With `reference` (the float model)
    the fix is guarded: both are run with onnxruntime on the same inputs (`feeds`, else two
    seeded random samples), and a pass whose changes would make the error (max or mean |Δ|)
    worse than `model`'s own is split in halves until only the changes that keep it no worse
    remain (at most `max_trials` evaluations, default 48; the rest are left and said so).
    Never modifies the caller's model.
    """
    if max_trials is not None and (isinstance(max_trials, bool) or max_trials < 1):
        raise UsageError(f"--max-trials (max_trials) must be an integer >= 1, got {max_trials!r}")
    if max_trials is not None and reference is None:
        raise UsageError(
            "--max-trials (max_trials) bounds the error guard, which needs --reference "
            "FLOAT.onnx (reference=...); pass it too, or drop --max-trials"
        )
    loaded = load_model(model, load_weights=True)
    work = onnx.ModelProto()
    work.CopyFrom(loaded.model)
    view = QdqView(work, base_dir=loaded.base_dir)
    sites = attention_sites(view)
    before = lint_view(view, sites=sites)
    guard = None
    if reference is not None:
        from graphfix.qdq.error import ErrorGuard

        guard = ErrorGuard(loaded.model, reference, feeds=feeds, max_trials=max_trials or 48)
    changes: list[QdqChange] = []
    refused: list[QdqChange] = []
    notes: list[str] = []
    current = view.index.model
    for round_number in range(1, _MAX_ROUNDS + 1):
        # One change can enable another (a merge makes a pair bypassable): the passes repeat
        # until a round changes nothing, so running the fix again would change nothing.
        made_in_round: list[QdqChange] = []
        left_in_round: list[QdqChange] = []
        for step in PASSES:
            report_step(f"Q/DQ fix, round {round_number}: {step.__name__.replace('_', ' ')}")
            if guard is None:
                made, current = _apply(current, step, sites, _everything, loaded.base_dir)
            else:
                made, current, left = _guarded(current, step, sites, guard, loaded.base_dir)
                left_in_round += left
            made_in_round += made
        changes += made_in_round
        refused = left_in_round  # what the last round's guard left (earlier refusals recur)
        if not made_in_round:
            break
        if round_number == _MAX_ROUNDS:
            notes.append(
                f"stopped after {_MAX_ROUNDS} rounds of passes that each still changed the "
                "model; run `graphfix qdq fix` on the result to continue"
            )
            break
        view = QdqView(current, base_dir=loaded.base_dir)  # shapes for the tensors just made
        sites = attention_sites(view)
        current = view.index.model
    fixed = current
    del fixed.graph.value_info[:]  # inferred for the lint; stale names would only mislead
    reconcile_value_info(fixed, base_dir=loaded.base_dir)
    after = lint_view(QdqView(fixed, base_dir=loaded.base_dir), sites=sites)
    error = None
    if guard is not None:
        error = guard.check(fixed)
        notes.append(f"{guard.trials} error evaluations with onnxruntime")
        if guard.low_precision is not None:
            notes.append(f"error evaluations: {guard.low_precision}")
    if refused:
        notes.append(
            f"{len(refused)} fixable changes left as they were: alone or with their group they made "
            "the error against the float model worse than the input's (or the trial budget ran out)"
        )
    report = QdqFixReport(
        changes=tuple(changes),
        before=before,
        after=after,
        error=error,
        notes=tuple(notes),
        refused=tuple(refused),
    )
    return QdqFixResult(model=fixed, report=report)


def _apply(
    model: onnx.ModelProto, step: Pass, sites, allow: Allow, base_dir
) -> tuple[list[QdqChange], onnx.ModelProto]:
    """`step` applied to a copy of `model` (only to the nodes `allow` admits), again until it
    changes nothing: removing a reformat pair can leave the pair before it feeding only float
    ops, which the next application removes (eight deep in the SVD UNet)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    made: list[QdqChange] = []
    while True:
        view = QdqView(copy, base_dir=base_dir, infer_shapes=False)
        again = step(view, LintContext(view, sites), allow)
        if not again:
            return made, copy
        _remove_dead_quantizers(copy)
        made += again


def _guarded(model, step: Pass, sites, guard, base_dir):
    """Apply `step`'s changes that keep the error no worse than the input model's, by halving.

    Returns (changes made, the model, proposed changes left out)."""
    proposed, candidate = _apply(model, step, sites, _everything, base_dir)
    if not proposed:
        return [], model, []
    if guard.acceptable(candidate):
        return proposed, candidate, []
    by_node = {c.node: c for c in proposed}
    accepted: list[QdqChange] = []
    refused: list[str] = []
    pending = [[c.node for c in proposed]]
    while pending:
        group = pending.pop(0)
        if guard.exhausted:
            refused += group
            continue
        made, trial = _apply(model, step, sites, set(group).__contains__, base_dir)
        if made and guard.acceptable(trial):
            accepted += made
            model = trial
        elif len(group) > 1:
            middle = len(group) // 2
            pending[:0] = [group[:middle], group[middle:]]
        else:
            refused += group
    return accepted, model, [by_node[name] for name in refused if name in by_node]


# --- passes ----------------------------------------------------------------------------------


def merge_duplicates(
    view: QdqView, ctx: LintContext, allow: Allow = _everything
) -> list[QdqChange]:
    """Q nodes reading one tensor with identical parameters, and DQs reading one Q, become one."""
    changes: list[QdqChange] = []
    for op in ("QuantizeLinear", "DequantizeLinear"):
        groups: dict[str, list[onnx.NodeProto]] = {}
        for node in view.nodes:
            if node.op_type == op and (view.is_q(node) or view.is_dq(node)):
                groups.setdefault(node.input[0], []).append(node)
        for nodes in groups.values():
            kept: list[onnx.NodeProto] = []
            for node in nodes:
                twin = next(
                    (k for k in kept if view.quantizer(k).same_params(view.quantizer(node))), None
                )
                if twin is None or not allow(view.label(node)):
                    kept.append(node)
                    continue
                _rename_input(view, node.output[0], twin.output[0])
                changes.append(
                    QdqChange(
                        "duplicate-quantizer",
                        "merge",
                        view.label(node),
                        f"same tensor and parameters as {view.label(twin)}; its consumers now "
                        f"read {view.label(twin)} (exact)",
                    )
                )
    return changes


def residual_branch(view: QdqView, ctx: LintContext, allow: Allow = _everything) -> list[QdqChange]:
    changes = []
    for add, position, compute, dq in rules.residual_adds(ctx):
        if dq is None or view.label(compute) not in ctx.quantized:
            continue
        q = view.pair_source(dq)
        if not allow(view.label(q)):
            continue
        add.input[position] = q.input[0]
        changes.append(
            QdqChange(
                "residual-qdq-on-conv-branch",
                "bypass",
                view.label(q),
                f"residual Add '{view.label(add)}' now reads {compute.op_type} "
                f"'{view.label(compute)}' directly (exact); the pair stays for other consumers",
            )
        )
    return changes


def myelin_split(view: QdqView, ctx: LintContext, allow: Allow = _everything) -> list[QdqChange]:
    changes = []
    for q, dq in list(rules.activation_pairs(view)):
        reason = rules.myelin_split_reason(ctx, q)
        if reason and allow(view.label(q)) and _bypass(view, q, dq):
            changes.append(
                QdqChange("myelin-split", "remove", view.label(q), f"pair {reason} removed (exact)")
            )
    return changes


def concat_scales(view: QdqView, ctx: LintContext, allow: Allow = _everything) -> list[QdqChange]:
    changes = []
    graph = view.index.model.graph
    for concat, dqs, differ in list(rules.concat_sites(ctx)):
        target = rules.concat_target(view, concat) if differ else None
        if target is None or not all(view.pair_source(d) is not None for d in dqs):
            continue
        wanted = view.quantizer(target)
        for dq in dqs:
            if view.quantizer(dq).same_params(wanted) or not allow(view.label(dq)):
                continue
            source = view.pair_source(dq).input[0]
            q_out = f"{source}_concat_q"
            dq_out = f"{source}_concat_dq"
            params = list(target.input[1:])
            new_q = onnx.helper.make_node(
                "QuantizeLinear", [source, *params], [q_out], name=f"{view.label(dq)}_requant_Q"
            )
            new_q.attribute.extend(a for a in target.attribute)
            new_dq = onnx.helper.make_node(
                "DequantizeLinear", [q_out, *params], [dq_out], name=f"{view.label(dq)}_requant_DQ"
            )
            for i, name in enumerate(concat.input):
                if name == dq.output[0]:
                    concat.input[i] = dq_out
            position = list(graph.node).index(concat)
            graph.node.insert(position, new_dq)
            graph.node.insert(position, new_q)
            changes.append(
                QdqChange(
                    "concat-scale-mismatch",
                    "requantize",
                    view.label(dq),
                    f"input of Concat '{view.label(concat)}' now quantized with the parameters of "
                    f"{view.label(target)} ({wanted.describe()}); exact or better: one rounding "
                    "onto the grid the Concat's output is quantized to anyway",
                )
            )
    return changes


def reformat_only(view: QdqView, ctx: LintContext, allow: Allow = _everything) -> list[QdqChange]:
    changes = []
    for q, dq in list(rules.activation_pairs(view)):
        if not allow(view.label(q)) or rules.quantizes_compute_output(ctx, q):
            continue
        used, float_ops = rules.pair_use(ctx, dq)
        if not used and _bypass(view, q, dq):
            changes.append(
                QdqChange(
                    "qdq-reformat",
                    "remove",
                    view.label(q),
                    f"pair fed only float ops ({', '.join(float_ops)}); removed (exact)",
                )
            )
    return changes


PASSES: tuple[Pass, ...] = (
    merge_duplicates,
    residual_branch,
    myelin_split,
    concat_scales,
    reformat_only,
)


# --- graph edits -----------------------------------------------------------------------------


def _bypass(view: QdqView, q: onnx.NodeProto, dq: onnx.NodeProto) -> bool:
    """Every consumer of `dq` reads `q`'s input instead.  Not done for graph outputs."""
    if dq.output[0] in view.index.graph_outputs:
        return False
    _rename_input(view, dq.output[0], q.input[0])
    return True


def _rename_input(view: QdqView, old: str, new: str) -> None:
    for consumer in view.consumers(old):
        for i, name in enumerate(consumer.input):
            if name == old:
                consumer.input[i] = new


def _remove_dead_quantizers(model: onnx.ModelProto) -> None:
    """Drop Q/DQ nodes that nothing reads any more, and the scale/zero-point initializers only
    they read (initializers that are also graph inputs stay)."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    released: set[str] = set()
    while True:
        used = {i for n in graph.node for i in n.input} | outputs
        dead = [
            n
            for n in graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear")
            and not any(o in used for o in n.output)
        ]
        if not dead:
            break
        for node in dead:
            released.update(node.input)
            graph.node.remove(node)
    used = {i for n in graph.node for i in n.input} | outputs | {v.name for v in graph.input}
    drop = released - used
    if drop:
        kept = [t for t in graph.initializer if t.name not in drop]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def describe_error(check: ErrorCheck) -> str:
    verdict = "no worse" if check.passed else "WORSE"
    return (
        f"error vs float ({check.reference}): max |Δ| {check.before_max_abs:.4g} → "
        f"{check.after_max_abs:.4g}, mean |Δ| {check.before_mean_abs:.4g} → "
        f"{check.after_mean_abs:.4g} ({verdict})"
    )
