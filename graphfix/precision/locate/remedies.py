"""The smallest set of graph fixes with which the candidate passes validate's tolerance.

Remedies: a float32 island (nodes kept in float32 by the converter) grown from a suspect; for a
suspect inside a decomposed norm, norm fusion (`graphfix.precision.norms`: one LayerNormalization
/ RMSNormalization / GroupNormalization node, whose statistics TensorRT and onnxruntime compute in
float32); for a suspect inside an attention block, that block's `fp32_island` attention strategy.
For a suspect inside an attention block, float32 accumulation through IAttention comes first
(the block as one ONNX Attention node with float32 Q, K, V: TensorRT ≥ 11.3 keeps its fused
kernel; offered by onnxruntime runs and TensorRT ≥ 11.3 runners), as the one remedy that keeps
fusion.  The search is greedy over the ranked suspects — per suspect float32 accumulation, norm
fusion, the attention strategy, then the island in rings
(the suspect plus every node whose reference values exceed the type's range, then its neighbours,
1, 1, 2, 4, ... rings more per trial) until the candidate passes — followed by a bisection that drops contiguous runs of
island nodes the verdict does not need.  Every trial is one candidate build and run, recorded with
its error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import onnx

from graphfix.attention.matcher import find_attention
from graphfix.attention.native.decompose import lower_native_nodes
from graphfix.attention.strategies.native_attention import NativeAttentionStrategy
from graphfix.model_io import LoadedModel
from graphfix.precision import policy
from graphfix.precision.locate.candidate import BuiltCandidate, build_candidate
from graphfix.precision.locate.localise import RANGE_MAX, UNIT_ROUNDOFF, Suspect, TensorError
from graphfix.precision.locate.reference import infer_types, node_label
from graphfix.progress import step as report_step
from graphfix.validation.compare import OutputComparison, Tolerance, compare_output
from graphfix.validation.low_precision import LowPrecision

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_RANGE_MARGIN = 0.5  # values above this fraction of the type's range go to float32 at once


class RemedyKind(str, Enum):
    FLOAT32_ISLAND = "float32_island"
    ATTENTION_STRATEGY = "attention_strategy"
    NORM_FUSION = "norm_fusion"
    # the block as one Attention node with Q, K, V cast to float32 around it: TensorRT ≥ 11.3
    # keeps its FP16 fused kernel and accumulates in float32 (native_attention --accumulate)
    ATTENTION_ACCUMULATION = "attention_float32_accumulation"


@dataclass(frozen=True)
class Remedy:
    """One graph fix: nodes computed in float32, or an attention block's strategy."""

    kind: RemedyKind
    suspect: str  # the suspect it was grown from
    nodes: tuple[str, ...] = ()
    block: int | None = None
    strategy: str | None = None

    @property
    def keeps_fusion(self) -> bool:
        """The engine keeps its fused attention kernel (the search tries these first)."""
        return self.kind is RemedyKind.ATTENTION_ACCUMULATION

    def describe(self) -> str:
        if self.kind is RemedyKind.ATTENTION_ACCUMULATION:
            return (
                f"attention block {self.block}: float32 accumulation through IAttention "
                "(TensorRT ≥ 11.3; keeps the fused kernel)"
            )
        if self.kind is RemedyKind.ATTENTION_STRATEGY:
            return f"attention block {self.block}: strategy {self.strategy}"
        if self.kind is RemedyKind.NORM_FUSION:
            return f"norm fusion (the norm of {len(self.nodes)} node(s) around {self.suspect})"
        return f"float32 island of {len(self.nodes)} node(s) around {self.suspect}"


@dataclass(frozen=True)
class Trial:
    """One candidate run with a set of remedies, and its verdict."""

    step: str  # "as converted", "greedy", "bisect"
    remedies: tuple[Remedy, ...]
    float32_nodes: int  # float32 compute nodes in the trial's model
    error: float  # the largest absolute error over the outputs (inf: NaN/inf where finite)
    passed: bool
    seconds: float
    latency_ms: float | None = None  # TensorRT trials: the engine's inference time


@dataclass(frozen=True)
class SearchResult:
    """What the search tried, what it kept, and the model it kept."""

    trials: tuple[Trial, ...]
    kept: tuple[Remedy, ...]
    passed: bool
    error: float
    float32_nodes: tuple[str, ...]
    model: onnx.ModelProto | None = field(default=None, repr=False, compare=False)


