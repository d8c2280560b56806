/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The fallback attention kernel: one block of 128 threads per [BQ query rows, (batch, head)],
 * walking the keys in tiles of BK. Per tile: K and V are staged in shared memory as float32;
 * each thread computes a small register tile of scores (scale, softcap, mask, causal); a group
 * of threads per query row updates the running maximum and sum (the online softmax) and turns
 * the scores into unnormalised probabilities; the output accumulator, float32 in shared memory,
 * is rescaled and accumulated. Probabilities stay float32 throughout (fused kernels that round
 * them to the I/O type before the second product lose most of their accuracy there); the output
 * is rounded once. Rows whose keys are all blocked (-inf) give NaN, or 0 with nanToZero.
 *
 * It is the fallback for what neither the cuDNN path nor the flash kernels
 * (graphfixAttentionFlash.h) can run: head dimensions above 128 or not multiples of 8 (4 for
 * float32), GPUs before sm_80, misaligned tensors; correct first and reasonably fast second. float32 runs on CUDA cores; float16 and bfloat16 on
 * sm_80 and newer take the tensor-core variant below (same algorithm and accuracy).
 */
#include "graphfixAttentionKernel.h"

#include "../../common/cudaConversions.cuh"

#include <math_constants.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kTHREADS{128};
constexpr int32_t kWARP{32};
constexpr uint32_t kFULL_MASK{0xffffffffU};
constexpr int32_t kDEFAULT_SMEM_BYTES{48 * 1024};
constexpr int64_t kMAX_GRID_BLOCKS{int64_t{1} << 30};

using conversions::fromFloat;
using conversions::toFloat;

__device__ __forceinline__ float negativeInfinity()
{
    return -CUDART_INF_F;
}

//! One mask element as float (a bool mask gives 1 or 0).
__device__ __forceinline__ float maskValue(AttentionMaskView const& mask, int64_t offset)
{
    switch (mask.type)
    {
    case AttentionMaskType::kBool: return static_cast<uint8_t const*>(mask.data)[offset] != 0 ? 1.F : 0.F;
    case AttentionMaskType::kFloat: return static_cast<float const*>(mask.data)[offset];
    case AttentionMaskType::kHalf: return __half2float(static_cast<__half const*>(mask.data)[offset]);
    case AttentionMaskType::kBFloat16: return __bfloat162float(static_cast<__nv_bfloat16 const*>(mask.data)[offset]);
    }
    return 0.F;
}

__device__ __forceinline__ bool maskBlocks(AttentionMaskView const& mask, int64_t offset)
{
    float const m = maskValue(mask, offset);
    return mask.kind == AttentionMaskKind::kBool ? m == 0.F : m == negativeInfinity();
}

//! Floats of shared memory the kernel with tiles BQ x BK needs.
constexpr int64_t sharedFloats(int32_t bq, int32_t bk, int64_t headDim, int64_t valueDim)
{
    return bq * (headDim + 1) + bk * (headDim + 1) + bk * valueDim + bq * (bk + 1) + bq * valueDim + 3 * bq;
}

