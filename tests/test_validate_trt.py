"""`graphfix.validate` with a real TensorRT engine: verdict, engine cache, precision, fusion proof.

Skipped, with the reason, where `import tensorrt` fails; the plugin tests also need graphfix's
plugin library built (`graphfix plugins build`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

import graphfix
from graphfix.errors import PluginBuildError
from graphfix.examples import vit_example
from graphfix.validation.inputs import ValidationUsageError
from graphfix.validation.validate import validate

pytestmark = [pytest.mark.trt, pytest.mark.gpu]
trt = pytest.importorskip("tensorrt", reason="TensorRT's Python package is not importable here")
TRT_MAJOR = int(trt.__version__.split(".")[0])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trt")
    original = vit_example()
    paths = {"original": folder / "vit.onnx", "fixed": folder / "vit.fixed.onnx"}
    onnx.save(original, paths["original"])
    onnx.save(graphfix.break_attention_fusion(original), paths["fixed"])
    return paths


@pytest.fixture(scope="module")
def plugin_library():
    from graphfix.plugins.build import find_plugin_libraries

    try:
        return find_plugin_libraries().static
    except PluginBuildError as exc:
        pytest.skip(f"graphfix's plugin library is not built: {exc}")


def test_fixed_engine_agrees_and_runs_the_plugin(models, plugin_library, tmp_path):
    options = {"backend": "tensorrt", "plugins": [plugin_library], "engine_cache": tmp_path}
    report = validate(models["original"], models["fixed"], **options)
    print(report.summary())
    assert report.passed, report.summary()
    assert report.backend == "tensorrt" and report.tensorrt_note is None
    proof = report.fusion
    assert [b.node for b in proof.candidate] == ["/blocks.0/attn/Softmax", "/blocks.1/attn/Softmax"]
    assert all(b.status == "plugin" for b in proof.candidate), proof.summary_lines()
    assert proof.original is not None and len(proof.original) == 2
    again = validate(models["original"], models["fixed"], **options)
    assert "engine reused from" in again.candidate


def test_default_plugin_library_is_found(models, plugin_library, tmp_path):
    report = validate(models["original"], models["fixed"], engine_cache=tmp_path)
    assert report.backend == "tensorrt" and str(plugin_library) in report.candidate


@pytest.mark.skipif(TRT_MAJOR >= 11, reason="fp16 builder flags exist on TensorRT 10 only")
def test_fp16_flag_on_tensorrt_10(models, plugin_library, tmp_path):
    options = {"backend": "tensorrt", "plugins": [plugin_library], "engine_cache": tmp_path}
    report = validate(models["original"], models["fixed"], precision="fp16", **options)
    assert report.tolerance_origin == "atol and rtol: default for fp16"
    assert report.passed, report.summary()


@pytest.mark.skipif(TRT_MAJOR < 11, reason="TensorRT 11 is strongly typed; 10 takes fp16 flags")
def test_fp16_flag_refused_on_tensorrt_11(models, tmp_path):
    with pytest.raises(ValidationUsageError, match="strongly typed"):
        validate(
            models["original"],
            models["fixed"],
            backend="tensorrt",
            precision="fp16",
            engine_cache=tmp_path,
        )


def test_unfixed_model_on_tensorrt_reports_fusion(models, tmp_path):
    report = validate(
        models["original"], models["original"], backend="tensorrt", engine_cache=tmp_path
    )
    print(report.summary())
    assert len(report.fusion.candidate) == 2
    assert all(b.status in ("fused", "unfused") for b in report.fusion.candidate)


def test_json_report_is_the_only_thing_on_stdout(models, plugin_library, tmp_path, capfd):
    """polygraphy and TensorRT log while the engine builds: none of it may reach stdout."""
    from graphfix.cli import main

    argv = ["validate", models["original"], models["fixed"], "--json", "--backend", "tensorrt"]
    argv += ["--plugins", plugin_library, "--engine-cache", tmp_path]
    code = main([str(a) for a in argv])
    out, _ = capfd.readouterr()
    assert code == 0
    report = json.loads(out)  # exactly one document, nothing around it
    assert report["check"] == "TensorRT engine"
    assert all(b["status"] == "plugin" for b in report["fusion"]["candidate"])


def test_engine_description_names_the_gpu_it_was_built_for(models, plugin_library, tmp_path):
    report = validate(
        models["original"], models["fixed"], plugins=[plugin_library], engine_cache=tmp_path
    )
    from graphfix.validation.backends.gpu import current_gpu

    assert f" on {current_gpu().describe()}" in report.candidate


_REGISTRY_PROBE = """
import ctypes, json, sys
import tensorrt as trt
from graphfix.plugins.spec import PLUGIN_SPECS
logger = trt.Logger(trt.Logger.WARNING)
runtime = trt.Runtime(logger)
registry = trt.get_plugin_registry()
if sys.argv[1] == "static":
    ctypes.CDLL(sys.argv[2])
else:
    registry.load_library(sys.argv[2])
print(json.dumps({s.op_type: registry.get_creator(s.op_type, s.version, s.namespace) is not None
                  for s in PLUGIN_SPECS}))
"""


@pytest.mark.parametrize("loading", ["static", "dynamic"])
def test_each_library_registers_every_creator_under_graphfix(loading):
    from graphfix.plugins.build import find_plugin_libraries

    try:
        libraries = find_plugin_libraries()
    except PluginBuildError as exc:
        pytest.skip(f"graphfix's plugin library is not built: {exc}")
    library = libraries.static if loading == "static" else libraries.dynamic
    done = subprocess.run(
        [sys.executable, "-c", _REGISTRY_PROBE, loading, str(library)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"GraphfixSoftmax": True, "GraphfixAttention": True}
