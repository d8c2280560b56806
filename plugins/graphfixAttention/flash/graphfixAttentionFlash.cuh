/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The flash kernels (graphfixAttentionFlash.h), included by one translation unit per element type
 * (graphfixAttentionFlash{Float,Half,BFloat16}.cu) so that they compile in parallel.
 * One block of 4 warps per [64 query rows, (batch, head)]; each warp owns 16 rows (kMT 16-row
 * tiles, one: see rowTilesFor) and keeps its scores, softmax statistics and output accumulator
 * in registers (the mma accumulator layout: thread (g = lane / 4, t = lane % 4) holds rows g and
 * g + 8, columns 2t and 2t + 1 of each 8-column tile). Per key tile of 64:
 *
 *   issue V_j (cp.async) | wait K_j | S = Q K_jᵀ | issue K_j+1 | softmax | wait V_j | O += P V_j
 *
 * so each load overlaps the other product. Shared-memory rows are padded (8 halves; float32:
 * kROW_QK_F32, kROW_V_F32) so that ldmatrix and the float32 fragment loads are free of bank
 * conflicts.
 *
 * float16/bfloat16: Q stays in registers as A fragments (ldmatrix) up to head dim 128 and is read
 * from shared memory per key tile above (kQ_IN_REGISTERS: at 256 the output accumulator alone
 * takes 128 registers a thread), K and V are read with ldmatrix (V transposed); the probabilities of two neighbouring 8-key tiles, as 16-bit pairs
 * (float16: rounded once; bfloat16: hi + lo, see kSPLIT_P), are exactly the A fragment of a
 * 16-key step of P·V. float32 (flashTf32x3Kernel): fragments are read with plain shared loads
 * (Q and K 16 bytes at a time, the head dimension taken in a permuted order) and split into TF32
 * hi + lo in 4 instructions (3 products); for P·V the 8 keys of a step are taken in the order
 * 0,2,4,6,1,3,5,7 (a permutation of the summation index, the same for P and V), which makes the
 * scores' accumulator layout the TF32 A fragment without shuffles; 8-key tiles past the end of K
 * or the causal diagonal are skipped; register-capped to 3 blocks per SM up to head dim 80; above
 * head dim 128 two warps per 16 rows, each taking half of every key tile (kKEY_HALVES_F32).
 * Two other float32 designs were built, measured on the H200 and not kept: K and V split once per
 * tile by the block (slower: its hi/lo tiles leave room for two blocks per SM, not three) and two
 * 8-key P·V steps summed in one accumulator (faster on Llama, up to 1.2x the error);
 * notes/attention_plugin.md, "float32 mma.sync kernel: 3xTF32", has the figures.
 */
#ifndef GRAPHFIX_ATTENTION_FLASH_CUH
#define GRAPHFIX_ATTENTION_FLASH_CUH

#include "graphfixAttentionFlash.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <type_traits>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kWARPS{4};
constexpr int32_t kTHREADS{kWARPS * 32};
constexpr int32_t kBLOCK_KEYS{64};
constexpr int32_t kKEY_TILES{kBLOCK_KEYS / 8};
constexpr uint32_t kFULL_MASK{0xffffffffU};
constexpr float kLOG2E{1.4426950408889634F};
constexpr float kNEGATIVE_INFINITY{-INFINITY};
constexpr int32_t kPADDED_DIMS[]{32, 64, 80, 96, 128, 160, 192, 256};
constexpr int64_t kMAX_GRID_BLOCKS{(int64_t{1} << 31) - 1};

//! Query rows per block: each warp owns kMT tiles of 16 rows.
template <int32_t kMT>
constexpr int32_t kBLOCK_ROWS = 16 * kMT * kWARPS;

//! kMT for a padded head dimension. Two tiles per warp (each K and V fragment read from shared
//! memory then serves 32 rows) measured slower on the H200 on most benchmark shapes (SDXL cross,
//! SigLIP, BERT: 200+ registers, fewer blocks per SM), 3% faster on SDXL self only: one.
constexpr int32_t rowTilesFor(int32_t /*elementBytes*/, int32_t /*paddedDim*/)
{
    return 1;
}

//! Whether the 16-bit kernel keeps Q's A fragments in registers for the whole key loop (kD / 4
//! registers a thread) or reads them from shared memory for each key tile (wider heads, where
//! they would push the kernel past 255 registers next to the kD / 2 of the output accumulator).
template <int32_t kD>
constexpr bool kQ_IN_REGISTERS = kD <= 128;

//! Shared-memory row length in elements: padded so that 8 rows hit 8 different 16-byte bank groups
//! (16-bit) or fragment loads hit 32 different banks (float32).
template <typename T, int32_t kD>
constexpr int32_t kROW = std::is_same_v<T, float> ? kD + 4 : kD + 8;

template <typename T, int32_t kD>
constexpr int32_t sharedBytesFor()
{
    return (kBLOCK_ROWS<rowTilesFor(static_cast<int32_t>(sizeof(T)), kD)> + 2 * kBLOCK_KEYS) * kROW<T, kD> * static_cast<int32_t>(sizeof(T));
}

// ---- PTX wrappers ------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t sharedAddress(void const* pointer)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

//! 16 bytes global -> shared, asynchronously; zeros when !valid (src must still be a valid address).
__device__ __forceinline__ void copyAsync16(void* shared, void const* global, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(shared)), "l"(global),
        "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void commitAsync()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

//! Waits until at most N of this thread's committed groups are still in flight.
template <int32_t N>
__device__ __forceinline__ void waitAsync()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void loadMatrixX4(uint32_t (&r)[4], void const* shared)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(shared)));
}

__device__ __forceinline__ void loadMatrixX4Transposed(uint32_t (&r)[4], void const* shared)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(shared)));
}