template <typename T, int32_t BQ, int32_t BK>
__global__ void __launch_bounds__(kTHREADS) attentionKernel(T const* __restrict__ q, T const* __restrict__ k,
    T const* __restrict__ v, AttentionMaskView const mask, T* __restrict__ out, AttentionShape const shape,
    AttentionParams const params, int64_t const qTiles)
{
    static_assert(BQ % 8 == 0 && BK % 16 == 0 && kTHREADS % BQ == 0, "tile shape");
    constexpr int32_t kROWS_PER_THREAD = BQ / 8; // score stage: 8 row groups x 16 column groups
    constexpr int32_t kCOLS_PER_THREAD = BK / 16;
    constexpr int32_t kTHREADS_PER_ROW = kTHREADS / BQ; // softmax stage
    constexpr int32_t kROWS_PER_WARP = BQ / (kTHREADS / kWARP); // output stage

    extern __shared__ float smem[];
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const qStride = headDim + 1;
    int32_t const pStride = BK + 1;
    float* const qs = smem;
    float* const ks = qs + BQ * qStride;
    float* const vs = ks + BK * qStride;
    float* const ps = vs + BK * valueDim;
    float* const os = ps + BQ * pStride;
    float* const rowMax = os + BQ * valueDim;
    float* const rowSum = rowMax + BQ;
    float* const rowAlpha = rowSum + BQ;

    int64_t const tile = blockIdx.x % qTiles;
    int64_t const bh = blockIdx.x / qTiles;
    int64_t const b = bh / shape.headsQ;
    int64_t const h = bh % shape.headsQ;
    int64_t const hkv = h / (shape.headsQ / shape.headsKV);
    int64_t const q0 = tile * BQ;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);

    T const* const qBase = q + bh * shape.seqQ * headDim;
    T const* const kBase = k + (b * shape.headsKV + hkv) * shape.seqK * headDim;
    T const* const vBase = v + (b * shape.headsKV + hkv) * shape.seqK * valueDim;
    int64_t const maskBase = b * mask.stride[0] + h * mask.stride[1];

    for (int32_t e = tid; e < BQ * headDim; e += kTHREADS)
    {
        int32_t const r = e / headDim;
        int32_t const c = e - r * headDim;
        int64_t const qi = q0 + r;
        qs[r * qStride + c] = qi < shape.seqQ ? toFloat(qBase[qi * headDim + c]) : 0.F;
    }
    for (int32_t e = tid; e < BQ * valueDim; e += kTHREADS)
    {
        os[e] = 0.F;
    }
    if (tid < BQ)
    {
        rowMax[tid] = negativeInfinity();
        rowSum[tid] = 0.F;
        rowAlpha[tid] = 1.F;
    }

    int64_t const kEnd = params.causal && q0 + BQ < shape.seqK ? q0 + BQ : shape.seqK;
    int32_t const rowGroup = tid / 16;
    int32_t const colGroup = tid % 16;
    for (int64_t k0 = 0; k0 < kEnd; k0 += BK)
    {
        __syncthreads(); // the previous tile's probabilities and values are consumed
        if (params.kTransposed)
        {
            for (int32_t e = tid; e < BK * headDim; e += kTHREADS)
            {
                int32_t const c = e / BK;
                int32_t const r = e - c * BK;
                int64_t const kj = k0 + r;
                ks[r * qStride + c] = kj < shape.seqK ? toFloat(kBase[c * shape.seqK + kj]) : 0.F;
            }
        }
        else
        {
            for (int32_t e = tid; e < BK * headDim; e += kTHREADS)
            {
                int32_t const r = e / headDim;
                int32_t const c = e - r * headDim;
                int64_t const kj = k0 + r;
                ks[r * qStride + c] = kj < shape.seqK ? toFloat(kBase[kj * headDim + c]) : 0.F;
            }
        }
        for (int32_t e = tid; e < BK * valueDim; e += kTHREADS)
        {
            int32_t const r = e / valueDim;
            int64_t const kj = k0 + r;
            vs[e] = kj < shape.seqK ? toFloat(vBase[kj * valueDim + (e - r * valueDim)]) : 0.F;
        }
        __syncthreads();

        // scores
        float acc[kROWS_PER_THREAD][kCOLS_PER_THREAD];
#pragma unroll
        for (int32_t i = 0; i < kROWS_PER_THREAD; ++i)
        {
#pragma unroll
            for (int32_t j = 0; j < kCOLS_PER_THREAD; ++j)
            {
                acc[i][j] = 0.F;
            }
        }
        for (int32_t d = 0; d < headDim; ++d)
        {
            float qv[kROWS_PER_THREAD];
            float kv[kCOLS_PER_THREAD];
#pragma unroll
            for (int32_t i = 0; i < kROWS_PER_THREAD; ++i)
            {
                qv[i] = qs[(rowGroup * kROWS_PER_THREAD + i) * qStride + d];
            }
#pragma unroll
            for (int32_t j = 0; j < kCOLS_PER_THREAD; ++j)
            {
                kv[j] = ks[(colGroup + 16 * j) * qStride + d];
            }
#pragma unroll
            for (int32_t i = 0; i < kROWS_PER_THREAD; ++i)
            {
#pragma unroll
                for (int32_t j = 0; j < kCOLS_PER_THREAD; ++j)
                {
                    acc[i][j] = fmaf(qv[i], kv[j], acc[i][j]);
                }
            }
        }
#pragma unroll
        for (int32_t i = 0; i < kROWS_PER_THREAD; ++i)
        {
#pragma unroll
            for (int32_t j = 0; j < kCOLS_PER_THREAD; ++j)
            {
                int32_t const row = rowGroup * kROWS_PER_THREAD + i;
                int32_t const col = colGroup + 16 * j;
                int64_t const qi = q0 + row;
                int64_t const kj = k0 + col;
                float s = acc[i][j] * params.scale;
                if (params.softcap > 0.F)
                {
                    s = params.softcap * tanhf(s / params.softcap);
                }
                if (kj >= shape.seqK)
                {
                    s = negativeInfinity();
                }
                else
                {
                    if (mask.kind != AttentionMaskKind::kNone && qi < shape.seqQ)
                    {
                        float const m = maskValue(mask, maskBase + qi * mask.stride[2] + kj * mask.stride[3]);
                        s = mask.kind == AttentionMaskKind::kBool ? (m != 0.F ? s : params.maskFill) : s + m;
                    }
                    if (params.causal && kj > qi)
                    {
                        s = negativeInfinity();
                    }
                }
                ps[row * pStride + col] = s;
            }
        }
        __syncthreads();

        // online softmax: kTHREADS_PER_ROW neighbouring lanes per row
        {
            int32_t const row = tid / kTHREADS_PER_ROW;
            int32_t const part = tid % kTHREADS_PER_ROW;
            float tileMax = negativeInfinity();
            for (int32_t c = part; c < BK; c += kTHREADS_PER_ROW)
            {
                tileMax = fmaxf(tileMax, ps[row * pStride + c]);
            }
#pragma unroll
            for (int32_t offset = kTHREADS_PER_ROW / 2; offset > 0; offset /= 2)
            {
                tileMax = fmaxf(tileMax, __shfl_xor_sync(kFULL_MASK, tileMax, offset, kTHREADS_PER_ROW));
            }
            float const oldMax = rowMax[row];
            float const newMax = fmaxf(oldMax, tileMax);
            float alpha = 1.F;
            float sum = 0.F;
            if (newMax == negativeInfinity())
            {
                for (int32_t c = part; c < BK; c += kTHREADS_PER_ROW)
                {
                    ps[row * pStride + c] = 0.F;
                }
            }
            else
            {
                alpha = expf(oldMax - newMax);
                for (int32_t c = part; c < BK; c += kTHREADS_PER_ROW)
                {
                    float const p = expf(ps[row * pStride + c] - newMax);
                    ps[row * pStride + c] = p;
                    sum += p;
                }
            }
#pragma unroll
            for (int32_t offset = kTHREADS_PER_ROW / 2; offset > 0; offset /= 2)
            {
                sum += __shfl_xor_sync(kFULL_MASK, sum, offset, kTHREADS_PER_ROW);
            }
            if (part == 0)
            {
                rowMax[row] = newMax;
                rowSum[row] = rowSum[row] * alpha + sum;
                rowAlpha[row] = alpha;
            }
        }
        __syncthreads();

        // out = out * alpha + P V; each warp owns kROWS_PER_WARP rows, lanes walk the columns
        {
            int32_t const warp = tid / kWARP;
            int32_t const lane = tid % kWARP;
            int32_t const firstRow = warp * kROWS_PER_WARP;
            for (int32_t c = lane; c < valueDim; c += kWARP)
            {
                float o[kROWS_PER_WARP];
#pragma unroll
                for (int32_t i = 0; i < kROWS_PER_WARP; ++i)
                {
                    o[i] = os[(firstRow + i) * valueDim + c] * rowAlpha[firstRow + i];
                }
#pragma unroll 4
                for (int32_t j = 0; j < BK; ++j)
                {
                    float const value = vs[j * valueDim + c];
#pragma unroll
                    for (int32_t i = 0; i < kROWS_PER_WARP; ++i)
                    {
                        o[i] = fmaf(ps[(firstRow + i) * pStride + j], value, o[i]);
                    }
                }
#pragma unroll
                for (int32_t i = 0; i < kROWS_PER_WARP; ++i)
                {
                    os[(firstRow + i) * valueDim + c] = o[i];
                }
            }
        }
    }
    __syncthreads();

    T* const outBase = out + bh * shape.seqQ * valueDim;
    for (int32_t e = tid; e < BQ * valueDim; e += kTHREADS)
    {
        int32_t const r = e / valueDim;
        int64_t const qi = q0 + r;
        if (qi < shape.seqQ)
        {
            float const sum = rowSum[r];
            float const value = sum > 0.F ? os[e] / sum : (params.nanToZero ? 0.F : CUDART_NAN_F);
            outBase[qi * valueDim + (e - r * valueDim)] = fromFloat<T>(value);
        }
    }
}

