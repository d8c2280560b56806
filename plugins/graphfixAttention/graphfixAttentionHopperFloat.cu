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
 *   issue S_j+1 (wgmma) | issue T = P_j V_j (wgmma, into a zeroed accumulator)
 *   | wait S_j+1 | online softmax of S_j+1 | wait own loads of K_j+2, V_j+1 and split them
 *   | wait T | O = (O + T) alpha | split P_j+1 | fence.proxy.async | barrier | load K_j+3, V_j+2
 *
 * P_j V_j goes into its own accumulator, then is added to O in float32: the tensor core truncates
 * as it accumulates (the mma.sync float32 kernel measured 8x the error when it summed a whole row
 * in the tensor core), so its error stays within one 64-key tile.
 *
 * Shared memory: Q hi, Q lo (128 rows), K hi, K lo, V hi, V lo (64 keys, two stages each):
 * (2 x 128 + 8 x 64) x D x 4 bytes, 192 KB at D = 64, 216 KB at D = 72; one block per SM.
 * Head dims up to 72 (32, 64, 72 as built; 80 would need 240 KB): wider heads and other GPUs run
 * the mma.sync flash kernel (flashTf32x3Kernel).
 */
#include "graphfixAttentionHopper.cuh"

#include <cstdlib>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kTF32_WG{2};
constexpr int32_t kTF32_THREADS{kTF32_WG * 128};
constexpr int32_t kTF32_ROWS{kTF32_WG * 64};
constexpr int32_t kTF32_KEYS{64};

//! x = hi + lo, each a TF32 value (see splitTf32), hi written over x in place.
__device__ __forceinline__ void splitInPlace(float* hiAt, float* loAt)
{
    uint32_t hi;
    uint32_t lo;
    splitTf32(*hiAt, hi, lo);
    *hiAt = __uint_as_float(hi);
    *loAt = __uint_as_float(lo);
}

