"""The plugin libraries on the host, without a GPU and without TensorRT.

The libraries are built once per session (CUDA architecture $GRAPHFIX_TEST_CUDA_ARCHS, default
75, to keep CI's build short) with the TensorRT headers graphfix.plugins.build finds or fetches.
The host harness (plugins/tests/pluginHarness.cpp) loads each library the way TensorRT does and
drives the plugin through TensorRT's interfaces; these tests check what it reports against
graphfix's plugin spec and DESIGN.md. No TensorRT is involved: the harness stands in for the
plugin registry and the logger, nothing else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import plugin_harness_support as support
import pytest
from plugin_harness_support import Tools

from graphfix.cli import main
from graphfix.errors import PluginBuildError, UsageError
from graphfix.plugins import build as plugin_build
from graphfix.plugins.build import find_plugin_libraries, trtexec_command
from graphfix.plugins.spec import PLUGIN_NAMESPACE, PLUGIN_SPECS, SOFTMAX

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.compile  # builds the plugin libraries and a harness with nvcc
SUPPORTED_TYPES = ("kFLOAT", "kHALF", "kBF16")
LOADINGS = ("static", "dynamic")


@pytest.fixture(scope="session")
def tools() -> Tools:
    return support.host_tools()


@dataclass(frozen=True)
class HarnessRun:
    report: dict
    stderr: str


def run_harness(tools: Tools, command: str, loading: str, *args: str) -> HarnessRun:
    done = support.run_harness_process(tools, command, loading, *args, timeout=60)
    assert done.returncode == 0, f"harness exited {done.returncode}: {done.stdout}{done.stderr}"
    return HarnessRun(json.loads(done.stdout), done.stderr)


def probe(tools: Tools, loading: str, *fields: str, dims: str = "2,3,4") -> HarnessRun:
    args = [arg for field in fields for arg in ("--field", field)]
    return run_harness(tools, "probe", loading, *args, "--dims", dims)


def _dynamic_symbols(library: Path, *, defined: bool) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    flag = "--defined-only" if defined else "--undefined-only"
    done = subprocess.run(
        [nm, "-D", flag, "--format=posix", str(library)], capture_output=True, text=True, check=True
    )
    return {line.split()[0].split("@")[0] for line in done.stdout.splitlines() if line.strip()}


# ---- exported symbols: one library per loading path ------------------------------------------


def test_dynamic_library_exports_exactly_the_loadlibrary_entry_points(tools: Tools) -> None:
    assert _dynamic_symbols(tools.libraries.dynamic, defined=True) == {
        "getCreators",
        "setLoggerFinder",
    }
    undefined = _dynamic_symbols(tools.libraries.dynamic, defined=False)
    assert "getPluginRegistry" not in undefined


def test_static_library_exports_nothing_and_asks_for_the_registry(tools: Tools) -> None:
    assert _dynamic_symbols(tools.libraries.static, defined=True) == set()
    assert "getPluginRegistry" in _dynamic_symbols(tools.libraries.static, defined=False)


# ---- loading, creators and the spec ----------------------------------------------------------


def _spec_fields() -> list[dict]:
    return [
        {"name": name, "type": kind, "length": 1, "values": None} for name, kind in SOFTMAX.fields
    ]


def _assert_creator_matches_spec(creator: dict) -> None:
    assert creator["interface"] == {"kind": "PLUGIN CREATOR_V3ONE", "major": 1, "minor": 0}
    assert creator["name"] == SOFTMAX.op_type
    assert creator["version"] == SOFTMAX.version
    assert creator["namespace"] == SOFTMAX.namespace
    assert creator["fields"] == _spec_fields()


def _softmax_creators(creators: list[dict]) -> list[dict]:
    return [c for c in creators if c.get("name") == SOFTMAX.op_type]


def test_static_library_registers_every_creator_under_the_graphfix_namespace_on_load(
    tools: Tools,
) -> None:
    """registerCreator's namespace argument is the creator's own ("graphfix", as the ONNX parser
    asks for it), not REGISTER_TENSORRT_PLUGIN's "": found whichever one the registry keys on."""
    report = run_harness(tools, "describe", "static").report
    registered = [r["creator"] for r in report["registrations"]]
    assert sorted(c["name"] for c in registered) == sorted(s.op_type for s in PLUGIN_SPECS)
    for registration in report["registrations"]:
        assert registration["namespace_argument"] == registration["creator"]["namespace"]
        assert registration["namespace_argument"] == PLUGIN_NAMESPACE
    (creator,) = _softmax_creators([r["creator"] for r in report["registrations"]])
    _assert_creator_matches_spec(creator)
    assert report["exports_get_creators"] is False
    assert report["exports_set_logger_finder"] is False


