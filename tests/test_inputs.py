"""Input specs, --shape/--range parsing, seeded generation and npz loading, on tiny graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.validation.inputs import (
    InputSpec,
    ValidationUsageError,
    ValueRange,
    check_same_inputs,
    input_specs,
    make_inputs,
    parse_range,
    parse_shape,
)


def _text_model(vocab: int = 50, input_type: int = TensorProto.INT64) -> onnx.ModelProto:
    """ids [batch, seq] → Cast → Gather(table [vocab, 4]) ; mask [batch, seq] float → Mul."""
    table = numpy_helper.from_array(np.zeros((vocab, 4), np.float32), "table")
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], name="cast", to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "ids64"], ["emb"], name="/emb/Gather"),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["mask3"], name="unsq"),
        helper.make_node("Mul", ["emb", "mask3"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "text",
        [
            helper.make_tensor_value_info("ids", input_type, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [table, numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _image_model(elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["pixels"], ["y"])],
        "img",
        [helper.make_tensor_value_info("pixels", elem, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", elem, [1, 3, 4, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("pixel_values:1x3x384x384", ("pixel_values", (1, 3, 384, 384))),
        ("input:0:2x7", ("input:0", (2, 7))),  # TensorFlow-style names keep their colon
        ("ids:2,8", ("ids", (2, 8))),
        ("scalar:", ("scalar", ())),
    ],
)
def test_parse_shape(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [("1x3x384", "is not NAME:DIMS"), ("x:1xAx3", "are not integers"), ("x:1x0", "at least 1")],
)
def test_parse_shape_errors(text, message):
    with pytest.raises(ValidationUsageError, match=message):
        parse_shape(text)


def test_parse_range():
    assert parse_range("input_ids:0:49407") == ("input_ids", ValueRange(0, 49407))
    assert parse_range("x:-1.5:2") == ("x", ValueRange(-1.5, 2))
    for bad, message in (
        ("ids:5", "NAME:LOW:HIGH"),
        ("ids:a:b", "must be numbers"),
        ("ids:3:1", "LOW <= HIGH"),
    ):
        with pytest.raises(ValidationUsageError, match=message):
            parse_range(bad)


def test_input_specs_skip_initializers_and_keep_symbols():
    model = _text_model()
    model.graph.input.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, [50, 4]))
    specs = input_specs(model)
    assert [s.name for s in specs] == ["ids", "mask"]
    assert specs[0].shape == ("batch", "seq") and specs[0].dtype == np.int64


def test_seeded_generation_is_reproducible_and_per_input():
    model = _image_model()
    a = make_inputs(model, seed=0).feeds["pixels"]
    assert np.array_equal(a, make_inputs(model, seed=0).feeds["pixels"])
    assert not np.array_equal(a, make_inputs(model, seed=1).feeds["pixels"])
    assert a.dtype == np.float32 and a.shape == (1, 3, 4, 4)
    assert a.min() >= -1 and a.max() < 1


def test_float_range_and_origin():
    data = make_inputs(_image_model(), ranges={"pixels": (0, 255)})
    assert data.feeds["pixels"].min() >= 0 and data.feeds["pixels"].max() > 1
    assert data.sources[0].origin == "uniform [0, 255) (given range), seed 0"


def test_dynamic_dims_need_a_shape_and_the_error_says_how():
    with pytest.raises(ValidationUsageError) as err:
        make_inputs(_text_model())
    message = str(err.value)
    assert "ids [batch, seq]" in message and "mask [batch, seq]" in message
    assert "--shape ids:NxN" in message


def test_one_shape_resolves_shared_symbols():
    data = make_inputs(_text_model(), shapes={"ids": (2, 9)})
    assert data.feeds["mask"].shape == (2, 9)


def test_integer_range_is_inferred_from_the_gather_table():
    data = make_inputs(_text_model(vocab=7), shapes={"ids": (4, 64)}, seed=5)
    ids = data.feeds["ids"]
    assert ids.min() >= 0 and ids.max() == 6  # 256 draws from 0..6 reach the top
    assert "random integers 0..6 (indices of Gather '/emb/Gather')" in data.sources[0].origin


def test_given_integer_range_wins_and_default_is_named():
    model = _text_model()
    given = make_inputs(model, shapes={"ids": (1, 200)}, ranges={"ids": (10, 12)})
    assert set(np.unique(given.feeds["ids"])) == {10, 11, 12}
    model.graph.node[1].input[1] = "nothing"  # the ids no longer index the table
    default = make_inputs(model, shapes={"ids": (1, 8)})
    assert "0..1 (default range; pass --range" in default.sources[0].origin


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shapes": {"ids": (1, 2, 3)}}, "does not fit the model's ids"),
        ({"shapes": {"ids": (1, 0)}}, "must hold integers >= 1"),
        ({"shapes": {"ids": (1, 2)}, "seed": -1}, "seed must be an integer >= 0"),
        ({"shapes": {"nope": (1,)}}, "--shape names nope"),
        ({"shapes": {"ids": (1, 2)}, "ranges": {"other": (0, 1)}}, "--range names other"),
        ({"shapes": {"ids": (1, 2)}, "ranges": {"ids": (0.2, 0.7)}}, "holds no integer"),
    ],
)
def test_bad_shapes_and_ranges(kwargs, message):
    with pytest.raises(ValidationUsageError, match=message):
        make_inputs(_text_model(), **kwargs)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT16])
def test_an_input_too_large_to_draw_is_refused_before_any_allocation(elem):
    """2**31 - 1 elements of a 2-byte type: 4 GiB as stored, but numpy draws them as 8-byte
    values first (16 GiB: the fuzz campaign's MemoryError under its 8 GiB address-space cap)."""
    x = helper.make_tensor_value_info("x", elem, ["n"])
    y = helper.make_tensor_value_info("y", elem, ["n"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValidationUsageError, match=r"'x' \[2147483647\] would take 16 GiB"):
        make_inputs(model, shapes={"x": (2**31 - 1,)})


def test_static_dims_cannot_be_overridden():
    with pytest.raises(
        ValidationUsageError, match=r"does not fit the model's pixels \[1, 3, 4, 4\]"
    ):
        make_inputs(_image_model(), shapes={"pixels": (2, 3, 4, 4)})


def test_npz_inputs(tmp_path):
    path = tmp_path / "in.npz"
    ids = np.arange(6, dtype=np.int32).reshape(1, 6)
    np.savez(path, ids=ids, mask=np.ones((1, 6), np.float32), extra=np.zeros(1))
    data = make_inputs(_text_model(), npz=path)
    assert data.feeds["ids"].dtype == np.int64 and np.array_equal(data.feeds["ids"], ids)
    assert data.sources[0].origin == "from in.npz"
    assert data.notes == ("npz arrays not used by the model: extra",)


def test_npz_problems(tmp_path):
    model = _text_model()
    path = tmp_path / "in.npz"
    np.savez(path, ids=np.zeros((1, 6), np.int64))
    with pytest.raises(
        ValidationUsageError,
        match="the inputs lack mask; they hold ids and the model takes ids, mask",
    ):
        make_inputs(model, npz=path)
    np.savez(path, ids=np.zeros((1, 6), np.int64), mask=np.ones((1, 6, 1), np.float32))
    with pytest.raises(ValidationUsageError, match=r"'mask' has shape \[1, 6, 1\] in the npz"):
        make_inputs(model, npz=path)
    np.savez(path, ids=np.zeros((1, 6), np.float32), mask=np.ones((1, 6), np.float32))
    with pytest.raises(
        ValidationUsageError, match="'ids' is float32 in the npz but the model takes int64"
    ):
        make_inputs(model, npz=path)
    with pytest.raises(ValidationUsageError, match="cannot be combined with --shape"):
        make_inputs(model, npz=path, shapes={"ids": (1, 6)})
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    with pytest.raises(ValidationUsageError, match=r"is not a readable \.npz"):
        make_inputs(model, npz=bad)
    with pytest.raises(ValidationUsageError, match="inputs file not found"):
        make_inputs(model, npz=tmp_path / "missing.npz")


def test_inputs_given_as_arrays():
    arrays = {"pixels": np.full((1, 3, 4, 4), 0.5, np.float32)}
    data = make_inputs(_image_model(), npz=arrays)
    assert np.array_equal(data.feeds["pixels"], arrays["pixels"])
    assert data.sources[0].origin == "given array"


def test_check_same_inputs():
    fp32 = input_specs(_image_model())
    fp16 = input_specs(_image_model(TensorProto.FLOAT16))
    assert check_same_inputs(fp32, fp16) == (
        "input 'pixels': the same values are cast to float32 for the original "
        "and float16 for the candidate",
    )
    with pytest.raises(
        ValidationUsageError,
        match=r"only the original has \['pixels'\], only the candidate has \['ids', 'mask'\]",
    ):
        check_same_inputs(fp32, input_specs(_text_model()))
    with pytest.raises(
        ValidationUsageError, match="int64 in the original but int32 in the candidate"
    ):
        check_same_inputs(
            input_specs(_text_model()), input_specs(_text_model(input_type=TensorProto.INT32))
        )
    other = [InputSpec("pixels", TensorProto.FLOAT, (1, 3, 8, 8))]
    with pytest.raises(
        ValidationUsageError, match=r"\[1, 3, 4, 4\] in the original but \[1, 3, 8, 8\]"
    ):
        check_same_inputs(fp32, other)


def _masked_scores(mask_type: int, mask_nodes: list, mask_out: str, name: str) -> onnx.ModelProto:
    """scores [batch, seq, seq] + bias made from a mask input [batch, seq] by `mask_nodes`."""
    nodes = [
        *mask_nodes,
        helper.make_node("Unsqueeze", [mask_out, "axes"], ["bias3"]),
        helper.make_node("Add", ["scores", "bias3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 5, 5]),
            helper.make_tensor_value_info(name, mask_type, [2, 5]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 5])],
        [
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "min"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_transformers_style_integer_mask_keeps_every_key_by_its_role():
    """(1 - mask) * finfo.min, under a name that does not say "mask": the graph shows the role."""
    nodes = [
        helper.make_node("Cast", ["keep"], ["keepf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "keepf"], ["inverted"]),
        helper.make_node("Mul", ["inverted", "min"], ["bias"]),
    ]
    data = make_inputs(_masked_scores(TensorProto.INT64, nodes, "bias", "keep"))
    assert np.array_equal(data.feeds["keep"], np.ones((2, 5), np.int64))
    (source,) = [s for s in data.sources if s.name == "keep"]
    assert source.origin.startswith("all 1 (a mask: the graph turns 0 into a blocking score bias")


def test_bool_padding_mask_that_blocks_where_true_is_all_false():
    """PyTorch's key_padding_mask: Where(pad, -inf, 0): True blocks, so every key kept is False."""
    nodes = [helper.make_node("Where", ["pad", "ninf", "zero"], ["bias"])]
    data = make_inputs(_masked_scores(TensorProto.BOOL, nodes, "bias", "pad"))
    assert data.feeds["pad"].dtype == np.bool_ and not data.feeds["pad"].any()
    inverted = [  # the same mask read through Not: True keeps
        helper.make_node("Not", ["keep"], ["pad"]),
        helper.make_node("Where", ["pad", "ninf", "zero"], ["bias"]),
    ]
    data = make_inputs(_masked_scores(TensorProto.BOOL, inverted, "bias", "keep"))
    assert data.feeds["keep"].all()


def test_mask_by_name_when_the_graph_does_not_show_its_role():
    nodes = [helper.make_node("Cast", ["attention_mask"], ["bias"], to=TensorProto.FLOAT)]
    model = _masked_scores(TensorProto.INT64, nodes, "bias", "attention_mask")
    data = make_inputs(model)
    assert np.array_equal(data.feeds["attention_mask"], np.ones((2, 5), np.int64))
    (source,) = [s for s in data.sources if s.name == "attention_mask"]
    assert "a mask by its name: 1 keeps a key" in source.origin
    padding = [helper.make_node("Cast", ["key_padding_mask"], ["bias"], to=TensorProto.FLOAT)]
    model = _masked_scores(TensorProto.BOOL, padding, "bias", "key_padding_mask")
    assert not make_inputs(model).feeds["key_padding_mask"].any()  # True marks padding
    given = make_inputs(model, ranges={"key_padding_mask": (0, 1)})  # the user's range wins
    (source,) = [s for s in given.sources if s.name == "key_padding_mask"]
    assert "random booleans" in source.origin


def test_float_mask_scaled_to_a_blocking_bias_is_all_ones_by_its_role():
    """BERT's legacy float mask: (1 - mask) * -10000; the test text model's float `mask`
    multiplies an embedding instead, so it stays uniform random."""
    nodes = [
        helper.make_node("Sub", ["one", "keep"], ["inverted"]),
        helper.make_node("Mul", ["inverted", "min"], ["bias"]),
    ]
    data = make_inputs(_masked_scores(TensorProto.FLOAT, nodes, "bias", "keep"))
    assert np.array_equal(data.feeds["keep"], np.ones((2, 5), np.float32))
    assert make_inputs(_text_model(), shapes={"ids": (2, 9)}).feeds["mask"].min() < 0


def test_integer_input_that_is_no_mask_stays_random():
    nodes = [helper.make_node("Cast", ["step"], ["bias"], to=TensorProto.FLOAT)]
    data = make_inputs(_masked_scores(TensorProto.INT64, nodes, "bias", "step"), seed=3)
    assert set(np.unique(data.feeds["step"])) == {0, 1}


def _causal_lm_entries():
    import fusion_corpus
    import lm_corpus
    import model_corpus

    ours = [(e, lm_corpus.model_path) for e in lm_corpus.CAUSAL_LMS]
    ours += [
        (e, fusion_corpus.model_path)
        for e in fusion_corpus.ENTRIES
        if e.model in ("bloom", "falcon")
    ]
    theirs = [
        (e, model_corpus.model_path)
        for e in model_corpus.CORPUS
        if e.model in ("gpt2_eager", "gpt2_sdpa", "llama_eager", "llama_sdpa", "gemma2_eager")
    ]
    return [pytest.param(e, path, id=e.name, marks=pytest.mark.slow) for e, path in ours + theirs]


@pytest.mark.parametrize("entry, exported", _causal_lm_entries())
def test_causal_lm_passes_validate_after_precision_with_default_inputs(entry, exported):
    """Qwen2/3, Phi-3, Gemma 2/3, Mistral (sliding window), OPT, BLOOM, Falcon, GPT-2, Llama;
    both exporters."""
    pytest.importorskip("torch", reason="exporting the corpus model needs torch")
    from graphfix.precision.convert import convert_precision
    from graphfix.validation.validate import validate

    model = onnx.load(str(exported(entry)))
    converted = convert_precision(model, to="float16").model
    report = validate(model, converted, backend="onnxruntime")
    mask = next(s for s in report.inputs if s.name == "attention_mask")
    assert mask.origin.startswith("all 1 (a mask"), mask.origin  # every key kept, and said why
    ids = next(s for s in report.inputs if s.name == "input_ids")
    assert "random integers 0..63 (indices of Gather" in ids.origin  # inside the vocabulary
    assert report.passed, report.summary(histograms=False)