__device__ __forceinline__ void splitInPlace4(float* hiAt, float* loAt)
{
    float4 const x = *reinterpret_cast<float4 const*>(hiAt);
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
//! the same chunks (this thread's) into hi (in place) and lo (at lo, the same layout) instead.
//! A warp takes 16 rows (row group warp % kRG) x 2 chunks (pair warp / kRG + i 8 / kRG): 32-byte
//! pieces of global rows, 2 x 256 contiguous bytes of shared memory; each thread's offsets are a
//! base plus compile-time steps (few live registers).
template <int32_t kD, int32_t kRows, bool kSPLIT>
__device__ __forceinline__ void chunkMajorF32(
    float* shared, float* lo, float const* global, int64_t row0, int64_t rows, int32_t cols)
{
    constexpr int32_t kPAIRS = kD / 8;
    constexpr int32_t kRG = kRows / 16;
    constexpr int32_t kSTEP = (kTF32_THREADS / 32) / kRG; // pairs taken at once
    static_assert(kD % 8 == 0 && kRows % 16 == 0 && (kTF32_THREADS / 32) % kRG == 0, "whole units");
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
            splitInPlace4(shared + at, lo + at);
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
//! `keys` and `cols`. Warp w takes chunks w and w + 8, 8 value rows at a time: four 32-byte
//! pieces of global rows, 32 consecutive words of shared memory. kSPLIT: split this thread's
//! elements instead.
template <int32_t kD, int32_t kN, bool kSPLIT>
__device__ __forceinline__ void transposedF32(
    float* shared, float* lo, float const* global, int64_t key0, int64_t keys, int32_t cols)
{
    static_assert(kN / 4 == 2 * (kTF32_THREADS / 32) && kD % 8 == 0, "two chunks per warp");
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const position = lane / 8;
    int32_t const at0 = (warp * kD + lane % 8) * 4 + position;
    int64_t const keyOf0 = key0 + (warp / 2) * 8 + 2 * position + warp % 2;
#pragma unroll
    for (int32_t c2 = 0; c2 < 2; ++c2)
    {
#pragma unroll
        for (int32_t db = 0; db < kD / 8; ++db)
        {
            int32_t const at = at0 + c2 * 8 * kD * 4 + db * 32;
            if constexpr (kSPLIT)
            {
                splitInPlace(shared + at, lo + at);
            }
            else
            {
                int64_t const key = keyOf0 + 32 * c2;
                int32_t const d = db * 8 + lane % 8;
                bool const valid = key < keys && d < cols;
                copyAsync4(shared + at, valid ? global + key * cols + d : global, valid);
            }
        }
    }
}

//! kPLAIN: no mask and no softcap (compiled without that per-score code).
template <int32_t kD, bool kPLAIN, int32_t kV>
__global__ void __launch_bounds__(kTF32_THREADS, 1) hopperTf32Kernel(float const* __restrict__ q,
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
    constexpr int32_t kN = kTF32_KEYS;
    constexpr int32_t kRows = kTF32_ROWS;
    constexpr int32_t kTILE = kN * kD; // floats of one K or V tile
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw); // hi
    float* const sQlo = sQ + kRows * kD;
    float* const sK = sQlo + kRows * kD;  // hi, two stages
    float* const sKlo = sK + 2 * kTILE;   // two stages
    float* const sV = sKlo + 2 * kTILE;   // Vᵀ hi, two stages
    float* const sVlo = sV + 2 * kTILE;   // two stages

    BlockSetup<float> const block(q, k, v, out, mask, shape, params, kRows, qTiles);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);

    auto const loadK = [&](int32_t j) {
        chunkMajorF32<kD, kN, false>(sK + (j % 2) * kTILE, nullptr, block.kBase, static_cast<int64_t>(j) * kN,
            shape.seqK, headDim);
    };
    auto const splitK = [&](int32_t j) {
        chunkMajorF32<kD, kN, true>(sK + (j % 2) * kTILE, sKlo + (j % 2) * kTILE, nullptr, 0, 0, 0);
    };
    auto const loadV = [&](int32_t j) {
        transposedF32<kD, kN, false>(sV + (j % 2) * kTILE, nullptr, block.vBase, static_cast<int64_t>(j) * kN,
            shape.seqK, valueDim);
    };
    auto const splitV = [&](int32_t j) {
        transposedF32<kD, kN, true>(sV + (j % 2) * kTILE, sVlo + (j % 2) * kTILE, nullptr, 0, 0, 0);
    };

    // Q, K_0, V_0 and K_1, each split by the thread that loaded it.
    chunkMajorF32<kD, kRows, false>(sQ, nullptr, block.qBase, block.q0, shape.seqQ, headDim);
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
    chunkMajorF32<kD, kRows, true>(sQ, sQlo, nullptr, 0, 0, 0);
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

    // Variants (experiment): kV 0: S in one accumulator, P V_j in one, overlapped; 1: S in 2,
    // P V_j in two halves one after the other, overlapped; 2: S in 4, P V_j in 2, not
    // overlapped; 3: S in 2, P V_j in 2, overlapped.
    constexpr bool kOVERLAP = kV != 2;
    constexpr int32_t kNS = kV == 0 ? 1 : (kV == 2 ? 4 : 2);
    constexpr int32_t kNP = kV >= 2 ? 2 : 1;
    constexpr int32_t kSTEPS = kD / 8;
    constexpr int32_t kPV_STEPS = kN / 8;

    // S = Q K_jᵀ (issued and committed, not waited for) into kNS accumulators: the first takes the
    // lo·hi and hi·lo products of every k8 step, then each takes the hi·hi products of its share
    // of the steps. The tensor core truncates as it accumulates: each truncation costs at most an
    // ulp of the running sum, so the large hi·hi products go last and into several sums.
    // K (B, K-major, N = keys): LBO = kN rows of 16 bytes, SBO = 8 rows.
    auto const issueScores = [&](float (&acc)[kNS][kN / 8][4], int32_t j) {
        uint32_t const stage = static_cast<uint32_t>((j % 2) * kTILE * 4);
        uint64_t const kHiDesc = descriptor(kHiAddress + stage, kN * 16, 128);
        uint64_t const kLoDesc = descriptor(kLoAddress + stage, kN * 16, 128);
#pragma unroll
        for (int32_t g = 0; g < kNS; ++g)
        {
            fenceOperands(acc[g]);
        }
        wgmmaFence();
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
            int32_t const g = kk * kNS / kSTEPS;
            bool const first = g > 0 && (kk == 0 || (kk - 1) * kNS / kSTEPS != g);
            uint64_t const qStep = static_cast<uint64_t>(2 * kk * kRows);
            uint64_t const kStep = static_cast<uint64_t>(2 * kk * kN);
            hp::Wgmma<float, kN>::ss(acc[g], qHiDesc + qStep, kHiDesc + kStep, !first);
        }
        wgmmaCommit();
    };
    // The sum of the kNS accumulators in float32, into acc[0].
    auto const combineScores = [&](float (&acc)[kNS][kN / 8][4]) {
#pragma unroll
        for (int32_t g = 1; g < kNS; ++g)
        {
#pragma unroll
            for (int32_t n = 0; n < kN / 8; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    acc[0][n][e] += acc[g][n][e];
                }
            }
        }
    };
    // T = P V_j over the key steps [kB, kE) (8 keys each) into kNP zeroed accumulators, the same
    // way: lo terms first into the first, then the hi·hi products shared out. Vᵀ (B, K-major,
    // N = value dim): LBO = the next 4 keys (kD rows of 16 bytes), SBO = 8 value rows.
    auto const issueValues = [&](float (&t)[kNP][kD / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4],
                                 int32_t j, int32_t const kB, int32_t const kE) {
        uint32_t const stage = static_cast<uint32_t>((j % 2) * kTILE * 4);
        uint64_t const vHiDesc = descriptor(vHiAddress + stage, kD * 16, 128);
        uint64_t const vLoDesc = descriptor(vLoAddress + stage, kD * 16, 128);
#pragma unroll
        for (int32_t g = 0; g < kNP; ++g)
        {
            fenceOperands(t[g]);
        }
        fenceOperands(pHi);
        fenceOperands(pLo);
        wgmmaFence();
#pragma unroll
        for (int32_t kk = kB; kk < kE; ++kk)
        {
            uint64_t const vStep = static_cast<uint64_t>(2 * kk * kD);
            hp::Wgmma<float, kD>::rs(t[0], pLo[kk], vHiDesc + vStep, kk > kB);
            hp::Wgmma<float, kD>::rs(t[0], pHi[kk], vLoDesc + vStep, true);
        }
#pragma unroll
        for (int32_t kk = kB; kk < kE; ++kk)
        {
            int32_t const g = (kk - kB) * kNP / (kE - kB);
            bool const first = g > 0 && (kk == kB || (kk - 1 - kB) * kNP / (kE - kB) != g);
            uint64_t const vStep = static_cast<uint64_t>(2 * kk * kD);
            hp::Wgmma<float, kD>::rs(t[g], pHi[kk], vHiDesc + vStep, !first);
        }
        wgmmaCommit();
    };
    // o += the kNP accumulators (then times alpha when given).
    auto const addValues = [&](float (&t)[kNP][kD / 8][4]) {
#pragma unroll
        for (int32_t g = 0; g < kNP; ++g)
        {
#pragma unroll
            for (int32_t n = 0; n < kD / 8; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    o[n][e] += t[g][n][e];
                }
            }
        }
    };
    auto const softmaxOf = [&](float (&s)[kN / 8][4], float (&alpha)[2], int32_t j) {
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        softmax.template update<false>(s, alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape, params,
            checkEach);
    };
    auto const splitP = [&](float const (&s)[kN / 8][4], uint32_t (&pHi)[kN / 8][4], uint32_t (&pLo)[kN / 8][4]) {
#pragma unroll
        for (int32_t kk = 0; kk < kN / 8; ++kk)
        {
            probabilityFragment(s[kk], pHi[kk], pLo[kk]);
        }
    };
    auto const fenceValues = [&](float (&t)[kNP][kD / 8][4]) {
#pragma unroll
        for (int32_t g = 0; g < kNP; ++g)
        {
            fenceOperands(t[g]);
        }
    };

    float s[kNS][kN / 8][4];
    float t[kNP][kD / 8][4];
    float alpha[2];
    uint32_t pHi[kN / 8][4];
    uint32_t pLo[kN / 8][4];
    if (keyTiles > 0)
    {
        issueScores(s, 0);
        wgmmaWait<0>();
#pragma unroll
        for (int32_t g = 0; g < kNS; ++g)
        {
            fenceOperands(s[g]);
        }
        combineScores(s);
        softmaxOf(s[0], alpha, 0);
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
        if constexpr (kOVERLAP)
        {
            issueScores(s, j + 1);
            if constexpr (kV == 1)
            {
                issueValues(t, pHi, pLo, j, 0, kPV_STEPS / 2);
            }
            else
            {
                issueValues(t, pHi, pLo, j, 0, kPV_STEPS);
            }
            wgmmaWait<1>();
#pragma unroll
            for (int32_t g = 0; g < kNS; ++g)
            {
                fenceOperands(s[g]);
            }
            combineScores(s);
            softmaxOf(s[0], alpha, j + 1);
            if constexpr (kV == 1)
            {
                wgmmaWait<0>();
                fenceValues(t);
                addValues(t);
                issueValues(t, pHi, pLo, j, kPV_STEPS / 2, kPV_STEPS);
            }
            waitAsync<0>();
            if (j + 2 < keyTiles)
            {
                splitK(j + 2);
            }
            splitV(j + 1);
            wgmmaWait<0>();
            fenceValues(t);
            fenceOperands(pHi);
            fenceOperands(pLo);
            addValues(t);
            rescale(o, alpha);
            splitP(s[0], pHi, pLo);
        }
        else
        {
            issueValues(t, pHi, pLo, j, 0, kPV_STEPS);
            waitAsync<0>();
            if (j + 2 < keyTiles)
            {
                splitK(j + 2);
            }
            splitV(j + 1);
            wgmmaWait<0>();
            fenceValues(t);
            fenceOperands(pHi);
            fenceOperands(pLo);
            addValues(t);
            issueScores(s, j + 1);
            wgmmaWait<0>();
#pragma unroll
            for (int32_t g = 0; g < kNS; ++g)
            {
                fenceOperands(s[g]);
            }
            combineScores(s);
            softmaxOf(s[0], alpha, j + 1);
            rescale(o, alpha);
            splitP(s[0], pHi, pLo);
        }
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
        if constexpr (kV == 1)
        {
            // the last tile's second half only when it holds a key (SDXL's 77 keys: 64 + 13)
            issueValues(t, pHi, pLo, keyTiles - 1, 0, kPV_STEPS / 2);
            wgmmaWait<0>();
            fenceValues(t);
            addValues(t);
            if (static_cast<int64_t>(keyTiles - 1) * kN + kN / 2 < block.keyEnd)
            {
                issueValues(t, pHi, pLo, keyTiles - 1, kPV_STEPS / 2, kPV_STEPS);
                wgmmaWait<0>();
                fenceValues(t);
                addValues(t);
            }
        }
        else
        {
            issueValues(t, pHi, pLo, keyTiles - 1, 0, kPV_STEPS);
            wgmmaWait<0>();
            fenceValues(t);
            addValues(t);
        }
    }
    waitAsync<0>();
    softmax.finish();
    storeOutput<float, kD>(o, softmax, block.outBase, warpRow0 + lane / 4, shape, params);
