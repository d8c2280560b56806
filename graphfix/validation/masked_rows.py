"""Query positions whose every key is masked: where a fused kernel and the chain may differ.

With left padding and a causal mask (batched LLM inference), the first query positions of a
padded sequence have every key masked. Those rows carry no information (no valid position reads
them: their keys are masked for every valid query), yet their values depend on arithmetic a
rewrite need not keep: a float16 chain adds the fill -65504 to each score and rounds in steps of
32 (so the row's softmax is about uniform), while a fused kernel (graphfix's GraphfixAttention,
ONNX Attention, TensorRT's own MHA) adds it in float32, exactly. `validate` compares the two
models on such inputs; where an output differs beyond tolerance only at those positions, it says
so and compares the rest (`compare_output`'s `exclude`).

Positions are read from the reference model's attention masks as onnxruntime computes them on
the validation inputs: an additive mask at or below `MASKED_AT` (or -inf), or a `Where` whose
condition blocks the score with such a fill. A position counts when every key of its row is
masked in every head of some self-attention block whose query length is the output's axis 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphfix.attention.match_types import (
    AttentionKind,
    BiasStep,
    MaskKind,
    MaskStep,
)
from graphfix.attention.matcher import find_attention
from graphfix.model_io import LoadedModel
from graphfix.progress import step
from graphfix.validation.backends import BackendError
from graphfix.validation.compare import OutputComparison, Tolerance, compare_output
from graphfix.validation.inputs import cast_feeds, input_specs

# exp(x) is exactly 0 in float32 below about -104: a value this low only masks (a position bias,
# ALiBi at 4096 keys included, stays far above it)
MASKED_AT = -1.0e4


def fully_masked_positions(
    model: LoadedModel, feeds: Mapping[str, np.ndarray]
) -> np.ndarray | None:
    """Boolean [batch, query] (either may be 1, broadcast): True where every key of the row is
    masked in some self-attention block of `model` on `feeds`; None when no block has a mask
    onnxruntime can compute here."""
    blocks = [
        steps
        for m in find_attention(model.model)
        if not m.location and m.kind is not AttentionKind.CROSS
        for steps in [[s for s in m.score_steps if isinstance(s, MaskStep | BiasStep)]]
        if steps
    ]
    names = sorted({s.source for steps in blocks for s in steps})
    if not names:
        return None
    from graphfix.precision.locate.reference import TensorStreamer

    try:
        with TensorStreamer(model, label="the original (its attention masks)") as streamer:
            values = streamer.fetch(names, cast_feeds(feeds, input_specs(model.model)))
    except (BackendError, MemoryError, OSError):  # the verdict stands as it was
        return None
    found = None
    for steps in blocks:
        rows = _masked_rows(steps, values)
        if rows is None:
            continue
        try:
            found = rows if found is None else found | rows
        except ValueError:  # blocks of other lengths: keep the first
            continue
    return found


def _masked_rows(
    steps: list[MaskStep | BiasStep], values: Mapping[str, np.ndarray]
) -> np.ndarray | None:
    """One block's rows [batch or 1, S] whose every key its mask steps block (None: none)."""
    masked = None
    for chain_step in steps:
        value = values.get(chain_step.source)
        if value is None:
            return None
        if isinstance(chain_step, BiasStep):
            if not np.issubdtype(value.dtype, np.floating):
                return None
            blocked = value.astype(np.float32) <= MASKED_AT
        elif chain_step.fill is not None and chain_step.fill <= MASKED_AT:
            condition = value.astype(bool)
            blocked = ~condition if chain_step.kind is MaskKind.KEEP else condition
        else:
            continue  # a Where whose fill does not mask
        try:
            masked = blocked if masked is None else masked | blocked
        except ValueError:
            return None
    if masked is None or masked.ndim not in (2, 4):
        return None
    rows = masked.all(axis=-1)  # [.., S]
    if rows.ndim == 3:  # [B, H, S]: masked in every head
        rows = rows.all(axis=1)
    else:  # [S]: the same for every batch
        rows = rows[None, :]
    if not rows.any():
        return None
    return rows


def exclusion_for(positions: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """`positions` as a mask broadcastable to an output of `shape` [batch, query, ...]; None
    when the output's leading axes are not the blocks' batch and query (a query axis of 1: the
    mask is the same for every query, so a masked row masks the whole sequence)."""
    if (
        len(shape) < 2
        or positions.shape[1] not in (1, shape[1])
        or positions.shape[0] not in (1, shape[0])
    ):
        return None
    return positions.reshape(positions.shape + (1,) * (len(shape) - 2))


def leave_out_masked_rows(
    reference: LoadedModel,
    feeds: Mapping[str, np.ndarray],
    comparisons: tuple[OutputComparison, ...],
    reference_outputs: Mapping[str, np.ndarray],
    candidate_outputs: Mapping[str, np.ndarray],
    tolerance: Tolerance,
) -> tuple[tuple[OutputComparison, ...], list[str]]:
    """`comparisons` with each failed output that passes once the positions every key masks are
    left out compared so, and a note for each (the others as they were). `candidate_outputs`
    by the reference's output names; `feeds` as the reference ran."""
    step("comparing again without the query positions every key masks")
    positions = fully_masked_positions(reference, feeds)
    if positions is None:
        return comparisons, []
    kept, notes = [], []
    for comparison in comparisons:
        name = comparison.name
        exclude = exclusion_for(positions, comparison.shape)
        again = None
        if not comparison.passed and exclude is not None and comparison.problem is None:
            again = compare_output(
                name, reference_outputs[name], candidate_outputs[name], tolerance, exclude=exclude
            )
        if again is None or not again.passed:
            kept.append(comparison)
            continue
        kept.append(again)
        rows = np.argwhere(np.broadcast_to(positions, comparison.shape[:2]))
        shown = ", ".join(f"({b}, {s})" for b, s in rows[:4]) + (", ..." if len(rows) > 4 else "")
        notes.append(
            f"output '{name}' differs beyond tolerance only at the {len(rows)} (batch, position)s "
            f"whose every key is masked ({shown}: padding, which no valid position reads), "
            "where the chain and a fused kernel legitimately differ (the chain rounds the fill "
            "plus each score in its type, in float16 -65504 in steps of 32; a fused kernel keeps "
            f"it exact): left out of its verdict ({again.excluded} elements; the rest within "
            "tolerance)"
        )
    return tuple(kept), notes
