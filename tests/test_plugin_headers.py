"""Where the plugin build gets TensorRT's headers, and the TensorRT version a built library
records (issue 20 items 1, 10 and 14).  No nvcc and no network: NVIDIA's published tarball is
stood in for by a tarball of the same layout served from a file:// URL, built next to the test.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

REPO = Path(__file__).resolve().parents[1]
MARKER_SOURCE = REPO / "plugins" / "common" / "tensorrtHeaderVersion.cpp"


def _version_header(major: int, minor: int) -> str:
    """NvInferVersion.h's version lines as TensorRT 10.x/11.x write them (through the
    TRT_*_ENTERPRISE macros; TensorRT 11.1's include/NvInferVersion.h, lines 26-31)."""
    return (
        f"#define TRT_MAJOR_ENTERPRISE {major}\n#define TRT_MINOR_ENTERPRISE {minor}\n"
        "#define TRT_PATCH_ENTERPRISE 0\n"
        "#define NV_TENSORRT_MAJOR TRT_MAJOR_ENTERPRISE //!< TensorRT major version.\n"
        "#define NV_TENSORRT_MINOR TRT_MINOR_ENTERPRISE //!< TensorRT minor version.\n"
    )


def _include_dir(folder: Path, major: int, minor: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "NvInferVersion.h").write_text(_version_header(major, minor))
    (folder / "NvInferRuntime.h").write_text('#include "NvInferVersion.h"\n')
    return folder


