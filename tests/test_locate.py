"""`graphfix locate`: streamed comparison, suspect ranking, remedy search, CLI, JSON, errors.

Faults are planted next to the assertion: an E[x²]−E[x]² variance on inputs with a large mean
(rounding, no overflow), an attention block with very large logits, and a MatMul/Gemm weight of a
real export scaled so its output peaks at 3e5 (beyond float16's 65504).
"""

from __future__ import annotations

import json

import model_corpus
import numpy as np
import onnx
import pytest
from graphs import with_output_named
from locate_faults import plant_overflow
from onnx import TensorProto, helper, numpy_helper

from graphfix.cli import main
from graphfix.precision.locate import locate
from graphfix.precision.locate.localise import measure, module_path
from graphfix.precision.locate.reference import TensorSite
from graphfix.precision.locate.trt_candidate import bisect_prefix
from graphfix.validation.inputs import make_inputs
from graphfix.validation.validate import validate

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), *, check=True):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    if check:
        onnx.checker.check_model(model)
    return model


def variance_model() -> onnx.ModelProto:
    """y = ((x − E[x]) / sqrt(E[x²] − E[x]² + eps)) @ W: the variance cancels catastrophically."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((64, 32)) / 8).astype(np.float32), "W")
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="/norm/ReduceMean"),
        helper.make_node("Mul", ["x", "x"], ["x2"], name="/norm/Square"),
        helper.make_node("ReduceMean", ["x2"], ["ex2"], axes=[-1], name="/norm/ReduceMean_1"),
        helper.make_node("Mul", ["mean", "mean"], ["mean2"], name="/norm/MeanSquare"),
        helper.make_node("Sub", ["ex2", "mean2"], ["var"], name="/norm/Variance"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="/norm/AddEps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="/norm/Sqrt"),
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="/norm/Centre"),
        helper.make_node("Div", ["centred", "std"], ["normed"], name="/norm/Div"),
        helper.make_node("MatMul", ["normed", "W"], ["y"], name="/proj/MatMul"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [4, 16, 64])],
        [helper.make_tensor_value_info("y", F, [4, 16, 32])],
        [w, eps],
    )


def attention_model(key_offset: float) -> onnx.ModelProto:
    """Single-head self-attention whose keys share a constant offset: softmax ignores it, but
    it makes every logit of a query large (|logit| up to ~4e3 for an offset of 3e3, no overflow),
    and float16 keeps ~3 significant digits of it, so the O(1) differences between keys are lost."""
    d = 32
    rng = np.random.default_rng(1)
    weights = {n: (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in "QKV"}
    inits = [numpy_helper.from_array(w, f"W{n}") for n, w in weights.items()]
    inits.append(numpy_helper.from_array(np.full(d, key_offset, np.float32), "key_offset"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"))
    nodes = [
        helper.make_node("MatMul", ["x", "WQ"], ["q"], name="/attn/q_proj/MatMul"),
        helper.make_node("MatMul", ["x", "WK"], ["k_proj"], name="/attn/k_proj/MatMul"),
        helper.make_node("Add", ["k_proj", "key_offset"], ["k"], name="/attn/k_proj/Add"),
        helper.make_node("MatMul", ["x", "WV"], ["v"], name="/attn/v_proj/MatMul"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="/attn/Transpose"),
        helper.make_node("Mul", ["q", "scale"], ["q_scaled"], name="/attn/Mul"),
        helper.make_node("MatMul", ["q_scaled", "kt"], ["logits"], name="/attn/MatMul"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="/attn/Softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="/attn/MatMul_1"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 24, d])],
        [helper.make_tensor_value_info("y", F, [2, 24, d])],
        inits,
    )


def layer_norm_model() -> onnx.ModelProto:
    """A decomposed LayerNorm (as legacy exports write it) on activations spread over ±900: its
    squared deviations reach ~8e5, beyond float16, unless the norm is fused."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 64).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.uniform(-0.1, 0.1, 64).astype(np.float32), "beta"),
        numpy_helper.from_array(np.full((64,), 300.0, np.float32), "spread"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "spread"], ["h"], name="/proj/Mul"),
        helper.make_node("ReduceMean", ["h"], ["mean"], axes=[-1], name="/ln/ReduceMean"),
        helper.make_node("Sub", ["h", "mean"], ["d"], name="/ln/Sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="/ln/ReduceMean_1"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="/ln/Add"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="/ln/Sqrt"),
        helper.make_node("Div", ["d", "std"], ["normed"], name="/ln/Div"),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="/ln/Mul"),
        helper.make_node("Add", ["scaled", "beta"], ["y"], name="/ln/Add_1"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 16, 64])],
        [helper.make_tensor_value_info("y", F, [2, 16, 64])],
        inits,
    )