def test_static_library_reports_a_refused_registration_on_stderr(tools: Tools) -> None:
    env = {**os.environ, "GRAPHFIX_HARNESS_REFUSE_REGISTRATION": "1"}
    done = support.run_harness_process(tools, "describe", "static", timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    for spec in PLUGIN_SPECS:
        assert (
            f"graphfix plugin: registerCreator: TensorRT refused {spec.namespace}::{spec.op_type} "
            f"version {spec.version}: a creator of that name, version and namespace is already "
            "registered"
        ) in done.stderr


def test_dynamic_library_registers_nothing_until_asked(tools: Tools) -> None:
    report = run_harness(tools, "describe", "dynamic").report
    assert report["registrations"] == []
    assert report["exports_get_creators"] is True
    assert report["exports_set_logger_finder"] is True
    (creator,) = _softmax_creators(report["creators"])
    _assert_creator_matches_spec(creator)


def test_both_libraries_offer_the_same_creators(tools: Tools) -> None:
    static = run_harness(tools, "describe", "static").report["creators"]
    dynamic = run_harness(tools, "describe", "dynamic").report["creators"]
    assert static == dynamic


@pytest.mark.parametrize("loading", LOADINGS)
def test_plugin_reports_spec_and_capability_interfaces(tools: Tools, loading: str) -> None:
    plugin = run_harness(tools, "describe", loading).report["plugin"]
    assert plugin["interface"] == {"kind": "PLUGIN", "major": 1, "minor": 0}
    assert (plugin["name"], plugin["version"], plugin["namespace"]) == (
        SOFTMAX.op_type,
        SOFTMAX.version,
        SOFTMAX.namespace,
    )
    assert plugin["capabilities"] == {
        "core": {"kind": "PLUGIN_V3ONE_CORE", "major": 1, "minor": 0},
        "build": {"kind": "PLUGIN_V3ONE_BUILD", "major": 1, "minor": 0},
        "runtime": {"kind": "PLUGIN_V3ONE_RUNTIME", "major": 1, "minor": 0},
    }
    assert plugin["nb_outputs"] == 1


# ---- build-time behaviour ----------------------------------------------------------------------


def test_output_type_is_input_type_for_float_types_only(tools: Tools) -> None:
    types = probe(tools, "dynamic", "axis:kINT32:1:-1").report["output_types"]
    for name, result in types.items():
        if name in SUPPORTED_TYPES:
            assert result == {"status": 0, "type": name}
        else:
            assert result["status"] != 0, name


@pytest.mark.parametrize(
    ("dims", "axis"),
    [
        ("7", 0),
        ("7", -1),
        ("2,77", -1),
        ("2,10,77", 1),
        ("2,10,4096,4096", -1),
        ("2,10,4096,4096", -4),
        ("3,1,5,1,2", 2),
        ("2,1,3,1,2,1,5,7", -3),
        ("2,0,5", -1),
    ],
)
def test_output_shape_is_input_shape(tools: Tools, dims: str, axis: int) -> None:
    report = probe(tools, "dynamic", f"axis:kINT32:1:{axis}", dims=dims).report
    shapes = report["output_shapes"]
    assert shapes["status"] == 0
    assert shapes["dims"] == [int(d) for d in dims.split(",")]
    assert shapes["same_expressions"] is True
    assert shapes["builder_calls"] == 0
    assert set(report["configure"].values()) == {0}
    assert set(report["on_shape_change"].values()) == {0}
    # the probe asks for the output type of every TensorRT type; only those calls may fail
    assert [e for e in report["errors"] if "getOutputDataTypes" not in e] == []


def test_supports_linear_float_types_with_output_type_equal_to_input(tools: Tools) -> None:
    formats = probe(tools, "dynamic", "axis:kINT32:1:-1").report["formats"]
    expected = [[0, t, "kLINEAR"] for t in SUPPORTED_TYPES]
    expected += [[1, t, "kLINEAR", t] for t in SUPPORTED_TYPES]
    assert sorted(formats) == sorted(expected)


@pytest.mark.parametrize("loading", LOADINGS)
@pytest.mark.parametrize("axis", [-1, 0, 2, -3, 7, -8])
def test_axis_survives_serialisation(tools: Tools, loading: str, axis: int) -> None:
    report = probe(tools, loading, f"axis:kINT32:1:{axis}", dims="1,2,3,4,5,6,7,8").report
    serialised = [{"name": "axis", "type": "kINT32", "length": 1, "values": [axis]}]
    assert report["serialized_fields"] == serialised
    assert report["deserialized_fields"] == serialised
    assert report["cloned_fields"] == serialised
    assert report["attached_fields"] == serialised


def test_missing_axis_means_onnx_default(tools: Tools) -> None:
    report = probe(tools, "dynamic").report
    assert report["created"] is True
    assert report["serialized_fields"][0]["values"] == [-1]


# ---- bad fields and shapes give errors, not crashes --------------------------------------------


@pytest.mark.parametrize("loading", LOADINGS)
@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("axis:kFLOAT32:1:1.0", "expected kINT32"),
        ("axis:kINT64:1:1", "expected kINT32"),
        ("axis:kCHAR:1:x", "expected kINT32"),
        ("axis:kINT32:2:0,1", "exactly one value"),
        ("axis:kINT32:0:null", "exactly one value"),
        ("axis:kINT32:1:null", "no data"),
        ("axis:kINT32:1:8", "out of range for any TensorRT tensor"),
        ("axis:kINT32:1:-9", "out of range for any TensorRT tensor"),
        ("dim:kINT32:1:0", "unknown field 'dim'"),
    ],
)
def test_bad_field_is_an_error(tools: Tools, loading: str, field: str, message: str) -> None:
    run = probe(tools, loading, field)
    assert run.report["created"] is False
    logged = run.report["errors"] if loading == "dynamic" else [run.stderr]
    assert any(message in text and "createPlugin" in text for text in logged), logged


