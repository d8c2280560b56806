/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The Hopper float32 attention kernel (sm_90a only; graphfixAttentionHopper.h): 3xTF32 on wgmma.
 *
 * Per block: 2 warpgroups x 64 query rows of one (batch, head), tiles of kN = 64 keys, as the
 * 16-bit Hopper kernel (graphfixAttentionHopper.cuh), whose helpers and per-score code
 * (OnlineSoftmax: masks, causal, softcap, mask_fill, nan_to_zero) it reuses. Every float32
 * operand x is split once into TF32 hi + lo (splitTf32: both rounded to nearest, x - hi exact),
 * and each product is hi·hi + hi·lo + lo·hi with float32 accumulation:
 *
 *   S = Q K_jᵀ:  wgmma m64n64k8 tf32, A = Q hi / lo and B = K_j hi / lo, all in shared memory;
 *   O += P V_j:  wgmma m64nDk8 tf32, A = P hi / lo in registers (the scores' accumulators are
 *                the TF32 A fragment once the 8 keys of a step are taken in the order
 *                0,2,4,6,1,3,5,7), B = V_jᵀ hi / lo in shared memory.
 *
 * wgmma tf32 takes both operands K-major, so V is stored transposed (keys contiguous), its keys
 * permuted the same way as P's: it is loaded with 4-byte cp.async straight into that layout. All
 * tiles are in the no-swizzle core-matrix layout (16-byte chunks of 4 floats, chunk-major). Q is
 * split once per block, K_j and V_j once per tile per block: each thread splits the elements its
 * own cp.async brought (the hi in place, the lo into the tile's lo buffer), so no barrier sits
 * between a load's arrival and its split. Per tile, in each warpgroup, with P_j split in
 * registers and K_j+1, V_j split in shared memory:
 *
 *   issue S_j+1 and T = P_j V_j over keys 0-31 (wgmma) | wait S_j+1, online softmax of S_j+1
 *   | wait T, O += T, issue T = P_j V_j over keys 32-63 | wait own loads of K_j+2, V_j+1, split
 *   | wait T, O = (O + T) alpha, split P_j+1 | fence.proxy.async | barrier | load K_j+3, V_j+2
 *
 * The tensor core truncates as it accumulates (up to an ulp of its running sum per instruction,
 * towards zero), so no sum runs long in it: S goes into two accumulators (lo terms first, the
 * hi·hi products shared out), P V_j into a zeroed accumulator per 32 keys, each added in float32.
 * In one accumulator each, the errors measured up to 2.2x the unfused float32 chain's; so, 0.27-
 * 0.64x (notes/attention_plugin.md, "float32 Hopper kernel: 3xTF32 on tf32 wgmma").
 *
 * Shared memory: Q hi, Q lo (128 rows), K hi, K lo, V hi, V lo (64 keys, two stages each):
 * (2 x 128 + 8 x 64) x D x 4 bytes, 192 KB at D = 64, 216 KB at D = 72; one block per SM.
 * Head dims up to 72 (32, 64, 72 as built; 80 would need 240 KB). Above 72, up to 128 (96 and 128
 * as built), hopperTf32WideKernel runs the same steps on 32-key tiles with one stage of K and V
 * hi / lo and a staging buffer for the next raw tiles (224 KB at 128); above 128 (192 and 256 as
 * built) on one warpgroup of 64 rows with 16-key tiles (224 KB at 256). Other GPUs run the
 * mma.sync flash kernel (flashTf32x3Kernel).
 *
 * Short key sequences (every key in at most two tiles, T <= 128; head dims 32 and 64): the
 * persistent hopperTf32ShortKernel (below) runs instead. One block per SM walks a contiguous run
 * of (batch, head, query tile) items, loads and splits K and V once per (batch, kv head) it meets
 * and loads the next item's Q while the current one computes (224 KB at D = 64). SDXL cross
 * (2x10x4096x77x64) on the H200 by CUDA graphs: 0.045 ms against 0.063 for this kernel, 0.42x the
 * unfused chain (notes/attention_plugin.md, "float32 Hopper kernel: persistent short-key variant").
 */
#include "graphfixAttentionHopper.cuh"

namespace graphfix
{
namespace plugin
{
namespace
{

//! The tiling built: 2 warpgroups (128 query rows) x 64-key tiles, one block per SM. The kernel
//! also compiles for 1 warpgroup x 32-key tiles (96 KB at head dim 64, two blocks per SM, 77 keys
//! padded to 96 instead of 128): measured on the H200 it was no faster on SDXL cross (0.066 against
//! 0.062 ms) and 1.3-1.4x slower on the longer sequences, so it is not instantiated.
constexpr int32_t kTF32_WG{2};
constexpr int32_t kTF32_KEYS{64};

//! x = hi + lo, each a TF32 value (see splitTf32): x read at `at`, hi and lo written at hiAt and
//! loAt (hiAt may be `at`: in place).
__device__ __forceinline__ void splitInto(float const* at, float* hiAt, float* loAt)
{
    uint32_t hi;
    uint32_t lo;
    splitTf32(*at, hi, lo);
    *hiAt = __uint_as_float(hi);
    *loAt = __uint_as_float(lo);
}

//! The same for 4 consecutive floats (16-byte accesses).
__device__ __forceinline__ void splitInto4(float const* at, float* hiAt, float* loAt)
{
    float4 const x = *reinterpret_cast<float4 const*>(at);
    uint32_t hi[4];
    uint32_t lo[4];
    splitTf32(x.x, hi[0], lo[0]);
    splitTf32(x.y, hi[1], lo[1]);
    splitTf32(x.z, hi[2], lo[2]);
    splitTf32(x.w, hi[3], lo[3]);
    *reinterpret_cast<uint4*>(hiAt) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(loAt) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

//! 4 bytes global -> shared, asynchronously; zero when !valid.
__device__ __forceinline__ void copyAsync4(void* shared, void const* global, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sharedAddress(shared)), "l"(global),
        "r"(valid ? 4 : 0)
                 : "memory");
}

//! Rows [row0, row0 + kRows) x [0, kD) of a [rows, cols] float matrix in the K-major chunk-major
//! layout ([kD / 4][kRows] chunks of 16 bytes), zeros past `rows` and `cols`; with kSPLIT, split
//! the same chunks (this thread's) into hi (in place, or at hi when given) and lo (at lo, the same
//! layout) instead.
//! A warp takes 16 rows (row group warp % kRG) x 2 chunks (pair warp / kRG + i 8 / kRG): 32-byte
//! pieces of global rows, 2 x 256 contiguous bytes of shared memory; each thread's offsets are a
//! base plus compile-time steps (few live registers). kWHOLE: the caller knows that every row is
//! there and cols == kD (no checks; the global offsets compile-time steps too).
template <int32_t kD, int32_t kRows, int32_t kThreads, bool kSPLIT, bool kWHOLE = false>
__device__ __forceinline__ void chunkMajorF32(
    float* shared, float* lo, float const* global, int64_t row0, int64_t rows, int32_t cols, float* hi = nullptr)
{
    constexpr int32_t kPAIRS = kD / 8;
    constexpr int32_t kRG = kRows / 16;
    constexpr int32_t kSTEP = (kThreads / 32) / kRG; // pairs taken at once
    static_assert(kD % 8 == 0 && kRows % 16 == 0 && (kThreads / 32) % kRG == 0, "whole units");
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const r = (warp % kRG) * 16 + lane % 16;
    int32_t const c0 = 2 * (warp / kRG) + lane / 16;
    int32_t const at0 = (c0 * kRows + r) * 4;
    int64_t const row = row0 + r;
#pragma unroll
    for (int32_t i = 0; i < (kPAIRS + kSTEP - 1) / kSTEP; ++i)
    {
        if (kPAIRS % kSTEP != 0 && warp / kRG + i * kSTEP >= kPAIRS)
        {
            break;
        }
        int32_t const at = at0 + i * 2 * kSTEP * kRows * 4;
        if constexpr (kSPLIT)
        {
            splitInto4(shared + at, (hi != nullptr ? hi : shared) + at, lo + at);
        }
        else if constexpr (kWHOLE)
        {
            copyAsync16(shared + at, global + row * kD + (c0 + 2 * kSTEP * i) * 4, true);
        }
        else
        {
            int32_t const c = c0 + 2 * kSTEP * i;
            bool const valid = row < rows && c * 4 < cols;
            copyAsync16(shared + at, valid ? global + row * cols + c * 4 : global, valid);
        }
    }
}

//! Keys [key0, key0 + kN) x [0, kD) of V ([keys, cols] floats) as Vᵀ, the K-major B operand of
//! P·V (N = the value dimension, K = keys): chunk 2m + (key % 2) of 8-key group m holds keys
//! 8m + {0, 2, 4, 6} (even) or {1, 3, 5, 7} (odd), position key % 8 / 2, for every value row:
//! the order in which P's accumulator layout gives the keys (see the file comment). Zeros past
//! `keys` and `cols`. Warp w takes chunks w, w + warps, ..., 8 value rows at a time: four 32-byte
//! pieces of global rows, 32 consecutive words of shared memory. kSPLIT: split this thread's
//! elements instead (hi in place, or at hi when given).
template <int32_t kD, int32_t kN, int32_t kThreads, bool kSPLIT>
__device__ __forceinline__ void transposedF32(
    float* shared, float* lo, float const* global, int64_t key0, int64_t keys, int32_t cols, float* hi = nullptr)
{
    constexpr int32_t kWARPS = kThreads / 32;
    constexpr int32_t kPER_WARP = kN / 4 / kWARPS;
    static_assert(kN / 4 == kPER_WARP * kWARPS && kWARPS % 2 == 0 && kD % 8 == 0, "whole chunks per warp");
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const position = lane / 8;
    int32_t const at0 = (warp * kD + lane % 8) * 4 + position;
    int64_t const keyOf0 = key0 + (warp / 2) * 8 + 2 * position + warp % 2;
#pragma unroll
    for (int32_t c2 = 0; c2 < kPER_WARP; ++c2)
    {
#pragma unroll
        for (int32_t db = 0; db < kD / 8; ++db)
        {
            int32_t const at = at0 + c2 * kWARPS * kD * 4 + db * 32;
            if constexpr (kSPLIT)
            {
                splitInto(shared + at, (hi != nullptr ? hi : shared) + at, lo + at);
            }
            else
            {
                int64_t const key = keyOf0 + 4 * kWARPS * c2;
                int32_t const d = db * 8 + lane % 8;
                bool const valid = key < keys && d < cols;
                copyAsync4(shared + at, valid ? global + key * cols + d : global, valid);
            }
        }
    }
}

//! Keys [key0, key0 + kN) x [0, kD) of V ([keys, cols] floats) as loaded, row-major (kD floats a
//! key), zeros past `keys` and `cols`: 16-byte cp.async, consecutive threads along a row (a warp
//! reads 512 contiguous bytes). splitTransposedF32 makes Vᵀ hi / lo of it. Where every key is there
//! and cols == kD (the common tile), chunk c is at c x 4 floats from the tile's first element in
//! global memory too: no checks, compile-time offsets.
template <int32_t kD, int32_t kN, int32_t kThreads>
__device__ __forceinline__ void rowMajorF32(float* shared, float const* global, int64_t key0, int64_t keys, int32_t cols)
{
    constexpr int32_t kCHUNKS = kD / 4; // a key's
    static_assert(kN * kCHUNKS % kThreads == 0, "whole chunks per thread");
    int32_t const thread = static_cast<int32_t>(threadIdx.x);
    if (key0 + kN <= keys && cols == kD)
    {
        float const* const tile = global + key0 * kD;
#pragma unroll
        for (int32_t i = 0; i < kN * kCHUNKS / kThreads; ++i)
        {
            int32_t const c = i * kThreads + thread;
            copyAsync16(shared + c * 4, tile + c * 4, true);
        }
        return;
    }
#pragma unroll
    for (int32_t i = 0; i < kN * kCHUNKS / kThreads; ++i)
    {
        int32_t const c = i * kThreads + thread;
        int32_t const key = c / kCHUNKS;
        int32_t const d = (c % kCHUNKS) * 4;
        bool const valid = key0 + key < keys && d < cols;
        copyAsync16(shared + c * 4, valid ? global + (key0 + key) * cols + d : global, valid);
    }
}

//! rowMajorF32's tile split into Vᵀ hi and lo in transposedF32's layout (chunk 2m + key % 2 of
//! 8-key group m holds keys 8m + {0, 2, 4, 6} or {1, 3, 5, 7} of one value row). Warp w takes chunk
//! columns w, w + warps, ...; a lane the value rows lane + 32 r: four 4-byte loads of consecutive
//! words across the warp and two 16-byte stores of consecutive chunks (no bank conflicts). The
//! transposedF32 split it replaces at one warpgroup cost each thread 32 4-byte cp.async (about 15
//! instructions each, with their addresses) and 64 4-byte stores a tile.
template <int32_t kD, int32_t kN, int32_t kThreads>
__device__ __forceinline__ void splitTransposedF32(float const* raw, float* hi, float* lo)
{
    constexpr int32_t kWARPS = kThreads / 32;
    constexpr int32_t kCOLUMNS = kN / 4;
    static_assert(kCOLUMNS % kWARPS == 0 && kD % 32 == 0, "whole columns per warp, rows per lane");
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
#pragma unroll
    for (int32_t cc = 0; cc < kCOLUMNS / kWARPS; ++cc)
    {
        int32_t const column = warp + cc * kWARPS;
        float const* const from = raw + ((column / 2) * 8 + column % 2) * kD + lane;
        int32_t const to = (column * kD + lane) * 4;
#pragma unroll
        for (int32_t r = 0; r < kD / 32; ++r)
        {
            uint32_t h[4];
            uint32_t l[4];
#pragma unroll
            for (int32_t i = 0; i < 4; ++i)
            {
                splitTf32(from[2 * i * kD + 32 * r], h[i], l[i]);
            }
            *reinterpret_cast<uint4*>(hi + to + 128 * r) = make_uint4(h[0], h[1], h[2], h[3]);
            *reinterpret_cast<uint4*>(lo + to + 128 * r) = make_uint4(l[0], l[1], l[2], l[3]);
        }
    }
}

//! desc moved on by `units` 16-byte units: a 32-bit add to the start address (bits 0-13; shared
//! addresses stay below 256 KB, so it never carries into the leading offset), the high word (the
//! stride offset, a compile-time constant) left as it is. A 64-bit add lets the carry reach the
//! high word, and ptxas then rebuilt each step's descriptor in ordinary registers: about 12
//! instructions a wgmma, 40% of the 256-wide kernel's instructions per key tile.
__device__ __forceinline__ uint64_t advanced(uint64_t desc, uint32_t units)
{
    return (desc & 0xFFFFFFFF00000000ULL) | (static_cast<uint32_t>(desc) + units);
}

//! S = Q K_jᵀ (issued and committed, not waited for) into kSUMS accumulators: the first takes the
//! lo·hi and hi·lo products of every k8 step, then the hi·hi products of the first part of the
//! steps; each other accumulator those of its part (the last takes what is left). The tensor core
//! truncates as it accumulates (each instruction can lose an ulp of its running sum, always towards
//! zero), so the large hi·hi products come last and are shared between several sums, added in
//! float32 afterwards (one accumulator, each step's three products in turn, measured 1.8-2.2x the
//! unfused chain's error on SDXL cross and SigLIP; two sums, 0.64x and 0.51x). Two sums up to head
//! dim 128 (at most 8 hi·hi steps each); above, kD / 64 (8 steps each again). Q (A, K-major): LBO =
//! the next 4 head-dim elements (kRows rows of 16 bytes), SBO = 8 rows; K (B, K-major, N = keys):
//! LBO = kN rows of 16 bytes, SBO = 8 rows; a k8 step is 2 chunks.
template <int32_t kD, int32_t kN, int32_t kRows, int32_t kSUMS = 2>
__device__ __forceinline__ void issueTf32Scores(float (&acc)[kSUMS][kN / 8][4], uint64_t const qHiDesc,
    uint64_t const qLoDesc, uint64_t const kHiDesc, uint64_t const kLoDesc)
{
    constexpr int32_t kSTEPS = kD / 8;
    constexpr int32_t kPART = kSTEPS / kSUMS;
#pragma unroll
    for (int32_t i = 0; i < kSUMS; ++i)
    {
        fenceOperands(acc[i]);
    }
    wgmmaFence();
    if constexpr (kD > 128)
    {
        // 24 or 32 k8 steps: a loop of kROLL steps a trip (4 descriptors moved on by one add each
        // a trip, each wgmma's by an immediate), where unrolled ptxas computed all 72-96
        // descriptors in ordinary registers and moved each to uniform ones before its wgmma (about
        // 12 instructions a wgmma; now about 5, in uniform registers; 8 steps a trip measured 48
        // instructions a tile fewer in SASS than 4)
        constexpr int32_t kROLL = 8;
        static_assert(kPART % kROLL == 0 && kPART * kSUMS == kSTEPS, "whole trips");
        uint64_t qLo = qLoDesc;
        uint64_t qHi = qHiDesc;
        uint64_t kHi = kHiDesc;
        uint64_t kLo = kLoDesc;
#pragma unroll 1
        for (int32_t k0 = 0; k0 < kSTEPS; k0 += kROLL)
        {
            wgmmaFence(); // each trip's (else ptxas adds it, C7519)
#pragma unroll
            for (int32_t u = 0; u < kROLL; ++u)
            {
                uint32_t const qStep = static_cast<uint32_t>(2 * u * kRows);
                uint32_t const kStep = static_cast<uint32_t>(2 * u * kN);
                hp::Wgmma<float, kN>::ss(acc[0], advanced(qLo, qStep), advanced(kHi, kStep), k0 + u > 0);
                hp::Wgmma<float, kN>::ss(acc[0], advanced(qHi, qStep), advanced(kLo, kStep), true);
            }
            qLo = advanced(qLo, 2 * kROLL * kRows);
            qHi = advanced(qHi, 2 * kROLL * kRows);
            kHi = advanced(kHi, 2 * kROLL * kN);
            kLo = advanced(kLo, 2 * kROLL * kN);
        }
        // the hi·hi products: step k0 + u of every part in one trip (each sum still takes its steps
        // in order); the last trip after the loop, so that the commit follows straight-line wgmmas
        // (after a loop ptxas closes the group with an added empty wgmma and warpgroup.arrive, C7519)
        qHi = qHiDesc;
        kHi = kHiDesc;
        auto const hiTrip = [&](int32_t k0) {
            wgmmaFence();
#pragma unroll
            for (int32_t u = 0; u < kROLL; ++u)
            {
#pragma unroll
                for (int32_t part = 0; part < kSUMS; ++part)
                {
                    int32_t const kk = part * kPART + u;
                    hp::Wgmma<float, kN>::ss(acc[part], advanced(qHi, static_cast<uint32_t>(2 * kk * kRows)),
                        advanced(kHi, static_cast<uint32_t>(2 * kk * kN)), part == 0 || k0 + u > 0);
                }
            }
            qHi = advanced(qHi, 2 * kROLL * kRows);
            kHi = advanced(kHi, 2 * kROLL * kN);
        };
#pragma unroll 1
        for (int32_t k0 = 0; k0 + kROLL < kPART; k0 += kROLL)
        {
            hiTrip(k0);
        }
        hiTrip(kPART - kROLL);
    }
    else
    {
#pragma unroll
        for (int32_t kk = 0; kk < kSTEPS; ++kk)
        {
            uint64_t const qStep = static_cast<uint64_t>(2 * kk * kRows);
            uint64_t const kStep = static_cast<uint64_t>(2 * kk * kN);
            hp::Wgmma<float, kN>::ss(acc[0], qLoDesc + qStep, kHiDesc + kStep, kk > 0);
            hp::Wgmma<float, kN>::ss(acc[0], qHiDesc + qStep, kLoDesc + kStep, true);
        }
#pragma unroll
        for (int32_t kk = 0; kk < kSTEPS; ++kk)
        {
            uint64_t const qStep = static_cast<uint64_t>(2 * kk * kRows);
            uint64_t const kStep = static_cast<uint64_t>(2 * kk * kN);
            int32_t const part = kk / kPART < kSUMS ? kk / kPART : kSUMS - 1;
            hp::Wgmma<float, kN>::ss(acc[part], qHiDesc + qStep, kHiDesc + kStep, part == 0 || kk > part * kPART);
        }
    }
    wgmmaCommit();
}

//! T = P V_j over the key steps [from, to) (8 keys each) into a zeroed accumulator, the same order
//! (lo terms, then hi·hi), issued and committed. A tile is taken in two halves, each added to O in
//! float32 (the same argument: 32 keys' worth of truncation, not 64). Vᵀ (B, K-major, N = value
//! dim): LBO = the next 4 keys (kVROWS rows of 16 bytes), SBO = 8 rows. kD is the N of the
//! wgmma: the descriptors may start inside the kVROWS value rows of the tile (one part of O).
template <int32_t kD, int32_t kN, int32_t kVROWS = kD>
__device__ __forceinline__ void issueTf32Values(float (&t)[kD / 8][4], uint32_t (&pHi)[kN / 8][4],
    uint32_t (&pLo)[kN / 8][4], uint64_t const vHiDesc, uint64_t const vLoDesc, int32_t const from, int32_t const to)
{
    fenceOperands(t);
    fenceOperands(pHi);
    fenceOperands(pLo);
    wgmmaFence();
#pragma unroll
    for (int32_t kk = from; kk < to; ++kk)
    {
        uint64_t const vStep = static_cast<uint64_t>(2 * kk * kVROWS);
        hp::Wgmma<float, kD>::rs(t, pLo[kk], vHiDesc + vStep, kk > from);
        hp::Wgmma<float, kD>::rs(t, pHi[kk], vLoDesc + vStep, true);
    }
#pragma unroll
    for (int32_t kk = from; kk < to; ++kk)
    {
        hp::Wgmma<float, kD>::rs(t, pHi[kk], vHiDesc + static_cast<uint64_t>(2 * kk * kVROWS), true);
    }
    wgmmaCommit();
}

//! P (the scores' accumulators, the TF32 A fragment) split into hi + lo.
template <int32_t kN>
__device__ __forceinline__ void splitProbabilities(
    float const (&p)[kN / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4])
{
#pragma unroll
    for (int32_t kk = 0; kk < kN / 8; ++kk)
    {
        probabilityFragment(p[kk], pHi[kk], pLo[kk]);
    }
}

//! Waits for every wgmma of this warpgroup, then o += t (a P V_j half, see issueTf32Values), or
//! with t narrower than o, o[first..] += t (one part of the value dim).
template <int32_t kD, int32_t kDT = kD>
__device__ __forceinline__ void addValuesInto(float (&o)[kD / 8][4], float (&t)[kDT / 8][4], int32_t const first = 0)
{
    wgmmaWait<0>();
    fenceOperands(t);
#pragma unroll
    for (int32_t n = 0; n < kDT / 8; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            o[first + n][e] += t[n][e];
        }
    }
}

//! Waits for the wgmmas of this warpgroup but the last kPENDING groups, then o[first..] =
//! o[first..] carry + t, per row (a part of P V_j added to O while O moves to the maximum of the
//! tile before, see hopperTf32WideKernel).
template <int32_t kD, int32_t kDT, int32_t kPENDING>
__device__ __forceinline__ void addScaledValuesInto(
    float (&o)[kD / 8][4], float (&t)[kDT / 8][4], float const (&carry)[2], int32_t const first)
{
    wgmmaWait<kPENDING>();
    fenceOperands(t);
#pragma unroll
    for (int32_t n = 0; n < kDT / 8; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            o[first + n][e] = fmaf(o[first + n][e], carry[e / 2], t[n][e]);
        }
    }
}

//! The scores' sums (see issueTf32Scores) added into the first, once they are waited for.
template <int32_t kN, int32_t kSUMS = 2>
__device__ __forceinline__ void addScoreSums(float (&acc)[kSUMS][kN / 8][4])
{
#pragma unroll
    for (int32_t i = 0; i < kSUMS; ++i)
    {
        fenceOperands(acc[i]);
    }
#pragma unroll
    for (int32_t i = 1; i < kSUMS; ++i)
    {
#pragma unroll
        for (int32_t n = 0; n < kN / 8; ++n)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                acc[0][n][e] += acc[i][n][e];
            }
        }
    }
}

