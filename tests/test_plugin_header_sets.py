"""The plugins' and harnesses' host sources compile against a TensorRT 10.x and an 11.x header set
(issue 20 item 11).

Every C++ (not CUDA) source under plugins/ — the plugins, their creators, the registration entry
points and the host harnesses with their test doubles — is compiled by g++ (`-fsyntax-only`)
against each header set: the kernels are CUDA with no TensorRT types, compiled by the nvcc tests.

Header sets: TensorRT 10.14 from the kernel-lens wheel (PyPI, fetched into graphfix's cache as a
plugin build does); any TensorRT 11 headers `graphfix plugins build` fetched into the cache for a
pip-only TensorRT 11; and the include folders listed in $GRAPHFIX_TENSORRT_HEADER_SETS
(os.pathsep-separated, e.g. NVIDIA/TensorRT's include/ at the tags v10.8.0 and v11.1).  No PyPI
package ships TensorRT 11 headers (the tensorrt-cu12/cu13 wheels ship none), so where no 11.x set
is present the 11.x test skips saying how to provide one.  CUDA's host headers come from the CUDA
toolkit, else from the nvidia-cuda-runtime, -crt and -cccl wheels (PyPI, into the cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "plugins"
# The CUDA 13 wheels holding cuda_runtime_api.h, crt/host_defines.h and libcu++'s nv/target.
CUDA_HEADER_WHEELS = (
    ("nvidia-cuda-runtime==13.5.37", "cuda_runtime_api.h"),
    ("nvidia-cuda-crt==13.5.37", "crt/host_defines.h"),
    ("nvidia-cuda-cccl==13.3.5.0.6", "nv/target"),
)


def _sources() -> list[Path]:
    return sorted(PLUGINS.rglob("*.cpp"))


def _cuda_include_dirs() -> list[Path]:
    try:
        toolkit = plugin_build.find_nvcc().resolve().parent.parent / "include"
    except PluginBuildError:
        toolkit = None
    if toolkit is not None and (toolkit / "cuda_runtime_api.h").is_file():
        return [toolkit]
    folders = []
    for requirement, header in CUDA_HEADER_WHEELS:
        name = requirement.replace("==", "-")
        folder = plugin_build.cache_dir() / "cuda-headers" / name / "include"
        try:
            folders.append(
                plugin_build._fetch_wheel_headers(
                    requirement,
                    prefix="nvidia/cu13/include/",
                    include_dir=folder,
                    header=header,
                    missing="no CUDA toolkit here",
                    remedy="install the CUDA toolkit",
                    suffixes=None,
                )
            )
        except PluginBuildError as exc:
            pytest.skip(f"no CUDA headers to compile against: {exc}")
    return folders


def _header_sets() -> dict[str, Path]:
    """(TensorRT major.minor → include folder) of every header set present here."""
    sets: dict[str, Path] = {}
    configured = os.environ.get("GRAPHFIX_TENSORRT_HEADER_SETS", "")
    cached = sorted((plugin_build.cache_dir() / "tensorrt-headers").glob("nvidia-*/include"))
    for folder in [Path(p) for p in configured.split(os.pathsep) if p] + cached:
        major, minor = plugin_build.tensorrt_header_version(folder)
        sets.setdefault(f"{major}.{minor}", folder)
    return sets


def _compile(include_dir: Path) -> None:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    includes = sorted({p.parent for p in PLUGINS.rglob("*.h")})
    command = [compiler, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra"]
    command += ["-Wno-deprecated-declarations"]
    command += [f"-I{p}" for p in includes]
    command += [f"-isystem{include_dir}"] + [f"-isystem{p}" for p in _cuda_include_dirs()]
    failed = []
    for source in _sources():
        done = subprocess.run([*command, str(source)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            failed.append(f"{source.relative_to(REPO)}: {errors[:3]}")
    assert not failed, "\n".join(failed)


def test_host_sources_compile_against_tensorrt_10_14_from_pypi():
    try:
        include_dir = plugin_build.fetch_tensorrt_headers()
    except PluginBuildError as exc:
        pytest.skip(f"kernel-lens's TensorRT 10.14 headers cannot be fetched here: {exc}")
    assert plugin_build.tensorrt_header_version(include_dir) == (10, 14)
    _compile(include_dir)


def test_host_sources_compile_against_tensorrt_11():
    elevens = {v: p for v, p in _header_sets().items() if v.startswith("11.")}
    if not elevens:
        pytest.skip(
            "no TensorRT 11 header set here (no PyPI package ships one): set "
            "GRAPHFIX_TENSORRT_HEADER_SETS to an include/ of NVIDIA/TensorRT at v11.x, or run "
            "`graphfix plugins build` once with pip TensorRT 11, which caches NVIDIA's headers"
        )
    for include_dir in elevens.values():
        _compile(include_dir)


def test_host_sources_compile_against_other_configured_tensorrt_10_sets():
    """TensorRT 10.0–10.9 (no getAllCreatorsRecursive) and the rest, where configured."""
    tens = {v: p for v, p in _header_sets().items() if v.startswith("10.")}
    if not tens:
        pytest.skip("no TensorRT 10 header set configured in GRAPHFIX_TENSORRT_HEADER_SETS")
    for include_dir in tens.values():
        _compile(include_dir)
