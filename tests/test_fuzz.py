"""The fuzzing campaign (tests/fuzz_onnx.py): a smoke run, and each finding fixed as a regression.

The campaign itself (`python tests/fuzz_onnx.py --cases 20000`) runs outside CI; this file runs a
fixed, seeded slice of it and replays the cases that once crashed graphfix.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import fuzz_onnx
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import ModelLoadError
from graphfix.examples import vit_example
from graphfix.model_io import load_model


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(plan=fuzz_onnx.plans())
def test_fuzz_smoke(plan):
    outcome = fuzz_onnx.run_case(plan)
    assert outcome.ok, f"{plan.to_json()}\n{outcome.findings[0].detail}"


# (plan, answers the commands must give among theirs): cases the campaign found, replayed.
REGRESSIONS = [
    (  # an initializer's raw_data shorter than its shape: numpy's reshape error escaped inspect
        '{"command": "qdq", "mutations": [{"a": 3198, "b": 579, "c": 10726, "kind": '
        '"raw_truncate"}], "seed": "eager_bf16-legacy17", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # an initializer retyped with its bytes kept: the checker accepts data longer than needed
        '{"command": "inspect", "mutations": [{"a": 363, "b": 198, "c": 488, "kind": "dtype"}, '
        '{"a": 363, "b": 198, "c": 488, "kind": "dtype"}, {"a": 363, "b": 8119, "c": 499, '
        '"kind": "dtype"}], "seed": "eager_einsum-legacy17", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # a Constant node's value cut short: its reading escaped the matcher's constant folding
        '{"command": "locate", "mutations": [{"a": 537, "b": 21950, "c": 44463, "kind": '
        '"constant_value"}, {"a": 537, "b": 19295, "c": 1799, "kind": "constant_value"}], '
        '"seed": "sdpa_cross-legacy17", "strategy": "max_subtract"}',
        [("inspect", 2)],
    ),
    (  # a graph input 2**40 long: validate drew its random inputs until numpy gave up
        '{"command": "validate", "mutations": [{"a": 5809, "b": 2051, "c": 2834, "kind": "dim"}, '
        '{"a": 2834, "b": 2051, "c": 2834, "kind": "dim"}, {"a": 5809, "b": 2051, "c": 2834, '
        '"kind": "dim"}], "seed": "vit_demo", "strategy": "max_subtract"}',
        [("validate", 2)],
    ),
    (  # an initializer of element type 999: numpy's type table raised KeyError
        '{"command": "inspect", "mutations": [{"a": 76, "b": 76, "c": 76, "kind": "dtype"}], '
        '"seed": "eager_einsum-legacy17", "strategy": "fused_plugin"}',
        [("inspect", 2)],
    ),
    (  # external data of length -5: precision's streamed conversion read a negative length
        '{"command": "locate", "mutations": [{"a": 85, "b": 16505, "c": 9012, "kind": '
        '"external"}, {"a": 15172, "b": 16483, "c": 1917, "kind": "dim"}], "seed": '
        '"sdpa_mask-dynamo23", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # an int8 weight cut short, read as a reference into the .onnx file (1 KB and more)
        '{"command": "inspect", "mutations": [{"a": 22193, "b": 22193, "c": 2408, "kind": '
        '"raw_truncate"}], "seed": "sdpa_mask-ort_qdq", "strategy": "fused_plugin"}',
        [("inspect", 2)],
    ),
    (  # Cast(to=99): the element type's name was looked up in onnx's enum, which raised
        '{"command": "locate", "mutations": [{"a": 4859, "b": 4859, "c": 6386, "kind": '
        '"attr_value"}], "seed": "sdpa_fp16-legacy17", "strategy": "mark_output"}',
        [("inspect", 2)],
    ),
    (  # a value_info of element type 999: the fused strategy named it through onnx's enum
        '{"command": "validate", "mutations": [{"a": 41470, "b": 13760, "c": 379, "kind": '
        '"dtype"}, {"a": 447, "b": 215, "c": 4847, "kind": "rank"}, {"a": 4770, "b": 79, "c": '
        '9223, "kind": "name_clash"}], "seed": "sdpa_mask-dynamo18", "strategy": "fused_plugin"}',
        [("inspect", 2)],
    ),
    (  # graph input and output of element type UNDEFINED: onnxruntime's symbolic shape
        # inference (the Q/DQ lint's) looped for ever
        '{"command": "inspect", "mutations": [{"a": 1153, "b": 130, "c": 1220, "kind": "dtype"}, '
        '{"a": 65536, "b": 130, "c": 4592, "kind": "dtype"}, {"a": 2094, "b": 36599, "c": 130, '
        '"kind": "softmax_axis"}], "seed": "sdpa_causal_dynamic-legacy17", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # flipped bytes in a name (not UTF-8): inspect --json and the Q/DQ lint met bytes
        '{"command": "precision", "mutations": [{"a": 1192, "b": 1192, "c": 24596, "kind": '
        '"dup_output"}, {"a": 2724, "b": 1919, "c": 346, "kind": "flip_bytes"}], "seed": '
        '"vit_demo", "strategy": "native_attention"}',
        [("inspect", 2)],
    ),
    (  # a byte flip in the graph's own text: shape inference's copy of the graph decoded it
        '{"command": "fix", "mutations": [{"a": 4, "b": 295, "c": 24399, "kind": '
        '"flip_bytes"}], "seed": "vit_demo", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # Einsum's equation with a 0xff byte (not UTF-8): the matcher decoded it
        '{"command": "inspect", "mutations": [{"a": 8167, "b": 8167, "c": 8167, "kind": '
        '"attr_value"}], "seed": "eager_einsum-legacy17", "strategy": "fused_plugin"}',
        [("inspect", 2)],
    ),
    (  # a weight's element type turned into STRING with no strings: the matcher's constant
        # folding reshaped an empty array
        '{"command": "validate", "mutations": [{"a": 271, "b": 6974, "c": 11912, "kind": '
        '"raw_truncate"}, {"a": 153, "b": 65535, "c": 2190, "kind": "dtype"}], "seed": '
        '"sdpa_mask-ort_qdq", "strategy": "plugin"}',
        [("inspect", 2)],
    ),
    (  # a graph input 2**40 long, through locate's reference run
        '{"command": "locate", "mutations": [{"a": 144, "b": 9759, "c": 9499, "kind": "dim"}], '
        '"seed": "moe_router-legacy17", "strategy": "mark_output"}',
        [("locate", 2)],
    ),
]


@pytest.mark.parametrize(("plan", "exits"), REGRESSIONS)
def test_fuzz_regression(plan, exits):
    outcome = fuzz_onnx.run_case(fuzz_onnx.Plan.from_json(plan))
    assert outcome.ok, outcome.findings[0].detail
    assert all(pair in outcome.exits for pair in exits), outcome.exits


def _saved(model: onnx.ModelProto, tmp_path) -> str:
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_truncated_tensor_data_is_a_load_error(tmp_path):
    model = vit_example()
    weight = model.graph.initializer[0]
    weight.raw_data = weight.raw_data[:5]
    with pytest.raises(ModelLoadError, match=rf"not a valid ONNX model: .*{weight.name}"):
        load_model(_saved(model, tmp_path), load_weights=False)


def test_a_cycle_is_a_load_error(tmp_path):
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Add", ["x", "b"], ["y"], name="out"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [value("x", TensorProto.FLOAT, [2])], [value("y", TensorProto.FLOAT, [2])]
    )
    with pytest.raises(ModelLoadError, match="topologically sorted"):
        load_model(_saved(helper.make_model(graph), tmp_path), load_weights=False)


def test_weights_on_disk_are_not_read_to_check_the_structure(tmp_path):
    """The check runs without the weights: a model whose data file holds garbage of the right
    length loads (its bytes are only the runtime's business), one with a dangling input does not."""
    model = vit_example()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data")
    data = tmp_path / "m.data"
    data.write_bytes(np.full(data.stat().st_size, 0xFF, np.uint8).tobytes())
    assert load_model(tmp_path / "m.onnx", load_weights=False).model.graph.initializer
    model.graph.node[1].input[0] = "nowhere"
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "extra"))
    with pytest.raises(ModelLoadError, match="nowhere"):
        load_model(_saved(model, tmp_path), load_weights=False)