def float32_compute_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """Compute nodes (`graphfix.precision.policy.is_compute`, as `precision_census` counts them)
    whose first float output is float32, as labels."""
    types = infer_types(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if not policy.is_compute(node.op_type):
            continue
        floats = [types[o] for o in node.output if types.get(o) in _FLOAT_TYPES]
        if floats and floats[0] == onnx.TensorProto.FLOAT:
            found.append(node_label(node, i))
    return tuple(found)


TrialRun = Callable[
    [onnx.ModelProto, Mapping[str, np.ndarray]], tuple[dict[str, np.ndarray], float | None]
]


def run_trial_on_onnxruntime(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    low_precision: LowPrecision | None = None,
) -> tuple[dict[str, np.ndarray], float | None]:
    """`model`'s outputs on `feeds` by onnxruntime, float16/bfloat16 materialised unless
    `low_precision` says as-is (`graphfix.validation.low_precision`); no latency.

    An ONNX Attention node (a remedy writes them) runs through its standard-op lowering, so a
    plain float16 Attention keeps float16 scores, as a kernel storing them would, and the
    float32-accumulation remedy float32 ones."""
    from graphfix.validation.backends.onnxruntime_backend import OnnxRuntimeRunner

    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    lower_native_nodes(lowered, op_types=("Attention",))
    runner = OnnxRuntimeRunner(
        LoadedModel(lowered, None, True),
        label="the candidate with remedies",
        low_precision=low_precision,
    )
    return runner.infer(feeds), None


class TrialRunner:
    """Builds and runs candidates with remedies against the reference outputs."""

    def __init__(
        self,
        model: onnx.ModelProto,
        *,
        precision: str,
        feeds: Mapping[str, np.ndarray],
        reference_outputs: Mapping[str, np.ndarray],
        tolerance: Tolerance,
        base: str | None = None,
        run_trial: TrialRun | None = None,
        attention_accumulation: bool | None = None,
    ) -> None:
        """`run_trial`: what runs each trial's model (a candidate runner's `run_trial`; None:
        onnxruntime with float16/bfloat16 materialised).  `attention_accumulation`: whether the
        runner honours float32 accumulation through IAttention (None: it does, as onnxruntime's
        lowering does; a TensorRT runner only from 11.3 on)."""
        self.run_trial = run_trial_on_onnxruntime if run_trial is None else run_trial
        self.offers_attention_accumulation = attention_accumulation is not False
        self.base = "minimal" if base is None else base
        self._fusion = None  # fuse_norms' result, made on first use
        self.model = model
        self.precision = precision
        self.feeds = feeds
        self.reference_outputs = reference_outputs
        self.tolerance = tolerance

    def build(self, remedies: Sequence[Remedy]) -> BuiltCandidate:
        keep = sorted({n for r in remedies if r.kind is RemedyKind.FLOAT32_ISLAND for n in r.nodes})
        model = self.model
        if any(r.kind is RemedyKind.NORM_FUSION for r in remedies):
            model = self.fused_norms()
            names = {n.name for n in model.graph.node}
            keep = [n for n in keep if n in names]  # nodes fused away are no longer there
        attention = [
            (r.block, r.strategy, r.nodes)
            for r in remedies
            if r.kind in (RemedyKind.ATTENTION_STRATEGY, RemedyKind.ATTENTION_ACCUMULATION)
        ]
        accumulate = {r.block for r in remedies if r.kind is RemedyKind.ATTENTION_ACCUMULATION}
        return build_candidate(
            model,
            precision=self.precision,
            keep=keep,
            attention=attention,
            accumulate=accumulate,
            base=self.base,
        )

    def fused_norms(self) -> onnx.ModelProto:
        """The model with its decomposed norms fused (`graphfix.precision.norms`), cached."""
        return self._norm_fusion().model

    def norm_chains(self) -> dict[str, tuple[str, ...]]:
        """node → the nodes of the decomposed norm it belongs to (empty without norm fusion)."""
        report = self._norm_fusion().report
        return {node: tuple(f.replaced) for f in report.fused for node in f.replaced}

    def _norm_fusion(self):
        if self._fusion is None:
            from graphfix.precision.norms import fuse_norms

            self._fusion = fuse_norms(self.model)
        return self._fusion

    def run_candidate(self, model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], float | None]:
        """The candidate's outputs on the feeds, and its latency in ms where the runner measures
        one (TensorRT does; onnxruntime's CPU timing would mean nothing)."""
        return self.run_trial(model, self.feeds)

    def trial(self, step: str, remedies: Sequence[Remedy]) -> tuple[Trial, BuiltCandidate]:
        start = time.perf_counter()
        built = self.build(remedies)
        outputs, latency = self.run_candidate(built.model)
        comparisons = [
            compare_output(name, ref, outputs[name], self.tolerance)
            for name, ref in self.reference_outputs.items()
        ]
        return (
            Trial(
                step=step,
                remedies=tuple(remedies),
                float32_nodes=len(float32_compute_nodes(built.model)),
                error=worst_error(comparisons),
                passed=all(c.passed for c in comparisons),
                seconds=time.perf_counter() - start,
                latency_ms=latency,
            ),
            built,
        )