int32_t maxSharedBytes() noexcept
{
    int32_t device = 0;
    int32_t bytes = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    {
        return kDEFAULT_SMEM_BYTES;
    }
    return bytes;
}

template <typename T, int32_t BQ, int32_t BK>
cudaError_t launchTiles(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, size_t smemBytes, cudaStream_t stream)
{
    auto const kernel = attentionKernel<T, BQ, BK>;
    if (smemBytes > static_cast<size_t>(kDEFAULT_SMEM_BYTES))
    {
        cudaError_t const status
            = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int32_t>(smemBytes));
        if (status != cudaSuccess)
        {
            return status;
        }
    }
    int64_t const qTiles = (shape.seqQ + BQ - 1) / BQ;
    int64_t const blocks = qTiles * shape.batch * shape.headsQ;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return cudaErrorInvalidConfiguration;
    }
    kernel<<<static_cast<uint32_t>(blocks), kTHREADS, smemBytes, stream>>>(q, k, v, mask, out, shape, params, qTiles);
    return cudaGetLastError();
}

// ---- the tensor-core variant for 16-bit inputs (sm_80 and newer) ---------------------------
//
// Same algorithm, 64 query rows per block (16 per warp) and 64 keys per tile. Q·Kᵀ runs on the
// tensor cores (16-bit products are exact, accumulation float32). The probabilities are split
// into a sum of kSPLIT 16-bit terms (p = hi + mid + lo), each multiplied by V on the tensor
// cores into a float32 accumulator: the product keeps about 22 (float16) or 24 (bfloat16) bits of
// each probability, the float32 path's accuracy, at two or three times the tensor-core work of a
// fused kernel that rounds p once. Rows belong to warps, so the softmax needs no block barrier.