//! kWG warpgroups x 64 query rows, kN-key tiles (2 x 64 as built); kPLAIN: no mask and no softcap
//! (compiled without that per-score code). One block per SM at 2 warpgroups (its shared memory
//! allows no more), two at one.
template <int32_t kD, int32_t kWG, int32_t kN, bool kPLAIN>
__global__ void __launch_bounds__(kWG * 128, kWG == 1 ? 2 : 1) hopperTf32Kernel(float const* __restrict__ q,
    float const* __restrict__ k, float const* __restrict__ v, AttentionMaskView const givenMask,
    float* __restrict__ out, AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    AttentionMaskView const noMask{};
    AttentionMaskView const& mask = kPLAIN ? noMask : givenMask;
    AttentionParams params = givenParams;
    if constexpr (kPLAIN)
    {
        params.softcap = 0.F;
    }
    constexpr int32_t kThreads = kWG * 128;
    constexpr int32_t kRows = kWG * 64;
    constexpr int32_t kTILE = kN * kD; // floats of one K or V tile
    constexpr int32_t kPV_STEPS = kN / 8;
    constexpr int32_t kHALF = kPV_STEPS / 2;
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw); // hi
    float* const sQlo = sQ + kRows * kD;
    float* const sK = sQlo + kRows * kD; // hi, two stages
    float* const sKlo = sK + 2 * kTILE;  // two stages
    float* const sV = sKlo + 2 * kTILE;  // Vᵀ hi, two stages
    float* const sVlo = sV + 2 * kTILE;  // two stages

    BlockSetup<float> const block(q, k, v, out, mask, shape, params, kRows, qTiles);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);

    auto const loadK = [&](int32_t j) {
        chunkMajorF32<kD, kN, kThreads, false>(sK + (j % 2) * kTILE, nullptr, block.kBase,
            static_cast<int64_t>(j) * kN, shape.seqK, headDim);
    };
    auto const splitK = [&](int32_t j) {
        chunkMajorF32<kD, kN, kThreads, true>(sK + (j % 2) * kTILE, sKlo + (j % 2) * kTILE, nullptr, 0, 0, 0);
    };
    auto const loadV = [&](int32_t j) {
        transposedF32<kD, kN, kThreads, false>(sV + (j % 2) * kTILE, nullptr, block.vBase,
            static_cast<int64_t>(j) * kN, shape.seqK, valueDim);
    };
    auto const splitV = [&](int32_t j) {
        transposedF32<kD, kN, kThreads, true>(sV + (j % 2) * kTILE, sVlo + (j % 2) * kTILE, nullptr, 0, 0, 0);
    };

    // Q, K_0, V_0 and K_1, each split by the thread that loaded it.
    chunkMajorF32<kD, kRows, kThreads, false>(sQ, nullptr, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadK(0);
        loadV(0);
    }
    if (keyTiles > 1)
    {
        loadK(1);
    }
    commitAsync();
    waitAsync<0>();
    chunkMajorF32<kD, kRows, kThreads, true>(sQ, sQlo, nullptr, 0, 0, 0);
    if (keyTiles > 0)
    {
        splitK(0);
        splitV(0);
    }
    if (keyTiles > 1)
    {
        splitK(1);
    }
    fenceProxyAsync();
    __syncthreads();

    // Q (A, K-major): LBO = the next 4 head-dim elements (kRows rows of 16 bytes), SBO = 8 rows;
    // a k8 step is 2 chunks.
    uint32_t const qOffset = static_cast<uint32_t>(group * 64 * 16);
    uint64_t const qHiDesc = descriptor(sharedAddress(sQ) + qOffset, kRows * 16, 128);
    uint64_t const qLoDesc = descriptor(sharedAddress(sQlo) + qOffset, kRows * 16, 128);
    uint32_t const kHiAddress = sharedAddress(sK);
    uint32_t const kLoAddress = sharedAddress(sKlo);
    uint32_t const vHiAddress = sharedAddress(sV);
    uint32_t const vLoAddress = sharedAddress(sVlo);

    float o[kD / 8][4];
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
    }
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warp * 16;

    // S = Q K_jᵀ and T = P V_j on tile j's stage (issueTf32Scores, issueTf32Values: products,
    // order and accumulator splits).
    auto const issueScores = [&](float (&acc)[2][kN / 8][4], int32_t j) {
        uint32_t const stage = static_cast<uint32_t>((j % 2) * kTILE * 4);
        issueTf32Scores<kD, kN, kRows>(acc, qHiDesc, qLoDesc, descriptor(kHiAddress + stage, kN * 16, 128),
            descriptor(kLoAddress + stage, kN * 16, 128));
    };
    auto const issueValues = [&](float (&t)[kD / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4],
                                 int32_t j, int32_t const from, int32_t const to) {
        uint32_t const stage = static_cast<uint32_t>((j % 2) * kTILE * 4);
        issueTf32Values<kD, kN>(t, pHi, pLo, descriptor(vHiAddress + stage, kD * 16, 128),
            descriptor(vLoAddress + stage, kD * 16, 128), from, to);
    };
    auto const addValues = [&](float (&t)[kD / 8][4]) { addValuesInto<kD>(o, t); };
    // Waits for the scores (the group before the last), adds the two sums, runs the online softmax.
    auto const softmaxOf = [&](float (&acc)[2][kN / 8][4], float (&alpha)[2], int32_t j, auto wait) {
        wait();
        addScoreSums<kN>(acc);
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        softmax.template update<false>(acc[0], alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape,
            params, checkEach);
    };
    auto const splitP = [&](float const (&p)[kN / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4]) {
        splitProbabilities<kN>(p, pHi, pLo);
    };

    float s[2][kN / 8][4];
    float t[kD / 8][4];
    float alpha[2];
    uint32_t pHi[kN / 8][4];
    uint32_t pLo[kN / 8][4];
    if (keyTiles > 0)
    {
        issueScores(s, 0);
        softmaxOf(s, alpha, 0, [] { wgmmaWait<0>(); });
        splitP(s[0], pHi, pLo);
        __syncthreads(); // every warpgroup done with S_0: K_0's stage takes K_2
        if (keyTiles > 2)
        {
            loadK(2);
        }
        if (keyTiles > 1)
        {
            loadV(1);
        }
        commitAsync();
    }
    for (int32_t j = 0; j + 1 < keyTiles; ++j)
    {
        // Here: P_j split in pHi/pLo (O scaled to its maximum), K_j+1 and V_j split and visible,
        // K_j+2 and V_j+1 on their way into the hi buffers of stages j % 2 and (j + 1) % 2.
        issueScores(s, j + 1);
        issueValues(t, pHi, pLo, j, 0, kHALF);
        softmaxOf(s, alpha, j + 1, [] { wgmmaWait<1>(); }); // while the first half of P_j V_j runs
        addValues(t);
        issueValues(t, pHi, pLo, j, kHALF, kPV_STEPS);
        waitAsync<0>(); // while the second half runs: split this thread's part of K_j+2 and V_j+1
        if (j + 2 < keyTiles)
        {
            splitK(j + 2);
        }
        splitV(j + 1);
        addValues(t);
        fenceOperands(pHi);
        fenceOperands(pLo);
        rescale(o, alpha);
        splitP(s[0], pHi, pLo);
        fenceProxyAsync();
        __syncthreads(); // every warpgroup done with S_j+1 and P_j V_j; the splits visible
        if (j + 3 < keyTiles)
        {
            loadK(j + 3);
        }
        if (j + 2 < keyTiles)
        {
            loadV(j + 2);
        }
        commitAsync();
    }
    if (keyTiles > 0)
    {
        issueValues(t, pHi, pLo, keyTiles - 1, 0, kHALF);
        addValues(t);
        // the last tile's second half only when it holds a key (SDXL's 77 keys: 64 + 13)
        if (static_cast<int64_t>(keyTiles - 1) * kN + kN / 2 < block.keyEnd)
        {
            issueValues(t, pHi, pLo, keyTiles - 1, kHALF, kPV_STEPS);
            addValues(t);
        }
    }
    waitAsync<0>();
    softmax.finish();
    storeOutput<float, kD>(o, softmax, block.outBase, warpRow0 + lane / 4, shape, params);
