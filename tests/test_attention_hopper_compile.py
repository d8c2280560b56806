"""GraphfixAttention's Hopper kernel on a machine without a GPU: a compile-only check.

CI has nvcc but no GPU, and its host harness builds for sm_75, where the Hopper kernel (wgmma,
sm_90a machine code only) is not built at all. This compiles its float16 translation unit for
sm_90a as CMake does and checks what only the compiler can tell without an H200: it compiles,
every kernel instance is there, ptxas did not serialise the wgmma chains (its C7510/C7514
warnings, which make the kernel several times slower and still correct) and, where cuobjdump is
installed, the machine code holds HGMMA. Whether the kernel is *right* is checked on the GPU
(tests/test_attention_plugin_gpu.py, backends `portable` and `portable_mma`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "plugins" / "graphfixAttention" / "graphfixAttentionHopperHalf.cu"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, str]:
    try:
        nvcc = plugin_build.find_nvcc()
    except PluginBuildError as exc:
        pytest.skip(f"the compile-only Hopper check needs nvcc: {exc}")
    cubin = tmp_path_factory.mktemp("hopper") / "hopper_half.cubin"
    command = [
        str(nvcc), "-cubin", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
        "-Xptxas", "-v", f"-I{SOURCE.parent}", f"-I{REPO / 'plugins' / 'common'}",
        str(SOURCE), "-o", str(cubin),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    if done.returncode != 0 and "Unsupported gpu architecture" in log:
        pytest.skip(f"this nvcc cannot target sm_90a: {log.strip().splitlines()[-1]}")
    assert done.returncode == 0, log
    return cubin, log


def test_every_hopper_kernel_instance_compiles_for_sm_90a(compiled):
    """Compile-only: head dims 64/80/96/128 (72 is padded to 80), plain and masked variants."""
    _, log = compiled
    entries = re.findall(
        r"Compiling entry function '(\w*hopperAttentionKernel\w*)' for 'sm_90a'", log
    )
    dims = {int(m) for e in entries for m in re.findall(r"__halfLi(\d+)E", e)}
    assert {64, 80, 96, 128} <= dims, entries
    assert len(entries) >= 8  # each head dim with and without the mask/softcap code


def test_ptxas_does_not_serialise_the_wgmma_chains(compiled):
    """ptxas serialises wgmma (correct, several times slower) when an accumulator crosses a
    function boundary or a register is touched between the async issue and its wait."""
    _, log = compiled
    assert not re.search(r"C75(10|14)|wgmma\.mma_async instructions are serialized", log), log


def test_the_machine_code_holds_hgmma(compiled):
    cubin, _ = compiled
    cuobjdump = shutil.which("cuobjdump") or shutil.which(
        "cuobjdump", path=str(plugin_build.find_nvcc().parent)
    )
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed next to nvcc or on PATH")
    sass = subprocess.run(
        [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    assert "HGMMA" in sass