constexpr int32_t kTC_BQ{64};
constexpr int32_t kTC_BK{64};
constexpr int32_t kTC_ROWS_PER_WARP{16};
constexpr int32_t kFRAGMENT{16};

static_assert(kTC_BQ == kTC_ROWS_PER_WARP * (kTHREADS / kWARP), "each warp owns 16 query rows");

template <typename T>
constexpr int32_t kSPLIT = std::is_same_v<T, __half> ? 2 : 3;

//! Shared-memory layout of the tensor-core kernel; leading dimensions in elements, offsets in
//! bytes (32-byte aligned, as wmma loads and stores require).
struct TensorCoreLayout
{
    int32_t dp;  //!< headDim rounded up to 16 (zero padded)
    int32_t dvp; //!< valueDim rounded up to 16
    int32_t ldq; //!< Q and K rows (16-bit)
    int32_t ldv; //!< V rows (16-bit)
    int32_t lds; //!< scores (float)
    int32_t ldp; //!< probability terms (16-bit)
    int32_t ldo; //!< output accumulator (float)
    int64_t qOffset, kOffset, vOffset, sOffset, pOffset, oOffset, statsOffset, bytes;
};

constexpr int64_t alignTo(int64_t value, int64_t alignment)
{
    return (value + alignment - 1) / alignment * alignment;
}

TensorCoreLayout tensorCoreLayout(int64_t headDim, int64_t valueDim, int32_t split)
{
    TensorCoreLayout l{};
    l.dp = static_cast<int32_t>(alignTo(headDim, kFRAGMENT));
    l.dvp = static_cast<int32_t>(alignTo(valueDim, kFRAGMENT));
    l.ldq = l.dp + 8;
    l.ldv = l.dvp + 8;
    l.lds = kTC_BK + 4;
    l.ldp = kTC_BK + 8;
    l.ldo = l.dvp + 4;
    int64_t at = 0;
    auto const take = [&at](int64_t bytes) {
        int64_t const offset = at;
        at = alignTo(at + bytes, 128);
        return offset;
    };
    l.qOffset = take(int64_t{kTC_BQ} * l.ldq * 2);
    l.kOffset = take(int64_t{kTC_BK} * l.ldq * 2);
    l.vOffset = take(int64_t{kTC_BK} * l.ldv * 2);
    l.sOffset = take(int64_t{kTC_BQ} * l.lds * 4);
    l.pOffset = take(int64_t{split} * kTC_BQ * l.ldp * 2);
    l.oOffset = take(int64_t{kTC_BQ} * l.ldo * 4);
    l.statsOffset = take(int64_t{2} * kTC_BQ * 4);
    l.bytes = at;
    return l;
}