#endif
}

//! Head dims above 72 (96 and 128 as built): Q hi / lo of 128 rows alone take 128 KB at 128, so the
//! two stages of K and V hi / lo of hopperTf32Kernel (256 KB more) do not fit. This kernel keeps one
//! stage of K and Vᵀ hi / lo of kN = kTF32_WIDE_KEYS = 32 keys and lands the next tiles' raw K and Vᵀ
//! in a staging buffer (cp.async) while the current ones compute: (2 x 128 + 6 x 32) x D x 4 bytes,
//! 224 KB at D = 128. Per tile, in each warpgroup, with K_j and V_j-1 split in shared memory, P_j-1
//! split in registers, raw K_j+1 and V_j on their way into the staging buffer:
//!
//!   issue S_j and T = P_j-1 V_j-1 | wait S_j, online softmax of S_j | wait T, O = (O + T) alpha,
//!   split P_j | block barrier | split this thread's K_j+1, V_j from the staging buffer
//!   | fence.proxy.async | load K_j+2, V_j+1 into it | block barrier
//!
//! Each thread splits only the staging chunks its own cp.async brought, so the staging buffer needs
//! no barrier of its own. The products and accumulator splits are hopperTf32Kernel's (S in two
//! accumulators, P V over 32 keys into a zeroed accumulator added in float32): the same error
//! bound. Causal blocks run heavy-first over all (batch, head)s (one block per SM).
//!
//! Above 128 (192 and 256 as built) the same products run with one warpgroup of 64 rows and
//! kTF32_WIDEST_KEYS = 16-key tiles: Q hi / lo of 64 rows are 128 KB at 256 and the tiles 96 KB,
//! (2 x 64 + 6 x 16) x D x 4 bytes = 224 KB. O is 128 registers per thread at 256, so T = P V_j is
//! taken in kPARTS slices of the value dim (each its own zeroed accumulator, added to its slice of
//! O) instead of one accumulator as wide as O; S takes kD / 64 sums (8 hi·hi steps each, as at 128).
//! With one block of 4 warps per SM (one warp per scheduler) a tile takes about as long as its
//! instructions take to issue, so there V is loaded row-major and transposed by its split, and the
//! splits run while the tensor cores work (the order is in the loop's comment).
constexpr int32_t kTF32_WIDE_KEYS{kHOPPER_TF32_WIDE_KEYS};
constexpr int32_t kTF32_WIDEST_KEYS{kHOPPER_TF32_WIDEST_KEYS};
//! The parts of the value dim T = P V_j is taken in, each into its own zeroed accumulator: 1 up to
//! head dim 128; above, parts of 32 columns (6 at 192, 8 at 256) in two accumulators, one part
//! on the tensor cores while the one before is added to O (one accumulator of 64 columns at 256,
//! each part waited for before the next was issued, left the tensor cores idle between parts).
__host__ __device__ constexpr int32_t tf32ValueParts(int32_t d)
{
    return d <= 128 ? 1 : d / 32;
}

