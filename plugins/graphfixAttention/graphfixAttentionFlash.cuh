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
 * so each load overlaps the other product. Shared-memory rows are padded (8 halves / 4 floats)
 * so that ldmatrix and the float32 fragment loads are free of bank conflicts.
 *
 * float16/bfloat16: Q stays in registers as A fragments (ldmatrix), K and V are read with
 * ldmatrix (V transposed); the probabilities of two neighbouring 8-key tiles, as 16-bit pairs
 * (float16: rounded once; bfloat16: hi + lo, see kSPLIT_P), are exactly the A fragment of a
 * 16-key step of P·V. float32: fragments are read with plain shared loads and
 * split into TF32 hi + lo (3 products); for P·V the 8 keys of a step are taken in the order
 * 0,2,4,6,1,3,5,7 (a permutation of the summation index, the same for P and V), which makes the
 * scores' accumulator layout the TF32 A fragment without shuffles.
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
constexpr int32_t kPADDED_DIMS[]{32, 64, 80, 96, 128};
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

__device__ __forceinline__ uint32_t toTf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n"
        : "=r"(r)
        : "f"(x));
    return r;
}

//! x = hi + lo with hi and lo TF32 (lo keeps the next 11 bits; x - hi is exact in float32).
__device__ __forceinline__ void splitTf32(float x, uint32_t& hi, uint32_t& lo)
{
    hi = toTf32(x);
    lo = toTf32(x - __uint_as_float(hi));
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

    __device__ BlockSetup(T const* q, T const* k, T const* v, T* out, AttentionMaskView const& mask,
        AttentionShape const& shape, AttentionParams const& params, int32_t blockRows, int32_t qTiles)
    {
        // Heavy causal tiles (late rows) first, so the last wave is made of light ones.
        int64_t const tile = qTiles - 1 - static_cast<int64_t>(blockIdx.x % static_cast<uint32_t>(qTiles));
        int64_t const bh = blockIdx.x / static_cast<uint32_t>(qTiles);
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
template <typename T, int32_t kD, int32_t kRow, int32_t kRows>
__device__ __forceinline__ void loadTileAsync(T* shared, T const* global, int64_t row0, int64_t rows, int32_t cols)
{
    constexpr int32_t kPER_CHUNK = 16 / static_cast<int32_t>(sizeof(T));
    constexpr int32_t kCHUNKS = kD / kPER_CHUNK;
#pragma unroll 4
    for (int32_t c = static_cast<int32_t>(threadIdx.x); c < kRows * kCHUNKS; c += kTHREADS)
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
template <typename T, int32_t kD, int32_t kRow>
__device__ __forceinline__ void zeroPadding(T* shared, int32_t rows, int32_t from)
{
    int32_t const width = kD - from;
    for (int32_t e = static_cast<int32_t>(threadIdx.x); e < rows * width; e += kTHREADS)
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
        bool const common = !masked && !checkEach && params.softcap == 0.F;
        bool const folded = kFOLD && common && params.scale > 0.F;
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
                    if (!folded)
                    {
                        s[n][e] *= params.scale;
                    }
                    tileMax[e / 2] = fmaxf(tileMax[e / 2], s[n][e]);
                }
            }
            if (folded)
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

template <typename T, int32_t kD, int32_t kMT>
__global__ void __launch_bounds__(kTHREADS) flashMma16Kernel(T const* __restrict__ q, T const* __restrict__ k,
    T const* __restrict__ v, AttentionMaskView const mask, T* __restrict__ out, AttentionShape const shape,
    AttentionParams const params, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int32_t kRow = kROW<T, kD>;
    constexpr int32_t kRows = kBLOCK_ROWS<kMT>;
    extern __shared__ __align__(16) unsigned char sharedRaw[];
    T* const sQ = reinterpret_cast<T*>(sharedRaw);
    T* const sK = sQ + kRows * kRow;
    T* const sV = sK + kBLOCK_KEYS * kRow;

    BlockSetup<T> const block(q, k, v, out, mask, shape, params, kRows, qTiles);
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
    uint32_t qFragment[kMT][kD / 16][4];
#pragma unroll
    for (int32_t mt = 0; mt < kMT; ++mt)
    {
#pragma unroll
        for (int32_t kk = 0; kk < kD / 16; ++kk)
        {
            loadMatrixX4(qFragment[mt][kk], sQ + (warpRow + mt * 16 + lane % 16) * kRow + kk * 16 + (lane / 16) * 8);
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
#pragma unroll
            for (int32_t nn = 0; nn < kKEY_TILES / 2; ++nn)
            {
                uint32_t b[4];
                loadMatrixX4(b, sK + (nn * 16 + (lane / 16) * 8 + lane % 8) * kRow + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    mma16816<T>(s[mt][2 * nn], qFragment[mt][kk], b[0], b[1]);
                    mma16816<T>(s[mt][2 * nn + 1], qFragment[mt][kk], b[2], b[3]);
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
#endif
}

// ---- float32: 3xTF32 ---------------------------------------------------------------------------

//! c += a b in 3xTF32 (lo·hi + hi·lo + hi·hi), the three products summed by the tensor core into
//! a zeroed accumulator and added to c in float32: the tensor core truncates when it accumulates,
//! so its error then stays within one 8-term step instead of growing along the whole sum.
__device__ __forceinline__ void mma3xTf32(float (&c)[4], uint32_t const (&aHi)[4], uint32_t const (&aLo)[4],
    uint32_t const (&bHi)[2], uint32_t const (&bLo)[2])
{
    float step[4]{0.F, 0.F, 0.F, 0.F};
    mma1688(step, aLo, bHi[0], bHi[1]);
    mma1688(step, aHi, bLo[0], bLo[1]);
    mma1688(step, aHi, bHi[0], bHi[1]);
#pragma unroll
    for (int32_t e = 0; e < 4; ++e)
    {
        c[e] += step[e];
    }
}

template <int32_t kD, int32_t kMT>
__global__ void __launch_bounds__(kTHREADS) flashTf32x3Kernel(float const* __restrict__ q,
    float const* __restrict__ k, float const* __restrict__ v, AttentionMaskView const mask, float* __restrict__ out,
    AttentionShape const shape, AttentionParams const params, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int32_t kRow = kROW<float, kD>;
    constexpr int32_t kRows = kBLOCK_ROWS<kMT>;
    extern __shared__ __align__(16) unsigned char sharedRaw[];
    float* const sQ = reinterpret_cast<float*>(sharedRaw);
    float* const sK = sQ + kRows * kRow;
    float* const sV = sK + kBLOCK_KEYS * kRow;

    BlockSetup<float> const block(q, k, v, out, mask, shape, params, kRows, qTiles);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const g = lane / 4;
    int32_t const t = lane % 4;

    if (headDim < kD)
    {
        zeroPadding<float, kD, kRow>(sQ, kRows + kBLOCK_KEYS, headDim);
    }
    if (valueDim < kD)
    {
        zeroPadding<float, kD, kRow>(sV, kBLOCK_KEYS, valueDim);
    }
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kBLOCK_KEYS - 1) / kBLOCK_KEYS);
    loadTileAsync<float, kD, kRow, kRows>(sQ, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadTileAsync<float, kD, kRow, kBLOCK_KEYS>(sK, block.kBase, 0, shape.seqK, headDim);
    }
    commitAsync();
    waitAsync<0>();
    __syncthreads();

    int32_t const warpRow = warp * 16 * kMT;
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
    float const* const qRows = sQ + (warpRow + g) * kRow;

    for (int32_t j = 0; j < keyTiles; ++j)
    {
        int64_t const k0 = static_cast<int64_t>(j) * kBLOCK_KEYS;
        loadTileAsync<float, kD, kRow, kBLOCK_KEYS>(sV, block.vBase, k0, shape.seqK, valueDim);
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
#pragma unroll 2
        for (int32_t kk = 0; kk < kD / 8; ++kk)
        {
            uint32_t aHi[kMT][4];
            uint32_t aLo[kMT][4];
#pragma unroll
            for (int32_t mt = 0; mt < kMT; ++mt)
            {
                float const* const rows = qRows + mt * 16 * kRow + kk * 8 + t;
                splitTf32(rows[0], aHi[mt][0], aLo[mt][0]);
                splitTf32(rows[8 * kRow], aHi[mt][1], aLo[mt][1]);
                splitTf32(rows[4], aHi[mt][2], aLo[mt][2]);
                splitTf32(rows[8 * kRow + 4], aHi[mt][3], aLo[mt][3]);
            }
#pragma unroll
            for (int32_t n = 0; n < kKEY_TILES; ++n)
            {
                float const* const kRowPtr = sK + (n * 8 + g) * kRow + kk * 8 + t;
                uint32_t bHi[2];
                uint32_t bLo[2];
                splitTf32(kRowPtr[0], bHi[0], bLo[0]);
                splitTf32(kRowPtr[4], bHi[1], bLo[1]);
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    mma3xTf32(s[mt][n], aHi[mt], aLo[mt], bHi, bLo);
                }
            }
        }
        __syncthreads(); // every warp is done with K_j
        if (j + 1 < keyTiles)
        {
            loadTileAsync<float, kD, kRow, kBLOCK_KEYS>(sK, block.kBase, k0 + kBLOCK_KEYS, shape.seqK, headDim);
        }
        commitAsync();

        bool const checkEach = k0 + kBLOCK_KEYS > shape.seqK || (params.causal && k0 + kBLOCK_KEYS - 1 > warpRow0);
#pragma unroll
        for (int32_t mt = 0; mt < kMT; ++mt)
        {
            float alpha[2];
            softmax[mt].template update<false>(
                s[mt], alpha, warpRow0 + mt * 16 + g, k0, mask, block.maskBase, shape, params, checkEach);
            rescale(o[mt], alpha);
        }

        waitAsync<1>(); // V_j
        __syncthreads();
#pragma unroll
        for (int32_t kk = 0; kk < kKEY_TILES; ++kk)
        {
            // keys kk*8 + {0,2,4,6,1,3,5,7}: A's column t is key 2t, column t + 4 is key 2t + 1
            uint32_t aHi[kMT][4];
            uint32_t aLo[kMT][4];
#pragma unroll
            for (int32_t mt = 0; mt < kMT; ++mt)
            {
                splitTf32(s[mt][kk][0], aHi[mt][0], aLo[mt][0]);
                splitTf32(s[mt][kk][2], aHi[mt][1], aLo[mt][1]);
                splitTf32(s[mt][kk][1], aHi[mt][2], aLo[mt][2]);
                splitTf32(s[mt][kk][3], aHi[mt][3], aLo[mt][3]);
            }
            float const* const vRows = sV + (kk * 8 + 2 * t) * kRow + g;
#pragma unroll
            for (int32_t n = 0; n < kD / 8; ++n)
            {
                uint32_t bHi[2];
                uint32_t bLo[2];
                splitTf32(vRows[n * 8], bHi[0], bLo[0]);
                splitTf32(vRows[kRow + n * 8], bHi[1], bLo[1]);
#pragma unroll
                for (int32_t mt = 0; mt < kMT; ++mt)
                {
                    mma3xTf32(o[mt][n], aHi[mt], aLo[mt], bHi, bLo);
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
        storeOutput<float, kD>(o[mt], softmax[mt], block.outBase, warpRow0 + mt * 16 + g, shape, params);
    }
#endif
}

// ---- dispatch ----------------------------------------------------------------------------------

template <typename T, int32_t kD>
constexpr auto kernelFor()
{
    if constexpr (std::is_same_v<T, float>)
    {
        return flashTf32x3Kernel<kD, rowTilesFor(4, kD)>;
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
    case 128: return f(kernelFor<T, 128>());
    default: return cudaErrorInvalidConfiguration;
    }
}

constexpr int32_t blockRowsFor(int32_t elementBytes, int32_t paddedDim)
{
    return 16 * rowTilesFor(elementBytes, paddedDim) * kWARPS;
}

constexpr int32_t sharedBytes(int32_t elementBytes, int32_t paddedDim)
{
    return (blockRowsFor(elementBytes, paddedDim) + 2 * kBLOCK_KEYS) * (paddedDim + (elementBytes == 4 ? 4 : 8)) * elementBytes;
}

static_assert(sharedBytes(2, 128) == sharedBytesFor<__half, 128>(), "one shared-memory formula");
static_assert(sharedBytes(2, 64) == sharedBytesFor<__half, 64>(), "one shared-memory formula");
static_assert(sharedBytes(4, 80) == sharedBytesFor<float, 80>(), "one shared-memory formula");
static_assert(sharedBytes(2, 80) == sharedBytesFor<__nv_bfloat16, 80>(), "one shared-memory formula");

inline bool aligned16(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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
    if (plan.kernel != expected || params.kTransposed || shape.headsKV <= 0 || shape.headsQ % shape.headsKV != 0)
    {
        return cudaErrorInvalidValue;
    }
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out))
    {
        return cudaErrorMisalignedAddress;
    }
    if (shape.batch == 0 || shape.headsQ == 0 || shape.seqQ == 0)
    {
        return cudaSuccess;
    }
    int64_t const qTiles = (shape.seqQ + plan.blockRows - 1) / plan.blockRows;
    int64_t const blocks = qTiles * shape.batch * shape.headsQ;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return cudaErrorInvalidConfiguration;
    }
    return withKernel<T>(plan, [&](auto kernel) {
        kernel<<<static_cast<uint32_t>(blocks), kTHREADS, static_cast<size_t>(plan.sharedBytes), stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(qTiles));
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_FLASH_CUH
