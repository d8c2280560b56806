"""Query positions every key masks: validate leaves them out, and only them (validation.masked_rows).

New-user probe (session 8): GPT-NeoX and OLMo exported in float16 (`model.half()`, eager
attention) and rewritten by `fix --strategy fused_plugin` or `native_attention` failed validate on
left-padded inputs, by 0.02 at the padded positions only. There the causal and padding masks
block every key; the chain adds float16's -65504 to each score and rounds in steps of 32 (an about
uniform row), the fused node adds it exactly. No valid position reads those rows, so the rewrite
is not wrong: validate (and locate, which judges outputs alike) now says so and compares the
rest. A minimal graph shows it, with the cases that must still fail.
"""

from __future__ import annotations

import model_corpus
import numpy as np
import onnx
import pytest
from graphs import B, S, Variant, attention_model

import graphfix
from graphfix.precision.locate import locate
from graphfix.validation.compare import Tolerance, compare_output
from graphfix.validation.validate import validate

F16 = onnx.TensorProto.FLOAT16
LOWEST = np.float16(-65504.0)


def _padded_causal_model() -> onnx.ModelProto:
    """float16 attention whose additive mask input is [B, 1, S, S], as a causal LM builds it."""
    model = attention_model(Variant(dtype=F16, mask="add", scale="mul_after"))
    (mask,) = [i for i in model.graph.input if i.name == "mask"]
    mask.type.tensor_type.shape.dim[2].dim_value = S
    return model


def _feeds(pad: int) -> dict[str, np.ndarray]:
    """Batch 1 left-padded by `pad` tokens: its first `pad` query rows have every key masked."""
    rng = np.random.default_rng(3)
    causal = np.triu(np.full((S, S), LOWEST, np.float16), k=1)
    mask = np.broadcast_to(causal, (B, 1, S, S)).copy()
    mask[1, :, :, :pad] = LOWEST
    x = rng.standard_normal((B, S, 12)).astype(np.float16)
    return {"x": x, "mask": mask}


def _validate_pair(tmp_path, original, candidate, feeds):
    """Both models saved under `tmp_path`, then validated on onnxruntime on `feeds`."""
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(candidate, tmp_path / "candidate.onnx")
    return validate(
        tmp_path / "original.onnx", tmp_path / "candidate.onnx", inputs=feeds, backend="onnxruntime"
    )


@pytest.mark.parametrize("strategy", ["fused_plugin", "native_attention"])
def test_a_fused_rewrite_differs_only_where_every_key_is_masked(tmp_path, strategy) -> None:
    original = _padded_causal_model()
    fixed = graphfix.fix_attention(original, strategy=strategy)
    assert fixed.report.blocks[0].rewritten
    feeds = _feeds(pad=2)
    report = _validate_pair(tmp_path, original, fixed.model, feeds)
    assert report.passed, report.summary()
    (note,) = [n for n in report.notes if "every key is masked" in n]
    assert "(1, 0), (1, 1):" in note
    (output,) = report.outputs
    assert output.excluded == 2 * 12  # the two padded rows of batch 1, 12 features each
    # the rows left out really differ, and only they: the chain's row is about uniform
    ref, cand = report.reference_outputs["y"], report.candidate_outputs["y"]
    diff = np.abs(ref.astype(np.float32) - cand.astype(np.float32)).max(axis=-1)
    assert diff[1, :2].min() > 0.01 and diff[0].max() < 0.01 and diff[1, 2:].max() < 0.01
    # locate judges the outputs as validate does
    located = locate(tmp_path / "original.onnx", tmp_path / "candidate.onnx", inputs=feeds)
    assert not located.diverges, located.summary()
    assert any("every key is masked" in n for n in located.notes)
    assert located.to_dict()["outputs"][0]["excluded"] == 2 * 12


def test_without_fully_masked_rows_nothing_is_left_out(tmp_path) -> None:
    original = _padded_causal_model()
    fixed = graphfix.fix_attention(original, strategy="fused_plugin")
    report = _validate_pair(tmp_path, original, fixed.model, _feeds(0))
    assert report.passed and report.outputs[0].excluded == 0
    assert not any("every key is masked" in n for n in report.notes)


