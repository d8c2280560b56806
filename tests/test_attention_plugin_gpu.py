"""GraphfixAttention's enqueue on a GPU against a float64 NumPy reference (the ATTENTION contract).

The host harness (plugins/tests/attentionHarness.cpp) runs every case in one process per backend,
through TensorRT's plugin interfaces: createPlugin, configurePlugin with dynamic dimensions,
getWorkspaceSize, the serialisation round trip, attachToContext, onShapeChange, enqueue. Outputs
are poisoned before each run and the bytes around each output checked untouched.

Both backends run every case: `portable` (the plugin's own kernels) and `auto` (cuDNN's fused
SDPA where the plugin takes it, else the own kernels), each once plainly, once with the
enqueue captured into a CUDA graph (cudaStreamCaptureModeGlobal: no allocation, no
synchronisation) and the graph launched, and once captured after an onShapeChange for other
shapes (enqueue then runs the own kernels from a host-side plan, building nothing). cuDNN is found through an installed
`nvidia-cudnn-cu12/cu13` wheel (as PyTorch ships it) or the system.

The own kernels: on an sm_90 GPU, the Hopper kernels (wgmma) for float16/bfloat16 (head dims up
to 256) and float32 (3xTF32 on tf32 wgmma, up to 256 too); the flash kernels on tensor cores (mma.sync
m16n8k16 for float16/bfloat16; 3xTF32 mma.sync m16n8k8 for float32) for head dimensions up to
256 in multiples of 8 (4 for float32) whose tiles fit the GPU's shared memory; the fallback kernel
for the rest. Which one ran is read
from the plugin's onShapeChange note and checked against that rule. A third backend,
`portable_mma` (portable with GRAPHFIX_ATTENTION_HOPPER=0), keeps the mma.sync flash kernels
running on an H100/H200 too, so that both paths of every type are checked there.

Bounds, with inputs ~N(0, 1): the own kernels within half an ulp of the output format of the
exact result plus float32 accumulation error (4e-5 absolute); the cuDNN path, which rounds the
probabilities to the I/O type before the second product, within 2^-8 (float16) or 2^-5
(bfloat16) absolute — the accuracy of the fused kernels the issue measured.

Run on a GPU machine:  python -m pytest tests/test_attention_plugin_gpu.py -m gpu -q
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plugin_harness_support as support
import pytest

from graphfix.plugins.build import ATTENTION_HARNESS_NAME, cudnn_runtime_environment

pytestmark = pytest.mark.gpu

DTYPES = ("float32", "float16", "bfloat16")
BACKENDS = ("portable", "auto", "portable_mma")
# backend -> environment
BACKEND_ENV = {
    "portable": {"GRAPHFIX_ATTENTION_BACKEND": "portable"},
    "auto": {"GRAPHFIX_ATTENTION_BACKEND": "auto"},
    "portable_mma": {"GRAPHFIX_ATTENTION_BACKEND": "portable", "GRAPHFIX_ATTENTION_HOPPER": "0"},
}
# harness flags per mode; "stale": onShapeChange planned a larger batch than enqueue then gets
# (enqueue must run the shapes it is given without re-planning), under capture
MODES = {
    "plain": ("--capture", "0"),
    "captured": ("--capture", "1"),
    "stale": ("--capture", "1", "--stale-shape", "1"),
}
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
CUDNN_ATOL = {"float16": 2.0**-8, "bfloat16": 2.0**-5}


@dataclass(frozen=True)
class Case:
    name: str
    q: tuple[int, ...]  # [B, Hq, S, D] or [N, S, D]
    heads_kv: int
    seq_k: int
    value_dim: int
    k_transposed: bool = False
    causal: bool = False
    softcap: float = 0.0
    # none | pad_bool | rand_bool | add_q | add_f32 | blocked_rows | finite_fill
    mask: str = "none"
    mask_shape: tuple[int, ...] = ()
    mask_fill: float = float("-inf")
    nan_to_zero: bool = False
    magnitude: float = 1.0
    # V's scale (the absolute error allowed scales with it: attention is linear in V)
    value_magnitude: float = 1.0
    # bfloat16 only: column 5 of V set to this in every head (so that column of the output is this
    # value, exact, whatever P's rounding: cuDNN's bound holds too)
    value_peak: float = 0.0
    # the peak in one element only instead (the last key of the last batch and KV head, column
    # 5): one conversion block of bfloat16's float16 P·V meets it, and every block of the
    # attention kernel must still take the split P·V (V converted inside the kernel: only the
    # blocks whose keys reach it)
    value_peak_once: bool = False
    # whether the plugin should take cuDNN for float16/bfloat16 when cuDNN is there
    cudnn_eligible: bool = True
    # a shape the plugin must refuse with this message (at onShapeChange), not run
    refused: str = ""


def _one_huge_value(
    name: str, q: tuple[int, ...], heads_kv: int, seq_k: int, dv: int, *, causal: bool = False
) -> Case:
    """A bfloat16 V whose one element (value_peak_once) is 1e5, above float16's 65504."""
    return Case(name, q, heads_kv, seq_k, dv, causal=causal, value_peak=1.0e5, value_peak_once=True)


