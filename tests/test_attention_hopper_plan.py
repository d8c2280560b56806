"""GraphfixAttention's Hopper plan (planHopperAttention) on a machine without a GPU.

Which Hopper kernel runs a shape, at what tiling and shared memory, or why none does, is host
logic; on a GPU it is reached only on an sm_90 device of a build for sm_90a, which CI has neither
of. plugins/tests/hopperPlanProbe.cpp compiles the plan's translation unit as such a build does
(GRAPHFIX_WITH_HOPPER, no kernels) and prints its plan for any device and shape. The expected
shared memory is computed here from the kernels' documented layouts (graphfixAttentionHopper.cuh,
graphfixAttentionHopperFloat.cu), not read back from the plan. That the kernels then run the
plan correctly is checked on the GPU (tests/test_attention_plugin_gpu.py, path-choice test).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from compile_cache import compile_once

from graphfix.errors import PluginBuildError
from graphfix.plugins import build as plugin_build

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "plugins" / "graphfixAttention" / "hopper"
H100_SHARED = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200 (227 KB)
ROWS, KEYS = 128, 64  # 2 warpgroups x 64 query rows, 64-key tiles
PRODUCER_BIT, SWIZZLE_BIT = 32, 128  # kHOPPER_VARIANT_PRODUCER, kHOPPER_VARIANT_SWIZZLE
SHORT_BIT = 512  # kHOPPER_VARIANT_SHORT_KEYS


@pytest.fixture(scope="module")
def probe() -> Path:
    try:
        nvcc = plugin_build.find_nvcc()
    except PluginBuildError as exc:
        pytest.skip(f"the Hopper plan probe is built with nvcc's host compiler: {exc}")

    def command(binary: Path) -> list[str]:
        return [
            str(nvcc), "-std=c++17", "-DGRAPHFIX_WITH_HOPPER", f"-I{SOURCE}",
            str(REPO / "plugins" / "tests" / "hopperPlanProbe.cpp"),
            str(SOURCE / "graphfixAttentionHopperPlan.cpp"), "-o", str(binary),
        ]  # fmt: skip

    done = compile_once(
        "hopperPlanProbe", command, read=(SOURCE.parent, REPO / "plugins" / "tests")
    )
    assert done.returncode == 0, done.log
    return done.output


def plan(probe: Path, element_bytes: int, d: int, dv: int | None = None, *, t: int = 4096,
         cc: tuple[int, int] = (9, 0), shared: int = H100_SHARED) -> dict:  # fmt: skip
    dims = [2, 10, 10, 4096, t, d, d if dv is None else dv]
    args = [element_bytes, *cc, shared, *dims]
    done = subprocess.run([str(probe), *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def sixteen_bit_bytes(padded: int) -> int:
    """Q (128 rows) and two stages each of K and V (64 keys), 2 bytes an element."""
    return (ROWS + 4 * KEYS) * padded * 2


def float32_bytes(padded: int) -> int:
    """Q hi and lo (128 rows) and two stages each of K hi, K lo, Vᵀ hi, Vᵀ lo (64 keys)."""
    return (2 * ROWS + 8 * KEYS) * padded * 4


@pytest.mark.parametrize(
    ("d", "dv", "padded"),
    [(32, 32, 32), (40, 40, 64), (64, 64, 64), (72, 72, 80), (64, 72, 80), (96, 96, 96),
     (104, 104, 128), (128, 64, 128), (136, 136, 160), (160, 128, 160), (192, 192, 192),
     (200, 256, 256), (256, 256, 256)],
)  # fmt: skip
def test_sixteen_bit_heads_take_the_next_built_dim(probe, d: int, dv: int, padded: int) -> None:
    got = plan(probe, 2, d, dv)
    assert got["reason"] == ""
    assert (got["padded_dim"], got["block_rows"], got["keys"]) == (padded, ROWS, KEYS)
    assert got["shared_bytes"] == sixteen_bit_bytes(padded)


SWIZZLE_ALIGN = 1024  # the 128-byte swizzle's period, to which its tiles are aligned


def producer_keys(padded: int) -> int:
    """The warp-specialised kernel's key tiles: 128, 64 at padded head dim 256 (O's registers)."""
    return 64 if padded == 256 else 128


def producer_bytes(padded: int) -> int:
    """The warp-specialised kernel: Q (128 rows) and two stages each of K and V, and the slack to
    start them on a 1024-byte boundary (kHOPPER_SWIZZLE_ALIGN)."""
    return (ROWS + 4 * producer_keys(padded)) * padded * 2 + SWIZZLE_ALIGN


@pytest.mark.parametrize(
    ("d", "dv", "t", "padded", "stages"),
    [(40, 40, 4096, 64, 2), (64, 64, 4096, 64, 2), (64, 64, 129, 64, 2), (64, 64, 128, 64, 0),
     (64, 64, 77, 64, 0), (72, 72, 4096, 80, 0), (96, 96, 4096, 96, 0), (104, 104, 4096, 128, 0),
     (104, 128, 4096, 128, 2), (64, 128, 4096, 128, 2), (128, 128, 4096, 128, 2),
     (128, 128, 77, 128, 2), (128, 112, 4096, 128, 0), (160, 160, 4096, 160, 0),
     (256, 256, 4096, 256, 2), (200, 200, 65, 256, 2), (256, 256, 64, 256, 0),
     (192, 256, 4096, 256, 0), (256, 192, 4096, 256, 0)],
)  # fmt: skip
def test_sixteen_bit_warp_specialised_kernel_shapes(probe, d, dv, t, padded, stages):
    """Shapes without mask and softcap run the warp-specialised kernel (hopperProducerKernel, two
    K/V stages): at padded head dim 128 with value dim 128 (a narrower one never ran on the GPU),
    at 64 and 256 (built swizzled only: D and Dv above 192 there) over more than one key tile;
    the others, and float32, have none."""
    got = plan(probe, 2, d, dv, t=t)
    assert (got["padded_dim"], got["producer_stages"]) == (padded, stages)
    assert got["producer_keys"] == (producer_keys(padded) if stages else 0)
    assert got["producer_shared_bytes"] == (producer_bytes(padded) if stages else 0)
    assert got["producer_shared_bytes"] <= H100_SHARED
    assert got["variant"] & PRODUCER_BIT and got["variant"] & SWIZZLE_BIT
    assert plan(probe, 4, 64)["producer_stages"] == 0


def test_the_warp_specialised_kernel_needs_its_shared_memory(probe) -> None:
    """A device with room for the 64-key kernel's tiles but not for the warp-specialised
    kernel's keeps the 64-key kernel."""
    got = plan(probe, 2, 128, shared=producer_bytes(128) - 1)
    assert (got["keys"], got["producer_stages"]) == (KEYS, 0)


