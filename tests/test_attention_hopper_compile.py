"""GraphfixAttention's Hopper kernel on a machine without a GPU: a compile-only check.

CI has nvcc but no GPU, and its host harness builds for sm_75, where the Hopper kernel (wgmma,
sm_90a machine code only) is not built at all. This compiles its translation units for
sm_90a (float16, bfloat16 and the float32 3xTF32 kernel) as CMake does and checks what only the compiler can tell without an H200: it compiles, every kernel instance
is there, ptxas did not serialise the wgmma chains (its C751x messages: still correct, every
wgmma then waits for the one before; the bfloat16 kernels had C7513 until this test covered them) and, where cuobjdump is
installed, the machine code holds HGMMA. Whether the kernel is *right* is checked on the GPU
(tests/test_attention_plugin_gpu.py, backends `portable` and `portable_mma`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from compile_cache import compile_once

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "float16": REPO / "plugins" / "graphfixAttention" / "hopper" / "graphfixAttentionHopperHalf.cu",
    "bfloat16": REPO
    / "plugins"
    / "graphfixAttention"
    / "hopper"
    / "graphfixAttentionHopperBFloat16.cu",
    "float32": REPO
    / "plugins"
    / "graphfixAttention"
    / "hopper"
    / "graphfixAttentionHopperFloat.cu",
}
# Each type's kernel entry (mangled name) and the template arguments that name one instance.
KERNEL = {
    "float16": "hopperAttentionKernel",
    "bfloat16": "hopperAttentionKernel",
    "float32": "hopperTf32(?:Short|Wide)?Kernel",
}
INSTANCE = {
    "float16": r"__halfLi(\d+)ELi\d+ELi\d+ELb[01]",
    "bfloat16": r"13__nv_bfloat16Li(\d+)ELi\d+ELi\d+ELb[01]",
    "float32": r"hopperTf32(?:Short|Wide)?KernelILi(\d+)E(?:Li\d+ELi\d+E)?Lb[01]",
}
# Head dims each type's kernel is built for (72 is padded to 80 in 16 bits, exact in float32).
WIDE = {160, 192, 256}
DIMS = {
    "float16": {64, 80, 96, 128} | WIDE,
    "bfloat16": {64, 80, 96, 128} | WIDE,
    "float32": {32, 64, 72, 96, 128, 192, 256},
}
# 16-bit: the 8 padded head dims x plain, key-mask and general x loads by cp.async early or late,
# or by TMA (72); float32: its 3 head dims x plain and masked (6), the persistent short-key
# kernel (keys in at most two tiles) at head dims 32 and 64 x plain and masked (4), and the
# wide-head kernel at 96, 128, 192 and 256 x plain and masked (8).
ENTRIES = {"float16": 72, "bfloat16": 72, "float32": 18}
# The float32 short-key kernel's head dims (its third Q buffer does not fit at 72).
SHORT_DIMS = {32, 64}
# The 16-bit warp-specialised kernel (hopperProducerKernel, shapes without mask and softcap):
# P·V's type (the I/O type, a substitution in the mangled name, or bfloat16's float16 P·V:
# 6__half, kHOPPER_VARIANT_HALF_VALUES), padded head dim, keys per tile, K/V stages and 128-byte
# swizzled tiles (kHOPPER_VARIANT_SWIZZLE): at 128 with and without, at 64 (128-key tiles) and
# 256 (64-key tiles) swizzled only.
PRODUCER_INSTANCE = (
    r"hopperProducerKernelI(?:6__half|13__nv_bfloat16)(S\d*_|6__half)"
    r"Li(\d+)ELi(\d+)ELi(\d+)ELb([01])E"
)
PRODUCER_SHAPES = {(128, 128, 2, 0), (128, 128, 2, 1), (64, 128, 2, 1), (256, 64, 2, 1)}
PRODUCER_BUILT = {
    "float16": {(False, *shape) for shape in PRODUCER_SHAPES},
    "bfloat16": {(half, *shape) for shape in PRODUCER_SHAPES for half in (False, True)},
}
# The 16-bit persistent short-key kernel (hopperShortKernel: keys in at most two 64-key tiles,
# no mask, no softcap) at padded head dims 32 and 64, two blocks per SM (at most 128 registers),
# and whether its tiles are 128-byte swizzled (kHOPPER_VARIANT_SWIZZLE: at 64 with and without).
SHORT_INSTANCE = r"hopperShortKernelI(?:6__half|13__nv_bfloat16)Li(\d+)ELb([01])E"
SHORT_16_BUILT = {(32, False), (64, False), (64, True)}
# Kernels left serialised on purpose, with the measurement that chose it: bfloat16's plain
# head-dim-80 kernels keep two blocks of 128 registers, where ptxas serialises them whether or not
# they wait (kWAIT_PV in graphfixAttentionHopper.cuh); SigLIP-384 b32 on the H200: 0.487 ms
# (two serialised blocks) against 0.585 ms (one pipelined block). The prefix names all four of
# them: plain and key-mask (kKEYMASK), loads before or after the wgmmas (kLATE_LOADS), and the
# TMA-loading two of them (kTMA: no spills there, still serialised at 128 registers).
SERIALISED_BY_CHOICE = {"bfloat16": ("13__nv_bfloat16Li80ELi64ELi2ELb1",)}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def compiled(request) -> tuple[Path, str, str]:
    dtype = request.param
    source = SOURCES[dtype]
    try:
        nvcc = plugin_build.find_nvcc()
    except PluginBuildError as exc:
        pytest.skip(f"the compile-only Hopper check needs nvcc: {exc}")
    common = REPO / "plugins" / "common"

    def command(cubin: Path) -> list[str]:
        return [
            str(nvcc), "-cubin", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
            "-Xptxas", "-v", f"-I{source.parent}", f"-I{common}", str(source), "-o", str(cubin),
        ]  # fmt: skip

    # The folders its includes reach (hopper/ reads ../flash/): a change there compiles again.
    attention = REPO / "plugins" / "graphfixAttention"
    done = compile_once(f"hopper_{dtype}.cubin", command, read=(attention, common))
    if done.returncode != 0 and "Unsupported gpu architecture" in done.log:
        pytest.skip(f"this nvcc cannot target sm_90a: {done.log.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.log
    return done.output, done.log, dtype


def test_every_hopper_kernel_instance_compiles_for_sm_90a(compiled):
    """Compile-only: every head dim (16-bit: 32/64/80/96/128/160/192/256, 72 padded to 80, plain, key-mask
    and general kernels, cp.async loads early or late or TMA loads; float32: 32/64/72, plain and
    masked, the short-key kernel at 32/64 and the wide-head kernel at 96/128/192/256)."""
    _, log, dtype = compiled
    entries = re.findall(
        r"Compiling entry function '(\w*" + KERNEL[dtype] + r"\w*)' for 'sm_90a'", log
    )
    dims = {int(m) for e in entries for m in re.findall(INSTANCE[dtype], e)}
    assert DIMS[dtype] <= dims, entries
    assert len(entries) == ENTRIES[dtype], entries
    if dtype == "float32":
        short = {
            int(m) for e in entries for m in re.findall(r"hopperTf32ShortKernelILi(\d+)ELb[01]", e)
        }
        assert short == SHORT_DIMS, entries


def test_the_warp_specialised_kernels_compile_without_spills(compiled):
    """16-bit: the warp-specialised kernel (two K/V stages; PRODUCER_BUILT; bfloat16 also with
    float16 P·V), with no spills: its consumers run at the 240 registers setmaxnreg gives them
    (ptxas reports the 168 of the launch)."""
    _, log, dtype = compiled
    if dtype == "float32":
        pytest.skip("16-bit only")
    properties = re.findall(
        r"Compiling entry function '\w*(" + PRODUCER_INSTANCE + r")\w*' for 'sm_90a'\n"
        r"[^\n]*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores",
        log,
    )
    built = {(instance[1] == "6__half", *map(int, instance[2:6])) for instance in properties}
    assert built == PRODUCER_BUILT[dtype], properties
    assert all(stack == "0" and spills == "0" for *_, stack, spills in properties), properties
    # bfloat16 also converts V inside the float16 P·V kernel at padded head dim 64
    # (kHOPPER_VARIANT_CONVERT_IN_KERNEL: the instance whose last template argument is true)
    converting = re.findall(
        r"Compiling entry function '\w*hopperProducerKernelI\w*Li(\d+)ELi\d+ELi\d+ELb1ELb1E\w*'",
        log,
    )
    assert converting == (["64"] if dtype == "bfloat16" else []), converting
    # and the flash blocks that recompute a converting block whose V exceeded float16's range
    # (hopperSplitFallbackKernel), at 64, bfloat16 only, with no spills
    fallback = re.findall(
        r"Compiling entry function '\w*hopperSplitFallbackKernelI\w*Li(\d+)ELi\d+E\w*' for 'sm_90a'\n"
        r"[^\n]*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores",
        log,
    )
    assert fallback == ([("64", "0", "0")] if dtype == "bfloat16" else []), fallback


def test_the_short_key_kernels_compile_without_spills(compiled):
    """16-bit: the persistent short-key kernel at padded head dims 32 and 64 (and swizzled at
    64), with no spills within the 128 registers of its two blocks per SM."""
    _, log, dtype = compiled
    if dtype == "float32":
        pytest.skip("16-bit only (float32's short-key kernel is counted above)")
    properties = re.findall(
        r"Compiling entry function '\w*" + SHORT_INSTANCE + r"\w*' for 'sm_90a'\n"
        r"[^\n]*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores[^\n]*\n"
        r"[^\n]*Used (\d+) registers",
        log,
    )
    assert {(int(dim), swizzle == "1") for dim, swizzle, *_ in properties} == SHORT_16_BUILT
    assert len(properties) == len(SHORT_16_BUILT), properties
    assert all(stack == "0" and spills == "0" for _, _, stack, spills, _ in properties), properties
    assert all(int(registers) <= 128 for *_, registers in properties), properties


def test_ptxas_does_not_serialise_the_wgmma_chains(compiled):
    """ptxas serialises wgmma (correct, slower: every wgmma then waits for the one before) when
    an accumulator crosses a function boundary, registers run short (C7512) or an input register
    is written while a wgmma may still read it (C7513, which the bfloat16 kernels had)."""
    _, log, dtype = compiled
    serialised = {
        (
            re.search(INSTANCE[dtype], line)
            or re.search(PRODUCER_INSTANCE, line)
            or re.search(SHORT_INSTANCE, line)
        ).group(0)
        for line in log.splitlines()
        if re.search(r"C751\d|wgmma\.mma_async instructions are serialized", line)
    }
    assert serialised <= set(SERIALISED_BY_CHOICE.get(dtype, ())), log


def test_the_machine_code_holds_hgmma(compiled):
    """HGMMA (wgmma) in every type's kernels; UTMALDG (TMA box loads, cp.async.bulk.tensor) in
    the 16-bit ones (the H200 build of the eighth round held 180)."""
    cubin, _, dtype = compiled
    cuobjdump = shutil.which("cuobjdump") or shutil.which(
        "cuobjdump", path=str(plugin_build.find_nvcc().parent)
    )
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed next to nvcc or on PATH")
    sass = subprocess.run(
        [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    assert "HGMMA" in sass
    if dtype != "float32":
        assert "UTMALDG" in sass