template <typename T>
__global__ void __launch_bounds__(kTHREADS) attentionTensorCoreKernel(T const* __restrict__ q,
    T const* __restrict__ k, T const* __restrict__ v, AttentionMaskView const mask, T* __restrict__ out,
    AttentionShape const shape, AttentionParams const params, int64_t const qTiles, TensorCoreLayout const l)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    namespace wmma = nvcuda::wmma;
    constexpr int32_t kSPLIT_TERMS = kSPLIT<T>;
    extern __shared__ __align__(128) unsigned char raw[];
    T* const qs = reinterpret_cast<T*>(raw + l.qOffset);
    T* const ks = reinterpret_cast<T*>(raw + l.kOffset);
    T* const vs = reinterpret_cast<T*>(raw + l.vOffset);
    float* const ss = reinterpret_cast<float*>(raw + l.sOffset);
    T* const ps = reinterpret_cast<T*>(raw + l.pOffset);
    float* const os = reinterpret_cast<float*>(raw + l.oOffset);
    float* const rowMax = reinterpret_cast<float*>(raw + l.statsOffset);
    float* const rowSum = rowMax + kTC_BQ;

    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int64_t const tile = blockIdx.x % qTiles;
    int64_t const bh = blockIdx.x / qTiles;
    int64_t const b = bh / shape.headsQ;
    int64_t const h = bh % shape.headsQ;
    int64_t const hkv = h / (shape.headsQ / shape.headsKV);
    int64_t const q0 = tile * kTC_BQ;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    int32_t const warp = tid / kWARP;
    int32_t const lane = tid % kWARP;
    T const zero = fromFloat<T>(0.F);

    T const* const qBase = q + bh * shape.seqQ * headDim;
    T const* const kBase = k + (b * shape.headsKV + hkv) * shape.seqK * headDim;
    T const* const vBase = v + (b * shape.headsKV + hkv) * shape.seqK * valueDim;
    int64_t const maskBase = b * mask.stride[0] + h * mask.stride[1];

    for (int32_t e = tid; e < kTC_BQ * l.dp; e += kTHREADS)
    {
        int32_t const r = e / l.dp;
        int32_t const c = e - r * l.dp;
        int64_t const qi = q0 + r;
        qs[r * l.ldq + c] = qi < shape.seqQ && c < headDim ? qBase[qi * headDim + c] : zero;
    }
    for (int32_t e = tid; e < kTC_BQ * l.dvp; e += kTHREADS)
    {
        int32_t const r = e / l.dvp;
        os[r * l.ldo + (e - r * l.dvp)] = 0.F;
    }
    if (tid < kTC_BQ)
    {
        rowMax[tid] = negativeInfinity();
        rowSum[tid] = 0.F;
    }

    int64_t const kEnd = params.causal && q0 + kTC_BQ < shape.seqK ? q0 + kTC_BQ : shape.seqK;
    int32_t const warpRow = warp * kTC_ROWS_PER_WARP;
    for (int64_t k0 = 0; k0 < kEnd; k0 += kTC_BK)
    {
        __syncthreads(); // every warp is done with the previous K and V tiles
        if (params.kTransposed)
        {
            for (int32_t e = tid; e < kTC_BK * l.dp; e += kTHREADS)
            {
                int32_t const c = e / kTC_BK;
                int32_t const r = e - c * kTC_BK;
                int64_t const kj = k0 + r;
                ks[r * l.ldq + c] = kj < shape.seqK && c < headDim ? kBase[c * shape.seqK + kj] : zero;
            }
        }
        else
        {
            for (int32_t e = tid; e < kTC_BK * l.dp; e += kTHREADS)
            {
                int32_t const r = e / l.dp;
                int32_t const c = e - r * l.dp;
                int64_t const kj = k0 + r;
                ks[r * l.ldq + c] = kj < shape.seqK && c < headDim ? kBase[kj * headDim + c] : zero;
            }
        }
        for (int32_t e = tid; e < kTC_BK * l.dvp; e += kTHREADS)
        {
            int32_t const r = e / l.dvp;
            int32_t const c = e - r * l.dvp;
            int64_t const kj = k0 + r;
            vs[r * l.ldv + c] = kj < shape.seqK && c < valueDim ? vBase[kj * valueDim + c] : zero;
        }
        __syncthreads();

        // scores of this warp's 16 rows
        for (int32_t n = 0; n < kTC_BK / kFRAGMENT; ++n)
        {
            wmma::fragment<wmma::accumulator, kFRAGMENT, kFRAGMENT, kFRAGMENT, float> acc;
            wmma::fill_fragment(acc, 0.F);
            for (int32_t kk = 0; kk < l.dp / kFRAGMENT; ++kk)
            {
                wmma::fragment<wmma::matrix_a, kFRAGMENT, kFRAGMENT, kFRAGMENT, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, kFRAGMENT, kFRAGMENT, kFRAGMENT, T, wmma::col_major> bk;
                wmma::load_matrix_sync(a, qs + warpRow * l.ldq + kk * kFRAGMENT, l.ldq);
                wmma::load_matrix_sync(bk, ks + n * kFRAGMENT * l.ldq + kk * kFRAGMENT, l.ldq);
                wmma::mma_sync(acc, a, bk, acc);
            }
            wmma::store_matrix_sync(ss + warpRow * l.lds + n * kFRAGMENT, acc, l.lds, wmma::mem_row_major);
        }
        __syncwarp();

        // online softmax: two lanes per row, 32 keys each
        {
            int32_t const row = warpRow + lane / 2;
            int32_t const c0 = (lane % 2) * (kTC_BK / 2);
            int64_t const qi = q0 + row;
            float* const srow = ss + row * l.lds;
            float tileMax = negativeInfinity();
            for (int32_t j = 0; j < kTC_BK / 2; ++j)
            {
                int32_t const c = c0 + j;
                int64_t const kj = k0 + c;
                float s = srow[c] * params.scale;
                if (params.softcap > 0.F)
                {
                    s = params.softcap * tanhf(s / params.softcap);
                }
                if (kj >= shape.seqK)
                {
                    s = negativeInfinity();
                }
                else
                {
                    if (mask.kind != AttentionMaskKind::kNone && qi < shape.seqQ)
                    {
                        float const m = maskValue(mask, maskBase + qi * mask.stride[2] + kj * mask.stride[3]);
                        s = mask.kind == AttentionMaskKind::kBool ? (m != 0.F ? s : params.maskFill) : s + m;
                    }
                    if (params.causal && kj > qi)
                    {
                        s = negativeInfinity();
                    }
                }
                srow[c] = s;
                tileMax = fmaxf(tileMax, s);
            }
            tileMax = fmaxf(tileMax, __shfl_xor_sync(kFULL_MASK, tileMax, 1));
            float const oldMax = rowMax[row];
            float const newMax = fmaxf(oldMax, tileMax);
            bool const empty = newMax == negativeInfinity();
            float sum = 0.F;
            for (int32_t j = 0; j < kTC_BK / 2; ++j)
            {
                int32_t const c = c0 + j;
                float const p = empty ? 0.F : expf(srow[c] - newMax);
                sum += p;
                float rest = p;
#pragma unroll
                for (int32_t term = 0; term < kSPLIT_TERMS; ++term)
                {
                    T const part = fromFloat<T>(rest);
                    ps[(term * kTC_BQ + row) * l.ldp + c] = part;
                    rest -= toFloat(part);
                }
            }
            sum += __shfl_xor_sync(kFULL_MASK, sum, 1);
            float const alpha = empty ? 1.F : expf(oldMax - newMax);
            if (lane % 2 == 0)
            {
                rowMax[row] = newMax;
                rowSum[row] = rowSum[row] * alpha + sum;
            }
            for (int32_t c = lane % 2; c < l.dvp; c += 2)
            {
                os[row * l.ldo + c] *= alpha;
            }
        }
        __syncwarp();

        // out += P V, P as the sum of its terms
        for (int32_t n = 0; n < l.dvp / kFRAGMENT; ++n)
        {
            wmma::fragment<wmma::accumulator, kFRAGMENT, kFRAGMENT, kFRAGMENT, float> acc;
            float* const tileOut = os + warpRow * l.ldo + n * kFRAGMENT;
            wmma::load_matrix_sync(acc, tileOut, l.ldo, wmma::mem_row_major);
            for (int32_t kk = 0; kk < kTC_BK / kFRAGMENT; ++kk)
            {
                wmma::fragment<wmma::matrix_b, kFRAGMENT, kFRAGMENT, kFRAGMENT, T, wmma::row_major> bv;
                wmma::load_matrix_sync(bv, vs + kk * kFRAGMENT * l.ldv + n * kFRAGMENT, l.ldv);
#pragma unroll
                for (int32_t term = 0; term < kSPLIT_TERMS; ++term)
                {
                    wmma::fragment<wmma::matrix_a, kFRAGMENT, kFRAGMENT, kFRAGMENT, T, wmma::row_major> a;
                    wmma::load_matrix_sync(a, ps + (term * kTC_BQ + warpRow) * l.ldp + kk * kFRAGMENT, l.ldp);
                    wmma::mma_sync(acc, a, bv, acc);
                }
            }
            wmma::store_matrix_sync(tileOut, acc, l.ldo, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncthreads(); // also when no key tile ran: the statistics were set by other warps

    T* const outBase = out + bh * shape.seqQ * valueDim;
    for (int32_t e = lane; e < kTC_ROWS_PER_WARP * valueDim; e += kWARP)
    {
        int32_t const r = warpRow + e / valueDim;
        int32_t const c = e % valueDim;
        int64_t const qi = q0 + r;
        if (qi < shape.seqQ)
        {
            float const sum = rowSum[r];
            float const value = sum > 0.F ? os[r * l.ldo + c] / sum : (params.nanToZero ? 0.F : CUDART_NAN_F);
            outBase[qi * valueDim + c] = fromFloat<T>(value);
        }
    }
#endif
}

bool tensorCoresUsable() noexcept
{
    int32_t device = 0;
    int32_t major = 0;
    return cudaGetDevice(&device) == cudaSuccess
        && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8;
}

template <typename T>
cudaError_t launchTensorCore(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, TensorCoreLayout const& layout, cudaStream_t stream)
{
    auto const kernel = attentionTensorCoreKernel<T>;
    size_t const smemBytes = static_cast<size_t>(layout.bytes);
    if (smemBytes > static_cast<size_t>(kDEFAULT_SMEM_BYTES))
    {
        cudaError_t const status
            = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int32_t>(smemBytes));
        if (status != cudaSuccess)
        {
            return status;
        }
    }
    int64_t const qTiles = (shape.seqQ + kTC_BQ - 1) / kTC_BQ;
    int64_t const blocks = qTiles * shape.batch * shape.headsQ;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return cudaErrorInvalidConfiguration;
    }
    kernel<<<static_cast<uint32_t>(blocks), kTHREADS, smemBytes, stream>>>(
        q, k, v, mask, out, shape, params, qTiles, layout);
    return cudaGetLastError();
}