def sixteen_bit_short_bytes(padded: int) -> int:
    """The 16-bit short-key kernel: both 64-key tiles of K and V, and three stages of each
    warpgroup's 64 Q rows (graphfixAttentionHopper.cuh, hopperShortKernel); at 64 with 1 KB to
    align its tiles to the 128-byte swizzle's 1024-byte period."""
    return (4 * KEYS + 3 * ROWS) * padded * 2 + (1024 if padded == 64 else 0)


@pytest.mark.parametrize(
    ("d", "dv", "t", "short"),
    [(64, 64, 77, True), (64, 64, 128, True), (40, 40, 1, True), (32, 24, 100, True),
     (64, 64, 129, False), (72, 72, 77, False), (64, 128, 77, False), (128, 128, 77, False)],
)  # fmt: skip
def test_sixteen_bit_keys_in_two_tiles_plan_the_short_key_kernel(probe, d, dv, t, short) -> None:
    """Every key in at most two 64-key tiles at padded head dims 32 and 64: the persistent
    short-key kernel (for shapes without mask and softcap; the 64-key kernel's plan stays for the
    others); float32's own short-key flag is not set."""
    got = plan(probe, 2, d, dv, t=t)
    assert got["reason"] == ""
    assert got["short_shared_bytes"] == (sixteen_bit_short_bytes(got["padded_dim"]) if short else 0)
    assert got["short_shared_bytes"] <= H100_SHARED
    assert got["shared_bytes"] == sixteen_bit_bytes(got["padded_dim"])
    assert got["short_keys"] is False
    assert got["variant"] & SHORT_BIT
    assert plan(probe, 4, d, dv, t=t)["short_shared_bytes"] == 0


def float32_short_bytes(padded: int) -> int:
    """The short-key kernel: a third Q buffer (the next query tile) and both tiles of K hi, K lo,
    Vᵀ hi, Vᵀ lo (graphfixAttentionHopperFloat.cu, hopperTf32ShortKernel)."""
    return (3 * ROWS + 8 * KEYS) * padded * 4


@pytest.mark.parametrize(("d", "padded"), [(20, 32), (32, 32), (64, 64), (72, 72)])
def test_float32_heads_up_to_72_run_the_tf32_kernel_unpadded_at_72(probe, d, padded) -> None:
    got = plan(probe, 4, d)
    assert got["reason"] == ""
    assert (got["padded_dim"], got["keys"]) == (padded, KEYS)
    assert got["shared_bytes"] == float32_bytes(padded) <= H100_SHARED
    assert got["short_keys"] is False


WIDE_KEYS = 32  # the float32 wide-head kernel's key tiles (hopperTf32WideKernel)


def float32_wide_bytes(padded: int) -> int:
    """Q hi and lo (128 rows), one stage of K hi, K lo, Vᵀ hi, Vᵀ lo and the staging buffer of the
    next raw K and Vᵀ (32 keys each): (2 x 128 + 6 x 32) x padded x 4, 224 KB at 128."""
    return (2 * ROWS + 6 * WIDE_KEYS) * padded * 4