def test_an_error_at_a_valid_position_still_fails(tmp_path) -> None:
    """A candidate wrong at a position that has keys: the exclusion must not hide it."""
    original = _padded_causal_model()
    broken = graphfix.fix_attention(original, strategy="fused_plugin").model
    (o_proj,) = [t for t in broken.graph.initializer if t.name == "Wo"]
    weights = onnx.numpy_helper.to_array(o_proj).copy()
    weights[0, 0] += np.float16(0.5)
    o_proj.CopyFrom(onnx.numpy_helper.from_array(weights, "Wo"))
    report = _validate_pair(tmp_path, original, broken, _feeds(2))
    assert not report.passed
    assert not any("every key is masked" in n for n in report.notes)


def test_compare_leaves_out_only_finite_candidate_values() -> None:
    tolerance = Tolerance(atol=0.01, rtol=0.01)
    reference = np.zeros((2, 3, 4), np.float32)
    candidate = reference.copy()
    candidate[1, 0] = 1.0  # a padded row, wrong
    exclude = np.zeros((2, 3, 1), bool)
    exclude[1, 0] = True
    assert not compare_output("y", reference, candidate, tolerance).passed
    left_out = compare_output("y", reference, candidate, tolerance, exclude=exclude)
    assert left_out.passed and left_out.excluded == 4 and left_out.mismatches == 0
    candidate[1, 0, 0] = np.nan  # a NaN there would poison any position that reads it
    nan = compare_output("y", reference, candidate, tolerance, exclude=exclude)
    assert not nan.passed and nan.nonfinite_mismatches == 1 and nan.excluded == 3
    candidate[1, 0, 0] = 1.0
    candidate[0, 2, 3] = 1.0  # a valid position, wrong
    assert not compare_output("y", reference, candidate, tolerance, exclude=exclude).passed


def test_gpt_neox_float16_export_with_left_padding(tmp_path) -> None:
    """A real export: GPT-NeoX in float16 (eager attention, random weights), left-padded batch."""
    torch, transformers = model_corpus.import_transformers(
        "exporting GPT-NeoX needs torch and transformers"
    )
    config = transformers.GPTNeoXConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPTNeoXModel(config).eval().half()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, keep):
            return self.model(input_ids=ids, attention_mask=keep).last_hidden_state

    ids = torch.tensor(np.random.default_rng(0).integers(3, 100, (2, 12)))
    keep = torch.ones(2, 12, dtype=torch.int64)
    keep[1, :4] = 0  # left padding
    path = tmp_path / "neox.onnx"
    torch.onnx.export(
        Hidden(), (ids, keep), path, input_names=["ids", "keep"], opset_version=17, dynamo=False
    )
    fixed = graphfix.fix_attention(onnx.load(path), strategy="fused_plugin")
    assert all(b.rewritten for b in fixed.report.blocks)
    onnx.save(fixed.model, tmp_path / "neox.fused.onnx")
    feeds = {"ids": ids.numpy(), "keep": keep.numpy()}
    report = validate(path, tmp_path / "neox.fused.onnx", inputs=feeds, backend="onnxruntime")
    assert report.passed, report.summary()
    assert any("(1, 0), (1, 1), (1, 2), (1, 3):" in n for n in report.notes)


def test_when_the_masks_cannot_be_read_the_verdict_stands(tmp_path, monkeypatch) -> None:
    """Reading the masks loads the original once more; if that runs out of memory, validate
    reports the FAIL it measured instead of a traceback."""
    from graphfix.precision.locate import reference

    def out_of_memory(self, names, feeds):
        raise MemoryError

    monkeypatch.setattr(reference.TensorStreamer, "fetch", out_of_memory)
    original = _padded_causal_model()
    fixed = graphfix.fix_attention(original, strategy="fused_plugin")
    report = _validate_pair(tmp_path, original, fixed.model, _feeds(2))
    assert not report.passed and report.outputs[0].excluded == 0