CASES = (
    Case("basic77", (2, 4, 77, 64), 4, 77, 64),
    Case("gqa", (2, 8, 128, 64), 2, 128, 64),
    Case("mqa_decode", (4, 8, 1, 64), 1, 300, 64),
    Case("cross77", (2, 4, 256, 64), 4, 77, 64),
    Case("causal130", (1, 4, 130, 64), 4, 130, 64, causal=True),
    Case(
        "causal_pad",
        (2, 2, 96, 64),
        2,
        96,
        64,
        causal=True,
        mask="pad_bool",
        mask_shape=(2, 1, 1, 96),
    ),
    Case("k_transposed", (2, 2, 50, 64), 2, 70, 64, k_transposed=True),
    Case("rank3_d72", (6, 33, 72), 1, 40, 72),
    Case("softcap", (2, 2, 64, 64), 2, 64, 64, softcap=5.0, magnitude=3.0, cudnn_eligible=False),
    Case("dv128", (2, 2, 64, 64), 2, 90, 128),
    Case("d20", (2, 3, 45, 20), 3, 45, 24, cudnn_eligible=False),
    Case("d256", (1, 2, 64, 256), 2, 64, 256),
    # the head dims above 128 of the flash kernels (Q read from shared memory per key tile), each
    # over several query and key tiles: Gemma-2-like (softcap, causal), Dv != D both ways
    Case(
        "d256_softcap_causal",
        (1, 2, 200, 256),
        2,
        200,
        256,
        causal=True,
        softcap=30.0,
        magnitude=3.0,
        cudnn_eligible=False,
    ),
    Case("d160_causal", (1, 4, 150, 160), 2, 150, 160, causal=True),
    Case("d192_dv256", (2, 2, 70, 192), 2, 130, 256),
    Case("d256_dv128_mask", (1, 4, 130, 256), 2, 140, 128, mask="add_q", mask_shape=(1, 1, 1, 140)),
    Case("d40", (2, 4, 100, 40), 4, 100, 40),
    # too wide for the tensor-core variant of the fallback kernel: its CUDA-core variant runs
    Case("d640", (1, 2, 40, 640), 2, 50, 64, cudnn_eligible=False),
    Case("long_wide", (1, 2, 16, 64), 2, 2048, 64, magnitude=3.0),
    # the 16-bit Hopper kernel's warp-specialised variant (no mask, no softcap, padded head dim
    # 128: 128-row blocks, 128-key tiles in a ring of two stages): several query tiles, key tiles
    # wrapping the ring three times with a partial last one, grouped heads; and causal
    Case("ring_gqa_d128", (2, 2, 260, 128), 1, 700, 128),
    Case("ring_causal_d128", (1, 4, 300, 128), 2, 300, 128, causal=True),
    # the same kernel at a head dim that pads to 128 with a partial 64-column block (its 128-byte
    # swizzled tiles, kHOPPER_VARIANT_SWIZZLE: the second box of each Q and K row zero-filled past
    # D = 112), over a partial query tile and a partial key tile
    Case("ring_d112_dv128", (1, 3, 200, 112), 3, 250, 128),
    # the same kernel at padded head dims 64 (D 40: one 64-column box zero-filled past 40; causal,
    # grouped heads) and 256 (64-key tiles; grouped heads, partial tiles)
    Case("ring_causal_d40", (1, 4, 300, 40), 2, 300, 40, causal=True),
    Case("ring_gqa_d256", (1, 4, 200, 256), 2, 300, 256),
    # bfloat16's float16 P·V on that kernel (kHOPPER_VARIANT_HALF_VALUES): V values above
    # float16's 65504 (the split bfloat16 kernel must run instead, exact as ever), and a V below
    # float16's normal range (2^-14; its subnormals round V by at most 2^-25)
    Case("ring_huge_v_d128", (1, 2, 200, 128), 2, 300, 128, value_peak=1.0e5),
    Case("ring_tiny_v_d64", (1, 2, 200, 64), 2, 300, 64, value_magnitude=2.0**-17),
    # one V value above 65504, in the last key of the last (batch, KV head) only. At padded head
    # dim 64 over at most 512 keys the float16 kernel converts V itself: only the blocks of that
    # head raise their slots and the flash blocks after it recompute those
    # (kHOPPER_VARIANT_CONVERT_IN_KERNEL);
    # at 256, and at 128 over more than 1024 conversion blocks' worth of V (the blocks stride, their
    # slots cap), the conversion pass's last block raises its slot and the split kernel runs instead
    _one_huge_value("ring_one_huge_v_d64", (1, 2, 150, 64), 2, 500, 64),
    # the blocks that recompute them (hopperSplitFallbackKernel, one wave of flash blocks): in the
    # heavy-first causal order with grouped heads (only the blocks whose keys reach the huge one
    # raise), and every block raised over more blocks than an H200 has SMs (several each), with a
    # partial last query tile
    _one_huge_value("ring_one_huge_v_d64_causal", (2, 4, 300, 64), 2, 300, 64, causal=True),
    Case("ring_huge_v_d64_blocks", (4, 8, 600, 64), 8, 200, 64, value_peak=1.0e5),
    _one_huge_value("ring_one_huge_v_d256", (1, 4, 100, 256), 2, 300, 256),
    _one_huge_value("ring_one_huge_v_strided", (1, 8, 40, 128), 8, 2100, 128),
    Case("rand_bool", (2, 4, 64, 80), 4, 80, 64, mask="rand_bool", mask_shape=(2, 4, 64, 80)),
    Case("add_q", (2, 4, 64, 80), 4, 80, 64, mask="add_q", mask_shape=(2, 1, 1, 80)),
    Case("add_q_direct", (2, 4, 64, 64), 4, 64, 64, mask="add_q", mask_shape=(2, 1, 64, 64)),
    Case(
        "add_f32",
        (2, 4, 64, 80),
        4,
        80,
        64,
        mask="add_f32",
        mask_shape=(64, 80),
        cudnn_eligible=False,
    ),
    Case("blocked_nan", (2, 2, 40, 64), 2, 48, 64, mask="blocked_rows", mask_shape=(2, 1, 40, 48)),
    Case(
        "blocked_zero",
        (2, 2, 40, 64),
        2,
        48,
        64,
        mask="blocked_rows",
        mask_shape=(2, 1, 40, 48),
        nan_to_zero=True,
    ),
    Case(
        "finite_fill",
        (2, 2, 40, 64),
        2,
        48,
        64,
        mask="blocked_rows",
        mask_shape=(2, 1, 40, 48),
        mask_fill=-1.0e4,
        cudnn_eligible=False,
    ),
    Case("rank3_mask", (3, 20, 64), 1, 30, 64, mask="rand_bool", mask_shape=(3, 1, 30)),
    # several query and key tiles, neither a multiple of 64, grouped heads, a per-head bool mask
    Case(
        "tiles_gqa_mask",
        (2, 4, 200, 96),
        2,
        333,
        96,
        mask="rand_bool",
        mask_shape=(2, 1, 200, 333),
    ),
    # the same at head dim 64 (the float32 Hopper kernel's): several query and key tiles
    Case(
        "tiles_gqa_mask64",
        (2, 4, 200, 64),
        2,
        333,
        64,
        mask="rand_bool",
        mask_shape=(2, 1, 200, 333),
    ),
    # softcap and causal at head dim 72 (float32: the Hopper kernel's unpadded 72), several tiles
    Case(
        "softcap_causal72",
        (1, 2, 150, 72),
        2,
        150,
        72,
        causal=True,
        softcap=4.0,
        magnitude=2.0,
        cudnn_eligible=False,
    ),
    # softcap, causal and a padding mask together, on the fast paths
    Case(
        "softcap_causal_pad",
        (2, 2, 150, 128),
        2,
        150,
        128,
        causal=True,
        softcap=4.0,
        mask="pad_bool",
        mask_shape=(2, 1, 1, 150),
        magnitude=2.0,
        cudnn_eligible=False,
    ),
    Case(
        "d80_add_f32_zero",
        (1, 3, 70, 80),
        3,
        90,
        80,
        mask="add_f32",
        mask_shape=(1, 3, 70, 90),
        nan_to_zero=True,
        cudnn_eligible=False,
    ),
    # masks the same for every query row (the Hopper kernel's key-mask kernel) over several key
    # tiles: a bool key padding with a finite mask_fill, and a per-head additive float32 one
    Case(
        "pad_fill_tiles",
        (2, 3, 150, 64),
        3,
        200,
        64,
        mask="pad_bool",
        mask_shape=(2, 1, 1, 200),
        mask_fill=-3.0,
        cudnn_eligible=False,
    ),
    Case(
        "add_keys_d128",
        (1, 4, 100, 128),
        2,
        300,
        128,
        mask="add_f32",
        mask_shape=(4, 1, 300),
        cudnn_eligible=False,
    ),
    # float32's wide-head Hopper kernel (32-key tiles) without mask or softcap: causal over 3
    # query tiles and 10 key tiles with grouped heads (heavy-first over all heads), and 77 keys
    # with a value dim below the head dim
    Case("causal_gqa_d128", (2, 3, 300, 128), 1, 300, 128, causal=True),
    Case("plain_d96_dv64", (1, 2, 130, 96), 2, 77, 64),
    # float32 above head dim 128 (the flash kernel, two warps per 16 rows, each taking half of
    # every 64-key tile, merged at the end): blocked rows (no key in either half), and 20 keys
    # (none in the second half)
    Case(
        "blocked_d256",
        (1, 4, 100, 256),
        2,
        150,
        256,
        mask="blocked_rows",
        mask_shape=(1, 1, 100, 150),
    ),
    Case("few_keys_d256", (1, 2, 70, 256), 1, 20, 256),
    # float32's Hopper kernel above head dim 128 (64-row blocks, 16-key tiles): causal over 6
    # query blocks (the last partial) and 21 key tiles heavy-first, 2:1 grouped heads
    Case("causal_gqa_d256", (1, 4, 330, 256), 2, 330, 256, causal=True),
    # float32's persistent short-key Hopper kernel (keys in <= 2 tiles, head dims <= 64): on a
    # 132-SM H200, 2 x 10 x 7 query tiles are 140 work items, 2 per block, and block 3's run
    # (items 6, 7) crosses from (0, 0) to (0, 1); pairs of heads share K and V (GQA, kept loaded
    # across the head change) under a per-head, per-query bool mask; 800 rows: a partial last tile
    Case(
        "short_runs_gqa_mask",
        (2, 10, 800, 64),
        5,
        77,
        64,
        mask="rand_bool",
        mask_shape=(2, 10, 800, 77),
    ),
    # causal and softcap on short keys, several items per block (2 x 12 x 6 = 144 items), 100
    # keys: rows below 64 see no key of the second tile
    Case(
        "short_causal_softcap",
        (2, 12, 700, 64),
        4,
        100,
        64,
        causal=True,
        softcap=4.0,
        magnitude=2.0,
        cudnn_eligible=False,
    ),
    # the 16-bit persistent short-key Hopper kernel (no mask, no softcap, keys in <= 2 tiles,
    # padded head dims 32 and 64): one key, 2:1 grouped heads, 300 rows (the last 128-row item's
    # second warpgroup wholly past the end: a Q box of zeros); 77 keys over 2 x 10 x 7 = 140
    # items with pairs of heads sharing K and V (runs crossing heads keep them, one crossing
    # kv heads reloads them); 128 keys (both tiles full), causal, D 40 zero-filled to 64; D 48 and
    # Dv 32 over a partial second tile; padded head dim 32 with 64 keys (one tile: the second's V
    # zeroed) over 130 rows
    Case("short_one_key", (2, 4, 300, 64), 2, 1, 64),
    Case("short_runs_gqa", (2, 10, 800, 64), 5, 77, 64),
    Case("short_causal_d40", (1, 6, 500, 40), 3, 128, 40, causal=True),
    Case("short_d48_dv32", (3, 4, 200, 48), 4, 100, 32),
    Case("short_d32", (2, 3, 130, 32), 3, 64, 32),
    # an attention sink as the fused_plugin rewrite gives it to the node (fused/sink.py): Q and K
    # head dim 64 + 8 = 72, V's 64, one key more (128 + 1), grouped heads, the additive mask with
    # its extra column
    Case(
        "sink_key_d72",
        (2, 8, 128, 72),
        2,
        129,
        64,
        mask="add_q",
        mask_shape=(2, 1, 128, 129),
    ),
    Case(
        "d2048_refused",
        (1, 1, 8, 2048),
        1,
        8,
        64,
        cudnn_eligible=False,
        refused="need more shared memory than this GPU has",
    ),
)