// ---- the kernels around the cuDNN path -----------------------------------------------------

constexpr int32_t kTRANSPOSE_TILE{32};

template <typename T>
__global__ void transposeKernel(T const* __restrict__ input, T* __restrict__ output, int64_t rows, int64_t cols)
{
    __shared__ T tile[kTRANSPOSE_TILE][kTRANSPOSE_TILE + 1];
    int64_t const matrix = blockIdx.z;
    T const* const in = input + matrix * rows * cols;
    T* const outMatrix = output + matrix * rows * cols;
    int64_t const c = static_cast<int64_t>(blockIdx.x) * kTRANSPOSE_TILE + threadIdx.x;
    for (int32_t i = threadIdx.y; i < kTRANSPOSE_TILE; i += blockDim.y)
    {
        int64_t const r = static_cast<int64_t>(blockIdx.y) * kTRANSPOSE_TILE + i;
        if (r < rows && c < cols)
        {
            tile[i][threadIdx.x] = in[r * cols + c];
        }
    }
    __syncthreads();
    int64_t const outC = static_cast<int64_t>(blockIdx.y) * kTRANSPOSE_TILE + threadIdx.x; // input row
    for (int32_t i = threadIdx.y; i < kTRANSPOSE_TILE; i += blockDim.y)
    {
        int64_t const outR = static_cast<int64_t>(blockIdx.x) * kTRANSPOSE_TILE + i; // input column
        if (outR < cols && outC < rows)
        {
            outMatrix[outR * rows + outC] = tile[threadIdx.x][i];
        }
    }
}