@pytest.mark.parametrize(("axis", "dims"), [(3, "2,3,4"), (-4, "2,3,4"), (1, "5"), (0, "")])
def test_axis_out_of_range_for_rank_is_an_error(tools: Tools, axis: int, dims: str) -> None:
    report = probe(tools, "dynamic", f"axis:kINT32:1:{axis}", dims=dims).report
    assert report["created"] is True
    assert report["output_shapes"]["status"] != 0
    assert set(report["configure"].values()) == {-1}
    assert set(report["on_shape_change"].values()) == {-1}
    assert any("getOutputShapes" in e and "rank" in e for e in report["errors"]), report["errors"]


# ---- the Python side ----------------------------------------------------------------------------


def test_trtexec_command_uses_the_getcreators_library(tools: Tools) -> None:
    command = trtexec_command("model fixed.onnx", libraries=tools.libraries)
    assert command == (
        f"trtexec '--onnx=model fixed.onnx' --dynamicPlugins={tools.libraries.dynamic}"
    )


def test_loading_flags_name_each_library(tools: Tools) -> None:
    flags = dict(tools.libraries.loading_flags())
    assert flags["trtexec --staticPlugins"] == tools.libraries.static
    assert flags["polygraphy --plugins"] == tools.libraries.static
    assert flags["trtexec --dynamicPlugins"] == tools.libraries.dynamic