def _encode(x: np.ndarray, dtype: str) -> tuple[bytes, np.ndarray]:
    """The bytes of `x` in `dtype` and their exact value in float64."""
    if dtype == "bool":
        return x.astype(np.bool_).tobytes(), x.astype(np.bool_)
    if dtype == "float32":
        q = x.astype(np.float32)
        return q.tobytes(), q.astype(np.float64)
    if dtype == "float16":
        q = x.astype(np.float16)
        return q.tobytes(), q.astype(np.float64)
    bits = support.to_bfloat16_bits(x)
    return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _decode(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "float32":
        return np.frombuffer(raw, np.float32).reshape(shape).astype(np.float64)
    if dtype == "float16":
        return np.frombuffer(raw, np.float16).reshape(shape).astype(np.float64)
    bits = np.frombuffer(raw, np.uint16).reshape(shape).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def _shapes(case: Case) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    batch = (case.q[0],) + ((case.heads_kv,) if len(case.q) == 4 else ())
    d = case.q[-1]
    k = batch + ((d, case.seq_k) if case.k_transposed else (case.seq_k, d))
    v = batch + (case.seq_k, case.value_dim)
    out = case.q[:-1] + (case.value_dim,)
    return k, v, out


def _make_mask(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, str] | None:
    if case.mask == "none":
        return None
    shape = case.mask_shape
    if case.mask == "pad_bool":
        keep = np.ones(shape, dtype=bool)
        keep[-1, ..., int(shape[-1] * 0.7) :] = False
        return keep, "bool"
    if case.mask == "rand_bool":
        keep = rng.random(shape) < 0.7
        keep[..., 0] = True
        return keep, "bool"
    if case.mask == "blocked_rows":
        keep = rng.random(shape) < 0.6
        keep[..., ::7, :] = False
        return keep, "bool"
    values = rng.standard_normal(shape) * 2.0
    values[rng.random(shape) < 0.2] = -np.inf
    values[..., 0] = 0.0
    return values, "q" if case.mask == "add_q" else "float32"


def reference_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, case: Case
) -> np.ndarray:
    """The ATTENTION contract in float64."""
    if case.k_transposed:
        k = np.swapaxes(k, -1, -2)
    if q.ndim == 4:
        group = q.shape[1] // k.shape[1]
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if case.softcap > 0:
        s = case.softcap * np.tanh(s / case.softcap)
    if mask is not None:
        s = np.where(mask, s, case.mask_fill) if mask.dtype == np.bool_ else s + mask
    if case.causal:
        n, m = s.shape[-2:]
        s = np.where(np.triu(np.ones((n, m), dtype=bool), k=1), -np.inf, s)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        p = e / np.sum(e, axis=-1, keepdims=True)
    if case.nan_to_zero:
        p = np.where(np.isnan(p), 0.0, p)
    return p @ v