template <int32_t kD, int32_t kWG, int32_t kN, bool kPLAIN>
__global__ void __launch_bounds__(kWG * 128, 1) hopperTf32WideKernel(float const* __restrict__ q,
    float const* __restrict__ k, float const* __restrict__ v, AttentionMaskView const givenMask,
    float* __restrict__ out, AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    AttentionMaskView const noMask{};
    AttentionMaskView const& mask = kPLAIN ? noMask : givenMask;
    AttentionParams params = givenParams;
    if constexpr (kPLAIN)
    {
        params.softcap = 0.F;
    }
    constexpr int32_t kThreads = kWG * 128;
    constexpr int32_t kRows = kWG * 64;
    constexpr int32_t kTILE = kN * kD;
    constexpr int32_t kPV_STEPS = kN / 8;
    constexpr int32_t kSUMS = kD > 128 ? kD / 64 : 2;
    constexpr int32_t kPARTS = tf32ValueParts(kD);
    constexpr int32_t kDT = kD / kPARTS; // value dims of one part of T
    static_assert(kDT % 8 == 0 && kDT * kPARTS == kD, "whole parts");
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw); // hi
    float* const sQlo = sQ + kRows * kD;
    float* const sK = sQlo + kRows * kD; // hi
    float* const sKlo = sK + kTILE;
    float* const sV = sKlo + kTILE; // Vᵀ hi
    float* const sVlo = sV + kTILE;
    float* const sKraw = sVlo + kTILE; // the next K tile as loaded
    float* const sVraw = sKraw + kTILE; // the next V tile as loaded (see loadV)

    BlockSetup<float> const block(q, k, v, out, mask, shape, params, kRows, qTiles, params.causal);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    // a compile-time 0 for one warpgroup: the Q descriptors then depend on no thread index and
    // ptxas moves them on in uniform registers (from the thread index: 66 instructions a trip of
    // issueTf32Scores' loop, not 50)
    int32_t const group = kWG == 1 ? 0 : warp / 4;
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);

    auto const loadK = [&](int32_t j) {
        int64_t const key0 = static_cast<int64_t>(j) * kN;
        if (kWG == 1 && key0 + kN <= shape.seqK && headDim == kD)
        {
            // every key of the tile there, no columns to zero: no checks (one warpgroup only, so
            // that the kernels up to head dim 128 stay as measured)
            chunkMajorF32<kD, kN, kThreads, false, true>(sKraw, nullptr, block.kBase, key0, shape.seqK, headDim);
        }
        else
        {
            chunkMajorF32<kD, kN, kThreads, false>(sKraw, nullptr, block.kBase, key0, shape.seqK, headDim);
        }
    };
    // V: at one warpgroup loaded row-major and transposed by its split (rowMajorF32); else loaded
    // straight into the transposed layout (4-byte cp.async), split in place
    auto const loadV = [&](int32_t j) {
        if constexpr (kWG == 1)
        {
            rowMajorF32<kD, kN, kThreads>(sVraw, block.vBase, static_cast<int64_t>(j) * kN, shape.seqK, valueDim);
        }
        else
        {
            transposedF32<kD, kN, kThreads, false>(
                sVraw, nullptr, block.vBase, static_cast<int64_t>(j) * kN, shape.seqK, valueDim);
        }
    };
    auto const splitK = [&] { chunkMajorF32<kD, kN, kThreads, true>(sKraw, sKlo, nullptr, 0, 0, 0, sK); };
    auto const splitV = [&] {
        if constexpr (kWG == 1)
        {
            splitTransposedF32<kD, kN, kThreads>(sVraw, sV, sVlo);
        }
        else
        {
            transposedF32<kD, kN, kThreads, true>(sVraw, sVlo, nullptr, 0, 0, 0, sV);
        }
    };

    // Q and K_0, each split by the thread that loaded it; then V_0 and K_1 into the staging buffer.
    chunkMajorF32<kD, kRows, kThreads, false>(sQ, nullptr, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadK(0);
    }
    commitAsync();
    waitAsync<0>();
    chunkMajorF32<kD, kRows, kThreads, true>(sQ, sQlo, nullptr, 0, 0, 0);
    if (keyTiles > 0)
    {
        splitK();
        loadV(0);
    }
    if (keyTiles > 1)
    {
        loadK(1);
    }
    commitAsync();
    fenceProxyAsync();
    __syncthreads();

    uint32_t const qOffset = static_cast<uint32_t>(group * 64 * 16);
    uint64_t const qHiDesc = descriptor(sharedAddress(sQ) + qOffset, kRows * 16, 128);
    uint64_t const qLoDesc = descriptor(sharedAddress(sQlo) + qOffset, kRows * 16, 128);
    uint64_t const kHiDesc = descriptor(sharedAddress(sK), kN * 16, 128);
    uint64_t const kLoDesc = descriptor(sharedAddress(sKlo), kN * 16, 128);
    uint64_t const vHiDesc = descriptor(sharedAddress(sV), kD * 16, 128);
    uint64_t const vLoDesc = descriptor(sharedAddress(sVlo), kD * 16, 128);

    float o[kD / 8][4];
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
    }
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warp * 16;
    auto const softmaxOf = [&](auto& acc, float (&alpha)[2], int32_t j, auto wait) {
        wait();
        addScoreSums<kN, kSUMS>(acc);
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        softmax.template update<false>(acc[0], alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape,
            params, checkEach);
    };
    // The block's next K and V from the staging buffer once every warpgroup is done with the last
    // ones (each waited for all its wgmmas), and the loads of the tiles after them.
    auto const nextTiles = [&](int32_t j) {
        __syncthreads();
        waitAsync<0>();
        if (j + 1 < keyTiles)
        {
            splitK();
        }
        splitV();
        fenceProxyAsync();
        if (j + 2 < keyTiles)
        {
            loadK(j + 2);
        }
        if (j + 1 < keyTiles)
        {
            loadV(j + 1);
        }
        commitAsync();
        __syncthreads();
    };

    float s[kSUMS][kN / 8][4];
    float t[2][kDT / 8][4]; // T: one part, or at one warpgroup two (see tf32ValueParts)
    float alpha[2];
    uint32_t pHi[kN / 8][4];
    uint32_t pLo[kN / 8][4];
    // T = P V_j for value dims [part kDT, (part + 1) kDT): Vᵀ rows start part kDT rows (of 16
    // bytes: the descriptors count 16-byte units) into the tile
    auto const issueValues = [&](int32_t part) {
        uint64_t const rows = static_cast<uint64_t>(part * kDT);
        issueTf32Values<kDT, kN, kD>(t[part % 2], pHi, pLo, vHiDesc + rows, vLoDesc + rows, 0, kPV_STEPS);
    };
    // P_j-1 V_j-1 into O, the first part already issued; each further part issued once the one
    // before is added (one T accumulator)
    auto const addValues = [&] {
        addValuesInto<kD, kDT>(o, t[0]);
#pragma unroll
        for (int32_t part = 1; part < kPARTS; ++part)
        {
            issueValues(part);
            addValuesInto<kD, kDT>(o, t[0], part * kDT / 8);
        }
    };
    if constexpr (kWG == 1)
    {
        // One warpgroup. Each warp waits for its own part of a wgmma, so a barrier follows before
        // K's or V's hi / lo take the next tile; V's split reads what other threads loaded, so
        // every thread waits for its V loads before the barrier that precedes it, and the next V
        // loads follow the barrier after it. V_j-1 is split
        // while S_j runs, K_j+1 while the first part of P_j-1 V_j-1 runs (three barriers a tile,
        // the splits off the critical path). O is scaled as each part of T is added (fma, one
        // instruction an element: o = o carry + t, carry the factor of the tile before, P_j-1
        // being relative to its maximum), not (o + t) then o alpha. At the top of the loop: K_j
        // split, V's hi / lo free, raw V_j-1 landed, raw K_j+1 on its way, P_j-1 split.
        float carry[2]{1.F, 1.F};
        // part 0 issued: each next part issued before the one before is waited for and added
        auto const addScaledValues = [&] {
#pragma unroll
            for (int32_t part = 1; part < kPARTS; ++part)
            {
                issueValues(part);
                addScaledValuesInto<kD, kDT, 1>(o, t[(part - 1) % 2], carry, (part - 1) * kDT / 8);
            }
            addScaledValuesInto<kD, kDT, 0>(o, t[(kPARTS - 1) % 2], carry, (kPARTS - 1) * kDT / 8);
        };
        // K_j+1 split (this thread's chunks, landed), K_j+2's loads issued and committed
        auto const nextK = [&](int32_t j) {
            if (j + 1 < keyTiles)
            {
                splitK();
            }
            if (j + 2 < keyTiles)
            {
                loadK(j + 2);
            }
            commitAsync();
        };
        if (keyTiles > 0)
        {
            issueTf32Scores<kD, kN, kRows, kSUMS>(s, qHiDesc, qLoDesc, kHiDesc, kLoDesc);
            softmaxOf(s, alpha, 0, [] { wgmmaWait<0>(); });
            splitProbabilities<kN>(s[0], pHi, pLo);
            __syncthreads();
            waitAsync<0>(); // V_0 and K_1
            nextK(0);
            fenceProxyAsync();
            __syncthreads();
        }
        for (int32_t j = 1; j < keyTiles; ++j)
        {
            issueTf32Scores<kD, kN, kRows, kSUMS>(s, qHiDesc, qLoDesc, kHiDesc, kLoDesc);
            splitV(); // V_j-1, while S_j runs
            fenceProxyAsync();
            __syncthreads(); // V_j-1 split by every thread, its raw tile read by every thread
            loadV(j);
            commitAsync();
            issueValues(0);
            softmaxOf(s, alpha, j, [] { wgmmaWait<1>(); }); // while P_j-1 V_j-1 runs
            __syncthreads();                                  // every warp done with S_j
            waitAsync<1>();                                   // K_j+1 (V_j may be on its way)
            nextK(j);                                         // while P_j-1 V_j-1 runs
            addScaledValues();
            carry[0] = alpha[0];
            carry[1] = alpha[1];
            fenceOperands(pHi);
            fenceOperands(pLo);
            splitProbabilities<kN>(s[0], pHi, pLo);
            waitAsync<1>(); // V_j
            fenceProxyAsync();
            __syncthreads(); // K_j+1 split, V_j landed, every warp done with P_j-1 V_j-1
        }
        if (keyTiles > 0)
        {
            splitV();
            fenceProxyAsync();
            __syncthreads();
            issueValues(0);
            addScaledValues();
        }
    }
    else
    {
        if (keyTiles > 0)
        {
            issueTf32Scores<kD, kN, kRows, kSUMS>(s, qHiDesc, qLoDesc, kHiDesc, kLoDesc);
            softmaxOf(s, alpha, 0, [] { wgmmaWait<0>(); });
            splitProbabilities<kN>(s[0], pHi, pLo);
            nextTiles(0);
        }
        for (int32_t j = 1; j < keyTiles; ++j)
        {
            issueTf32Scores<kD, kN, kRows, kSUMS>(s, qHiDesc, qLoDesc, kHiDesc, kLoDesc);
            issueValues(0);
            softmaxOf(s, alpha, j, [] { wgmmaWait<1>(); }); // while P_j-1 V_j-1 runs
            addValues();
            fenceOperands(pHi);
            fenceOperands(pLo);
            rescale(o, alpha);
            splitProbabilities<kN>(s[0], pHi, pLo);
            nextTiles(j);
        }
        if (keyTiles > 0)
        {
            issueValues(0);
            addValues();
        }
    }
    waitAsync<0>();
    softmax.finish();
    storeOutput<float, kD>(o, softmax, block.outBase, warpRow0 + lane / 4, shape, params);