def test_cli_plugins_path_prints_the_libraries(tools: Tools, capsys) -> None:
    from graphfix.cli import main

    build_dir = tools.libraries.dynamic.parent
    assert main(["plugins", "path", "dynamic", "--build-dir", str(build_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(tools.libraries.dynamic)
    assert main(["plugins", "path", "--build-dir", str(build_dir)]) == 0
    assert str(tools.libraries.static) in capsys.readouterr().out


def test_cli_plugins_path_without_a_build_says_what_to_run(tmp_path: Path, capsys) -> None:
    from graphfix.cli import main

    assert main(["plugins", "path", "--build-dir", str(tmp_path)]) == 3
    assert "run `graphfix plugins build`" in capsys.readouterr().err


def test_find_plugin_libraries_names_the_missing_files(tmp_path: Path) -> None:
    with pytest.raises(PluginBuildError, match="libgraphfix_plugins_dynamic.so"):
        find_plugin_libraries(build_dir=tmp_path)


def test_missing_nvcc_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(plugin_build, "_DEFAULT_CUDA_ROOT", str(tmp_path))
    with pytest.raises(PluginBuildError, match="nvcc"):
        plugin_build.find_nvcc()


def test_tensorrt_root_without_headers_is_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TENSORRT_ROOT", str(tmp_path))
    with pytest.raises(PluginBuildError, match=r"TENSORRT_ROOT=.* has no include/NvInferRuntime.h"):
        plugin_build.find_tensorrt_headers()


def test_missing_headers_without_download_are_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.setenv("GRAPHFIX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_build, "_system_include_dirs", lambda: [])
    monkeypatch.setattr(plugin_build, "_installed_package_dirs", lambda names: [])
    with pytest.raises(PluginBuildError, match="set TENSORRT_ROOT"):
        plugin_build.find_tensorrt_headers(allow_download=False)


def test_bad_cuda_archs_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="not a list of CUDA architectures"):
        plugin_build.build_plugins(cuda_archs="hopper")
    assert main(["plugins", "build", "--cuda-archs", "hopper"]) == 2  # the user's input
    assert "--cuda-archs='hopper' is not a list" in capsys.readouterr().err


def test_load_into_tensorrt_without_tensorrt_is_a_clear_error(tools: Tools) -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(PluginBuildError, match="TensorRT's Python package cannot be imported"):
            plugin_build.load_plugins_into_tensorrt(libraries=tools.libraries)
    else:
        pytest.skip("TensorRT is importable here; tests marked trt cover loading")


def test_non_editable_install_ships_the_sources(tmp_path: Path) -> None:
    target = tmp_path / "site"
    # pip builds in the source folder (build/, *.egg-info): build a copy, not the checkout.
    copy = tmp_path / "source"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, copy / name)
    for name in ("graphfix", "plugins"):
        shutil.copytree(REPO / name, copy / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "build"))  # fmt: skip
    # Without setuptools here, pip fetches it into an isolated build environment.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", *isolation]
        + ["--target", str(target), str(copy)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    probe_source = subprocess.run(
        [
            sys.executable,
            "-c",
            "from graphfix.plugins.build import plugin_source_dir as p; print(p())",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert probe_source.returncode == 0, probe_source.stderr
    source = Path(probe_source.stdout.strip())
    assert source.is_relative_to(target)
    for name in ("CMakeLists.txt", "graphfixSoftmax/graphfixSoftmaxPlugin.h"):
        assert (source / name).is_file(), name


def test_without_nvcc_the_harness_tests_skip_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(plugin_build, "_DEFAULT_CUDA_ROOT", str(tmp_path / "cuda"))
    with pytest.raises(pytest.skip.Exception, match="needs nvcc and CMake: nvcc .* was not found"):
        support.host_tools()