@pytest.mark.parametrize(
    ("d", "dv", "padded"),
    [(80, 80, 96), (76, 76, 96), (96, 96, 96), (104, 104, 128), (128, 128, 128), (128, 64, 128),
     (64, 128, 128)],
)  # fmt: skip
def test_float32_heads_above_72_run_the_wide_head_kernel(probe, d, dv, padded) -> None:
    """Two stages of 64-key tiles would need 240 KB at 80: above 72 the wide-head kernel's
    32-key tiles, one stage and a staging buffer, short keys or not."""
    for t in (77, 4096):
        got = plan(probe, 4, d, dv, t=t)
        assert got["reason"] == ""
        assert (got["padded_dim"], got["block_rows"], got["keys"]) == (padded, ROWS, WIDE_KEYS)
        assert got["shared_bytes"] == float32_wide_bytes(padded) <= H100_SHARED
        assert got["short_keys"] is False


WIDEST_ROWS, WIDEST_KEYS = 64, 16  # above 128: one warpgroup, 16-key tiles


def float32_widest_bytes(padded: int) -> int:
    """Q hi and lo (64 rows), one stage of K hi, K lo, Vᵀ hi, Vᵀ lo and the staging buffer (16 keys
    each): (2 x 64 + 6 x 16) x padded x 4, 224 KB at 256."""
    return (2 * WIDEST_ROWS + 6 * WIDEST_KEYS) * padded * 4


@pytest.mark.parametrize(
    ("d", "dv", "padded"),
    [(132, 132, 192), (160, 160, 192), (192, 192, 192), (160, 128, 192), (64, 192, 192),
     (196, 196, 256), (256, 256, 256), (256, 128, 256), (128, 256, 256)],
)  # fmt: skip
def test_float32_heads_above_128_run_the_wide_head_kernel_on_64_rows(probe, d, dv, padded) -> None:
    """Q hi / lo of 128 rows would be 256 KB at 256: above 128 one warpgroup of 64 rows and 16-key
    tiles, the same one stage and staging buffer (160 padded to 192)."""
    for t in (77, 4096):
        got = plan(probe, 4, d, dv, t=t)
        assert got["reason"] == ""
        tiles = (got["padded_dim"], got["block_rows"], got["keys"])
        assert tiles == (padded, WIDEST_ROWS, WIDEST_KEYS)
        assert got["shared_bytes"] == float32_widest_bytes(padded) <= H100_SHARED
        assert got["short_keys"] is False


@pytest.mark.parametrize(
    ("d", "t", "short", "padded"),
    [(64, 77, True, 64), (64, 128, True, 64), (20, 1, True, 32), (64, 129, False, 64),
     (72, 77, False, 72), (64, 4096, False, 64)],
)  # fmt: skip
def test_float32_keys_in_two_tiles_take_the_short_key_kernel_up_to_64(probe, d, t, short, padded):
    """Every key in at most two 64-key tiles at head dims up to 64: the persistent short-key
    kernel (SDXL cross-attention's 77 keys); at 72 its third Q buffer would not fit (252 KB)."""
    got = plan(probe, 4, d, t=t)
    assert got["reason"] == ""
    assert (got["padded_dim"], got["keys"], got["short_keys"]) == (padded, KEYS, short)
    expected = float32_short_bytes(padded) if short else float32_bytes(padded)
    assert got["shared_bytes"] == expected <= H100_SHARED


def test_float32_short_keys_need_the_room_for_the_third_q_buffer(probe) -> None:
    """A device with room for the long kernel's 192 KB but not 224 KB keeps the long kernel."""
    got = plan(probe, 4, 64, t=77, shared=float32_short_bytes(64) - 1)
    assert (got["keys"], got["short_keys"]) == (KEYS, False)
    assert got["shared_bytes"] == float32_bytes(64)


@pytest.mark.parametrize(
    ("element_bytes", "d", "cc", "shared", "reason"),
    [
        (4, 260, (9, 0), H100_SHARED, "float32 head dimensions above 256"),
        (4, 128, (9, 0), 229375, "more shared memory than this GPU has"),
        (4, 256, (9, 0), 229375, "more shared memory than this GPU has"),
        (4, 22, (9, 0), H100_SHARED, "head dimensions not multiples of 4"),
        (2, 20, (9, 0), H100_SHARED, "head dimensions not multiples of 8"),
        (2, 264, (9, 0), H100_SHARED, "head dimensions above 256"),
        (2, 256, (9, 0), 196607, "more shared memory than this GPU has"),
        (2, 64, (8, 9), 101376, "not an sm_90 GPU"),
        (2, 64, (10, 0), H100_SHARED, "not an sm_90 GPU"),
        (4, 64, (9, 0), 101376, "more shared memory than this GPU has"),
        (1, 64, (9, 0), H100_SHARED, "not a 16-bit or float32 type"),
    ],
)
def test_what_no_hopper_kernel_takes_says_why(probe, element_bytes, d, cc, shared, reason) -> None:
    got = plan(probe, element_bytes, d, cc=cc, shared=shared)
    assert got["keys"] == 0
    assert reason in got["reason"]