//! c += a b, m16n8k16, 16-bit inputs, float32 accumulator.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (std::is_same_v<T, __half>)
    {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    else
    {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

//! c += a b, m16n8k8, TF32 inputs (bit patterns), float32 accumulator.
__device__ __forceinline__ void mma1688(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

//! 2^x by the SFU (relative error about 2^-22; results below 2^-126 flush to 0, -inf gives 0).
__device__ __forceinline__ float exp2Approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

//! x = hi + lo in TF32, each rounded to nearest (ties away from zero), as cvt.rna.tf32.f32 would
//! give them but in 4 instructions instead of 9 (ptxas emulates cvt.rna with a finiteness test):
//! hi = x + half a TF32 ulp, truncated (exact then, so x - hi is exact in float32); lo gets half
//! an ulp added and is left untruncated, since the tensor core reads a TF32 operand's top 19 bits
//! and ignores the low 13 (as CUTLASS's round_half_ulp_truncate relies on). NaN stays NaN (in lo).
__device__ __forceinline__ void splitTf32(float x, uint32_t& hi, uint32_t& lo)
{
    hi = (__float_as_uint(x) + 0x1000U) & 0xffffe000U;
    lo = __float_as_uint(x - __uint_as_float(hi)) + 0x1000U;
}

//! Whether the 16-bit kernel takes the probabilities into P·V as two terms (p = hi + lo, twice
//! the P·V tensor work) instead of rounding them once. float16: rounded once, as cuDNN and
//! FlashAttention do (11 bits; the H200 benchmark's errors equal cuDNN SDPA's on every shape, and
//! P·V costs half). bfloat16: split, since rounding once to 8 bits measured up to 2% more error
//! than cuDNN SDPA (BERT: 1.97e-3 vs 1.93e-3) where the split stays at or below it.
template <typename T>
constexpr bool kSPLIT_P = std::is_same_v<T, __nv_bfloat16>;

//! Two probabilities as the 16-bit pair P·V takes (a in the low half), and with kSPLIT_P<T> the
//! pair of what rounding left over (lo is untouched otherwise).
template <typename T>
__device__ __forceinline__ void probabilityPair(float a, float b, uint32_t& hi, uint32_t& lo)
{
    if constexpr (std::is_same_v<T, __half>)
    {
        __half2 const h = __floats2half2_rn(a, b);
        hi = *reinterpret_cast<uint32_t const*>(&h);
        if constexpr (kSPLIT_P<T>)
        {
            float2 const f = __half22float2(h);
            __half2 const l = __floats2half2_rn(a - f.x, b - f.y);
            lo = *reinterpret_cast<uint32_t const*>(&l);
        }
    }
    else
    {
        __nv_bfloat162 const h = __floats2bfloat162_rn(a, b);
        hi = *reinterpret_cast<uint32_t const*>(&h);
        if constexpr (kSPLIT_P<T>)
        {
            float2 const f = __bfloat1622float2(h);
            __nv_bfloat162 const l = __floats2bfloat162_rn(a - f.x, b - f.y);
            lo = *reinterpret_cast<uint32_t const*>(&l);
        }
    }
}

template <typename T>
__device__ __forceinline__ void storePair(T* out, float a, float b)
{
    if constexpr (std::is_same_v<T, float>)
    {
        *reinterpret_cast<float2*>(out) = make_float2(a, b);
    }
    else if constexpr (std::is_same_v<T, __half>)
    {
        *reinterpret_cast<__half2*>(out) = __floats2half2_rn(a, b);
    }
    else
    {
        *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
    }
}

// ---- the parts both kernels share --------------------------------------------------------------

//! Where a block works and what it reads.
template <typename T>
struct BlockSetup
{
    int64_t q0;       //!< first query row of the block
    int64_t keyEnd;   //!< keys past this are never allowed (causal) or absent
    T const* qBase;   //!< this (batch, head)'s Q rows
    T const* kBase;   //!< its K rows
    T const* vBase;   //!< its V rows
    T* outBase;       //!< its output rows
    int64_t maskBase; //!< mask offset of (batch, head)

    //! Block `id` of `blocks` (one per query tile of each (batch, head)): its query tile and
    //! (batch, head). Heavy causal tiles (late rows) first, so the last wave is made of light
    //! ones; acrossHeads: the order runs heavy-first over all (batch, head)s (block i is tile
    //! i / heads of (batch, head) i % heads, renumbered to the order within each), not within each.
    __device__ static void tileOf(
        uint32_t id, uint32_t blocks, int32_t qTiles, bool acrossHeads, int64_t& tile, int64_t& bh)
    {
        if (acrossHeads)
        {
            uint32_t const heads = blocks / static_cast<uint32_t>(qTiles);
            id = (id % heads) * static_cast<uint32_t>(qTiles) + id / heads;
        }
        tile = qTiles - 1 - static_cast<int64_t>(id % static_cast<uint32_t>(qTiles));
        bh = id / static_cast<uint32_t>(qTiles);
    }

    //! The block of this thread's (tileOf(blockIdx.x, gridDim.x, ...)).
    __device__ BlockSetup(T const* q, T const* k, T const* v, T* out, AttentionMaskView const& mask,
        AttentionShape const& shape, AttentionParams const& params, int32_t blockRows, int32_t qTiles,
        bool acrossHeads = false)
        : BlockSetup(q, k, v, out, mask, shape, params, blockRows, qTiles, acrossHeads, blockIdx.x, gridDim.x)
    {
    }

    //! Block `id` of `blocks`.
    __device__ BlockSetup(T const* q, T const* k, T const* v, T* out, AttentionMaskView const& mask,
        AttentionShape const& shape, AttentionParams const& params, int32_t blockRows, int32_t qTiles,
        bool acrossHeads, uint32_t id, uint32_t blocks)
    {
        int64_t tile = 0;
        int64_t bh = 0;
        tileOf(id, blocks, qTiles, acrossHeads, tile, bh);
        int64_t const b = bh / shape.headsQ;
        int64_t const h = bh - b * shape.headsQ;
        int64_t const hkv = h / (shape.headsQ / shape.headsKV);
        q0 = tile * blockRows;
        keyEnd = params.causal && q0 + blockRows < shape.seqK ? q0 + blockRows : shape.seqK;
        qBase = q + bh * shape.seqQ * shape.headDim;
        kBase = k + (b * shape.headsKV + hkv) * shape.seqK * shape.headDim;
        vBase = v + (b * shape.headsKV + hkv) * shape.seqK * shape.valueDim;
        outBase = out + bh * shape.seqQ * shape.valueDim;
        maskBase = b * mask.stride[0] + h * mask.stride[1];
    }
};

//! Copies rows [row0, row0 + kRows) x [0, cols) of a [rows, cols] matrix into shared memory with
//! row length kRow (elements), zeros for rows past `rows`; columns cols..kD-1 are left alone.
template <typename T, int32_t kD, int32_t kRow, int32_t kRows, int32_t kThreads = kTHREADS>
__device__ __forceinline__ void loadTileAsync(T* shared, T const* global, int64_t row0, int64_t rows, int32_t cols)
{
    constexpr int32_t kPER_CHUNK = 16 / static_cast<int32_t>(sizeof(T));
    constexpr int32_t kCHUNKS = kD / kPER_CHUNK;
#pragma unroll 4
    for (int32_t c = static_cast<int32_t>(threadIdx.x); c < kRows * kCHUNKS; c += kThreads)
    {
        int32_t const r = c / kCHUNKS;
        int32_t const col = (c - r * kCHUNKS) * kPER_CHUNK;
        if (col < cols)
        {
            int64_t const row = row0 + r;
            bool const valid = row < rows;
            copyAsync16(shared + r * kRow + col, valid ? global + row * cols + col : global, valid);
        }
    }
}

//! Zeros columns [from, kD) of `rows` shared rows (the head-dimension padding).
template <typename T, int32_t kD, int32_t kRow, int32_t kThreads = kTHREADS>
__device__ __forceinline__ void zeroPadding(T* shared, int32_t rows, int32_t from)
{
    int32_t const width = kD - from;
    for (int32_t e = static_cast<int32_t>(threadIdx.x); e < rows * width; e += kThreads)
    {
        int32_t const r = e / width;
        shared[r * kRow + from + (e - r * width)] = T{};
    }
}

__device__ __forceinline__ float maskElement(uint8_t x)
{
    return x != 0 ? 1.F : 0.F;
}

__device__ __forceinline__ float maskElement(float x)
{
    return x;
}

__device__ __forceinline__ float maskElement(__half x)
{
    return __half2float(x);
}

__device__ __forceinline__ float maskElement(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

//! Applies a mask of element type M to a tile of scaled scores (rows at mask offsets rowBase,
//! keys k0 + 8n + 2t + {0, 1}); keys past seqK are left for the caller to block.
template <typename M, int32_t kN>
__device__ __forceinline__ void applyMaskTile(float (&s)[kN][4], AttentionMaskView const& mask,
    int64_t const (&rowBase)[2], int64_t k0, int32_t t, AttentionShape const& shape, AttentionParams const& params)
{
    M const* const data = static_cast<M const*>(mask.data);
    bool const isBool = mask.kind == AttentionMaskKind::kBool;
#pragma unroll
    for (int32_t n = 0; n < kN; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            int64_t const kj = k0 + n * 8 + 2 * t + (e % 2);
            if (kj < shape.seqK)
            {
                float const m = maskElement(data[rowBase[e / 2] + kj * mask.stride[3]]);
                s[n][e] = isBool ? (m != 0.F ? s[n][e] : params.maskFill) : s[n][e] + m;
            }
        }
    }
}

//! One 16-row tile's online softmax. update() turns a tile of raw scores (Q·Kᵀ accumulators) into
//! unnormalised probabilities, updating the running maximum and this thread's part of the running
//! sum, and gives the factor by which the output rows must be rescaled. The thread's rows are r0
//! and r0 + 8 (query indices), its keys k0 + 8n + 2t + {0, 1}.
struct OnlineSoftmax
{
    float rowMax[2];
    float rowSum[2]; //!< this thread's columns only; reduced at the end

    __device__ OnlineSoftmax()
        : rowMax{kNEGATIVE_INFINITY, kNEGATIVE_INFINITY}
        , rowSum{0.F, 0.F}
    {
    }

    //! kFOLD: on the common tile, fold the scale into the exponent's FFMA, exp2(s·(scale·log2e) −
    //! max·log2e) as FlashAttention does, one instruction per score fewer than scaling first; the
    //! exponent is then rounded relative to s·scale rather than to s·scale − max, so the float32
    //! kernel keeps the separate steps.
    template <bool kFOLD, int32_t kN>
    __device__ __forceinline__ void update(float (&s)[kN][4], float (&alpha)[2], int64_t r0, int64_t k0,
        AttentionMaskView const& mask, int64_t maskBase, AttentionShape const& shape, AttentionParams const& params,
        bool checkEach)
    {
        int32_t const t = static_cast<int32_t>(threadIdx.x % 4);
        bool const masked = mask.kind != AttentionMaskKind::kNone;
        // (with kFOLD a scale <= 0 takes the general path, so that the common one folds at compile
        // time: a run-time choice there compiled to a multiply and a select per score)
        bool const common = !masked && !checkEach && params.softcap == 0.F && (!kFOLD || params.scale > 0.F);
        bool const folded = kFOLD && common;
        float tileMax[2]{kNEGATIVE_INFINITY, kNEGATIVE_INFINITY};
        if (common)
        {
            // every key present and allowed; one basic block for the scheduler
#pragma unroll
            for (int32_t n = 0; n < kN; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    if constexpr (!kFOLD)
                    {
                        s[n][e] *= params.scale;
                    }
                    tileMax[e / 2] = fmaxf(tileMax[e / 2], s[n][e]);
                }
            }
            if constexpr (kFOLD)
            {
                // scale > 0 and rounding are monotonic: max(s)·scale == max(s·scale) exactly
                tileMax[0] *= params.scale;
                tileMax[1] *= params.scale;
            }
        }
        else
        {
            // Each stage a uniform branch around an unrolled loop (not a branch per element).
#pragma unroll
            for (int32_t n = 0; n < kN; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    s[n][e] *= params.scale;
                    if (params.softcap > 0.F)
                    {
                        s[n][e] = params.softcap * tanhf(s[n][e] / params.softcap);
                    }
                }
            }
            if (masked)
            {
                // rows past seqQ read the last row's mask (their output is never written)
                int64_t const lastRow = shape.seqQ - 1;
                int64_t const rowBase[2]{maskBase + (r0 < lastRow ? r0 : lastRow) * mask.stride[2],
                    maskBase + (r0 + 8 < lastRow ? r0 + 8 : lastRow) * mask.stride[2]};
                switch (mask.type)
                {
                case AttentionMaskType::kBool: applyMaskTile<uint8_t>(s, mask, rowBase, k0, t, shape, params); break;
                case AttentionMaskType::kFloat: applyMaskTile<float>(s, mask, rowBase, k0, t, shape, params); break;
                case AttentionMaskType::kHalf: applyMaskTile<__half>(s, mask, rowBase, k0, t, shape, params); break;
                case AttentionMaskType::kBFloat16:
                    applyMaskTile<__nv_bfloat16>(s, mask, rowBase, k0, t, shape, params);
                    break;
                }
            }
            if (checkEach)
            {
#pragma unroll
                for (int32_t n = 0; n < kN; ++n)
                {
#pragma unroll
                    for (int32_t e = 0; e < 4; ++e)
                    {
                        int64_t const qi = r0 + (e / 2) * 8;
                        int64_t const kj = k0 + n * 8 + 2 * t + (e % 2);
                        if (kj >= shape.seqK || (params.causal && kj > qi))
                        {
                            s[n][e] = kNEGATIVE_INFINITY;
                        }
                    }
                }
            }
#pragma unroll
            for (int32_t n = 0; n < kN; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    tileMax[e / 2] = fmaxf(tileMax[e / 2], s[n][e]);
                }
            }
        }
#pragma unroll
        for (int32_t i = 0; i < 2; ++i)
        {
            tileMax[i] = fmaxf(tileMax[i], __shfl_xor_sync(kFULL_MASK, tileMax[i], 1));
            tileMax[i] = fmaxf(tileMax[i], __shfl_xor_sync(kFULL_MASK, tileMax[i], 2));
            float const newMax = fmaxf(rowMax[i], tileMax[i]);
            // A row with no allowed key so far keeps probabilities exp(-inf - 0) = 0 and sum 0.
            alpha[i] = newMax == kNEGATIVE_INFINITY ? 1.F : exp2Approx((rowMax[i] - newMax) * kLOG2E);
            rowMax[i] = newMax;
            rowSum[i] *= alpha[i];
        }
        float const reference[2]{rowMax[0] == kNEGATIVE_INFINITY ? 0.F : rowMax[0],
            rowMax[1] == kNEGATIVE_INFINITY ? 0.F : rowMax[1]};
        if (folded)
        {
            float const factor = params.scale * kLOG2E;
            float const offset[2]{-reference[0] * kLOG2E, -reference[1] * kLOG2E};
#pragma unroll
            for (int32_t n = 0; n < kN; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    s[n][e] = exp2Approx(fmaf(s[n][e], factor, offset[e / 2]));
                    rowSum[e / 2] += s[n][e];
                }
            }
        }
        else
        {
#pragma unroll
            for (int32_t n = 0; n < kN; ++n)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    s[n][e] = exp2Approx((s[n][e] - reference[e / 2]) * kLOG2E);
                    rowSum[e / 2] += s[n][e];
                }
            }
        }
    }

    //! The full row sums (over the 4 threads of a row).
    __device__ __forceinline__ void finish()
    {
#pragma unroll
        for (int32_t i = 0; i < 2; ++i)
        {
            rowSum[i] += __shfl_xor_sync(kFULL_MASK, rowSum[i], 1);
            rowSum[i] += __shfl_xor_sync(kFULL_MASK, rowSum[i], 2);
        }
    }
};

