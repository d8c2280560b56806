"""The TensorRT path's logic that needs no TensorRT: polygraphy requirement, log routing, plugin
loading errors, registry checks, build folders and engine-cache keys.

What needs TensorRT itself is in tests/test_validate_trt.py (marked `trt`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build
from graphfix.plugins.spec import ATTENTION, PLUGIN_SPECS, SOFTMAX
from graphfix.validation.backends.gpu import GpuIdentity
from graphfix.validation.backends.tensorrt_backend import (
    POLYGRAPHY_MINIMUM,
    _cache_key,
    engine_options,
    plugin_load_problem,
    polygraphy_logs_on_stderr,
    polygraphy_problem,
)

REPO = Path(__file__).resolve().parents[1]


# --- polygraphy: the version that works on TensorRT 10 and 11 ---------------------------------


def test_tensorrt_extra_requires_the_polygraphy_the_backend_checks_for():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["tensorrt"] == [f"polygraphy>={POLYGRAPHY_MINIMUM}"]
    assert POLYGRAPHY_MINIMUM == "0.53.4"


@pytest.mark.parametrize("version", [None, "0.49.20", "0.49.26", "0.50.3"])
def test_missing_or_old_polygraphy_is_refused_with_the_install_command(version):
    problem = polygraphy_problem(version, "11.0.0")
    assert problem is not None
    assert "pip install 'graphfix[tensorrt]'" in problem
    assert "polygraphy>=0.53.4" in problem


@pytest.mark.parametrize("version", ["0.53.4", "0.53.6", "0.54.0", "1.0.0"])
def test_working_polygraphy_is_accepted(version):
    assert polygraphy_problem(version, "10.14.1") is None


# --- logs: polygraphy (and TensorRT through it) never print on stdout ---------------------------


def test_polygraphy_logs_go_to_stderr_and_only_warnings(capfd):
    from polygraphy.logger import G_LOGGER

    before = G_LOGGER.module_severity.get()
    with polygraphy_logs_on_stderr():
        G_LOGGER.info("graphfix-test info line")
        G_LOGGER.warning("graphfix-test warning line")
        G_LOGGER.error("graphfix-test error line")
        os.write(1, b"graphfix-test native write\n")  # as native code writing to stdout would
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "graphfix-test warning line" in captured.err
    assert "graphfix-test error line" in captured.err
    assert "graphfix-test native write" in captured.err
    assert "graphfix-test info line" not in captured.err
    assert "\x1b[" not in captured.err  # no colour codes
    assert G_LOGGER.module_severity.get() == before
    G_LOGGER.warning("graphfix-test after")  # outside, polygraphy's own behaviour is back
    os.write(1, b"graphfix-test native after\n")
    out = capfd.readouterr().out
    assert "graphfix-test after" in out and "graphfix-test native after" in out


# --- loading the plugin library: one line with the fix -------------------------------------------


@pytest.mark.compile  # builds the plugin libraries with nvcc
def test_library_built_without_libnvinfer_is_explained(tmp_path):
    tools = _host_tools()
    with pytest.raises(OSError) as raised:
        ctypes.CDLL(str(tools.libraries.static))
    message = plugin_load_problem(tools.libraries.static, raised.value, tensorrt_version="10.14.1")
    assert "undefined symbol: getPluginRegistry" in message
    assert "built without libnvinfer" in message and "graphfix plugins build" in message
    assert "\n" not in message


def test_library_linked_to_another_tensorrt_major_is_explained(tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    stub_source = tmp_path / "stub.c"
    stub_source.write_text("int nvinfer_stub(void) { return 0; }\n")
    stub = tmp_path / "libnvinfer.so.10"
    _run([gcc, "-shared", "-fPIC", "-Wl,-soname,libnvinfer.so.10", "-o", stub, stub_source])
    user_source = tmp_path / "plugin.c"
    user_source.write_text("int nvinfer_stub(void);\nint plugin(void) { return nvinfer_stub(); }\n")
    library = tmp_path / "libplugin.so"
    _run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-o",
            library,
            user_source,
            f"-L{tmp_path}",
            "-l:libnvinfer.so.10",
        ]
    )
    stub.unlink()  # as on a machine with TensorRT 11 only
    with pytest.raises(OSError) as raised:
        ctypes.CDLL(str(library))
    message = plugin_load_problem(library, raised.value, tensorrt_version="11.0.0")
    assert "built for TensorRT 10 but this is TensorRT 11.0.0" in message
    assert "libnvinfer.so.10" in message and "graphfix plugins build" in message


def _host_tools():
    sys.path.insert(0, str(Path(__file__).parent))
    import plugin_harness_support as support

    try:
        return support.host_tools()
    except PluginBuildError as exc:
        pytest.skip(f"the plugin libraries cannot be built here: {exc}")


def _run(command: list) -> None:
    subprocess.run([str(c) for c in command], check=True, capture_output=True)


class _Registry:
    """Answers `get_creator` like trt.IPluginRegistry for the creators it holds."""

    def __init__(self, *specs) -> None:
        self.creators = {(s.op_type, s.version, s.namespace) for s in specs}

    def get_creator(self, name: str, version: str, namespace: str = ""):
        return object() if (name, version, namespace) in self.creators else None


def test_every_graphfix_creator_must_be_found_after_loading():
    plugin_build.require_creators(
        _Registry(*PLUGIN_SPECS), loaded="lib.so", tensorrt_version="10.14.1"
    )
    with pytest.raises(
        PluginBuildError, match=r"no creator GraphfixAttention version 1 in namespace 'graphfix'"
    ):
        plugin_build.require_creators(
            _Registry(SOFTMAX), loaded="lib.so", tensorrt_version="10.14.1"
        )
    assert plugin_build.missing_creators(_Registry(ATTENTION)) == (SOFTMAX,)


# --- build folders and engine caches: keyed by what the artefact depends on ----------------------


def test_plugin_build_folder_is_per_tensorrt_major(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHFIX_CACHE_DIR", str(tmp_path))
    ten = plugin_build.default_build_dir(tensorrt_major=10)
    eleven = plugin_build.default_build_dir(tensorrt_major=11)
    assert ten != eleven
    assert ten.name.endswith("-trt10") and eleven.name.endswith("-trt11")


def test_tensorrt_major_is_read_from_the_headers(tmp_path):
    try:
        headers = plugin_build.find_tensorrt_headers(allow_download=False)
    except PluginBuildError as exc:
        pytest.skip(f"no TensorRT headers here: {exc}")
    if headers.origin != plugin_build.KERNEL_LENS_REQUIREMENT:
        pytest.skip(f"headers from {headers.origin}, not the known TensorRT 10.14 of kernel-lens")
    # kernel-lens 2.0.1's NvInferVersion.h: NV_TENSORRT_MAJOR is TRT_MAJOR_ENTERPRISE, which is 10
    assert plugin_build.tensorrt_header_major(headers.include_dir) == 10
    (tmp_path / "NvInferVersion.h").write_text("#define NV_TENSORRT_MINOR 14\n")
    with pytest.raises(PluginBuildError, match="defines no NV_TENSORRT_MAJOR"):
        plugin_build.tensorrt_header_major(tmp_path)


def test_engine_cache_key_depends_on_the_gpu(tmp_path):
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    options = engine_options(None, tensorrt_version="10.14.1")

    def key(gpu: GpuIdentity) -> str:
        return _cache_key(path, options, {"x": (2,)}, "10.14.1", [], gpu)

    h200 = GpuIdentity("NVIDIA H200", (9, 0))
    assert key(h200) == key(GpuIdentity("NVIDIA H200", (9, 0)))
    assert key(h200) != key(GpuIdentity("NVIDIA H100 80GB HBM3", (9, 0)))
    assert key(h200) != key(GpuIdentity("NVIDIA H200", (10, 0)))


def test_no_gpu_driver_is_a_backend_error():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("an NVIDIA driver is installed here")
    from graphfix.validation.backends import BackendError
    from graphfix.validation.backends.gpu import current_gpu

    with pytest.raises(
        BackendError, match=r"NVIDIA driver library cannot be loaded .* onnxruntime"
    ):
        current_gpu()


def test_build_refuses_headers_and_libnvinfer_of_different_majors(monkeypatch):
    try:
        headers = plugin_build.find_tensorrt_headers(allow_download=False)
        plugin_build.find_nvcc()
    except PluginBuildError as exc:
        pytest.skip(f"no nvcc or TensorRT headers here: {exc}")
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    if headers.origin != plugin_build.KERNEL_LENS_REQUIREMENT:
        pytest.skip(f"headers from {headers.origin}, not the known TensorRT 10.14 of kernel-lens")
    wheel_library = Path("/site-packages/tensorrt_libs/libnvinfer.so.11")
    monkeypatch.setattr(plugin_build, "_wheel_nvinfer_library", lambda: wheel_library)
    with pytest.raises(PluginBuildError, match=r"are TensorRT 10 but the installed libnvinfer"):
        plugin_build.build_plugins(cuda_archs="90")