def test_split_with_fewer_outputs_than_num_outputs_is_a_load_error(tmp_path):
    """onnx's shape inference aborts the whole process on such a Split (onnx/onnx#8255): load
    refuses it first.  (In-process is safe: load itself runs no shape inference.)"""
    value = helper.make_tensor_value_info
    split = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=1, name="cut")
    graph = helper.make_graph(
        [split],
        "g",
        [value("x", TensorProto.FLOAT, [2, 6])],
        [value(name, TensorProto.FLOAT, [2, 2]) for name in "abc"],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ModelLoadError, match="'cut' has num_outputs=1 but 3 outputs"):
        load_model(_saved(model, tmp_path), load_weights=False)


def test_text_attribute_not_utf8_is_a_load_error(tmp_path):
    """An ai.onnx op's text attribute is UTF-8 by the spec (the checker does not look); a
    custom domain's may carry bytes (plugin data) and loads."""
    value = helper.make_tensor_value_info
    einsum = helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,jk->ik", name="mm")
    einsum.attribute[0].s = b"\xffj,jk->ik"
    custom = helper.make_node("Blob", ["y"], ["z"], domain="example", data="x", name="blob")
    custom.attribute[0].s = b"\xff\x00"
    graph = helper.make_graph(
        [einsum, custom],
        "g",
        [value("x", TensorProto.FLOAT, [2, 2])],
        [value("z", TensorProto.FLOAT, [2, 2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("example", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(ModelLoadError, match="'mm' \\(Einsum\\) has attribute 'equation' whose"):
        load_model(_saved(model, tmp_path), load_weights=False)
    model.graph.node[0].attribute[0].s = b"ij,jk->ik"
    assert (
        load_model(_saved(model, tmp_path), load_weights=False).model.graph.node[1].op_type
        == "Blob"
    )


def _replay_in_child(plan: str, *, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, fuzz_onnx.__file__, "--replay", plan],
        preexec_fn=preexec_fn,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def test_fuzz_regression_that_aborted_the_process():
    """The campaign's crash: an attribute change left a Split with num_outputs=1 and two
    outputs, and onnx's shape inference (inspect's matcher) aborted the process.  Replayed in a
    child process, so a regression fails this test instead of killing the test run."""
    plan = (
        '{"command": "inspect", "mutations": [{"a": 790, "b": 3503, "c": 3503, "kind": '
        '"attr_value"}, {"a": 790, "b": 13262, "c": 3503, "kind": "attr_value"}], "seed": '
        '"sdpa_mask-dynamo23", "strategy": "plugin"}'
    )
    done = _replay_in_child(plan)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    replayed = json.loads(done.stdout)
    assert replayed["findings"] == [] and ["inspect", 2] in replayed["exits"], replayed


@pytest.mark.parametrize(
    "plan",
    [
        # an attribute declaring a size no memory holds: shape inference (value_info's pass in
        # fix, the Q/DQ lint's FLOP count) raised MemoryError
        '{"command": "qdq", "mutations": [{"a": 655, "b": 655, "c": 65535, "kind": '
        '"attr_value"}], "seed": "sdpa_mask-ort_qdq", "strategy": "mark_output"}',
        # a bfloat16 input of 2**31 - 1 elements: 4 GiB as stored passed validate's size check,
        # but numpy drew it as float64 (16 GiB)
        '{"command": "validate", "mutations": [{"a": 14952, "b": 720, "c": 4943, "kind": "dim"}, '
        '{"a": 720, "b": 347, "c": 720, "kind": "rank"}, {"a": 720, "b": 347, "c": 720, "kind": '
        '"rank"}], "seed": "eager_bf16-legacy17", "strategy": "fused_plugin"}',
    ],
)
def test_fuzz_regression_under_a_memory_cap(plan):
    """Replayed in a child process under the campaign's 8 GiB address-space cap, so the test
    process never allocates what the case asks for."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    done = _replay_in_child(plan, preexec_fn=cap)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_campaign_tells_a_crash_from_a_hang(tmp_path):
    """A worker that died inside a case is recorded with how it died: the watchdog's timeout is
    a hang, an abort a crash (the campaign once called the Split abort above a hang)."""
    log = tmp_path / "log.jsonl"
    aborted, slow = '{"seed": "a"}', '{"seed": "b"}'
    log.write_text(json.dumps({"start": aborted}) + "\n")
    fuzz_onnx._record_death(log, -6, "Fatal Python error: Aborted")
    with log.open("a") as stream:
        stream.write(json.dumps({"start": slow}) + "\n")
    fuzz_onnx._record_death(log, 1, "Timeout (0:02:00)!\nThread 0x1 (most recent call first):")
    kinds = {f["plan"]: f["kind"] for f in fuzz_onnx.summarise(log)["findings"]}
    assert kinds == {aborted: "crash", slow: "hang"}
    assert fuzz_onnx.summarise(log)["cases"] == 2