//! o (16 rows) *= alpha, per row.
template <int32_t kN>
__device__ __forceinline__ void rescale(float (&o)[kN][4], float const (&alpha)[2])
{
#pragma unroll
    for (int32_t n = 0; n < kN; ++n)
    {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

//! Writes 16 output rows: o / sum, NaN (0 with nanToZero) where no key was allowed.
template <typename T, int32_t kD>
__device__ __forceinline__ void storeOutput(float const (&o)[kD / 8][4], OnlineSoftmax const& softmax, T* outBase,
    int64_t r0, AttentionShape const& shape, AttentionParams const& params)
{
    int32_t const t = static_cast<int32_t>(threadIdx.x % 4);
    float const blocked = params.nanToZero ? 0.F : CUDART_NAN_F;
#pragma unroll
    for (int32_t i = 0; i < 2; ++i)
    {
        int64_t const row = r0 + 8 * i;
        if (row >= shape.seqQ)
        {
            continue;
        }
        float const sum = softmax.rowSum[i];
        float const inverse = sum > 0.F ? 1.F / sum : 0.F;
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
            int32_t const col = n * 8 + 2 * t;
            if (col < shape.valueDim)
            {
                float const a = sum > 0.F ? o[n][2 * i] * inverse : blocked;
                float const b = sum > 0.F ? o[n][2 * i + 1] * inverse : blocked;
                storePair(outBase + row * shape.valueDim + col, a, b);
            }
        }
    }
}

// ---- float16 / bfloat16 ------------------------------------------------------------------------

//! One block of flashMma16Kernel: query rows block.q0 .. block.q0 + kBLOCK_ROWS<kMT> - 1 of the
//! block's (batch, head), in `shared` (the kernel's dynamic shared memory, sharedBytesFor<T, kD>()
//! bytes, 16-byte aligned). A next call may reuse `shared` only after a block barrier.
template <typename T, int32_t kD, int32_t kMT>
__device__ __forceinline__ void flashMma16Block(BlockSetup<T> const& block, AttentionMaskView const& mask,
    AttentionShape const& shape, AttentionParams const& params, unsigned char* shared)
{
    constexpr int32_t kRow = kROW<T, kD>;
    constexpr int32_t kRows = kBLOCK_ROWS<kMT>;
    T* const sQ = reinterpret_cast<T*>(shared);
    T* const sK = sQ + kRows * kRow;
    T* const sV = sK + kBLOCK_KEYS * kRow;

    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);

    if (headDim < kD)
    {
        zeroPadding<T, kD, kRow>(sQ, kRows + kBLOCK_KEYS, headDim); // sQ and sK are adjacent
    }
    if (valueDim < kD)
    {
        zeroPadding<T, kD, kRow>(sV, kBLOCK_KEYS, valueDim);
    }
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kBLOCK_KEYS - 1) / kBLOCK_KEYS);
    loadTileAsync<T, kD, kRow, kRows>(sQ, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadTileAsync<T, kD, kRow, kBLOCK_KEYS>(sK, block.kBase, 0, shape.seqK, headDim);
    }
    commitAsync();
    waitAsync<0>();
    __syncthreads();

    int32_t const warpRow = warp * 16 * kMT; // first row of the warp within the block
    T const* const qLane = sQ + (warpRow + lane % 16) * kRow + (lane / 16) * 8; // + mt * 16 rows, kk * 16 columns
    uint32_t qFragment[kMT][kQ_IN_REGISTERS<kD> ? kD / 16 : 1][4];
    if constexpr (kQ_IN_REGISTERS<kD>)
    {
#pragma unroll
        for (int32_t mt = 0; mt < kMT; ++mt)
        {
#pragma unroll
            for (int32_t kk = 0; kk < kD / 16; ++kk)
            {
                loadMatrixX4(qFragment[mt][kk], qLane + mt * 16 * kRow + kk * 16);
            }
        }
    }

    float o[kMT][kD / 8][4];