@dataclass(frozen=True)
class Outcome:
    result: dict
    out: np.ndarray
    reference: np.ndarray
    value_max: float  # max |V| as given (in the I/O type)
    value_max_in_half: float  # the same over the values within float16's range (|v| <= 65504)

    @property
    def path(self) -> str:
        """cudnn, hopper, hopper_short (the short-key kernels; 16-bit: planned, for shapes
        without mask and softcap), flash or fallback, from the plugin's onShapeChange note."""
        notes = [m["text"] for m in self.result.get("messages", []) if "onShapeChange" in m["text"]]
        if notes and notes[-1].endswith("cuDNN SDPA"):
            return "cudnn"
        if notes and "; Hopper kernel" in notes[-1]:
            short = "persistent over query tiles" in notes[-1].split(" (else ")[0]
            return "hopper_short" if short else "hopper"
        return "flash" if notes and "; flash kernel" in notes[-1] else "fallback"


@functools.cache
def _sm90() -> bool:
    """Whether the GPU is compute capability 9.0 (H100/H200): the Hopper kernel's device."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    return done.stdout.strip().splitlines()[0].strip() == "9.0"


@functools.cache
def _shared_optin() -> int:
    """The GPU's opt-in shared memory per block (bytes); 227 KiB (sm_90) when torch cannot say."""
    try:
        import torch

        return torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    except (ImportError, RuntimeError, AttributeError):
        return 232448