def test_norm_overflow_is_repaired_by_norm_fusion_without_float32_nodes():
    from graphfix.precision.locate.candidate import build_candidate
    from graphfix.precision.locate.remedies import TrialRunner, search_remedies
    from graphfix.validation.compare import DEFAULT_TOLERANCES

    model = layer_norm_model()
    # convert_precision fuses norms itself: the candidate that diverges is a conversion that does
    # not (the remedy trials' minimal one, or the user's own float16 export)
    unfused = build_candidate(model, precision="float16", base="minimal").model
    report = locate(model, unfused)
    assert report.diverges
    assert report.suspects[0].node in ("/ln/Pow", "/ln/ReduceMean_1"), report.suspects
    feeds = make_inputs(model).feeds
    reference = {"y": validate(model, model, backend="onnxruntime").reference_outputs["y"]}
    runner = TrialRunner(
        model,
        precision="float16",
        feeds=feeds,
        reference_outputs=reference,
        tolerance=DEFAULT_TOLERANCES["fp16"],
    )
    found = search_remedies(model, report.suspects, report.tensors, runner)
    assert [r.kind.value for r in found.kept] == ["norm_fusion"]
    assert found.passed and found.float32_nodes == ()  # the fused norm computes stats inside
    assert any(n.op_type == "LayerNormalization" for n in found.model.graph.node)


def _variance_inputs(tmp_path):
    x = (30.0 + np.random.default_rng(2).standard_normal((4, 16, 64))).astype(np.float32)
    path = tmp_path / "x.npz"
    np.savez(path, x=x)
    return path


def test_rounding_fault_variance_is_located_and_repaired(tmp_path):
    inputs = _variance_inputs(tmp_path)
    report = locate(variance_model(), precision="float16", inputs=inputs, apply=True)
    assert report.diverges
    assert max(t.reference_absmax for t in report.tensors) < 65504  # no overflow: rounding only
    top = [s.node for s in report.suspects[:3]]
    assert "/norm/Variance" in top, top
    variance = next(s for s in report.suspects if s.node == "/norm/Variance")
    assert variance.amplification > 100 and variance.nonfinite == 0
    assert report.fixed is not None and report.fixed.passed
    assert validate(
        variance_model(),
        report.fixed_model,  # float16 materialised by default, as locate judged it
        inputs=inputs,
        backend="onnxruntime",
    ).passed
    assert report.fixed.float32_nodes and len(report.fixed.float32_nodes) < 10  # not everything


def test_attention_with_large_logits_is_located_in_its_block():
    model = attention_model(key_offset=3000.0)
    report = locate(model, precision="float16", apply=True)
    assert report.diverges
    logits = next(t for t in report.tensors if t.tensor == "logits")
    assert 1e3 < logits.reference_absmax < 65504  # large, yet no overflow
    top = report.suspects[:3]
    assert any(s.node in ("/attn/Softmax", "/attn/MatMul", "/attn/Mul") for s in top), top
    assert any(s.attention_block == 0 for s in top)
    assert report.fixed is not None and report.fixed.passed
    tried = {r.kind.value for t in report.remedies_tried for r in t.remedies}
    assert "attention_strategy" in tried  # the block's strategy is tried before islands grow


def test_the_rounding_note_names_the_type_the_candidate_computes_in():
    report = locate(attention_model(key_offset=0.0), precision="bfloat16")
    note = report.low_precision
    assert note.startswith("bfloat16 materialised") and "float16" not in note.replace("bfloat16", "")