def _release_tarball(path: Path, top: str, major: int, minor: int) -> None:
    """A tarball laid out like GitHub's archive of a TensorRT OSS tag: TOP/include/*.h beside
    the rest of the repository."""
    files = {
        f"{top}/include/NvInferVersion.h": _version_header(major, minor),
        f"{top}/include/NvInferRuntime.h": '#include "NvInferVersion.h"\n',
        f"{top}/include/impl/NvInferRuntimeImpl.h": "// impl\n",
        f"{top}/plugin/README.md": "not a header\n",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def pip_only_tensorrt(monkeypatch, tmp_path):
    """TensorRT 11.1.0 installed from pip only: no TENSORRT_ROOT, no system or wheel headers, an
    empty cache, NVIDIA's address replaced by a file:// folder of tarballs."""
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.setenv("GRAPHFIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(plugin_build, "_system_include_dirs", lambda: [])
    monkeypatch.setattr(plugin_build, "_installed_package_dirs", lambda names: [])
    monkeypatch.setattr(plugin_build, "installed_tensorrt_version", lambda: "11.1.0.106")
    releases = tmp_path / "releases"
    releases.mkdir()
    monkeypatch.setenv("GRAPHFIX_TENSORRT_HEADERS_URL", f"file://{releases}/{{tag}}.tar.gz")
    return releases


# --- item 1: pip-only TensorRT 11 gets NVIDIA's published headers for its major.minor -----------


def test_pip_only_tensorrt_11_fetches_the_published_headers_of_its_release(pip_only_tensorrt):
    # the repository tags 11.1 as v11.1 (no v11.1.0): the patch tag is tried first, then this
    _release_tarball(pip_only_tensorrt / "v11.1.tar.gz", "TensorRT-11.1", 11, 1)
    headers = plugin_build.find_tensorrt_headers()
    assert headers.origin == "NVIDIA's published headers"
    assert headers.include_dir == plugin_build.published_headers_dir(11, 1)
    assert plugin_build.tensorrt_header_version(headers.include_dir) == (11, 1)
    assert (headers.include_dir / "impl" / "NvInferRuntimeImpl.h").is_file()
    assert not (headers.include_dir / "README.md").exists()
    (pip_only_tensorrt / "v11.1.tar.gz").unlink()  # cached: found again without the network
    assert plugin_build.find_tensorrt_headers(allow_download=False) == headers


def test_offline_pip_tensorrt_11_says_which_command_fetches_the_headers(pip_only_tensorrt):
    with pytest.raises(PluginBuildError) as raised:
        plugin_build.find_tensorrt_headers()
    message = str(raised.value)
    assert "\n" not in message
    assert "TensorRT 11.1.0.106 is installed from pip, whose wheels ship no headers" in message
    assert "v11.1.0.tar.gz" in message and "v11.1.tar.gz" in message  # both tags were tried
    # the command it gives is one a shell runs: here with the file:// address, as offline users
    # would with the tarball copied from elsewhere
    command = message.split("run `", 1)[1].split("`", 1)[0]
    _release_tarball(pip_only_tensorrt / "v11.1.tar.gz", "TensorRT-11.1", 11, 1)
    subprocess.run(["bash", "-c", command], check=True, capture_output=True)
    headers = plugin_build.find_tensorrt_headers(allow_download=False)
    assert plugin_build.tensorrt_header_version(headers.include_dir) == (11, 1)


def test_headers_of_the_other_major_are_passed_over(pip_only_tensorrt, tmp_path, monkeypatch):
    ngc10 = _include_dir(tmp_path / "usr-include", 10, 14)
    monkeypatch.setattr(plugin_build, "_system_include_dirs", lambda: [ngc10])
    with pytest.raises(PluginBuildError, match="passed over: .*usr-include \\(TensorRT 10\\)"):
        plugin_build.find_tensorrt_headers(allow_download=False)
    ngc11 = _include_dir(tmp_path / "usr-local-TensorRT-11.1", 11, 1)
    monkeypatch.setattr(plugin_build, "_system_include_dirs", lambda: [ngc10, ngc11])
    assert plugin_build.find_tensorrt_headers() == plugin_build.TensorRTHeaders(ngc11, "system")


def test_a_tarball_of_another_release_is_refused(pip_only_tensorrt):
    _release_tarball(pip_only_tensorrt / "v11.1.tar.gz", "TensorRT-11.0", 11, 0)
    with pytest.raises(PluginBuildError, match="holds TensorRT \\(11, 0\\) headers, not 11.1"):
        plugin_build.find_tensorrt_headers()
    assert not plugin_build.published_headers_dir(11, 1).exists()


# --- item 10: the library records the headers' version; checked before loading ---------------


def _marker_library(tmp_path: Path, major: int, minor: int) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    include = _include_dir(tmp_path / f"include-{major}.{minor}", major, minor)
    library = tmp_path / f"libmarker{major}.so"
    subprocess.run(
        [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
        + [f"-I{include}", str(MARKER_SOURCE), "-o", str(library)],
        check=True,
        capture_output=True,
    )
    return library


@pytest.mark.parametrize(("major", "minor"), [(10, 8), (10, 14), (11, 1)])
def test_built_library_records_its_tensorrt_headers(tmp_path, major, minor):
    library = _marker_library(tmp_path, major, minor)
    assert plugin_build.library_tensorrt_headers(library) == (major, minor)


def test_library_of_the_other_major_is_refused_before_loading(tmp_path):
    library = _marker_library(tmp_path, 11, 1)
    plugin_build.check_library_tensorrt(library, tensorrt_version="11.4.0.106")
    with pytest.raises(PluginBuildError) as raised:
        plugin_build.check_library_tensorrt(library, tensorrt_version="10.14.1.48")
    message = str(raised.value)
    assert "built with TensorRT 11.1 headers but this is TensorRT 10.14.1.48" in message
    assert "graphfix plugins build" in message and "\n" not in message


def test_trtexec_line_is_refused_for_a_library_of_the_other_major(tmp_path, monkeypatch):
    library = _marker_library(tmp_path, 10, 14)
    libraries = plugin_build.PluginLibraries(static=library, dynamic=library)
    monkeypatch.setattr(plugin_build, "installed_tensorrt_version", lambda: "11.1.0")
    with pytest.raises(PluginBuildError, match="built with TensorRT 10.14 headers"):
        plugin_build.trtexec_command("m.onnx", libraries=libraries)
    monkeypatch.setattr(plugin_build, "installed_tensorrt_version", lambda: None)
    assert "--dynamicPlugins=" in plugin_build.trtexec_command("m.onnx", libraries=libraries)


def test_library_that_records_nothing_is_left_to_the_loader(tmp_path):
    library = tmp_path / "libold.so"
    library.write_bytes(b"\x7fELF built by an older graphfix")
    assert plugin_build.library_tensorrt_headers(library) is None
    plugin_build.check_library_tensorrt(library, tensorrt_version="11.1.0")


def test_wiring_the_marker_source_is_in_both_libraries():
    """Wiring check: CMake compiles the marker into the object library both libraries link."""
    cmake = (REPO / "plugins" / "CMakeLists.txt").read_text()
    objects = cmake.split("add_library(graphfix_plugin_objects OBJECT", 1)[1].split(")", 1)[0]
    assert "common/tensorrtHeaderVersion.cpp" in objects


def test_build_manifest_names_the_headers(tmp_path):
    include = _include_dir(tmp_path / "include", 11, 1)
    headers = plugin_build.TensorRTHeaders(include, "NVIDIA's published headers")
    plugin_build._write_manifest(tmp_path, headers, None, None, ("a note",))
    manifest = json.loads((tmp_path / plugin_build.BUILD_MANIFEST).read_text())
    assert manifest["tensorrt_headers"] == "11.1"
    assert manifest["tensorrt_headers_origin"] == "NVIDIA's published headers"
    assert manifest["notes"] == ["a note"]


# --- item 14: cudnn.h present, frontend download fails: the build goes on without cuDNN ------


def test_offline_cudnn_frontend_falls_back_to_the_own_kernels(tmp_path, monkeypatch):
    cudnn = tmp_path / "cudnn" / "include"
    cudnn.mkdir(parents=True)
    (cudnn / "cudnn.h").write_text("// cuDNN 9\n")
    monkeypatch.setenv("GRAPHFIX_CUDNN_INCLUDE_DIR", str(cudnn))
    monkeypatch.delenv("GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR", raising=False)
    monkeypatch.setenv("GRAPHFIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(plugin_build, "_system_include_dirs", lambda: [])
    monkeypatch.setattr(plugin_build, "_installed_package_dirs", lambda names: [])
    # offline as far as pip is concerned: no index, nothing to find
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    headers, note = plugin_build.cudnn_headers_for_build()
    assert headers is None
    assert note is not None and "cuDNN path left out, its own kernels only" in note
    assert "nvidia-cudnn-frontend" in note and "GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR" in note