#endif
}

//! Where one work item of the short-key kernel (query tile `tile` of (batch, head) `bh`) reads and
//! writes: BlockSetup's fields for an item number instead of blockIdx (tiles in order, no
//! heavy-first order: with all keys in at most two tiles, causal items differ little).
struct ShortItem
{
    int64_t q0;
    int64_t keyEnd;
    int64_t kv; //!< b * headsKV + hkv: K and V are reloaded only when this changes
    float const* qBase;
    float* outBase;
    int64_t maskBase;

    __device__ ShortItem(int64_t id, float const* q, float* out, AttentionMaskView const& mask,
        AttentionShape const& shape, AttentionParams const& params, int32_t blockRows, int32_t qTiles)
    {
        int64_t const bh = id / qTiles;
        int64_t const tile = id - bh * qTiles;
        int64_t const b = bh / shape.headsQ;
        int64_t const h = bh - b * shape.headsQ;
        kv = b * shape.headsKV + h / (shape.headsQ / shape.headsKV);
        q0 = tile * blockRows;
        keyEnd = params.causal && q0 + blockRows < shape.seqK ? q0 + blockRows : shape.seqK;
        qBase = q + bh * shape.seqQ * shape.headDim;
        outBase = out + bh * shape.seqQ * shape.valueDim;
        maskBase = b * mask.stride[0] + h * mask.stride[1];
    }
};