#pragma unroll
    for (int32_t mt = 0; mt < kMT; ++mt)
    {
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.F;
        }
    }
    OnlineSoftmax softmax[kMT];
    int64_t const warpRow0 = block.q0 + warpRow;

    for (int32_t j = 0; j < keyTiles; ++j)
    {
        int64_t const k0 = static_cast<int64_t>(j) * kBLOCK_KEYS;
        loadTileAsync<T, kD, kRow, kBLOCK_KEYS>(sV, block.vBase, k0, shape.seqK, valueDim);
        commitAsync();
        waitAsync<1>(); // K_j
        __syncthreads();

        float s[kMT][kKEY_TILES][4];
#pragma unroll
        for (int32_t mt = 0; mt < kMT; ++mt)
        {
#pragma unroll
            for (int32_t n = 0; n < kKEY_TILES; ++n)
            {
                s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.F;
            }
        }
#pragma unroll
        for (int32_t kk = 0; kk < kD / 16; ++kk)
        {
            if constexpr (!kQ_IN_REGISTERS<kD>)
            {
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    loadMatrixX4(qFragment[mt][0], qLane + mt * 16 * kRow + kk * 16);
                }
            }
#pragma unroll
            for (int32_t nn = 0; nn < kKEY_TILES / 2; ++nn)
            {
                uint32_t b[4];
                loadMatrixX4(b, sK + (nn * 16 + (lane / 16) * 8 + lane % 8) * kRow + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    uint32_t const (&a)[4] = qFragment[mt][kQ_IN_REGISTERS<kD> ? kk : 0];
                    mma16816<T>(s[mt][2 * nn], a, b[0], b[1]);
                    mma16816<T>(s[mt][2 * nn + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads(); // every warp is done with K_j
        if (j + 1 < keyTiles)
        {
            loadTileAsync<T, kD, kRow, kBLOCK_KEYS>(sK, block.kBase, k0 + kBLOCK_KEYS, shape.seqK, headDim);
        }
        commitAsync();

        bool const checkEach = k0 + kBLOCK_KEYS > shape.seqK || (params.causal && k0 + kBLOCK_KEYS - 1 > warpRow0);
#pragma unroll
        for (int32_t mt = 0; mt < kMT; ++mt)
        {
            float alpha[2];
            softmax[mt].template update<true>(
                s[mt], alpha, warpRow0 + mt * 16 + lane / 4, k0, mask, block.maskBase, shape, params, checkEach);
            rescale(o[mt], alpha);
        }

        waitAsync<1>(); // V_j
        __syncthreads();
#pragma unroll
        for (int32_t kk = 0; kk < kKEY_TILES / 2; ++kk)
        {
            // float16: P rounded once; bfloat16: P = hi + lo (see kSPLIT_P)
            uint32_t p[kMT][4];
            uint32_t lo[kMT][4];
#pragma unroll
            for (int32_t mt = 0; mt < kMT; ++mt)
            {
                probabilityPair<T>(s[mt][2 * kk][0], s[mt][2 * kk][1], p[mt][0], lo[mt][0]);
                probabilityPair<T>(s[mt][2 * kk][2], s[mt][2 * kk][3], p[mt][1], lo[mt][1]);
                probabilityPair<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1], p[mt][2], lo[mt][2]);
                probabilityPair<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3], p[mt][3], lo[mt][3]);
            }
#pragma unroll
            for (int32_t nn = 0; nn < kD / 16; ++nn)
            {
                uint32_t b[4];
                loadMatrixX4Transposed(
                    b, sV + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kRow + nn * 16 + (lane / 16) * 8);
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    if constexpr (kSPLIT_P<T>)
                    {
                        mma16816<T>(o[mt][2 * nn], lo[mt], b[0], b[1]);
                        mma16816<T>(o[mt][2 * nn + 1], lo[mt], b[2], b[3]);
                    }
                    mma16816<T>(o[mt][2 * nn], p[mt], b[0], b[1]);
                    mma16816<T>(o[mt][2 * nn + 1], p[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads(); // every warp is done with V_j
    }
    waitAsync<0>();
#pragma unroll
    for (int32_t mt = 0; mt < kMT; ++mt)
    {
        softmax[mt].finish();
        storeOutput<T, kD>(o[mt], softmax[mt], block.outBase, warpRow0 + mt * 16 + lane / 4, shape, params);
    }
}

template <typename T, int32_t kD, int32_t kMT>
__global__ void __launch_bounds__(kTHREADS) flashMma16Kernel(T const* __restrict__ q, T const* __restrict__ k,
    T const* __restrict__ v, AttentionMaskView const mask, T* __restrict__ out, AttentionShape const shape,
    AttentionParams const params, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char sharedRaw[];
    BlockSetup<T> const block(q, k, v, out, mask, shape, params, kBLOCK_ROWS<kMT>, qTiles);
    flashMma16Block<T, kD, kMT>(block, mask, shape, params, sharedRaw);
#endif
}

// ---- float32: 3xTF32 ---------------------------------------------------------------------------

//! Shared-memory row length (floats) of the float32 kernel's Q and K tiles: 16 mod 32, so that
//! the 16-byte row loads of a quarter warp (rows g and g + 1, 64 bytes each) hit all 32 banks once.
template <int32_t kD>
constexpr int32_t kROW_QK_F32 = kD + (48 - kD % 32) % 32;

//! The same for V, read by scalar loads of rows 2t and 2t + 1, columns g: 4 mod 8, conflict-free.
template <int32_t kD>
constexpr int32_t kROW_V_F32 = kD + 4;

template <int32_t kD, int32_t kRowQK = kROW_QK_F32<kD>>
constexpr int32_t sharedBytesF32()
{
    return ((kBLOCK_ROWS<1> + kBLOCK_KEYS) * kRowQK + kBLOCK_KEYS * kROW_V_F32<kD>) * 4;
}

//! Shared memory of the compact float32 layout (Q and K rows of kD + 4 floats, 2-way bank
//! conflicts on their 16-byte loads), for a GPU whose shared memory the usual one exceeds.
constexpr int32_t compactSharedBytesF32(int32_t paddedDim)
{
    return (kBLOCK_ROWS<1> + 2 * kBLOCK_KEYS) * (paddedDim + 4) * 4;
}

//! Whether the float32 kernel inlines both products twice, for full key tiles (one basic block)
//! and for tiles cut by the end of K or the causal diagonal; above head dim 128 only the second
//! (a compare per 8-key tile): with both, ptxas spilled 1720 bytes at head dim 256, with one 36.
template <int32_t kD>
constexpr bool kBOTH_PATHS_F32 = kD <= 128;

//! Blocks per multiprocessor the float32 kernel is register-capped for (3: 168 registers).
template <int32_t kD>
constexpr int32_t kMIN_BLOCKS_F32 = kD <= 80 ? 3 : 1;

//! Warps per 16 query rows of the float32 kernel: above head dim 128 its tiles leave room for one
//! block per SM, and 4 warps there left the tensor cores waiting on latency (Gemma-2-like causal,
//! head dim 256: 0.98 ms, about 40 cycles per mma.sync against 20 at head dim 128 with 8 warps per
//! SM); so two warps share each 16 rows, one taking keys 0-31 of every 64-key tile, the other keys
//! 32-63, each with its own online softmax, merged at the end (mergeKeyHalves).
constexpr int32_t keyHalvesF32(int32_t paddedDim)
{
    return paddedDim > 128 ? 2 : 1;
}

template <int32_t kD>
constexpr int32_t kKEY_HALVES_F32 = keyHalvesF32(kD);

//! c += (the products already in step): one float32 add per accumulator element.
__device__ __forceinline__ void addStep(float (&c)[4], float const (&step)[4])
{
#pragma unroll
    for (int32_t e = 0; e < 4; ++e)
    {
        c[e] += step[e];
    }
}

//! step += a b in 3xTF32 (lo·hi + hi·lo + hi·hi), the tensor core's own accumulation.
__device__ __forceinline__ void mma3xTf32Into(float (&step)[4], uint32_t const (&aHi)[4], uint32_t const (&aLo)[4],
    uint32_t const (&bHi)[2], uint32_t const (&bLo)[2])
{
    mma1688(step, aLo, bHi[0], bHi[1]);
    mma1688(step, aHi, bLo[0], bLo[1]);
    mma1688(step, aHi, bHi[0], bHi[1]);
}

//! c += a b in 3xTF32, the three products summed by the tensor core into a zeroed accumulator
//! and added to c in float32: the tensor core truncates when it accumulates, so its error then
//! stays within one 8-term step instead of growing along the whole sum.
__device__ __forceinline__ void mma3xTf32(float (&c)[4], uint32_t const (&aHi)[4], uint32_t const (&aLo)[4],
    uint32_t const (&bHi)[2], uint32_t const (&bLo)[2])
{
    float step[4]{0.F, 0.F, 0.F, 0.F};
    mma3xTf32Into(step, aHi, aLo, bHi, bLo);
    addStep(c, step);
}

//! s[n] = Q·K_nᵀ over the whole head dimension for the 8-key tiles n < liveTiles (all 8 when
//! !kPARTIAL: one basic block). The head dimension is taken in a permuted order, the same for Q
//! and K (only the order of the sum changes): for each 16 columns 16m..16m+15, thread t's 16-byte
//! load of columns 16m + 4t .. 16m + 4t + 3 feeds step 2m (TF32 fragment columns t, t + 4 = the
//! first two) and step 2m + 1 (the last two), both into one zeroed accumulator (6 products, then
//! one float32 add: a 16-term step; the fastest on the H200 with errors below the unfused float32
//! chain's, see notes/attention_plugin.md). Q rows g, g + 8 of the warp at qRow, K rows n·8 + g.
template <int32_t kD, bool kPARTIAL, int32_t kRowQK, int32_t kTILES>
__device__ __forceinline__ void scoresTf32(float (&s)[kTILES][4], float const* qRow, float const* kRow0,
    int32_t liveTiles)
{
#pragma unroll 1
    for (int32_t m = 0; m < kD / 16; ++m)
    {
        float4 const qa = *reinterpret_cast<float4 const*>(qRow + 16 * m);
        float4 const qb = *reinterpret_cast<float4 const*>(qRow + 8 * kRowQK + 16 * m);
        uint32_t aHi[2][4];
        uint32_t aLo[2][4];
        splitTf32(qa.x, aHi[0][0], aLo[0][0]);
        splitTf32(qb.x, aHi[0][1], aLo[0][1]);
        splitTf32(qa.y, aHi[0][2], aLo[0][2]);
        splitTf32(qb.y, aHi[0][3], aLo[0][3]);
        splitTf32(qa.z, aHi[1][0], aLo[1][0]);
        splitTf32(qb.z, aHi[1][1], aLo[1][1]);
        splitTf32(qa.w, aHi[1][2], aLo[1][2]);
        splitTf32(qb.w, aHi[1][3], aLo[1][3]);
#pragma unroll
        for (int32_t n = 0; n < kTILES; ++n)
        {
            if (kPARTIAL && n >= liveTiles)
            {
                continue;
            }
            float4 const kv = *reinterpret_cast<float4 const*>(kRow0 + n * 8 * kRowQK + 16 * m);
            uint32_t bHi[2][2];
            uint32_t bLo[2][2];
            splitTf32(kv.x, bHi[0][0], bLo[0][0]);
            splitTf32(kv.y, bHi[0][1], bLo[0][1]);
            splitTf32(kv.z, bHi[1][0], bLo[1][0]);
            splitTf32(kv.w, bHi[1][1], bLo[1][1]);
            float step[4]{0.F, 0.F, 0.F, 0.F};
            mma3xTf32Into(step, aHi[0], aLo[0], bHi[0], bLo[0]);
            mma3xTf32Into(step, aHi[1], aLo[1], bHi[1], bLo[1]);
            addStep(s[n], step);
        }
    }
}

//! The P·V A fragments of the 8 keys kk·8 .. kk·8 + 7, taken in the order 0,2,4,6,1,3,5,7 (the
//! same for P and V): A's column t is key 2t, column t + 4 is key 2t + 1, so the scores'
//! accumulator layout is the A fragment.
__device__ __forceinline__ void probabilityFragment(float const (&p)[4], uint32_t (&aHi)[4], uint32_t (&aLo)[4])
{
    splitTf32(p[0], aHi[0], aLo[0]);
    splitTf32(p[2], aHi[1], aLo[1]);
    splitTf32(p[1], aHi[2], aLo[2]);
    splitTf32(p[3], aHi[3], aLo[3]);
}

//! V's B fragment for keys 2t, 2t + 1 (rows vRow, vRow + kRowV) and column g (vRow's column).
template <int32_t kRowV>
__device__ __forceinline__ void valueFragment(float const* vRow, uint32_t (&bHi)[2], uint32_t (&bLo)[2])
{
    splitTf32(vRow[0], bHi[0], bLo[0]);
    splitTf32(vRow[kRowV], bHi[1], bLo[1]);
}

//! o += P·V_j for the 8-key tiles kk < liveTiles (all when !kPARTIAL), one 8-key step per
//! accumulator add (merging two steps was faster on Llama but up to 1.2x the error, see
//! notes/attention_plugin.md). vRows: V row 2t, column g.
template <int32_t kD, bool kPARTIAL, int32_t kTILES>
__device__ __forceinline__ void valuesTf32(
    float (&o)[kD / 8][4], float const (&s)[kTILES][4], float const* vRows, int32_t liveTiles)
{
    constexpr int32_t kRowV = kROW_V_F32<kD>;
#pragma unroll
    for (int32_t kk = 0; kk < kTILES; ++kk)
    {
        if (kPARTIAL && kk >= liveTiles)
        {
            continue;
        }
        uint32_t aHi[4];
        uint32_t aLo[4];
        probabilityFragment(s[kk], aHi, aLo);
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
            uint32_t bHi[2];
            uint32_t bLo[2];
            valueFragment<kRowV>(vRows + kk * 8 * kRowV + n * 8, bHi, bLo);
            mma3xTf32(o[n], aHi, aLo, bHi, bLo);
        }
    }
}

//! With two key halves (kKEY_HALVES_F32): the second half's warps hand their output rows and
//! softmax statistics to the first half's through shared memory (sO: [4 warps][kD / 8][4][32
//! lanes], sStats: [4 warps][2 rows][max, sum][32 lanes]; the K and V tiles' room, free once every
//! warp is done with them); the first half's warps merge them into theirs (both rescaled to the
//! larger maximum) and return true: they store the rows.
template <int32_t kD>
__device__ __forceinline__ bool mergeKeyHalves(float (&o)[kD / 8][4], OnlineSoftmax& softmax, float* sO, float* sStats)
{
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const rowWarp = warp % kWARPS;
    float* const oAt = sO + rowWarp * (kD / 8) * 4 * 32 + lane;
    float* const statsAt = sStats + rowWarp * 2 * 2 * 32 + lane;
    bool const first = warp < kWARPS;
    if (!first)
    {
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                oAt[(n * 4 + e) * 32] = o[n][e];
            }
        }
#pragma unroll
        for (int32_t i = 0; i < 2; ++i)
        {
            statsAt[(i * 2) * 32] = softmax.rowMax[i];
            statsAt[(i * 2 + 1) * 32] = softmax.rowSum[i];
        }
    }
    __syncthreads();
    if (!first)
    {
        return false;
    }
    float mine[2];
    float theirs[2];
#pragma unroll
    for (int32_t i = 0; i < 2; ++i)
    {
        float const otherMax = statsAt[(i * 2) * 32];
        float const otherSum = statsAt[(i * 2 + 1) * 32];
        float const newMax = fmaxf(softmax.rowMax[i], otherMax);
        // a half with no allowed key has sum 0 and output 0: its factor is moot, kept finite
        mine[i] = softmax.rowMax[i] == kNEGATIVE_INFINITY ? 0.F : exp2Approx((softmax.rowMax[i] - newMax) * kLOG2E);
        theirs[i] = otherMax == kNEGATIVE_INFINITY ? 0.F : exp2Approx((otherMax - newMax) * kLOG2E);
        softmax.rowMax[i] = newMax;
        softmax.rowSum[i] = softmax.rowSum[i] * mine[i] + otherSum * theirs[i];
    }
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            o[n][e] = o[n][e] * mine[e / 2] + oAt[(n * 4 + e) * 32] * theirs[e / 2];
        }
    }
    return true;
}