def _flash_shared_bytes(dtype: str, padded: int) -> int:
    """The flash kernel's shared memory at a padded head dim (graphfixAttentionFlash.cuh): 64 query
    rows and 64-key tiles; 16-bit Q, K and V rows of padded + 8 elements; float32 Q and K rows of
    16 mod 32 floats and V rows of padded + 4."""
    if dtype == "float32":
        row_qk = padded + (48 - padded % 32) % 32
        return (128 * row_qk + 64 * (padded + 4)) * 4
    return 192 * (padded + 8) * 2


def expected_own_path(case: Case, dtype: str, backend: str = "portable") -> str:
    """Which own kernel the plugin must take (sm_80+): the Hopper kernels' and the flash kernels'
    limits (the Hopper kernels on sm_90, unless GRAPHFIX_ATTENTION_HOPPER=0: float16/bfloat16 and
    float32 up to head dim 256; up to 64 with at most 128 keys: hopper_short; the
    flash kernels up to 256 where their tiles fit the GPU's shared memory)."""
    d, dv = case.q[-1], case.value_dim
    multiple = 4 if dtype == "float32" else 8
    widest = max(d, dv)
    padded = next((p for p in (32, 64, 80, 96, 128, 160, 192, 256) if widest <= p), 0)
    fits = (
        d % multiple == 0
        and dv % multiple == 0
        and padded > 0
        and (padded <= 128 or _flash_shared_bytes(dtype, padded) <= _shared_optin())
    )
    # the Hopper kernels take 16-bit head dims up to 256 where Q and two stages of K and V fit
    # (128 + 4 x 64 rows), float32 (3xTF32 on wgmma) up to 256 (above 72 the wide-head kernel:
    # 2 x 128 + 6 x 32 rows, 96 and 128 built; above 128 on 64 rows, 2 x 64 + 6 x 16 rows, 192
    # and 256 built)
    hopper_fits = fits and (
        (
            widest <= 72
            or (widest <= 128 and 448 * (96 if widest <= 96 else 128) * 4 <= _shared_optin())
            or (widest > 128 and 224 * (192 if widest <= 192 else 256) * 4 <= _shared_optin())
        )
        if dtype == "float32"
        else 384 * padded * 2 <= _shared_optin()
    )
    if hopper_fits and backend != "portable_mma" and _sm90():
        # every key in at most two 64-key tiles, head dims up to 64: the persistent short-key
        # kernels (float32: a third query-tile buffer does not fit at 72; 16-bit: planned at
        # padded head dims 32 and 64, run where there is no mask and no softcap)
        if case.seq_k <= 128 and max(d, dv) <= 64:
            return "hopper_short"
        return "hopper"
    return "flash" if fits else "fallback"