//! bar.sync on a named barrier for the 128 threads of this warpgroup (barrier 0 is __syncthreads).
__device__ __forceinline__ void warpgroupBarrier(int32_t group)
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
}

//! The short-key kernel: every key of a (batch, head) in at most kSHORT_TILES = 2 tiles of 64
//! (SDXL's cross-attention, 77 keys). A block is persistent over a contiguous run of work items
//! (query tiles of 128 rows, (batch, head)-major): K and V are loaded and split once for each
//! (batch, kv head) the run meets, and the next item's Q is loaded into a third Q buffer while the
//! current one computes; at the next item each thread splits its own chunks of it into Q hi / lo
//! (the rows of its own warpgroup), so the two warpgroups meet at a block barrier only when K and V
//! change. Per item and warpgroup the tile steps are the long kernel's (hopperTf32Kernel) with
//! no loads: S_0, softmax; S_1 with P_0 V_0 (two halves); P_1 V_1. Shared memory: 3 x 128 rows of
//! Q and 2 tiles of K hi/lo and Vᵀ hi/lo, (3 x 128 + 8 x 64) x D x 4 bytes = 224 KB at D = 64.
constexpr int32_t kSHORT_TILES{2};

template <int32_t kD, bool kPLAIN>
__global__ void __launch_bounds__(kTF32_WG * 128, 1) hopperTf32ShortKernel(float const* __restrict__ q,
    float const* __restrict__ k, float const* __restrict__ v, AttentionMaskView const givenMask,
    float* __restrict__ out, AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles,
    int64_t const items, int32_t const perBlock)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    AttentionMaskView const noMask{};
    AttentionMaskView const& mask = kPLAIN ? noMask : givenMask;
    AttentionParams params = givenParams;
    if constexpr (kPLAIN)
    {
        params.softcap = 0.F;
    }
    constexpr int32_t kWG = kTF32_WG;
    constexpr int32_t kN = kTF32_KEYS;
    constexpr int32_t kThreads = kWG * 128;
    constexpr int32_t kRows = kWG * 64;
    constexpr int32_t kTILE = kN * kD;
    constexpr int32_t kPV_STEPS = kN / 8;
    constexpr int32_t kHALF = kPV_STEPS / 2;
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw); // hi
    float* const sQlo = sQ + kRows * kD;
    float* const sQnext = sQlo + kRows * kD; // the next item's Q as loaded
    float* const sK = sQnext + kRows * kD;   // hi, tiles 0 and 1
    float* const sKlo = sK + kSHORT_TILES * kTILE;
    float* const sV = sKlo + kSHORT_TILES * kTILE; // Vᵀ hi
    float* const sVlo = sV + kSHORT_TILES * kTILE;

    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int32_t const kvTiles = static_cast<int32_t>((shape.seqK + kN - 1) / kN); // <= 2 (the plan's choice)
    int64_t const first = static_cast<int64_t>(blockIdx.x) * perBlock;
    int64_t const last = first + perBlock < items ? first + perBlock : items;

    uint32_t const qOffset = static_cast<uint32_t>(group * 64 * 16);
    uint64_t const qHiDesc = descriptor(sharedAddress(sQ) + qOffset, kRows * 16, 128);
    uint64_t const qLoDesc = descriptor(sharedAddress(sQlo) + qOffset, kRows * 16, 128);
    uint32_t const kHiAddress = sharedAddress(sK);
    uint32_t const kLoAddress = sharedAddress(sKlo);
    uint32_t const vHiAddress = sharedAddress(sV);
    uint32_t const vLoAddress = sharedAddress(sVlo);

    // The same products, orders and accumulator splits as hopperTf32Kernel (see there).
    auto const issueScores = [&](float (&acc)[2][kN / 8][4], int32_t j) {
        uint32_t const stage = static_cast<uint32_t>(j * kTILE * 4);
        issueTf32Scores<kD, kN, kRows>(acc, qHiDesc, qLoDesc, descriptor(kHiAddress + stage, kN * 16, 128),
            descriptor(kLoAddress + stage, kN * 16, 128));
    };
    auto const issueValues = [&](float (&t)[kD / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4],
                                 int32_t j, int32_t const from, int32_t const to) {
        uint32_t const stage = static_cast<uint32_t>(j * kTILE * 4);
        issueTf32Values<kD, kN>(t, pHi, pLo, descriptor(vHiAddress + stage, kD * 16, 128),
            descriptor(vLoAddress + stage, kD * 16, 128), from, to);
    };
    auto const splitP = [&](float const (&p)[kN / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4]) {
        splitProbabilities<kN>(p, pHi, pLo);
    };

    if (first < last)
    {
        ShortItem const item(first, q, out, mask, shape, params, kRows, qTiles);
        chunkMajorF32<kD, kRows, kThreads, false>(sQnext, nullptr, item.qBase, item.q0, shape.seqQ, headDim);
        commitAsync();
    }
    int64_t loadedKv = -1;
    for (int64_t id = first; id < last; ++id)
    {
        ShortItem const item(id, q, out, mask, shape, params, kRows, qTiles);
        bool const reload = item.kv != loadedKv;
        if (reload)
        {
            // every warpgroup done with the last K and V (each waited for all its wgmmas)
            __syncthreads();
            float const* const kBase = k + item.kv * shape.seqK * shape.headDim;
            float const* const vBase = v + item.kv * shape.seqK * shape.valueDim;
#pragma unroll
            for (int32_t j = 0; j < kSHORT_TILES; ++j)
            {
                if (j < kvTiles)
                {
                    chunkMajorF32<kD, kN, kThreads, false>(
                        sK + j * kTILE, nullptr, kBase, static_cast<int64_t>(j) * kN, shape.seqK, headDim);
                    transposedF32<kD, kN, kThreads, false>(
                        sV + j * kTILE, nullptr, vBase, static_cast<int64_t>(j) * kN, shape.seqK, valueDim);
                }
            }
            commitAsync();
            loadedKv = item.kv;
        }
        waitAsync<0>(); // this thread's chunks of this item's Q (and of K and V)
        // Q hi / lo from this thread's chunks of sQnext: the rows of its own warpgroup, whose
        // wgmmas on the last item's Q are all done
        chunkMajorF32<kD, kRows, kThreads, true>(sQnext, sQlo, nullptr, 0, 0, 0, sQ);
        if (reload)
        {
#pragma unroll
            for (int32_t j = 0; j < kSHORT_TILES; ++j)
            {
                if (j < kvTiles)
                {
                    chunkMajorF32<kD, kN, kThreads, true>(sK + j * kTILE, sKlo + j * kTILE, nullptr, 0, 0, 0);
                    transposedF32<kD, kN, kThreads, true>(sV + j * kTILE, sVlo + j * kTILE, nullptr, 0, 0, 0);
                }
            }
        }
        fenceProxyAsync();
        if (reload)
        {
            __syncthreads();
        }
        else
        {
            warpgroupBarrier(group);
        }
        if (id + 1 < last)
        {
            // the next item's Q, into this thread's own chunks of sQnext (split above)
            ShortItem const next(id + 1, q, out, mask, shape, params, kRows, qTiles);
            chunkMajorF32<kD, kRows, kThreads, false>(sQnext, nullptr, next.qBase, next.q0, shape.seqQ, headDim);
            commitAsync();
        }

        int32_t const keyTiles = static_cast<int32_t>((item.keyEnd + kN - 1) / kN);
        int64_t const warpRow0 = item.q0 + warp * 16;
        float o[kD / 8][4];
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
        }
        OnlineSoftmax softmax;
        auto const addValues = [&](float (&t)[kD / 8][4]) { addValuesInto<kD>(o, t); };
        auto const softmaxOf = [&](float (&acc)[2][kN / 8][4], float (&alpha)[2], int32_t j, auto wait) {
            wait();
            addScoreSums<kN>(acc);
            int64_t const k0 = static_cast<int64_t>(j) * kN;
            bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
            softmax.template update<false>(acc[0], alpha, warpRow0 + lane / 4, k0, mask, item.maskBase, shape,
                params, checkEach);
        };
        float s[2][kN / 8][4];
        float t[kD / 8][4];
        float alpha[2];
        uint32_t pHi[kN / 8][4];
        uint32_t pLo[kN / 8][4];
        if (keyTiles > 0)
        {
            issueScores(s, 0);
            softmaxOf(s, alpha, 0, [] { wgmmaWait<0>(); });
            splitP(s[0], pHi, pLo);
            if (keyTiles > 1)
            {
                issueScores(s, 1);
                issueValues(t, pHi, pLo, 0, 0, kHALF);
                softmaxOf(s, alpha, 1, [] { wgmmaWait<1>(); }); // while the first half of P_0 V_0 runs
                addValues(t);
                issueValues(t, pHi, pLo, 0, kHALF, kPV_STEPS);
                addValues(t);
                fenceOperands(pHi);
                fenceOperands(pLo);
                rescale(o, alpha);
                splitP(s[0], pHi, pLo);
            }
            issueValues(t, pHi, pLo, keyTiles - 1, 0, kHALF);
            addValues(t);
            // the last tile's second half only when it holds a key (SDXL's 77 keys: 64 + 13)
            if (static_cast<int64_t>(keyTiles - 1) * kN + kN / 2 < item.keyEnd)
            {
                issueValues(t, pHi, pLo, keyTiles - 1, kHALF, kPV_STEPS);
                addValues(t);
            }
        }
        softmax.finish();
        storeOutput<float, kD>(o, softmax, item.outBase, warpRow0 + lane / 4, shape, params);
    }
    waitAsync<0>();
