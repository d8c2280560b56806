"""`convert_precision`: a float32 model in float16 or bfloat16, with float32 islands where needed.

The steps, one module each: fuse decomposed norms (norms.py); find constants beyond the target's
range, and among them the attention masks' fills to lower (mask_fill.py); plan the float32
islands and say why (islands.py, policy.py); optionally rewrite attention blocks that must stay
float32 with a plugin strategy; apply the plan (apply.py: Casts at island
borders, retyped attributes and values); write each initializer once (initializers.py, weights
on disk streamed); report (report.py, census.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphfix.attention.matcher import scan_graph
from graphfix.errors import UsageError
from graphfix.float_types import LOW_PRECISIONS, FloatType, spellings
from graphfix.graph.index import GraphIndex, all_graphs, node_label
from graphfix.graph.value_info import reconcile_value_info
from graphfix.model_io import LoadedModel, load_model
from graphfix.precision import norms, weights
from graphfix.precision.apply import PlanApplier
from graphfix.precision.census import precision_census
from graphfix.precision.initializers import WeightsOut, place_weights
from graphfix.precision.islands import FLOAT, Forced, Plan, Planner, islands_of
from graphfix.precision.mask_fill import MaskFill, find_mask_fills, lower_mask_fills
from graphfix.precision.norm_types import NormKind
from graphfix.precision.norms import UnfusedNorm
from graphfix.precision.policy import Reason, untyped_in
from graphfix.precision.report import (
    Island,
    IslandReason,
    OutOfRange,
    PrecisionReport,
    PrecisionResult,
)
from graphfix.progress import step
from graphfix.selectors import parse_selectors, select_nodes

TARGETS = spellings(LOW_PRECISIONS)  # float16, bfloat16 (fp16, bf16 accepted too)


def convert_precision(
    model: LoadedModel | onnx.ModelProto | str | os.PathLike[str],
    *,
    to: str | None = None,
    keep: Sequence[str] | None = None,
    keep_io_types: bool | None = None,
    fuse_norms: bool | None = None,
    attention_strategy: str | None = None,
    external_data: str | os.PathLike[str] | None = None,
    opset: int | None = None,
) -> PrecisionResult:
    """Convert a float32 model to `to` ("float16", the default, or "bfloat16"; "fp16"/"bf16" too).

    `keep`: selector texts (`graphfix.selectors`) for nodes that stay float32.  `keep_io_types`
    (default True) keeps float32 graph inputs and outputs.  `fuse_norms` (default True) first
    fuses decomposed norms (`graphfix.precision.norms`); norms left unfused become float32
    islands.  An attention block that must stay float32 is kept whole, or, with
    `attention_strategy` (a `graphfix fix` strategy such as "plugin"), rewritten so its softmax
    computes in float32 inside a plugin and the rest runs in `to`.  `opset`: the default-domain
    opset norm fusion may raise the model to (as `fuse_norms`' `opset`; e.g. 23, where decomposed
    RMSNorms become `RMSNormalization` instead of float32 islands: TensorRT's ONNX parser reads
    it from TensorRT 10.15).

    A path (or a model loaded without weights) has its weights streamed into a new data file,
    `external_data` (default: a temporary folder that lives as long as the result); save the
    result with `graphfix.save_model(result.model, path, source=result.source)`.
    The caller's model is not mutated.
    """
    to = "float16" if to is None else FloatType.parse(to, allowed=LOW_PRECISIONS, option="to").value
    options = _Options(
        to=to,
        keep=keep,
        keep_io_types=True if keep_io_types is None else keep_io_types,
        fuse_norms=True if fuse_norms is None else fuse_norms,
        attention_strategy=attention_strategy,
        external_data=None if external_data is None else Path(external_data),
        opset=opset,
    )
    if opset is not None and not options.fuse_norms:
        raise UsageError(
            f"opset {opset} (--opset) is the opset norm fusion may raise the model to, and "
            "norm fusion is off (--no-fuse-norms, fuse_norms=False): drop one of the two"
        )
    loaded = load_model(model, load_weights=False)
    _refuse_low_precision(loaded.model)
    known: dict[str, float] = {}
    # The big weights start converting now, on worker threads, while the graph is planned.
    out = WeightsOut.open(loaded.model, loaded.base_dir, options.external_data, to)
    with out or contextlib.nullcontext():
        while True:  # a big weight found beyond range while streaming: plan again with it known
            try:
                return _convert(loaded, options, known, out)
            except weights.OutOfRangeWeight as found:
                known[found.name] = found.biggest
                if out is not None:
                    out.streamer.restart()


def _refuse_low_precision(model: onnx.ModelProto) -> None:
    """A model already holding float16/bfloat16 weights or inputs chose its own float32 parts
    (a Softmax between Casts, say): converting those would undo the exporter's choice.  A
    quantized (Q/DQ) model's scales and the float ops between its quantizers were calibrated in
    float32: retyping them is not a precision conversion graphfix can vouch for."""
    quantizers = [
        n
        for graph in all_graphs(model.graph)
        for n in graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.domain in ("", "ai.onnx")
    ]
    if quantizers:
        first = quantizers[0]
        raise UsageError(
            f"the model is quantized ({len(quantizers)} QuantizeLinear/DequantizeLinear nodes, "
            f"e.g. {first.op_type} '{first.name or first.output[0]}'); convert_precision "
            "converts float32 models: convert the float32 model first, then quantize the "
            "result (or keep this one as it is; `graphfix qdq inspect` checks it)"
        )
    low = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
    for tensor in model.graph.initializer:
        if tensor.data_type in low:
            raise UsageError(
                f"the model is already in {low[tensor.data_type]} (initializer {tensor.name}); "
                "convert_precision converts float32 models: pass the float32 export, or keep "
                "this one as it is"
            )
    for vi in model.graph.input:
        if vi.type.tensor_type.elem_type in low:
            raise UsageError(
                f"the model is already in {low[vi.type.tensor_type.elem_type]} (input "
                f"{vi.name}); convert_precision converts float32 models: pass the float32 export"
            )


@dataclass(frozen=True)
class _Options:
    to: str
    keep: Sequence[str] | None
    keep_io_types: bool
    fuse_norms: bool
    attention_strategy: str | None
    external_data: Path | None
    opset: int | None


def _convert(
    loaded: LoadedModel, options: _Options, known: dict[str, float], out: WeightsOut | None
) -> PrecisionResult:
    to, keep, keep_io_types = options.to, options.keep, options.keep_io_types
    attention_strategy, external_data = options.attention_strategy, options.external_data
    work = onnx.ModelProto()
    work.CopyFrom(loaded.model)
    base_dir = loaded.base_dir

    norms_note, unfused = ("not run (fuse_norms=False)", ())
    if options.fuse_norms:
        step("fusing decomposed norms")
        work, norms_note, unfused = _fuse_norms(work, options.opset)

    step("finding the attention blocks and the float32 islands")
    index = GraphIndex(work, base_dir=base_dir)
    out_of_range = {**_out_of_range(index, base_dir, to), **known}
    scan = scan_graph(index)
    user_keys = _user_keep(work, keep, scan.matches)
    planner = Planner(index, scan.matches, inputs_float32=keep_io_types)
    fills = find_mask_fills(index, scan.matches, out_of_range, to)
    while True:  # a fill is lowered only where its chains then run in the target type
        kept = {k: v for k, v in out_of_range.items() if k not in fills}
        plan = planner.plan(_forced(planner, index, kept, unfused, user_keys, to))
        stuck = {n for n, f in fills.items() if set(f.blocks) & set(plan.blocks_high)}
        if not stuck:
            break
        fills = {n: f for n, f in fills.items() if n not in stuck}
    out_of_range = kept
    blocks_total = len(scan.matches)
    rewritten: tuple[int, ...] = ()
    if attention_strategy is not None and plan.blocks_high:
        work, rewritten, user_keys = _rewrite_blocks(
            work, loaded, scan.matches, plan.blocks_high, attention_strategy, user_keys
        )
        index = GraphIndex(work, base_dir=base_dir)
        planner = Planner(index, scan_graph(index).matches, inputs_float32=keep_io_types)
        plan = planner.plan(_forced(planner, index, out_of_range, unfused, user_keys, to))

    lower_mask_fills(work, fills, base_dir)
    rewrite = PlanApplier(
        work,
        index,
        planner,
        plan,
        to=to,
        keep_io_types=keep_io_types,
        out_of_range=set(out_of_range),
    )
    before = _Snapshot.of(index, plan, out_of_range)
    step(f"rewriting the graph and its weights in {to}")
    rewrite.apply()
    source = place_weights(rewrite, base_dir, out)
    reconcile_value_info(work, base_dir=base_dir if source is None else source.parent)
    if source is not None:
        source.write_bytes(work.SerializeToString())
    report = _report(
        rewrite,
        before,
        out_of_range,
        blocks_total=blocks_total,
        blocks_high=tuple(b for b in plan.blocks_high if b not in rewritten),
        rewritten=rewritten,
        attention_strategy=attention_strategy,
        norms_note=norms_note,
        mask_fills=tuple(fills.values()),
    )
    result = PrecisionResult(model=work, report=report, source=source)
    if source is not None and external_data is None:
        weakref.finalize(result, shutil.rmtree, source.parent, True)
    return result


# --- inputs to the plan ------------------------------------------------------------------------
def _fuse_norms(
    model: onnx.ModelProto, opset: int | None
) -> tuple[onnx.ModelProto, str, tuple[UnfusedNorm, ...]]:
    """Fuse decomposed norms; the norms left unfused come back to become float32 islands."""
    result = norms.fuse_norms(model, opset=opset)
    summary = result.report.summary()
    return result.model, summary.splitlines()[0], result.report.unfused


def _unfused_float32(norm: UnfusedNorm, to: str) -> tuple[tuple[str, ...], str]:
    """The nodes of an unfused norm that stay float32, and why.

    An RMSNorm keeps only x², its mean, + ε and the root in float32 (as HF's LlamaRMSNorm
    upcasts for): the root is back in x's range, so x / rms (or x · 1/rms) and the scale run in
    `to` when ε keeps rms ≥ √ε a normal number of `to` and 1/√ε within its range.  Otherwise,
    and for other norms, everything up to the normalisation stays float32, as the fused op's
    stash_type would compute it."""
    why = f"norm not fused: {norm.reason}"
    if norm.kind is not NormKind.RMS_NORM or not norm.overflow or norm.epsilon is None:
        return norm.nodes, why
    root = math.sqrt(norm.epsilon)
    if root < weights.SMALLEST_NORMAL[to] or 1 / root > weights.LIMITS[to]:
        return norm.nodes, f"{why}; ε = {norm.epsilon:.3g} too small to normalise in {to}"
    return norm.overflow, f"RMSNorm statistics (x² overflows {to}; x / rms runs in {to}), {why}"


def _out_of_range(index: GraphIndex, base_dir: Path | None, to: str) -> dict[str, float]:
    """Float32 constants (initializers, Constant and ConstantOfShape values) beyond `to`'s range.

    Large weights on disk are checked while they are streamed (`weights.deferred_check`);
    `known` holds those found beyond range by an earlier attempt."""
    limit = weights.LIMITS[to]
    found: dict[str, float] = {}
    for tensor in index.graph.initializer:
        if tensor.data_type == FLOAT and not weights.deferred_check(tensor):
            # small weights on disk: read through the index's open file (one open per file)
            loaded = index.external_tensor(tensor) if weights.is_external(tensor) else None
            if loaded is not None and len(loaded.raw_data) != 4 * math.prod(tensor.dims):
                loaded = None  # truncated: max_abs says so
            biggest = weights.max_abs(tensor if loaded is None else loaded, base_dir)
            if biggest > limit:
                found[tensor.name] = biggest
    for node in index.graph.node:
        if node.op_type not in ("Constant", "ConstantOfShape"):
            continue
        for attr in node.attribute:
            values = None
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
                values = onnx.numpy_helper.to_array(attr.t)
            elif attr.name in ("value_float", "value_floats"):
                values = onnx.helper.get_attribute_value(attr)
            if values is not None:
                import numpy as np

                array = np.asarray(values, dtype=np.float32)
                finite = np.abs(array[np.isfinite(array)])
                if finite.size and float(finite.max()) > limit:
                    found[node.output[0]] = float(finite.max())
    return found


def _user_keep(
    model: onnx.ModelProto, keep: Sequence[str] | None, matches: Sequence
) -> dict[str, str]:
    """Node keys (name, or first output for unnamed nodes) the user keeps → the selector text."""
    if not keep:
        return {}
    if isinstance(keep, str):
        keep = [keep]
    selection = select_nodes(model, parse_selectors(keep), blocks=matches)
    keys: dict[str, str] = {}
    for hit in selection.hits:
        for position in hit.positions:
            keys.setdefault(_key(model.graph.node[position]), hit.selector.text)
    return keys


def _key(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def _forced(
    planner: Planner,
    index: GraphIndex,
    out_of_range: dict[str, float],
    unfused: Sequence[UnfusedNorm],
    user_keys: dict[str, str],
    to: str,
) -> dict[int, Forced]:
    forced = planner.default_reasons(out_of_range=out_of_range)
    for position, node in enumerate(index.graph.node):
        why = untyped_in(node, index.opset, to, planner.float_tensor)
        if why is not None:
            forced.setdefault(position, Forced(Reason.TYPE, why))
    by_name = {n.name: p for p, n in enumerate(index.graph.node) if n.name}
    for norm in unfused:
        names, why = _unfused_float32(norm, to)
        for name in names:
            if name in by_name:
                forced[by_name[name]] = Forced(Reason.NORM, why)
    for position, node in enumerate(index.graph.node):
        text = user_keys.get(_key(node))
        if text is not None:
            forced[position] = Forced(Reason.KEEP, f"kept by selector {text!r}")
    return forced


def _rewrite_blocks(
    work: onnx.ModelProto,
    loaded: LoadedModel,
    matches: Sequence,
    blocks: Sequence[int],
    strategy: str,
    user_keys: dict[str, str],
) -> tuple[onnx.ModelProto, tuple[int, ...], dict[str, str]]:
    """Rewrite the float32 attention blocks with `strategy`; their plugin computes in float32,
    so the rewritten block runs in the target type (the user's keeps inside it are dropped)."""
    from graphfix.attention.rewrite import fix_attention

    fixed = fix_attention(
        LoadedModel(model=work, path=loaded.path, weights_loaded=loaded.weights_loaded),
        strategy=strategy,
        select=list(blocks),
    )
    done = tuple(b.index for b in fixed.report.blocks if b.rewritten)
    inside = {_key(n.node) for m in matches if m.index in done for n in m.path}
    return fixed.model, done, {k: v for k, v in user_keys.items() if k not in inside}


# --- report ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Snapshot:
    """What the report needs from the graph as planned (positions change once Casts go in)."""

    labels: tuple[str, ...]
    op_types: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    consumers: dict[str, tuple[str, ...]]

    @staticmethod
    def of(index: GraphIndex, plan: Plan, out_of_range: dict[str, float]) -> _Snapshot:
        nodes = index.graph.node
        labels = tuple(node_label(n, p) for p, n in enumerate(nodes))
        return _Snapshot(
            labels=labels,
            op_types=tuple(n.op_type for n in nodes),
            groups=tuple(tuple(g) for g in islands_of(plan, index)),
            consumers={
                name: tuple(labels[index.position(c)] for c in index.consumers_of(name))
                for name in out_of_range
            },
        )


def _report(
    rewrite: PlanApplier,
    before: _Snapshot,
    out_of_range: dict[str, float],
    *,
    blocks_total: int,
    blocks_high: tuple[int, ...],
    rewritten: tuple[int, ...],
    attention_strategy: str | None,
    norms_note: str,
    mask_fills: tuple[MaskFill, ...],
) -> PrecisionReport:
    plan = rewrite.plan
    islands: list[Island] = []
    for number, group in enumerate(before.groups):
        members = set(group)
        by_reason: dict[tuple[Reason, str], list[str]] = {}
        for p in group:
            forced = plan.reasons[p]
            by_reason.setdefault((forced.reason, forced.detail), []).append(before.labels[p])
        reasons = sorted(by_reason.items(), key=lambda item: item[0][0] is Reason.MERGED)
        islands.append(
            Island(
                index=number,
                nodes=tuple(before.labels[p] for p in group),
                reasons=tuple(IslandReason(r, d, tuple(n)) for (r, d), n in reasons),
                casts_in=sum(c.up and c.first_consumer in members for c in rewrite.casts),
                casts_out=sum(not c.up and c.producer in members for c in rewrite.casts),
            )
        )
    census = precision_census(rewrite.model)
    return PrecisionReport(
        to=rewrite.to,
        keep_io_types=rewrite.keep_io_types,
        islands=tuple(islands),
        out_of_range=tuple(
            OutOfRange(name, value, weights.LIMITS[rewrite.to], before.consumers[name])
            for name, value in out_of_range.items()
        ),
        compute_nodes=census.compute - census.untyped,
        compute_nodes_low=census.compute - census.untyped - census.float32,
        casts_added=len(rewrite.casts),
        initializers_converted=len(rewrite.low_initializers),
        initializers_duplicated=rewrite.duplicated,
        attention_blocks=blocks_total,
        attention_blocks_float32=blocks_high,
        attention_blocks_rewritten=rewritten,
        attention_strategy=attention_strategy,
        norms=norms_note,
        saturated=tuple(rewrite.saturated),
        mask_fills=mask_fills,
    )