def _half_values_path(case: Case, dtype: str, planned_only: bool = False) -> bool:
    """Whether the Hopper kernel runs `case` in bfloat16 with P·V in float16: bit 256
    (kHOPPER_VARIANT_HALF_VALUES, on by default; GRAPHFIX_ATTENTION_HOPPER_VARIANT may clear it)
    with TMA loads (16) and the warp-specialised kernel (32), whose shapes these are
    (planHopperAttention), and no V value above float16's 65504 (the split kernel runs those;
    planned_only: whatever V holds)."""
    variant = os.environ.get("GRAPHFIX_ATTENTION_HOPPER_VARIANT", "")
    bits = int(variant) if variant else 256 | 32 | 16
    if dtype != "bfloat16" or bits & (256 | 32 | 16) != 256 | 32 | 16:
        return False
    d, dv, t = case.q[-1], case.value_dim, case.seq_k
    padded = next((p for p in (32, 64, 80, 96, 128, 160, 192, 256) if max(d, dv) <= p), 0)
    producer = (
        (padded == 128 and dv == 128)
        or (padded == 64 and t > 128)
        or (padded == 256 and d > 192 and dv > 192 and t > 64)
    )
    planned = producer and case.mask == "none" and case.softcap == 0.0
    return planned and (planned_only or case.value_peak <= 65504.0)