def worst_error(comparisons: Sequence[OutputComparison]) -> float:
    """The largest absolute error over outputs; inf when an output has NaN/inf disagreements."""
    worst = 0.0
    for c in comparisons:
        if c.nonfinite_mismatches or c.absolute is None:
            return float("inf") if c.size else worst
        worst = max(worst, c.absolute.max)
    return worst


def search_remedies(
    model: onnx.ModelProto,
    suspects: Sequence[Suspect],
    errors: Sequence[TensorError],
    runner: TrialRunner,
    *,
    max_trials: int = 32,
    max_rings: int = 8,
    max_suspects: int = 5,
    progress: Callable[[Trial], None] | None = None,
) -> SearchResult:
    """Greedy over `suspects`, then bisection; at most `max_trials` candidate runs."""
    graph = _Neighbours(model)
    chains = {
        m.index: tuple(node_label(n.node, n.position) for n in m.path)
        for m in find_attention(model)
        if not m.location  # a block inside an If/Loop body: its nodes are not the main graph's
    }
    norms = runner.norm_chains()
    trials: list[Trial] = []

    def run(step: str, remedies: Sequence[Remedy]) -> tuple[Trial, BuiltCandidate]:
        report_step(f"remedy trial {len(trials) + 1} of at most {max_trials} ({step})")
        trial, built = runner.trial(step, remedies)
        trials.append(trial)
        if progress is not None:
            progress(trial)
        return trial, built

    current, built = run("as converted", [])
    kept: list[Remedy] = []
    required = _beyond_range(model, errors, RANGE_MAX[runner.precision] * _RANGE_MARGIN)
    for suspect in suspects[:max_suspects]:
        if current.passed or len(trials) >= max_trials:
            break
        island = {suspect.node} | required
        if any(suspect.node in r.nodes for r in kept):
            continue
        options: list[Remedy] = []
        block = suspect.attention_block
        free = block is not None and not any(r.block == block for r in kept)
        if free and runner.offers_attention_accumulation:  # keeps the fused kernel: first
            accumulate = RemedyKind.ATTENTION_ACCUMULATION
            options.append(_block_remedy(accumulate, suspect, chains, NativeAttentionStrategy.name))
        if suspect.node in norms and not any(r.kind is RemedyKind.NORM_FUSION for r in kept):
            options.append(Remedy(RemedyKind.NORM_FUSION, suspect.node, nodes=norms[suspect.node]))
        if free:
            widen = RemedyKind.ATTENTION_STRATEGY
            options.append(_block_remedy(widen, suspect, chains, "fp32_island"))
        steps = (
            1  # rings added per trial: 1, 1, 2, 4, ... so the whole graph is reached in log steps
        )
        for ring in range(max_rings + 1):
            options.append(
                Remedy(RemedyKind.FLOAT32_ISLAND, suspect.node, nodes=tuple(graph.ordered(island)))
            )
            grown = island
            for _ in range(steps):
                grown = grown | graph.around(grown)
            if grown == island:
                break
            island = grown
            steps = 1 if ring == 0 else steps * 2
        best: tuple[Trial, BuiltCandidate, Remedy] | None = None
        for option in options:
            if len(trials) >= max_trials:
                break
            trial, candidate = run("greedy", [*kept, option])
            if best is None or trial.error < best[0].error:
                best = (trial, candidate, option)
            if trial.passed:
                break
        if best is not None and (best[0].passed or best[0].error < 0.5 * current.error):
            current, built, _ = best
            kept.append(best[2])
    if current.passed:
        kept, current, built = _bisect(kept, required, current, built, run, max_trials, trials)
    return SearchResult(
        trials=tuple(trials),
        kept=tuple(kept),
        passed=current.passed,
        error=current.error,
        float32_nodes=float32_compute_nodes(built.model),
        model=built.model if kept or current.passed else None,
    )


