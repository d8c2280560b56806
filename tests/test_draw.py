"""graphfix.attention.draw: which nodes one attention block's picture holds, how they are marked, PNGs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from graphs import Variant, attention_model, non_attention_models

import graphfix
from graphfix.attention.draw import draw_attention_block, draw_before_after

# The tiny chain of tests/graphs.py with an additive mask fed straight from a graph input:
# q_heads, k_transpose → qk → scale_div → mask_add(+mask) → softmax → pv(+v_heads) → merge_t
BOXES_BEFORE = {
    ("Transpose", "q_heads"),
    ("Transpose", "k_transpose"),
    ("MatMul", "qk"),
    ("Div", "scale_div"),
    ("input", "mask"),
    ("Add", "mask_add"),
    ("Softmax", "softmax"),
    ("Transpose", "v_heads"),
    ("MatMul", "pv"),
    ("Transpose", "merge_t"),
}
PLUGIN_FACE, ADDED_FACE = "#d1495b", "#b7e4c7"


def _model():
    return attention_model(Variant(mask="add"))


def _box_texts(axes) -> list[tuple[str, str]]:
    """(op type, short name) of each box in drawing order: a bold title over a smaller name."""
    texts = [t for t in axes.texts if t.get_fontweight() != "bold" or t.get_fontsize() == 9]
    titles = [t.get_text() for t in texts if t.get_fontsize() == 9]
    names = [t.get_text() for t in texts if t.get_fontsize() == 7]
    return list(zip(titles, names, strict=True))


def _boxes(axes) -> set[tuple[str, str]]:
    return set(_box_texts(axes))


def _edge_labels(axes) -> set[str]:
    return {t.get_text() for t in axes.texts if t.get_fontsize() == 8}


def _face(axes, op: str) -> str:
    """Face colour of the box whose op type reads `op`, as #rrggbb."""
    from matplotlib.colors import to_hex

    boxes = [p for p in axes.patches if type(p).__name__ == "FancyBboxPatch"]
    index = [title for title, _ in _box_texts(axes)].index(op)
    return to_hex(boxes[index].get_facecolor())


def test_block_holds_the_chain_its_producers_and_its_consumer(tmp_path: Path) -> None:
    figure = draw_attention_block(_model())
    (axes,) = figure.axes
    assert _boxes(axes) == BOXES_BEFORE
    assert _edge_labels(axes) == {"Q", "Kᵀ", "V", "mask"}
    assert axes.get_title() == "attention block 0 (self): softmax"

    path = tmp_path / "block.png"
    figure.savefig(path, dpi=80)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_before_after_plugin_replaces_only_the_softmax(tmp_path: Path) -> None:
    model = _model()
    figure = draw_before_after(model, graphfix.break_attention_fusion(model))
    before, after = figure.axes
    assert _boxes(before) == BOXES_BEFORE
    assert _boxes(after) == BOXES_BEFORE - {("Softmax", "softmax")} | {
        ("GraphfixSoftmax", "softmax")
    }
    assert _face(after, "GraphfixSoftmax") == PLUGIN_FACE
    assert after.get_title() == "after: plugin node"
    figure.savefig(tmp_path / "before_after.png", dpi=80)
    assert (tmp_path / "before_after.png").stat().st_size > 10_000


def test_before_after_marks_nodes_a_heuristic_inserted() -> None:
    model = _model()
    figure = draw_before_after(
        model, graphfix.break_attention_fusion(model, strategy="max_subtract")
    )
    _, after = figure.axes
    added = _boxes(after) - BOXES_BEFORE
    assert {op for op, _ in added} == {"ReduceMax", "Sub"}
    assert _face(after, "ReduceMax") == ADDED_FACE
    assert after.get_title() == "after: nodes added"


def test_before_after_shows_a_softmax_marked_as_output() -> None:
    model = _model()
    figure = draw_before_after(
        model, graphfix.break_attention_fusion(model, strategy="mark_output")
    )
    _, after = figure.axes
    assert _boxes(after) - BOXES_BEFORE == {("output", "probs")}
    assert after.get_title() == "after: new graph output"


def test_before_after_with_the_whole_chain_in_one_node() -> None:
    model = _model()
    fixed = graphfix.break_attention_fusion(model, strategy="fused_plugin")
    _, after = draw_before_after(model, fixed).axes
    ops = {op for op, _ in _boxes(after)}
    assert "GraphfixAttention" in ops
    assert ops.isdisjoint({"Softmax", "MatMul", "Div", "Add"})


def test_a_rewritten_model_draws_on_its_own_by_the_original_names() -> None:
    fixed = graphfix.break_attention_fusion(_model())
    figure = draw_attention_block(fixed, block="softmax", title="fixed")
    (axes,) = figure.axes
    assert ("GraphfixSoftmax", "softmax") in _boxes(axes)
    assert axes.get_title() == "fixed"


def test_draws_into_given_axes() -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 8))
    axes = figure.add_subplot()
    assert draw_attention_block(_model(), ax=axes) is figure
    assert _boxes(axes) == BOXES_BEFORE


def test_block_out_of_range_lists_the_blocks() -> None:
    with pytest.raises(graphfix.SelectionError, match=r"numbered 0\.\.0 .* softmax"):
        draw_attention_block(_model(), block=3)


def test_model_without_attention_says_so() -> None:
    with pytest.raises(graphfix.SelectionError, match="no attention block"):
        draw_attention_block(non_attention_models()["classifier"])


def test_fixed_model_that_is_not_a_rewrite_of_the_original() -> None:
    with pytest.raises(graphfix.GraphfixError, match="no node producing 'ctx_bhsd'"):
        draw_before_after(_model(), non_attention_models()["classifier"])


def test_no_pyplot_and_no_display_needed(tmp_path: Path) -> None:
    code = (
        "import sys, graphfix.attention.draw as d\n"
        "assert 'matplotlib' not in sys.modules, 'imported matplotlib on import'\n"
        "sys.path.insert(0, 'tests')\n"
        "from graphs import Variant, attention_model\n"
        f"d.draw_attention_block(attention_model(Variant())).savefig({str(tmp_path / 'a.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    hidden = ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.png").stat().st_size > 5_000