#endif
}

template <int32_t kD, int32_t kWG, int32_t kN, typename F>
cudaError_t withTf32Plain(bool plain, F&& f)
{
    return plain ? f(hopperTf32Kernel<kD, kWG, kN, true>, kWG) : f(hopperTf32Kernel<kD, kWG, kN, false>, kWG);
}

template <int32_t kD, typename F>
cudaError_t withTf32Tiles(HopperPlan const& plan, bool plain, F&& f)
{
    if (plan.keys == kTF32_KEYS && plan.blockRows == kTF32_WG * 64)
    {
        return withTf32Plain<kD, kTF32_WG, kTF32_KEYS>(plain, f);
    }
    return cudaErrorInvalidConfiguration;
}

template <int32_t kD, int32_t kWG, int32_t kN, typename F>
cudaError_t withTf32WideTiles(HopperPlan const& plan, bool plain, F&& f)
{
    if (plan.keys == kN && plan.blockRows == kWG * 64)
    {
        return plain ? f(hopperTf32WideKernel<kD, kWG, kN, true>, kWG)
                     : f(hopperTf32WideKernel<kD, kWG, kN, false>, kWG);
    }
    return cudaErrorInvalidConfiguration;
}

//! Calls f(kernel, warpgroups) with the kernel for the plan, or returns cudaErrorInvalidConfiguration.
template <typename F>
cudaError_t withHopperTf32Kernel(HopperPlan const& plan, bool plain, F&& f)
{
    switch (plan.paddedDim)
    {
    case 32: return withTf32Tiles<32>(plan, plain, f);
    case 64: return withTf32Tiles<64>(plan, plain, f);
    case 72: return withTf32Tiles<72>(plan, plain, f);
    case 96: return withTf32WideTiles<96, kTF32_WG, kTF32_WIDE_KEYS>(plan, plain, f);
    case 128: return withTf32WideTiles<128, kTF32_WG, kTF32_WIDE_KEYS>(plan, plain, f);
    case 192: return withTf32WideTiles<192, 1, kTF32_WIDEST_KEYS>(plan, plain, f);
    case 256: return withTf32WideTiles<256, 1, kTF32_WIDEST_KEYS>(plan, plain, f);
    default: return cudaErrorInvalidConfiguration;
    }
}