def _block_remedy(
    kind: RemedyKind, suspect: Suspect, chains: Mapping[int, tuple[str, ...]], strategy: str
) -> Remedy:
    """A remedy rewriting the suspect's attention block with `strategy`."""
    block = suspect.attention_block
    nodes = chains.get(block, ()) if block is not None else ()
    return Remedy(kind, suspect.node, nodes=nodes, block=block, strategy=strategy)


def _bisect(
    kept: list[Remedy],
    required: set[str],
    current: Trial,
    built: BuiltCandidate,
    run: Callable[[str, Sequence[Remedy]], tuple[Trial, BuiltCandidate]],
    max_trials: int,
    trials: list[Trial],
) -> tuple[list[Remedy], Trial, BuiltCandidate]:
    """Drop contiguous runs of island nodes (never the out-of-range ones) while it still passes."""
    islands = [r for r in kept if r.kind is RemedyKind.FLOAT32_ISLAND]
    others = [r for r in kept if r.kind is not RemedyKind.FLOAT32_ISLAND]
    if not islands:
        return kept, current, built
    order: list[str] = []
    for r in islands:
        order += [n for n in r.nodes if n not in order]
    removable = [n for n in order if n not in required]
    dropped: set[str] = set()
    segments = [removable] if removable else []
    while segments and len(trials) < max_trials:
        segment = segments.pop(0)
        attempt = _without(islands, dropped | set(segment))
        trial, candidate = run("bisect", [*others, *attempt])
        if trial.passed:
            dropped |= set(segment)
            current, built = trial, candidate
        elif len(segment) > 1:
            half = len(segment) // 2
            segments += [segment[:half], segment[half:]]
    return [*others, *_without(islands, dropped)], current, built


def _without(islands: Sequence[Remedy], dropped: set[str]) -> list[Remedy]:
    result = []
    for r in islands:
        nodes = tuple(n for n in r.nodes if n not in dropped)
        if nodes:
            result.append(Remedy(r.kind, r.suspect, nodes=nodes))
    return result


def _beyond_range(model: onnx.ModelProto, errors: Sequence[TensorError], limit: float) -> set[str]:
    """Nodes that write or read a float value beyond `limit` in the reference (or a weight) where
    the candidate as converted went wrong (saturating a mask constant is harmless).  Data movement
    counts too: a Reshape left in float16 between two float32 nodes would overflow the value it
    carries (it costs no float32 compute)."""
    big = {
        e.tensor
        for e in errors
        if e.reference_absmax > limit and (e.nonfinite or e.error > 16 * UNIT_ROUNDOFF["float16"])
    }
    for init in model.graph.initializer:
        if (
            init.data_type == onnx.TensorProto.FLOAT
            and init.data_location != onnx.TensorProto.EXTERNAL
        ):
            values = onnx.numpy_helper.to_array(init)
            if values.size and float(np.abs(values[np.isfinite(values)]).max(initial=0)) > limit:
                big.add(init.name)
    nodes = set()
    for i, node in enumerate(model.graph.node):
        if big.intersection(node.output) or big.intersection(node.input):
            nodes.add(node_label(node, i))
    return nodes


class _Neighbours:
    """Nodes adjacent through float tensors, by label, and topological order."""

    def __init__(self, model: onnx.ModelProto) -> None:
        types = infer_types(model)
        self.position: dict[str, int] = {}
        producer: dict[str, str] = {}
        consumers: dict[str, list[str]] = {}
        for i, node in enumerate(model.graph.node):
            label = node_label(node, i)
            self.position[label] = i
            for out in node.output:
                producer[out] = label
            for t in node.input:
                consumers.setdefault(t, []).append(label)
        self.adjacent: dict[str, set[str]] = {label: set() for label in self.position}
        for tensor, source in producer.items():
            if types.get(tensor, onnx.TensorProto.FLOAT) not in (
                onnx.TensorProto.FLOAT,
                onnx.TensorProto.FLOAT16,
                onnx.TensorProto.BFLOAT16,
            ):
                continue
            for sink in consumers.get(tensor, []):
                self.adjacent[source].add(sink)
                self.adjacent[sink].add(source)

    def around(self, nodes: set[str]) -> set[str]:
        return {n for node in nodes for n in self.adjacent.get(node, ())} - nodes

    def ordered(self, nodes: set[str]) -> list[str]:
        return sorted(nodes, key=lambda n: self.position.get(n, -1))