//! One warp: 16 query rows; per 64-key tile, the 8-key tiles past the last key the warp can use
//! (the end of K, or its last row under causal) are skipped: SDXL's 77 keys take 64 + 16 keys.
//! kRowQK: Q and K's shared row length, kROW_QK_F32 (conflict-free), or kD + 4 where that does
//! not fit the GPU's shared memory (compactSharedBytesF32: D = 128 on sm_86/sm_89, 99 KB per block).
template <int32_t kD, int32_t kRowQK = kROW_QK_F32<kD>>
__global__ void __launch_bounds__(kTHREADS* kKEY_HALVES_F32<kD>, kMIN_BLOCKS_F32<kD>) flashTf32x3Kernel(
    float const* __restrict__ q,
    float const* __restrict__ k, float const* __restrict__ v, AttentionMaskView const mask, float* __restrict__ out,
    AttentionShape const shape, AttentionParams const params, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    static_assert(kRowQK % 4 == 0, "16-byte rows");
    constexpr int32_t kRowV = kROW_V_F32<kD>;
    constexpr int32_t kRows = kBLOCK_ROWS<1>;
    constexpr int32_t kHALVES = kKEY_HALVES_F32<kD>;
    constexpr int32_t kThreads = kTHREADS * kHALVES;
    constexpr int32_t kTILES = kKEY_TILES / kHALVES; // 8-key tiles of a warp per 64-key tile
    constexpr int32_t kHALF_KEYS = kBLOCK_KEYS / kHALVES;
    static_assert(kHALVES == 1
            || (kWARPS * (kD / 8) * 4 * 32 <= kBLOCK_KEYS * kRowQK && kWARPS * 2 * 2 * 32 <= kBLOCK_KEYS * kRowV),
        "the merge's room");
    extern __shared__ __align__(16) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw);
    float* const sK = sQ + kRows * kRowQK;
    float* const sV = sK + kBLOCK_KEYS * kRowQK;

    // one or two blocks per SM: causal tiles ordered heavy-first over all (batch, head)s, so that
    // the last wave holds the light ones (at head dim 256, 0.98 ms against 1.51 heavy-first within
    // each (batch, head) on the Gemma-2-like benchmark shape)
    BlockSetup<float> const block(q, k, v, out, mask, shape, params, kRows, qTiles, params.causal);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const g = lane / 4;
    int32_t const t = lane % 4;
    // which keys of each tile this warp takes: [half * kHALF_KEYS, + kHALF_KEYS); its 16 rows
    int32_t const half = kHALVES == 1 ? 0 : warp / kWARPS;
    int32_t const rowWarp = kHALVES == 1 ? warp : warp % kWARPS;

    if (headDim < kD)
    {
        zeroPadding<float, kD, kRowQK, kThreads>(sQ, kRows + kBLOCK_KEYS, headDim); // sQ and sK are adjacent
    }
    if (valueDim < kD)
    {
        zeroPadding<float, kD, kRowV, kThreads>(sV, kBLOCK_KEYS, valueDim);
    }
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kBLOCK_KEYS - 1) / kBLOCK_KEYS);
    loadTileAsync<float, kD, kRowQK, kRows, kThreads>(sQ, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadTileAsync<float, kD, kRowQK, kBLOCK_KEYS, kThreads>(sK, block.kBase, 0, shape.seqK, headDim);
    }
    commitAsync();
    waitAsync<0>();
    __syncthreads();

    int32_t const warpRow = rowWarp * 16;
    float o[kD / 8][4];
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
    }
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warpRow;
    // the keys this warp's rows can use: all of K, or under causal up to its last row
    int64_t const warpKeyEnd = params.causal && warpRow0 + 16 < block.keyEnd ? warpRow0 + 16 : block.keyEnd;
    float const* const qRow = sQ + (warpRow + g) * kRowQK + 4 * t;
    float const* const kRow0 = sK + (half * kHALF_KEYS + g) * kRowQK + 4 * t;
    float const* const vRows = sV + (half * kHALF_KEYS + 2 * t) * kRowV + g;

    for (int32_t j = 0; j < keyTiles; ++j)
    {
        int64_t const tileKey0 = static_cast<int64_t>(j) * kBLOCK_KEYS;
        int64_t const k0 = tileKey0 + half * kHALF_KEYS; // this warp's first key
        loadTileAsync<float, kD, kRowV, kBLOCK_KEYS, kThreads>(sV, block.vBase, tileKey0, shape.seqK, valueDim);
        commitAsync();
        waitAsync<1>(); // K_j
        __syncthreads();

        // 8-key tiles holding a key the warp can use (none for a warp past the last query row)
        int64_t const live = warpRow0 < shape.seqQ ? (warpKeyEnd - k0 + 7) / 8 : 0;
        int32_t const liveTiles = live < 0 ? 0 : (live > kTILES ? kTILES : static_cast<int32_t>(live));
        float s[kTILES][4];
#pragma unroll
        for (int32_t n = 0; n < kTILES; ++n)
        {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.F;
        }
        if (kBOTH_PATHS_F32<kD> && liveTiles == kTILES)
        {
            scoresTf32<kD, false, kRowQK, kTILES>(s, qRow, kRow0, liveTiles);
        }
        else
        {
            scoresTf32<kD, true, kRowQK, kTILES>(s, qRow, kRow0, liveTiles);
        }
        __syncthreads(); // every warp is done with K_j
        if (j + 1 < keyTiles)
        {
            loadTileAsync<float, kD, kRowQK, kBLOCK_KEYS, kThreads>(
                sK, block.kBase, tileKey0 + kBLOCK_KEYS, shape.seqK, headDim);
        }
        commitAsync();

        // the skipped 8-key tiles hold only keys past seqK or past the diagonal: checkEach is
        // then true and blocks them
        bool const checkEach = k0 + kHALF_KEYS > shape.seqK || (params.causal && k0 + kHALF_KEYS - 1 > warpRow0);
        float alpha[2];
        softmax.template update<false>(s, alpha, warpRow0 + g, k0, mask, block.maskBase, shape, params, checkEach);
        rescale(o, alpha);

        waitAsync<1>(); // V_j
        __syncthreads();
        if (kBOTH_PATHS_F32<kD> && liveTiles == kTILES)
        {
            valuesTf32<kD, false, kTILES>(o, s, vRows, liveTiles);
        }
        else
        {
            valuesTf32<kD, true, kTILES>(o, s, vRows, liveTiles);
        }
        __syncthreads(); // every warp is done with V_j
    }
    waitAsync<0>();
    softmax.finish();
    if constexpr (kHALVES == 2)
    {
        if (!mergeKeyHalves<kD>(o, softmax, sK, sV))
        {
            return;
        }
    }
    storeOutput<float, kD>(o, softmax, block.outBase, warpRow0 + g, shape, params);