template <typename T>
__global__ void maskToBiasKernel(AttentionMaskView const mask, T* __restrict__ bias, int64_t biasHeads, int64_t seqQ,
    int64_t seqK, int64_t rowStride, int64_t total)
{
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        int64_t const j = e % seqK;
        int64_t const row = e / seqK;
        int64_t const i = row % seqQ;
        int64_t const bh = row / seqQ;
        int64_t const hh = bh % biasHeads;
        int64_t const bb = bh / biasHeads;
        int64_t const offset = bb * mask.stride[0] + hh * mask.stride[1] + i * mask.stride[2] + j * mask.stride[3];
        float const m = maskValue(mask, offset);
        float const value = mask.kind == AttentionMaskKind::kBool ? (m != 0.F ? 0.F : negativeInfinity()) : m;
        bias[row * rowStride + j] = fromFloat<T>(value);
    }
}

__global__ void firstAllowedKernel(AttentionMaskView const mask, int32_t* __restrict__ first, int64_t maskHeads,
    int64_t maskRows, int64_t seqK, int64_t rowsTotal)
{
    int64_t const row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWARP;
    int32_t const lane = static_cast<int32_t>(threadIdx.x % kWARP);
    if (row >= rowsTotal)
    {
        return;
    }
    int64_t const r = row % maskRows;
    int64_t const hh = (row / maskRows) % maskHeads;
    int64_t const bb = row / (maskRows * maskHeads);
    int64_t const base = bb * mask.stride[0] + hh * mask.stride[1] + r * mask.stride[2];
    int64_t found = seqK;
    for (int64_t j0 = 0; j0 < seqK; j0 += kWARP)
    {
        int64_t const j = j0 + lane;
        bool const allowed = j < seqK && !maskBlocks(mask, base + j * mask.stride[3]);
        uint32_t const ballot = __ballot_sync(kFULL_MASK, allowed);
        if (ballot != 0U)
        {
            found = j0 + __ffs(static_cast<int32_t>(ballot)) - 1;
            break;
        }
    }
    if (lane == 0)
    {
        first[row] = static_cast<int32_t>(found);
    }
}

template <typename T>
__global__ void blockedRowsKernel(int32_t const* __restrict__ first, int64_t maskBatch, int64_t maskHeads,
    int64_t maskRows, T* __restrict__ out, AttentionShape const shape, bool causal, bool nanToZero)
{
    int64_t const rows = shape.batch * shape.headsQ * shape.seqQ;
    for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < rows;
         row += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        int64_t const i = row % shape.seqQ;
        int64_t const h = (row / shape.seqQ) % shape.headsQ;
        int64_t const b = row / (shape.seqQ * shape.headsQ);
        int64_t const maskRow = ((maskBatch > 1 ? b : 0) * maskHeads + (maskHeads > 1 ? h : 0)) * maskRows
            + (maskRows > 1 ? i : 0);
        int64_t const allowed = first[maskRow];
        if (allowed >= shape.seqK || (causal && allowed > i))
        {
            T const value = fromFloat<T>(nanToZero ? 0.F : CUDART_NAN_F);
            for (int64_t c = 0; c < shape.valueDim; ++c)
            {
                out[row * shape.valueDim + c] = value;
            }
        }
    }
}

uint32_t gridFor(int64_t work, int32_t threads)
{
    int64_t const blocks = (work + threads - 1) / threads;
    return static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{1} << 20)));
}

} // namespace

bool fallbackAttentionFits(int64_t headDim, int64_t valueDim) noexcept
{
    int64_t const limit = maxSharedBytes();
    return headDim > 0 && valueDim > 0
        && (sharedFloats(32, 32, headDim, valueDim) * 4 <= limit || sharedFloats(16, 16, headDim, valueDim) * 4 <= limit);
}