def test_same_attention_with_ordinary_logits_does_not_diverge(capsys, tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(attention_model(key_offset=0.0), path)
    code = main(["locate", str(path), "--precision", "float16"])
    out = capsys.readouterr().out
    assert code == 0 and "no divergence" in out


PLANTED = ("bert_eager-legacy17", "gpt2_sdpa-dynamo18", "timm_vit_tiny-legacy17")


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(e, id=e.name, marks=[pytest.mark.slow] if e.slow else [])
        for e in model_corpus.CORPUS
        if e.name in PLANTED
    ],
)
def test_planted_overflow_in_real_export(entry, tmp_path):
    pytest.importorskip("torch", reason="exporting the corpus model needs torch")
    model = onnx.load(str(model_corpus.model_path(entry)))
    fault = plant_overflow(model, make_inputs(model).feeds)
    report = locate(fault.model, precision="float16", apply=True)
    ranked = [s.node for s in report.suspects[:3]]
    assert {fault.node, *fault.consumers} & set(ranked), (fault.node, ranked)
    assert report.fixed is not None and report.fixed.passed
    check = validate(fault.model, report.fixed_model, backend="onnxruntime")
    assert check.passed and check.tolerance.atol == 1e-2  # float16 tolerance
    assert 0 < len(report.fixed.float32_nodes) < len(fault.model.graph.node) // 4
    onnx.checker.check_model(report.fixed_model, full_check=True)  # what --apply writes
    onnx.shape_inference.infer_shapes(report.fixed_model, strict_mode=True)