#endif
}

// ---- dispatch ----------------------------------------------------------------------------------

template <typename T, int32_t kD>
constexpr auto kernelFor()
{
    if constexpr (std::is_same_v<T, float>)
    {
        return flashTf32x3Kernel<kD>;
    }
    else
    {
        return flashMma16Kernel<T, kD, rowTilesFor(2, kD)>;
    }
}

//! Calls f with the kernel for plan.paddedDim, or returns cudaErrorInvalidConfiguration.
template <typename T, typename F>
cudaError_t withKernel(FlashPlan const& plan, F&& f)
{
    switch (plan.paddedDim)
    {
    case 32: return f(kernelFor<T, 32>());
    case 64: return f(kernelFor<T, 64>());
    case 80: return f(kernelFor<T, 80>());
    case 96: return f(kernelFor<T, 96>());
    case 160: return f(kernelFor<T, 160>());
    case 192: return f(kernelFor<T, 192>());
    case 256: return f(kernelFor<T, 256>());
    case 128:
        if constexpr (std::is_same_v<T, float>)
        {
            if (plan.sharedBytes == compactSharedBytesF32(128))
            {
                return f(flashTf32x3Kernel<128, 128 + 4>); // see planFlashAttention
            }
        }
        return f(kernelFor<T, 128>());
    default: return cudaErrorInvalidConfiguration;
    }
}