//! Calls f(kernel) with the short-key kernel for the plan (head dims 32 and 64), or returns
//! cudaErrorInvalidConfiguration.
template <typename F>
cudaError_t withHopperTf32ShortKernel(HopperPlan const& plan, bool plain, F&& f)
{
    if (plan.keys != kTF32_KEYS || plan.blockRows != kTF32_WG * 64)
    {
        return cudaErrorInvalidConfiguration;
    }
    switch (plan.paddedDim)
    {
    case 32: return plain ? f(hopperTf32ShortKernel<32, true>) : f(hopperTf32ShortKernel<32, false>);
    case 64: return plain ? f(hopperTf32ShortKernel<64, true>) : f(hopperTf32ShortKernel<64, false>);
    default: return cudaErrorInvalidConfiguration;
    }
}

} // namespace

cudaError_t prepareHopperTf32Attention(HopperPlan const& plan) noexcept
{
    auto const prepare = [&](auto kernel, int32_t) {
        cudaFuncAttributes attributes{};
        cudaError_t const status = cudaFuncGetAttributes(&attributes, kernel);
        if (status != cudaSuccess)
        {
            return status;
        }
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.sharedBytes);
    };
    cudaError_t status = withHopperTf32Kernel(plan, true, prepare);
    status = status != cudaSuccess ? status : withHopperTf32Kernel(plan, false, prepare);
    if (status == cudaSuccess && plan.shortKeys)
    {
        auto const prepareShort = [&](auto kernel) { return prepare(kernel, kTF32_WG); };
        status = withHopperTf32ShortKernel(plan, true, prepareShort);
        status = status != cudaSuccess ? status : withHopperTf32ShortKernel(plan, false, prepareShort);
    }
    return status;
}

cudaError_t launchHopperTf32Attention(float const* q, float const* k, float const* v, AttentionMaskView const& mask,
    float* out, AttentionShape const& shape, AttentionParams const& params, HopperPlan const& plan,
    cudaStream_t stream) noexcept
{
    if (plan.keys == 0)
    {
        return cudaErrorInvalidValue;
    }
    LaunchGrid const grid = launchGridFor(q, k, v, out, shape, params, plan.blockRows);
    if (!grid.launch)
    {
        return grid.status;
    }
    bool const plain = mask.kind == AttentionMaskKind::kNone && params.softcap == 0.F;
    if (plan.shortKeys && shape.seqK <= kSHORT_TILES * kTF32_KEYS)
    {
        // persistent blocks over contiguous runs of the qTiles x B x H work items: as many items
        // per block as a full wave needs (640 items on 132 SMs: 5 each, 128 blocks), so that a
        // block reloads K and V only where its run crosses to another (batch, kv head)
        int32_t const processors = multiprocessorCount();
        if (processors <= 0)
        {
            return cudaErrorInvalidDevice;
        }
        int64_t const items = grid.blocks;
        int64_t const perBlock = (items + processors - 1) / processors;
        int64_t const blocks = (items + perBlock - 1) / perBlock;
        return withHopperTf32ShortKernel(plan, plain, [&](auto kernel) {
            kernel<<<static_cast<uint32_t>(blocks), static_cast<uint32_t>(kTF32_WG * 128),
                static_cast<size_t>(plan.sharedBytes), stream>>>(q, k, v, mask, out, shape, params,
                static_cast<int32_t>(grid.qTiles), items, static_cast<int32_t>(perBlock));
            return cudaGetLastError();
        });
    }
    return withHopperTf32Kernel(plan, plain, [&](auto kernel, int32_t warpgroups) {
        kernel<<<static_cast<uint32_t>(grid.blocks), static_cast<uint32_t>(warpgroups * 128),
            static_cast<size_t>(plan.sharedBytes), stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(grid.qTiles));
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix
