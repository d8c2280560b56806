"""Where the candidate's error is created: per-tensor error statistics and the suspect ranking.

Error is largest at the end of a graph, so ranking by error points at the last node.  A suspect is
instead a node that *creates* error: its output's error against the error already in its inputs
(`amplification`), non-finite values where the reference is finite while its inputs have none, and
a reference value beyond the candidate type's range while its inputs stay inside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from graphfix.precision.locate.reference import TensorSite

# Unit roundoff and largest finite value of the type the candidate computes in.
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
RANGE_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38}
# Below this many unit roundoffs an output error is rounding noise, whatever its amplification.
_SIGNIFICANT_ROUNDOFFS = 16
_AMPLIFYING = 4.0
# Values this large are sentinels (masks built from float32's lowest value), not activations:
# every converter saturates them, and they neither count as error nor as range overflow.
SENTINEL = 1e30


@dataclass(frozen=True)
class TensorError:
    """How one intermediate tensor of the candidate differs from the reference."""

    tensor: str
    node: str
    op_type: str
    position: int  # producing node's index in topological order (graph depth in the plot)
    error: float  # ‖c − r‖₂ / ‖r‖₂ over the elements finite on both sides
    max_abs_error: float
    reference_absmax: float  # largest finite |reference| (range overflow when beyond the type's)
    candidate_absmax: float
    nonfinite: int  # elements NaN/inf in the candidate but finite in the reference
    size: int


@dataclass(frozen=True)
class Suspect:
    """A node ranked by the error it creates; `reasons` say why it is suspected."""

    rank: int
    node: str
    op_type: str
    tensor: str
    position: int
    error: float
    input_error: float  # largest error among its inputs (0: weights, graph inputs; inf: NaN/inf)
    amplification: float  # error / max(input_error, unit roundoff)
    nonfinite: int
    reference_absmax: float
    reasons: tuple[str, ...]
    attention_block: int | None = None
    module: str | None = None


def measure(
    site: TensorSite,
    reference: np.ndarray,
    candidate: np.ndarray,
    *,
    range_max: float = math.inf,
) -> TensorError | None:
    """Statistics of one tensor pair (the candidate cast to float32); None when not comparable.

    Elements where the reference is a sentinel (|r| ≥ 1e30, a mask built from float32's lowest
    value) and the candidate saturated to the same sign (±range_max or ±inf) are left out: that
    saturation is the intended meaning.  A real activation beyond `range_max` that becomes inf
    counts as non-finite: that is the overflow `locate` looks for.
    """
    if reference.dtype.kind != "f" or candidate.shape != reference.shape:
        return None
    r = reference.astype(np.float32, copy=False).ravel()
    c = candidate.astype(np.float32, copy=False).ravel()
    r_finite = np.isfinite(r)
    both = r_finite & np.isfinite(c)
    if math.isfinite(range_max):
        with np.errstate(invalid="ignore"):
            saturated = (
                (np.abs(r) >= SENTINEL) & (np.abs(c) >= range_max) & (np.sign(r) == np.sign(c))
            )
        both &= ~saturated
        nonfinite = int(np.count_nonzero(r_finite & ~np.isfinite(c) & ~saturated))
    else:
        nonfinite = int(np.count_nonzero(r_finite & ~both))
    with np.errstate(over="ignore", invalid="ignore"):
        rb, cb = r[both], c[both]
        diff = cb - rb
    ref_norm = math.sqrt(float(np.dot(rb.astype(np.float64), rb)))
    diff_norm = math.sqrt(float(np.dot(diff.astype(np.float64), diff)))
    if rb.size == 0:
        error = math.inf if nonfinite else 0.0
    elif ref_norm == 0:
        error = 0.0 if diff_norm == 0 else math.inf
    else:
        error = diff_norm / ref_norm
    return TensorError(
        tensor=site.tensor,
        node=site.node,
        op_type=site.op_type,
        position=site.position,
        error=error,
        max_abs_error=float(np.abs(diff).max()) if diff.size else 0.0,
        reference_absmax=_absmax(r[r_finite & (np.abs(r) < SENTINEL)]),
        candidate_absmax=float(np.abs(c[np.isfinite(c)]).max()) if np.isfinite(c).any() else 0.0,
        nonfinite=nonfinite,
        size=int(r.size),
    )


def _absmax(values: np.ndarray) -> float:
    return float(np.abs(values).max()) if values.size else 0.0


def rank_suspects(
    errors: Iterable[TensorError],
    sites: Mapping[str, TensorSite],
    *,
    precision: str,
    attention_blocks: Mapping[str, int] | None = None,
    modules: Mapping[str, str] | None = None,
    top: int = 10,
) -> tuple[Suspect, ...]:
    """The nodes that create error, most suspect first (at most `top`).

    Order: nodes that create non-finite values, or where the reference first leaves the type's
    range (earliest first: what follows inherits it; a converter may keep the overflowing node
    itself in float32, so the inf appears at its first low-precision consumer), then nodes that
    amplify a significant error (largest amplification first).  Nodes whose output error is
    rounding noise are left out.
    """
    by_tensor = {e.tensor: e for e in errors}
    floor = UNIT_ROUNDOFF[precision]
    limit = RANGE_MAX[precision]
    candidates: list[tuple[tuple, Suspect]] = []
    for e in by_tensor.values():
        inputs = [by_tensor[t] for t in sites[e.tensor].inputs if t in by_tensor]
        # an input holding NaN/inf already carries unbounded error, whatever its finite part says
        input_error = max((math.inf if i.nonfinite else i.error for i in inputs), default=0.0)
        amplification = 0.0 if math.isinf(input_error) else e.error / max(input_error, floor)
        reasons = []
        creates_nonfinite = e.nonfinite > 0 and not any(i.nonfinite for i in inputs)
        overflow = e.reference_absmax > limit and not any(
            i.reference_absmax > limit for i in inputs
        )
        if creates_nonfinite:
            reasons.append(f"creates {e.nonfinite} NaN/inf where the reference is finite")
        if overflow:
            reasons.append(
                f"reference reaches {e.reference_absmax:.4g}, beyond {precision}'s {limit:.6g}"
            )
        significant = e.error > _SIGNIFICANT_ROUNDOFFS * floor
        if significant and amplification >= _AMPLIFYING:
            reasons.append(f"amplifies the error in its inputs {amplification:.3g}x")
        if not reasons:
            continue
        if creates_nonfinite or overflow:
            key = (0, e.position, 0.0)
        else:
            key = (1, 0, -amplification)
        candidates.append(
            (
                key,
                Suspect(
                    rank=0,
                    node=e.node,
                    op_type=e.op_type,
                    tensor=e.tensor,
                    position=e.position,
                    error=e.error,
                    input_error=input_error,
                    amplification=amplification,
                    nonfinite=e.nonfinite,
                    reference_absmax=e.reference_absmax,
                    reasons=tuple(reasons),
                    attention_block=(attention_blocks or {}).get(e.node),
                    module=(modules or {}).get(e.node),
                ),
            )
        )
    candidates.sort(key=lambda item: item[0])
    seen: set[str] = set()
    ranked: list[Suspect] = []
    for _, suspect in candidates:
        if suspect.node in seen:  # a node with several outputs is one suspect
            continue
        seen.add(suspect.node)
        ranked.append(_with_rank(suspect, len(ranked) + 1))
        if len(ranked) == top:
            break
    return tuple(ranked)


def _with_rank(suspect: Suspect, rank: int) -> Suspect:
    from dataclasses import replace

    return replace(suspect, rank=rank)


_LEGACY_SCOPE = re.compile(r"^/(.+)/[^/]+$")


def module_path(node: onnx.NodeProto) -> str | None:
    """The PyTorch module a node came from, when its name or metadata carries it.

    Legacy exports name nodes `/model/layers.3/self_attn/q_proj/MatMul`; the dynamo exporter puts
    the scopes in `pkg.torch.onnx.name_scopes` metadata.
    """
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [s for s in re.findall(r"'([^']*)'", prop.value) if s]
            if len(scopes) >= 2:
                return scopes[-2]
    found = _LEGACY_SCOPE.match(node.name)
    if found:
        return found.group(1).replace("/", ".")
    return None