constexpr int32_t blockRowsFor(int32_t elementBytes, int32_t paddedDim)
{
    return 16 * rowTilesFor(elementBytes, paddedDim) * kWARPS;
}

constexpr int32_t sharedBytes(int32_t elementBytes, int32_t paddedDim)
{
    if (elementBytes == 4)
    {
        // float32: Q and K rows of kROW_QK_F32 floats, V rows of kROW_V_F32 (sharedBytesF32)
        int32_t const rowQK = paddedDim + (48 - paddedDim % 32) % 32;
        return ((blockRowsFor(4, paddedDim) + kBLOCK_KEYS) * rowQK + kBLOCK_KEYS * (paddedDim + 4)) * 4;
    }
    return (blockRowsFor(elementBytes, paddedDim) + 2 * kBLOCK_KEYS) * (paddedDim + 8) * elementBytes;
}

static_assert(sharedBytes(2, 128) == sharedBytesFor<__half, 128>(), "one shared-memory formula");
static_assert(sharedBytes(2, 64) == sharedBytesFor<__half, 64>(), "one shared-memory formula");
static_assert(sharedBytes(4, 128) == sharedBytesF32<128>(), "one shared-memory formula");
static_assert(compactSharedBytesF32(128) == sharedBytesF32<128, 128 + 4>(), "one shared-memory formula");
static_assert(compactSharedBytesF32(128) < sharedBytes(4, 128), "the compact layout is smaller");
static_assert(sharedBytes(4, 64) == sharedBytesF32<64>(), "one shared-memory formula");
static_assert(sharedBytes(4, 80) == sharedBytesF32<80>(), "one shared-memory formula");
static_assert(sharedBytes(2, 80) == sharedBytesFor<__nv_bfloat16, 80>(), "one shared-memory formula");
static_assert(sharedBytes(2, 256) == sharedBytesFor<__half, 256>(), "one shared-memory formula");
static_assert(sharedBytes(4, 256) == sharedBytesF32<256>(), "one shared-memory formula");
static_assert(sharedBytes(4, 160) == sharedBytesF32<160>(), "one shared-memory formula");

