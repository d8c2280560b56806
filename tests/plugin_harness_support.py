"""What the plugin harness tests share: finding the GPU, building the libraries and a harness.

Used by test_plugin_host_harness.py, test_attention_plugin_host.py (host, no GPU) and
test_plugin_gpu.py, test_attention_plugin_gpu.py (GPU). The libraries are built in
cache_dirs.root()/plugin-build-<archs>-<checkout> (outside the source tree); the harnesses are plugins/tests/pluginHarness.cpp
(`target` None) and plugins/tests/attentionHarness.cpp (ATTENTION_HARNESS_NAME).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cache_dirs
import numpy as np
import pytest
from compile_cache import owned_temp_folder

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build
from graphfix.plugins.build import PluginLibraries, build_plugin_harness, build_plugins


@dataclass(frozen=True)
class Tools:
    libraries: PluginLibraries
    harness: Path

    def library(self, loading: str) -> Path:
        return self.libraries.static if loading == "static" else self.libraries.dynamic


def require_build_tools() -> None:
    """Skip, saying what is missing, where nvcc or CMake is (the README's promise)."""
    try:
        plugin_build.find_nvcc()
        plugin_build._find_cmake()
    except PluginBuildError as exc:
        pytest.skip(f"building the plugins needs nvcc and CMake: {exc}")


def plugin_build_dir(archs: str) -> Path:
    """Where the tests build the plugins for CUDA architectures `archs`: one folder per checkout
    (CMake refuses a build folder configured from other sources). benchmarks/gpu_env.sh builds
    there too, so that a GPU run's tests find the build done."""
    checkout = hashlib.sha1(str(plugin_build.plugin_source_dir()).encode()).hexdigest()[:10]
    return cache_dirs.root() / f"plugin-build-{archs.replace(';', '-')}-{checkout}"


def build_tools(archs: str, target: str | None = None) -> Tools:
    """The plugin libraries for CUDA architectures `archs` and the harness `target`."""
    require_build_tools()
    build_dir = plugin_build_dir(archs)
    with owned_temp_folder():  # nvcc's temporaries, removed however the build ends
        libraries = build_plugins(build_dir=build_dir, cuda_archs=archs).libraries
        harness = build_plugin_harness(build_dir=build_dir, target=target)
    return Tools(libraries=libraries, harness=harness)


def host_tools(target: str | None = None) -> Tools:
    """For the host tests: architectures $GRAPHFIX_TEST_CUDA_ARCHS, default 75."""
    return build_tools(os.environ.get("GRAPHFIX_TEST_CUDA_ARCHS", "75"), target)


def gpu_compute_capability() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    done = subprocess.run(
        [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    return lines[0].strip().replace(".", "")


def gpu_tools(target: str | None = None) -> Tools:
    """For the GPU tests: skips without a GPU; architectures $GRAPHFIX_TEST_CUDA_ARCHS, else the GPU's."""
    capability = gpu_compute_capability()
    if capability is None:
        pytest.skip("no NVIDIA GPU (nvidia-smi lists none)")
    return build_tools(os.environ.get("GRAPHFIX_TEST_CUDA_ARCHS", capability), target)


def run_harness_process(
    tools: Tools,
    command: str,
    loading: str,
    *args: str,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`harness COMMAND --library L --loading LOADING ARGS...`, its output captured as text."""
    return subprocess.run(
        [str(tools.harness), command, "--library", str(tools.library(loading))]
        + ["--loading", loading, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (inputs hold no NaN)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
