"""`graphfix plugins build` chooses the visible GPU's architecture and shows its progress."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from graphfix.errors import PluginBuildError, UsageError
from graphfix.plugins import build as plugin_build


def _fake_nvidia_smi(folder: Path, output: str, code: int = 0) -> None:
    script = folder / "nvidia-smi"
    lines = " ".join(f"'{line}'" for line in output.splitlines()) or "''"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines}\nexit {code}\n")  # builtins only
    script.chmod(0o755)


@pytest.fixture
def no_arch_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("GRAPHFIX_CUDA_ARCHS", raising=False)
    monkeypatch.delenv("CUDAARCHS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def test_the_visible_gpu_is_the_default(no_arch_settings: Path) -> None:
    _fake_nvidia_smi(no_arch_settings, "NVIDIA H200, 9.0\nNVIDIA H200, 9.0\nNVIDIA L4, 8.9")
    chosen = plugin_build.choose_cuda_archs()
    assert chosen.value == "90;89"
    assert chosen.origin.startswith("the visible GPU(s): NVIDIA H200 (sm_90), NVIDIA H200")


@pytest.mark.parametrize("smi", [None, ("", 0), ("No devices were found", 6)])
def test_without_a_gpu_the_wide_list_and_says_so(no_arch_settings: Path, smi) -> None:
    if smi is not None:
        _fake_nvidia_smi(no_arch_settings, *smi)
    chosen = plugin_build.choose_cuda_archs()
    assert chosen.value == "default"
    assert "no GPU visible" in chosen.origin and plugin_build.WIDE_ARCHS in chosen.origin
    assert "--cuda-archs 90" in chosen.origin


def test_explicit_settings_win_in_order(
    no_arch_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(no_arch_settings, "NVIDIA H200, 9.0")
    monkeypatch.setenv("CUDAARCHS", "80;86")
    assert plugin_build.choose_cuda_archs() == plugin_build.CudaArchs("80;86", "$CUDAARCHS")
    monkeypatch.setenv("GRAPHFIX_CUDA_ARCHS", "75")
    assert plugin_build.choose_cuda_archs().value == "75"
    assert plugin_build.choose_cuda_archs("100,120").value == "100;120"
    with pytest.raises(UsageError, match=r"\$CUDAARCHS='sm90' is not a list"):
        monkeypatch.delenv("GRAPHFIX_CUDA_ARCHS")
        monkeypatch.setenv("CUDAARCHS", "sm90")
        plugin_build.choose_cuda_archs()


def test_progress_lines_stream_and_everything_is_logged(tmp_path: Path) -> None:
    tool = (
        "import sys\n"
        "print('-- configuring')\n"
        "print('[1/3] Building CUDA object a.cu.o', flush=True)\n"
        "print('[ 66%] Building CXX object b.cpp.o')\n"
        "print('[3/3] Linking CUDA shared library libx.so')\n"
    )
    seen: list[str] = []
    log = tmp_path / "build.log"
    plugin_build._run_logged([sys.executable, "-c", tool], log, "building", seen.append)
    assert seen == [
        "[1/3] Building CUDA object a.cu.o",
        "[ 66%] Building CXX object b.cpp.o",
        "[3/3] Linking CUDA shared library libx.so",
    ]
    assert "-- configuring" in log.read_text() and "[3/3] Linking" in log.read_text()
    failing = [sys.executable, "-c", "print('error: nope'); raise SystemExit(2)"]
    with pytest.raises(PluginBuildError, match=r"building failed \(exit 2\); full log: .*\n.*nope"):
        plugin_build._run_logged(failing, log, "building", seen.append)


def test_a_build_reports_the_architectures_first(
    no_arch_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tools are faked and the build stops before CMake: the choice and its reason come first.
    seen: list[str] = []

    def stop(*args, **kwargs):
        raise PluginBuildError("stopped before compiling")

    monkeypatch.setattr(plugin_build, "find_nvcc", lambda: Path("nvcc"))
    monkeypatch.setattr(plugin_build, "_find_cmake", lambda: "cmake")
    monkeypatch.setattr(plugin_build, "find_tensorrt_headers", lambda: None)
    monkeypatch.setattr(plugin_build, "_wheel_nvinfer_library", stop)
    with pytest.raises(PluginBuildError, match="stopped"):
        plugin_build.build_plugins(progress=seen.append, build_dir=no_arch_settings / "b")
    assert seen[0].startswith("building for CUDA architectures default: no GPU visible")
    assert os.environ["PATH"] == str(no_arch_settings)