inline bool aligned16(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

//! What launchFlashAttention and launchHopperAttention check of their arguments (the contract in
//! graphfixAttentionFlash.h) and the grid they launch: qTiles tiles of blockRows query rows for
//! each (batch, head), one block each. !launch: return status (an error, or cudaSuccess when there
//! is nothing to compute).
struct LaunchGrid
{
    cudaError_t status{cudaSuccess};
    bool launch{false};
    int64_t qTiles{0};
    int64_t blocks{0};
};

inline LaunchGrid launchGridFor(void const* q, void const* k, void const* v, void const* out,
    AttentionShape const& shape, AttentionParams const& params, int32_t blockRows)
{
    if (params.kTransposed || shape.headsKV <= 0 || shape.headsQ % shape.headsKV != 0)
    {
        return {cudaErrorInvalidValue};
    }
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out))
    {
        return {cudaErrorMisalignedAddress};
    }
    if (shape.batch == 0 || shape.headsQ == 0 || shape.seqQ == 0)
    {
        return {cudaSuccess};
    }
    int64_t const qTiles = (shape.seqQ + blockRows - 1) / blockRows;
    int64_t const blocks = qTiles * shape.batch * shape.headsQ;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return {cudaErrorInvalidConfiguration};
    }
    return {cudaSuccess, true, qTiles, blocks};
}

//! The current device's multiprocessor count, for persistent grids (0 when it cannot be read).
inline int32_t multiprocessorCount()
{
    int32_t device = 0;
    int32_t processors = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    {
        return 0;
    }
    return processors;
}

} // namespace

template <typename T>
cudaError_t prepareFlashAttention(FlashPlan const& plan) noexcept
{
    return withKernel<T>(plan, [&](auto kernel) {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.sharedBytes);
    });
}

template <typename T>
cudaError_t launchFlashAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, FlashPlan const& plan, cudaStream_t stream) noexcept
{
    FlashKernel const expected = std::is_same_v<T, float> ? FlashKernel::kTf32x3 : FlashKernel::kMma16;
    if (plan.kernel != expected)
    {
        return cudaErrorInvalidValue;
    }
    LaunchGrid const grid = launchGridFor(q, k, v, out, shape, params, plan.blockRows);
    if (!grid.launch)
    {
        return grid.status;
    }
    size_t const sharedSize = static_cast<size_t>(plan.sharedBytes);
    uint32_t const threads = kTHREADS * (std::is_same_v<T, float> ? keyHalvesF32(plan.paddedDim) : 1);
    return withKernel<T>(plan, [&](auto kernel) {
        kernel<<<static_cast<uint32_t>(grid.blocks), threads, sharedSize, stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(grid.qTiles));
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_FLASH_CUH