@pytest.fixture(scope="session")
def gpu_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], Outcome]:
    tools = support.gpu_tools(ATTENTION_HARNESS_NAME)

    work = tmp_path_factory.mktemp("attention-cases")
    rng = np.random.default_rng(20251129)
    lines, pending = [], []
    for case in CASES:
        k_shape, v_shape, out_shape = _shapes(case)
        q = rng.standard_normal(case.q) * case.magnitude
        k = rng.standard_normal(k_shape) * case.magnitude
        v = rng.standard_normal(v_shape) * case.value_magnitude
        mask = _make_mask(case, rng)
        scale = float(1.0 / np.sqrt(case.q[-1]))
        fields = [
            f"scale:kFLOAT32:1:{scale!r}",
            f"k_transposed:kINT32:1:{int(case.k_transposed)}",
            f"causal:kINT32:1:{int(case.causal)}",
            f"softcap:kFLOAT32:1:{case.softcap!r}",
            f"mask_fill:kFLOAT32:1:{case.mask_fill!r}",
            f"nan_to_zero:kINT32:1:{int(case.nan_to_zero)}",
        ]
        for dtype in DTYPES:
            stem = work / f"{case.name}-{dtype}"
            tensors, exact = [], []
            peaked = v.copy()
            if case.value_peak and dtype == "bfloat16":
                if case.value_peak_once:
                    peaked[(-1,) * (peaked.ndim - 1) + (5,)] = case.value_peak
                else:
                    peaked[..., 5] = case.value_peak
            for name, x, kind in (("q", q, dtype), ("k", k, dtype), ("v", peaked, dtype)):
                raw, value = _encode(x, kind)
                (stem.parent / f"{stem.name}.{name}").write_bytes(raw)
                tensors.append(f"{kind}:{','.join(map(str, x.shape))}:{stem}.{name}")
                exact.append(value)
            mask_exact = None
            if mask is not None:
                values, kind = mask
                kind = dtype if kind == "q" else kind
                raw, mask_exact = _encode(values, kind)
                (stem.parent / f"{stem.name}.mask").write_bytes(raw)
                tensors.append(f"{kind}:{','.join(map(str, values.shape))}:{stem}.mask")
            lines.append(f"{';'.join(fields)}|{';'.join(tensors)}|{stem}.out|0")
            reference = reference_attention(*exact, mask_exact, case)
            magnitudes = np.abs(exact[2])
            maxima = (  # Outcome's value_max and value_max_in_half
                float(np.max(magnitudes)),
                float(np.max(magnitudes, where=magnitudes <= 65504.0, initial=0.0)),
            )
            pending.append((case, dtype, Path(f"{stem}.out"), out_shape, reference, maxima))
    manifest = work / "manifest.txt"
    manifest.write_text("\n".join(lines) + "\n")

    outcomes = {}
    env = cudnn_runtime_environment()
    for backend in BACKENDS:
        for mode in MODES:
            done = support.run_harness_process(
                tools,
                "run",
                "dynamic",
                "--manifest",
                str(manifest),
                *MODES[mode],
                env={**env, **BACKEND_ENV[backend]},
            )
            assert done.returncode == 0, done.stdout + done.stderr
            results = json.loads(done.stdout)
            for (case, dtype, out_path, out_shape, reference, maxima), result in zip(
                pending, results["cases"], strict=True
            ):
                out = (
                    _decode(out_path.read_bytes(), dtype, out_shape)
                    if result["status"] == 0
                    else np.full(out_shape, np.nan)
                )
                outcomes[(backend, mode, case.name, dtype)] = Outcome(
                    result, out, reference, *maxima
                )
    return outcomes


def _cudnn_loadable(outcomes) -> bool:
    return any(o.path == "cudnn" for o in outcomes.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if not c.refused], ids=lambda c: c.name)
def test_enqueue_matches_float64_reference(
    gpu_outcomes, backend: str, mode: str, case: Case, dtype: str
) -> None:
    outcome = gpu_outcomes[(backend, mode, case.name, dtype)]
    result = outcome.result
    assert result["status"] == 0, result
    assert result["cuda"] == "no error"
    assert result["guards_intact"], "the plugin wrote outside its output"
    nan_rows = np.isnan(outcome.reference)
    np.testing.assert_array_equal(np.isnan(outcome.out), nan_rows)
    if case.mask == "blocked_rows" and case.mask_fill == float("-inf"):
        assert nan_rows.any() != case.nan_to_zero
    valid = ~nan_rows
    error = np.abs(outcome.out[valid] - outcome.reference[valid])
    if outcome.path == "cudnn" and mode != "stale":
        bound = CUDNN_ATOL[dtype] + EPS[dtype] * np.abs(outcome.reference[valid])
        if case.value_peak_once:
            # cuDNN rounds P to the I/O type before P·V: EPS * max|v| (in the other cases within
            # CUDNN_ATOL; the own kernels keep P's error small, hence no such term for them)
            bound = bound + EPS[dtype] * outcome.value_max
    else:
        bound = 4e-5 * case.value_magnitude + EPS[dtype] * np.abs(outcome.reference[valid])
        own_path = expected_own_path(case, dtype, backend)
        if dtype == "float16" and own_path in ("flash", "hopper", "hopper_short"):
            # The float16 flash and Hopper kernels round each probability once to float16 before
            # P·V (as cuDNN and FlashAttention do): |sum (p~ - p) v| / sum p <= EPS * max|v|.
            bound = bound + EPS[dtype] * outcome.value_max
        if dtype == "float16":
            # an output below float16's normal range (2^-14) rounds to its subnormal spacing 2^-24
            bound = bound + 2.0**-25
        # a stale shape runs the own kernel whatever path onShapeChange planned
        own = outcome.path if mode != "stale" else expected_own_path(case, dtype, backend)
        if own == "hopper" and _half_values_path(case, dtype):
            # bfloat16 with float16 P·V rounds P as float16 does, and V below 2^-14 to float16's
            # subnormal spacing (at most 2^-25 an output, the probabilities summing to 1)
            bound = bound + EPS["float16"] * outcome.value_max + 2.0**-25
        elif own == "hopper" and case.value_peak_once and _half_values_path(case, dtype, True):
            # one V value above 65504: the blocks that meet it run P·V split (within the bound
            # above), those that do not keep their float16 P·V, with its rounding of P against
            # the values within float16's range (the huge one's, EPS * 1e5, would exceed this)
            bound = bound + EPS["float16"] * outcome.value_max_in_half + 2.0**-25
    worst = float(np.max(error - bound, initial=-1.0))
    if worst > 0.0:
        at = int(np.argmax(error - bound))
        where = tuple(int(i) for i in np.argwhere(valid)[at])
        pytest.fail(
            f"{outcome.path}: max error {error.max():.3g} exceeds the bound by {worst:.3g}; most "
            f"at {where}: {outcome.out[where]!r} against {outcome.reference[where]!r}"
        )


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("case", [c for c in CASES if c.cudnn_eligible], ids=lambda c: c.name)
def test_auto_takes_cudnn_where_it_can(gpu_outcomes, case: Case, dtype: str) -> None:
    if not _cudnn_loadable(gpu_outcomes):
        pytest.skip("cuDNN could not be loaded here; the auto backend used the own kernels")
    outcome = gpu_outcomes[("auto", "plain", case.name, dtype)]
    assert outcome.path == "cudnn", outcome.result["messages"]