template <typename T>
cudaError_t launchAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, cudaStream_t stream) noexcept
{
    if (shape.batch < 0 || shape.headsQ <= 0 || shape.headsKV <= 0 || shape.headsQ % shape.headsKV != 0
        || shape.seqQ < 0 || shape.seqK < 0 || shape.headDim <= 0 || shape.valueDim <= 0)
    {
        return cudaErrorInvalidValue;
    }
    if (shape.batch == 0 || shape.seqQ == 0)
    {
        return cudaSuccess;
    }
    int64_t const limit = maxSharedBytes();
    if constexpr (!std::is_same_v<T, float>)
    {
        TensorCoreLayout const layout = tensorCoreLayout(shape.headDim, shape.valueDim, kSPLIT<T>);
        if (layout.bytes <= limit && tensorCoresUsable())
        {
            return launchTensorCore<T>(q, k, v, mask, out, shape, params, layout, stream);
        }
    }
    int64_t const large = sharedFloats(32, 32, shape.headDim, shape.valueDim) * 4;
    if (large <= limit)
    {
        return launchTiles<T, 32, 32>(q, k, v, mask, out, shape, params, static_cast<size_t>(large), stream);
    }
    int64_t const small = sharedFloats(16, 16, shape.headDim, shape.valueDim) * 4;
    if (small <= limit)
    {
        return launchTiles<T, 16, 16>(q, k, v, mask, out, shape, params, static_cast<size_t>(small), stream);
    }
    return cudaErrorInvalidConfiguration;
}

template <typename T>
cudaError_t launchTransposeKeys(
    T const* input, T* output, int64_t matrices, int64_t rows, int64_t cols, cudaStream_t stream) noexcept
{
    if (matrices == 0 || rows == 0 || cols == 0)
    {
        return cudaSuccess;
    }
    if (matrices > 65535 || (rows + kTRANSPOSE_TILE - 1) / kTRANSPOSE_TILE > 65535)
    {
        return cudaErrorInvalidConfiguration;
    }
    dim3 const grid(static_cast<uint32_t>((cols + kTRANSPOSE_TILE - 1) / kTRANSPOSE_TILE),
        static_cast<uint32_t>((rows + kTRANSPOSE_TILE - 1) / kTRANSPOSE_TILE), static_cast<uint32_t>(matrices));
    transposeKernel<T><<<grid, dim3(kTRANSPOSE_TILE, 8), 0, stream>>>(input, output, rows, cols);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launchMaskToBias(AttentionMaskView const& mask, T* bias, int64_t biasBatch, int64_t biasHeads,
    int64_t seqQ, int64_t seqK, int64_t rowStride, cudaStream_t stream) noexcept
{
    int64_t const total = biasBatch * biasHeads * seqQ * seqK;
    if (total == 0)
    {
        return cudaSuccess;
    }
    maskToBiasKernel<T><<<gridFor(total, 256), 256, 0, stream>>>(mask, bias, biasHeads, seqQ, seqK, rowStride, total);
    return cudaGetLastError();
}

cudaError_t launchFirstAllowedKey(AttentionMaskView const& mask, int32_t* first, int64_t maskBatch,
    int64_t maskHeads, int64_t maskRows, int64_t seqK, cudaStream_t stream) noexcept
{
    int64_t const rows = maskBatch * maskHeads * maskRows;
    if (rows == 0)
    {
        return cudaSuccess;
    }
    int64_t const blocks = (rows * kWARP + kTHREADS - 1) / kTHREADS;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return cudaErrorInvalidConfiguration;
    }
    firstAllowedKernel<<<static_cast<uint32_t>(blocks), kTHREADS, 0, stream>>>(
        mask, first, maskHeads, maskRows, seqK, rows);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launchBlockedRows(int32_t const* first, int64_t maskBatch, int64_t maskHeads, int64_t maskRows, T* out,
    AttentionShape const& shape, bool causal, bool nanToZero, cudaStream_t stream) noexcept
{
    int64_t const rows = shape.batch * shape.headsQ * shape.seqQ;
    if (rows == 0)
    {
        return cudaSuccess;
    }
    blockedRowsKernel<T><<<gridFor(rows, 256), 256, 0, stream>>>(
        first, maskBatch, maskHeads, maskRows, out, shape, causal, nanToZero);
    return cudaGetLastError();
}

#define GRAPHFIX_INSTANTIATE_ATTENTION(T)                                                                              \
    template cudaError_t launchAttention<T>(T const*, T const*, T const*, AttentionMaskView const&, T*,                \
        AttentionShape const&, AttentionParams const&, cudaStream_t) noexcept;                                         \
    template cudaError_t launchTransposeKeys<T>(T const*, T*, int64_t, int64_t, int64_t, cudaStream_t) noexcept;       \
    template cudaError_t launchMaskToBias<T>(                                                                          \
        AttentionMaskView const&, T*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t) noexcept;             \
    template cudaError_t launchBlockedRows<T>(                                                                         \
        int32_t const*, int64_t, int64_t, int64_t, T*, AttentionShape const&, bool, bool, cudaStream_t) noexcept;

GRAPHFIX_INSTANTIATE_ATTENTION(float)
GRAPHFIX_INSTANTIATE_ATTENTION(__half)
GRAPHFIX_INSTANTIATE_ATTENTION(__nv_bfloat16)

} // namespace plugin
} // namespace graphfix
