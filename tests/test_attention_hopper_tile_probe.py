"""The warp-specialised Hopper kernel's tile path, alone: plugins/tests/hopperTileProbe.cu.

The probe loads one Q, K and V tile with the kernel's own TMA maps (encodeHopperMaps) and box
loads (loadTile), in the no-swizzle and the 128-byte swizzled layouts, multiplies them with the
kernel's own wgmma chains and descriptors, and checks S = Q Kᵀ and P V against float64 on the
host, over tiles with zero fill past the rows and past D. Every wait on a load gives up after a
second and names the load, so a wrong box or byte count fails here instead of hanging the GPU
tests. Compiled for sm_90a without a GPU (`compile` marker: no spills, no serialised wgmma); run
on an sm_90 GPU (`gpu` marker).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import plugin_harness_support as support
import pytest
from compile_cache import compile_once

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

REPO = Path(__file__).resolve().parents[1]
HOPPER = REPO / "plugins" / "graphfixAttention" / "hopper"
PROBE = REPO / "plugins" / "tests" / "hopperTileProbe.cu"


@pytest.fixture(scope="module")
def probe() -> tuple[Path, str]:
    try:
        nvcc = plugin_build.find_nvcc()
    except PluginBuildError as exc:
        pytest.skip(f"the Hopper tile probe is built with nvcc: {exc}")

    def command(binary: Path) -> list[str]:
        return [
            str(nvcc), "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas",
            "-v", "-DGRAPHFIX_WITH_HOPPER", f"-I{HOPPER}", f"-I{REPO / 'plugins' / 'common'}",
            str(PROBE), str(HOPPER / "graphfixAttentionHopperPlan.cpp"), "-o", str(binary),
        ]  # fmt: skip

    done = compile_once(
        "hopperTileProbe",
        command,
        read=(HOPPER.parent, REPO / "plugins" / "common", PROBE.parent),
    )
    if done.returncode != 0 and "Unsupported gpu architecture" in done.log:
        pytest.skip(f"this nvcc cannot target sm_90a: {done.log.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.log
    return done.output, done.log


@pytest.mark.compile
def test_the_tile_probe_compiles_without_spills_or_serialised_wgmma(probe) -> None:
    """Its 4 kernels (float16 / bfloat16 x no swizzle / 128-byte swizzle)."""
    _, log = probe
    entries = re.findall(r"Compiling entry function '(\w*tileProbeKernel\w*)' for 'sm_90a'", log)
    assert len(entries) == 4, entries
    # the probe's kernels and any its header brings (the float16 P·V conversion pass)
    assert set(re.findall(r"(\d+) bytes spill stores", log)) == {"0"}, log
    assert not re.search(r"C751\d", log), log


@pytest.mark.gpu
def test_tma_tiles_and_wgmma_descriptors_match_float64(probe) -> None:
    if support.gpu_compute_capability() != "90":
        pytest.skip("the probe runs wgmma and TMA: an sm_90 GPU (H100/H200) only")
    binary, _ = probe
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("\nok"), done.stdout + done.stderr