#endif
}

//! Experiment: GRAPHFIX_TF32_VARIANT picks the kernel variant (kV).
inline int32_t tf32Variant()
{
    char const* const env = std::getenv("GRAPHFIX_TF32_VARIANT");
    return env == nullptr ? 1 : std::atoi(env);
}

template <int32_t kD, bool kPLAIN, typename F>
cudaError_t withTf32Variant(F&& f)
{
    switch (tf32Variant())
    {
    case 0: return f(hopperTf32Kernel<kD, kPLAIN, 0>);
    case 2: return f(hopperTf32Kernel<kD, kPLAIN, 2>);
    case 3: return f(hopperTf32Kernel<kD, kPLAIN, 3>);
    default: return f(hopperTf32Kernel<kD, kPLAIN, 1>);
    }
}

template <int32_t kD, typename F>
cudaError_t withTf32Plain(bool plain, F&& f)
{
    return plain ? withTf32Variant<kD, true>(f) : withTf32Variant<kD, false>(f);
}

//! Calls f with the kernel for the plan, or returns cudaErrorInvalidConfiguration.
template <typename F>
cudaError_t withHopperTf32Kernel(HopperPlan const& plan, bool plain, F&& f)
{
    if (plan.keys != kTF32_KEYS || plan.blockRows != kTF32_ROWS)
    {
        return cudaErrorInvalidConfiguration;
    }
    switch (plan.paddedDim)
    {
    case 32: return withTf32Plain<32>(plain, f);
    case 64: return withTf32Plain<64>(plain, f);
    case 72: return withTf32Plain<72>(plain, f);
    default: return cudaErrorInvalidConfiguration;
    }
}

} // namespace

cudaError_t prepareHopperTf32Attention(HopperPlan const& plan) noexcept
{
    auto const prepare = [&](auto kernel) {
        cudaFuncAttributes attributes{};
        cudaError_t const status = cudaFuncGetAttributes(&attributes, kernel);
        if (status != cudaSuccess)
        {
            return status;
        }
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.sharedBytes);
    };
    cudaError_t const status = withHopperTf32Kernel(plan, true, prepare);
    return status != cudaSuccess ? status : withHopperTf32Kernel(plan, false, prepare);
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
    return withHopperTf32Kernel(plan, plain, [&](auto kernel) {
        kernel<<<static_cast<uint32_t>(grid.blocks), kTF32_THREADS, static_cast<size_t>(plan.sharedBytes), stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(grid.qTiles));
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix
