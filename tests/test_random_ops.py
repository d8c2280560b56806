"""Random ops drawn alike on both sides of every onnxruntime comparison (graphfix.validation.random_ops).

New-user probe (session 8): ViT-MAE draws a random patch order (RandomUniformLike → TopK →
GatherElements). `graphfix precision --to bfloat16` kept the random node as it was, yet validate
said FAIL and locate blamed the random node: without a seed, how many numbers onnxruntime has drawn
before depends on how each side is run, so the two sides shuffled the patches differently. A
minimal graph with the same shape of computation, and a real export, show it.
"""

from __future__ import annotations

import model_corpus
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.precision.convert import convert_precision
from graphfix.precision.locate import locate
from graphfix.validation.random_ops import (
    node_seed,
    random_note,
    seed_random_ops,
    unseeded_random_nodes,
)
from graphfix.validation.validate import validate


def _shuffle_model() -> onnx.ModelProto:
    """out = shuffle(x, argsort(uniform noise)) · w: ViT-MAE's random patch order in four nodes."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [
        helper.make_node(
            "RandomUniformLike", ["x"], ["noise"], dtype=TensorProto.FLOAT, name="noise"
        ),
        helper.make_node("TopK", ["noise", "k"], ["v", "order"], axis=1, largest=0, name="argsort"),
        helper.make_node("GatherElements", ["x", "order"], ["shuffled"], axis=1, name="shuffle"),
        helper.make_node("MatMul", ["shuffled", "w"], ["out"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "shuffle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.array([8], np.int64), "k"), numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("to", ["float16", "bfloat16"])
def test_validate_and_locate_draw_alike_on_both_sides(tmp_path, to) -> None:
    original = _shuffle_model()
    converted = convert_precision(original, to=to).model
    assert unseeded_random_nodes(converted)  # the conversion leaves the random node unseeded
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(converted, tmp_path / "converted.onnx")
    written = (tmp_path / "converted.onnx").read_bytes()

    report = validate(
        tmp_path / "original.onnx", tmp_path / "converted.onnx", backend="onnxruntime"
    )
    assert report.passed, report.summary()
    assert any("seed made from its name" in note for note in report.notes)
    located = locate(tmp_path / "original.onnx", tmp_path / "converted.onnx")
    assert not located.diverges, located.summary()
    assert (tmp_path / "converted.onnx").read_bytes() == written  # only the run copies are seeded


def test_a_seed_depends_on_the_node_alone_and_a_given_seed_is_kept() -> None:
    model = _shuffle_model()
    seeded = seed_random_ops(model)
    assert seeded is not None and not unseeded_random_nodes(seeded)
    assert unseeded_random_nodes(model)  # the caller's model is not mutated
    (node,) = [n for n in seeded.graph.node if n.op_type == "RandomUniformLike"]
    seed = helper.get_attribute_value(node.attribute[-1])
    assert seed == node_seed(node) == float(int(seed)) and 0 <= seed < 2**24
    renamed = helper.make_node("RandomUniformLike", ["x"], ["noise"], name="other")
    assert node_seed(renamed) != seed  # another name draws other numbers
    assert seed_random_ops(seeded) is None  # already seeded: nothing to add


def test_the_tensorrt_note_says_the_draws_differ_by_design() -> None:
    """Wiring only: TensorRT is not installed here, so only the note's wording is checked."""
    model = _shuffle_model()
    (note,) = random_note(model, model, candidate_on_onnxruntime=False)
    assert "RandomUniformLike 'noise'" in note and "differ by design" in note
    plain = _shuffle_model()
    del plain.graph.node[0]
    assert random_note(plain, plain, candidate_on_onnxruntime=True) == []


def test_vit_mae_export_in_bfloat16_validates(tmp_path) -> None:
    """A real export: ViT-MAE (transformers, random weights) shuffles its patches at random."""
    torch, transformers = model_corpus.import_transformers(
        "exporting ViT-MAE needs torch and transformers"
    )
    config = transformers.ViTMAEConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, mask_ratio=0.25,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = transformers.ViTMAEModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixels):
            return self.model(pixel_values=pixels).last_hidden_state

    path = tmp_path / "vit_mae.onnx"
    pixels = torch.randn(2, 3, 32, 32)
    torch.onnx.export(
        Hidden(), (pixels,), path, input_names=["pixels"], opset_version=17, dynamo=False
    )
    converted = convert_precision(onnx.load(path), to="bfloat16").model
    onnx.save(converted, tmp_path / "vit_mae.bf16.onnx")
    report = validate(path, tmp_path / "vit_mae.bf16.onnx", backend="onnxruntime")
    assert report.passed, report.summary()