@pytest.fixture
def planted_files(tmp_path):
    model = attention_model(key_offset=3000.0)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_json_document_and_apply_writes_model(planted_files, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    code = main(
        [
            "locate",
            str(planted_files),
            "--precision",
            "float16",
            "--json",
            "--apply",
            "-o",
            str(out),
            "--plot",
            str(tmp_path / "plots"),
        ]
    )
    captured = capsys.readouterr()
    document = json.loads(captured.out)  # exactly one JSON document on stdout
    assert code == 0
    first = document["suspects"][0]
    assert {"node", "op_type", "error", "amplification"} <= set(first)
    assert document["remedies"]["tried"] and document["remedies"]["kept"]
    fixed = document["fixed"]
    assert fixed["path"] == str(out) and fixed["passed"] is True
    assert fixed["float32_nodes"] and fixed["error"] < 1e-2
    onnx.checker.check_model(str(out), full_check=True)
    assert validate(planted_files, out, backend="onnxruntime").passed
    assert (tmp_path / "plots" / "locate_error_by_depth.png").stat().st_size > 10_000
    # same output-path rules as `graphfix fix`: an existing output is refused before any work
    code = main(["locate", str(planted_files), "--precision", "float16", "--apply", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "already exists" in err and err.count("\n") == 1


def test_divergence_without_apply_exits_1(planted_files, capsys):
    assert main(["locate", str(planted_files), "--precision", "float16", "--no-remedies"]) == 1
    assert "suspects" in capsys.readouterr().out


def test_user_candidate_with_shared_names(planted_files, tmp_path, capsys):
    from graphfix.precision.locate.candidate import build_candidate

    candidate = tmp_path / "fp16.onnx"
    onnx.save(build_candidate(onnx.load(planted_files), precision="float16").model, candidate)
    code = main(["locate", str(planted_files), str(candidate), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["precision"] == "float16"
    assert document["suspects"] and document["remedies"]["tried"] == []


@pytest.mark.parametrize("in_memory_bytes", [0, 1 << 30], ids=["weights-on-disk", "in-memory"])
def test_streaming_carries_the_frontier_instead_of_recomputing(planted_files, in_memory_bytes):
    from graphfix.model_io import load_model
    from graphfix.precision.locate.reference import TensorStreamer, chunk_tensors, plan_graph

    model = load_model(planted_files)
    feeds = make_inputs(model.model).feeds
    plan = plan_graph(model.model, feeds)
    names = [s.tensor for s in plan.sites]
    chunks = chunk_tensors(names, plan.nbytes, 1)  # one tensor per chunk
    with TensorStreamer(model, label="test", in_memory_bytes=in_memory_bytes) as streamer:
        streamed = {k: v for chunk in streamer.stream(chunks, feeds) for k, v in chunk.items()}
        assert streamer.runs == len(chunks) == len(names)
        assert streamer.nodes_run == len(model.model.graph.node)  # each node ran once
        whole = streamer.fetch(names, feeds)
    for name in names:
        np.testing.assert_array_equal(streamed[name], whole[name])


def test_streaming_in_small_chunks_gives_the_same_suspects(planted_files):
    whole = locate(planted_files, precision="float16", remedies=False)
    chunked = locate(planted_files, precision="float16", remedies=False, chunk_bytes=8 << 10)
    assert whole.chunks == 1 and chunked.chunks > 3
    assert [s.node for s in whole.suspects] == [s.node for s in chunked.suspects]
    assert [t.error for t in whole.tensors] == [t.error for t in chunked.tensors]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--precision", "float16", "--apply"], "--apply writes the repaired model: pass -o"),
        ([], "give either a CANDIDATE model or --precision"),
        (["OTHER", "--precision", "float16"], "not both"),
    ],
)
def test_usage_errors_exit_2_one_line(planted_files, tmp_path, capsys, argv, message):
    argv = [str(planted_files) if a == "OTHER" else a for a in argv]
    code = main(["locate", str(planted_files), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_mismatched_models_and_unshared_names_exit_2(planted_files, tmp_path, capsys):
    other = tmp_path / "other.onnx"
    onnx.save(variance_model(), other)
    assert main(["locate", str(planted_files), str(other)]) == 2
    assert "input" in capsys.readouterr().err  # different inputs: refused before running
    renamed = onnx.load(planted_files)
    mapping = {}
    for node in renamed.graph.node:
        for k, name in enumerate(node.output):
            if name != "y":
                mapping[name] = node.output[k] = f"renamed_{name}"
    for node in renamed.graph.node:
        node.input[:] = [mapping.get(i, i) for i in node.input]
    path = tmp_path / "renamed.onnx"
    onnx.save(renamed, path)
    code = main(["locate", str(planted_files), str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "shares no intermediate tensor name" in err and err.count("\n") == 1


def test_model_onnxruntime_cannot_run_exits_3(tmp_path, capsys):
    bad = _model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 5])],
        [numpy_helper.from_array(np.ones((4, 5), np.float32), "W")],  # 3 != 4: cannot run
        check=False,
    )
    path = tmp_path / "bad.onnx"
    onnx.save(bad, path)
    code = main(["locate", str(path), "--precision", "float16"])
    err = capsys.readouterr().err
    assert code == 3 and "onnxruntime cannot run" in err and err.count("\n") == 1


def test_tensorrt_backend_without_tensorrt_exits_3(planted_files, capsys):
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed: the trt-marked test covers it")
    except ImportError:
        pass
    code = main(["locate", str(planted_files), "--precision", "float16", "--backend", "tensorrt"])
    err = capsys.readouterr().err
    assert code == 3 and "needs TensorRT" in err


@pytest.mark.trt
def test_tensorrt_candidate_locates_large_logits(planted_files):
    pytest.importorskip("tensorrt", reason="needs TensorRT")
    report = locate(planted_files, precision="float16", backend="tensorrt", apply=True)
    assert report.diverges
    assert report.suspects or any("differential rebuilds" in n for n in report.notes)
    if report.suspects:  # every remedy trial is an engine build with its latency
        assert report.remedies_tried and all(t.latency_ms > 0 for t in report.remedies_tried)
        assert report.fixed is not None and report.fixed.passed


def test_trial_runner_reports_the_latency_its_backend_measures(planted_files):
    from graphfix.precision.locate.remedies import TrialRunner, run_trial_on_onnxruntime
    from graphfix.validation.compare import DEFAULT_TOLERANCES

    def timed(model, feeds):  # what a candidate runner's run_trial returns (TensorRT times it)
        outputs, latency = run_trial_on_onnxruntime(model, feeds)
        assert latency is None  # onnxruntime's CPU time would mean nothing
        return outputs, 1.5

    model = onnx.load(planted_files)
    feeds = make_inputs(model).feeds
    reference = validate(model, model, backend="onnxruntime").reference_outputs
    runner = TrialRunner(
        model,
        precision="float16",
        feeds=feeds,
        reference_outputs=reference,
        tolerance=DEFAULT_TOLERANCES["fp16"],
        run_trial=timed,
    )
    trial, _ = runner.trial("as converted", [])
    assert trial.latency_ms == 1.5 and not trial.passed


def test_mask_constant_saturating_is_not_an_error():
    site = TensorSite("m", "mask", "Where", 0, ())
    reference = np.array([0.0, -3.4e38, 1.0], np.float32)
    candidate = np.array([0.0, -65504.0, 1.0], np.float16)
    e = measure(site, reference, candidate, range_max=65504.0)
    assert e.error == 0 and e.nonfinite == 0
    overflowed = measure(
        site, np.array([3e5, 1.0], np.float32), np.array([np.inf, 1], np.float16), range_max=65504.0
    )
    assert overflowed.nonfinite == 1


def test_bisect_prefix_finds_the_culprit_in_log_builds():
    calls = []

    def passes(keep):
        calls.append(len(keep))
        return "n37" in keep

    nodes = [f"n{i}" for i in range(100)]
    assert bisect_prefix(nodes, passes) == 38
    assert len(calls) <= 8  # ⌈log2(100)⌉ + 1
    assert bisect_prefix(nodes, lambda keep: False) is None


def test_module_path_from_legacy_names_and_dynamo_metadata():
    legacy = helper.make_node(
        "MatMul", ["a", "b"], ["c"], name="/model/layers.3/self_attn/q_proj/MatMul"
    )
    assert module_path(legacy) == "model.layers.3.self_attn.q_proj"
    dynamo = helper.make_node("MatMul", ["a", "b"], ["c"], name="node_matmul_3")
    prop = dynamo.metadata_props.add()
    prop.key, prop.value = (
        "pkg.torch.onnx.name_scopes",
        "['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'matmul_3']",
    )
    assert module_path(dynamo) == "model.layers.0.mlp"
    assert module_path(helper.make_node("Relu", ["a"], ["b"], name="relu")) is None


def test_remedy_table_states_its_verdict_rule_beside_each_trial(planted_files, capsys):
    code = main(["locate", str(planted_files), "--precision", "float16", "--max-trials", "3"])
    out = capsys.readouterr().out
    assert code == 1
    header = next(line for line in out.splitlines() if line.startswith("remedy search"))
    assert "the absolute OR the relative bound" in header
    assert "error: the largest absolute error over the outputs" in header
    trials = [line for line in out.splitlines() if "(abs or rel)  max abs error" in line]
    assert len(trials) >= 2  # "as converted" and at least one greedy trial, each with its rule
    assert "low precision: float16 materialised at every node output" in out
    main(["locate", str(planted_files), "--precision", "float16", "--no-remedies", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["low_precision"].startswith("float16 materialised at every node output")
    assert "absolute OR the relative bound" in document["verdict_rule"]


def test_candidate_whose_outputs_are_numbered_differently_pairs_by_position(
    planted_files, tmp_path, capsys
):
    """Legacy exports number their outputs (591 vs 600): refused by name, with both names and
    the option; compared by position when asked."""
    from graphfix.precision.locate.candidate import build_candidate

    candidate = build_candidate(onnx.load(planted_files), precision="float16").model
    path = tmp_path / "numbered.onnx"
    onnx.save(with_output_named(candidate, "600"), path)
    assert main(["locate", str(planted_files), str(path)]) == 2
    err = capsys.readouterr().err
    assert "the original's outputs are y, the candidate's 600" in err
    assert "--pair-outputs position" in err and err.count("\n") == 1
    report = locate(planted_files, path, pair_outputs="position", remedies=False)
    assert report.diverges and [o.name for o in report.outputs] == ["y"]
    assert "outputs paired by position: y ↔ 600" in report.notes
    assert report.suspects  # intermediates still compare by their shared names


def _nan_model() -> onnx.ModelProto:
    """y = Sqrt(x - 2) on x in [-1, 1): NaN everywhere, in float32 and in float16 alike."""
    return _model(
        [
            helper.make_node("Sub", ["x", "two"], ["d"], name="sub"),
            helper.make_node("Sqrt", ["d"], ["y"], name="sqrt"),
        ],
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )


def test_nan_on_both_sides_is_a_finding_unless_allowed(tmp_path, capsys):
    path = tmp_path / "nan.onnx"
    onnx.save(_nan_model(), path)
    report = locate(path, precision="float16", remedies=False)
    assert report.diverges and report.outputs[0].nonfinite_both == 16
    assert "NaN/inf on both sides at 16" in report.summary()
    assert not locate(path, precision="float16", allow_nonfinite=True).diverges
    checked = validate(path, path, backend="onnxruntime")
    assert not checked.passed and checked.outputs[0].nonfinite_both == 16
    assert main(["validate", str(path), str(path), "--backend", "onnxruntime"]) == 1
    assert "NaN/inf on both sides at 16 element(s): not agreement" in capsys.readouterr().out
    argv = ["validate", str(path), str(path), "--backend", "onnxruntime", "--allow-nonfinite"]
    assert main(argv) == 0
    assert "NaN/inf on both sides allowed" in capsys.readouterr().out


def test_onnxruntime_only_options_are_refused_with_the_tensorrt_backend(planted_files, capsys):
    argv = ["locate", str(planted_files), "--precision", "float16", "--backend", "tensorrt"]
    assert main([*argv, "--low-precision", "as-is", "--allow-nonfinite"]) == 2
    err = capsys.readouterr().err
    assert "--low-precision, --allow-nonfinite apply to the onnxruntime backend" in err
    assert err.count("\n") == 1