@pytest.mark.parametrize("backend", ("portable", "portable_mma"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if not c.refused], ids=lambda c: c.name)
def test_portable_takes_the_fastest_own_kernel_it_can(
    gpu_outcomes, case: Case, dtype: str, backend: str
) -> None:
    outcome = gpu_outcomes[(backend, "plain", case.name, dtype)]
    assert outcome.path == expected_own_path(case, dtype, backend), outcome.result["messages"]


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("case", [c for c in CASES if not c.refused], ids=lambda c: c.name)
def test_hopper_kernel_loads_with_tma_by_default(gpu_outcomes, case: Case, dtype: str) -> None:
    """On sm_90 the 16-bit Hopper kernel loads Q, K and V by TMA unless
    GRAPHFIX_ATTENTION_HOPPER_VARIANT leaves bit 16 out: the plan encodes the tensor maps for
    every shape it takes (16-byte strides: D and Dv multiples of 8, as the kernel needs anyway)
    and its note says so; a shape whose maps the driver refused would run the cp.async kernel."""
    variant = os.environ.get("GRAPHFIX_ATTENTION_HOPPER_VARIANT", "")
    if variant and int(variant) & 16 == 0:
        pytest.skip("GRAPHFIX_ATTENTION_HOPPER_VARIANT leaves TMA loads off")
    if expected_own_path(case, dtype) not in ("hopper", "hopper_short"):
        pytest.skip("the Hopper kernel does not run this case here")
    outcome = gpu_outcomes[("portable", "plain", case.name, dtype)]
    notes = [m["text"] for m in outcome.result["messages"] if "onShapeChange" in m["text"]]
    assert notes and ", TMA loads (else " in notes[-1], notes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c for c in CASES if not c.refused], ids=lambda c: c.name)
def test_captured_enqueue_gives_the_same_bytes(gpu_outcomes, backend: str, case: Case) -> None:
    for dtype in DTYPES:
        plain = gpu_outcomes[(backend, "plain", case.name, dtype)]
        captured = gpu_outcomes[(backend, "captured", case.name, dtype)]
        assert captured.result["captured"] and captured.result["status"] == 0, captured.result
        np.testing.assert_array_equal(captured.out, plain.out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c for c in CASES if c.refused], ids=lambda c: c.name)
def test_unsupported_shape_is_a_clear_error(gpu_outcomes, backend: str, case: Case) -> None:
    for dtype in DTYPES:
        result = gpu_outcomes[(backend, "plain", case.name, dtype)].result
        assert result["status"] == -1
        assert result["stage"] == "onShapeChange"
        assert any(case.refused in m["text"] for m in result["messages"]), result["messages"]


@pytest.mark.parametrize(
    "case", [c for c in CASES if not c.cudnn_eligible and not c.refused], ids=lambda c: c.name
)
def test_auto_keeps_what_cudnn_cannot_do_on_the_portable_kernel(gpu_outcomes, case: Case) -> None:
    for dtype in DTYPES:
        assert gpu_outcomes[("auto", "plain", case.name, dtype)].path != "cudnn"
    assert gpu_outcomes[("auto", "plain", "basic77", "float32")].path != "cudnn"
