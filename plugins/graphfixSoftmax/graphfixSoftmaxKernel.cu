/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Softmax kernels, float32 math with max subtraction, ONNX Softmax-13 semantics.
 *
 * Layouts: the tensor is [outer, n, inner] with the softmax over n.
 *  - inner == 1 (the attention case): rows of n contiguous elements. A row is read in 16-byte
 *    chunks aligned in memory; the chunk that holds a row's first (last) element may also hold
 *    elements of the neighbouring rows, which are masked, so rows of any length and alignment take
 *    the vector path as long as input and output share their alignment modulo 16 bytes.
 *    - up to 32 * 8 chunks: one group of 1..32 lanes of a warp per row, the row in registers;
 *    - up to 4096 chunks: one block per row, the row in registers;
 *    - longer rows, or input and output misaligned to each other: one block per row in three
 *      passes (max, sum, write), the second and third reading the row back from L2.
 *  - inner > 1: one block per [outer index, 32 inner columns]; warps split the axis, lanes walk
 *    the contiguous inner dimension.
 * The output is rounded once from float32 (round to nearest even). float32 outputs divide by the
 * sum (correctly rounded) and accumulate the sum with compensation; 16-bit outputs multiply by its
 * reciprocal, whose error stays far below their rounding.
 */
#include "graphfixSoftmaxKernel.h"

#include "../common/cudaConversions.cuh"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kCHUNK_BYTES{16};
constexpr int32_t kWARP_SIZE{32};
constexpr int32_t kWARP_ROWS_THREADS{128};
constexpr int32_t kMAX_WARP_CHUNKS_PER_LANE{8};
constexpr int32_t kMIN_LANES_FOR_CHUNKS{4}; // 1 or 2 lanes per row take one chunk each
constexpr int32_t kMAX_BLOCK_CHUNKS{4096};
constexpr int32_t kLOOP_THREADS{512};
constexpr int32_t kLOOP_UNROLL{4};
constexpr int32_t kSTRIDED_COLUMNS{32};
constexpr int32_t kSTRIDED_SPLIT{8};
constexpr int64_t kMAX_BLOCKS{int64_t{1} << 30};
constexpr uint32_t kFULL_MASK{0xffffffffU};

template <typename T>
constexpr int32_t kVECTOR_ELEMENTS = kCHUNK_BYTES / static_cast<int32_t>(sizeof(T));

//! Whether the register kernels read a row's partial first and last chunks with whole 16-byte loads
//! (masked afterwards) and write them in aligned pieces, rather than element by element. Only for
//! 16-bit types: their 729-long rows were 15% slower than a copy with the element-wise path, while
//! float32 rows already run at copy speed and the extra code costs their warp kernels 8 registers
//! (notes/plugin_perf.md, run 6).
template <typename T>
constexpr bool kWHOLE_EDGE_CHUNKS = sizeof(T) < 4;

using conversions::fromFloat;
using conversions::toFloat;

//! A float32 sum carried with its rounding error (only for float32 outputs).
struct PartialSum
{
    float hi;
    float lo;
};

//! Knuth's TwoSum: s + e == a + b exactly.
__device__ __forceinline__ void twoSum(float a, float b, float& s, float& e)
{
    s = a + b;
    float const bp = s - a;
    e = (a - (s - bp)) + (b - bp);
}

template <bool kCompensated>
__device__ __forceinline__ void accumulate(PartialSum& acc, float x)
{
    if constexpr (kCompensated)
    {
        float s;
        float e;
        twoSum(acc.hi, x, s, e);
        acc.hi = s;
        acc.lo += e;
    }
    else
    {
        acc.hi += x;
    }
}

template <bool kCompensated>
__device__ __forceinline__ void combine(PartialSum& acc, PartialSum const& other)
{
    if constexpr (kCompensated)
    {
        float s;
        float e;
        twoSum(acc.hi, other.hi, s, e);
        acc.hi = s;
        acc.lo = acc.lo + other.lo + e;
    }
    else
    {
        acc.hi += other.hi;
    }
}

template <int32_t kWIDTH>
__device__ __forceinline__ float groupMax(float x)
{
#pragma unroll
    for (int32_t offset = kWIDTH / 2; offset > 0; offset /= 2)
    {
        x = fmaxf(x, __shfl_xor_sync(kFULL_MASK, x, offset));
    }
    return x;
}

template <int32_t kWIDTH, bool kCompensated>
__device__ __forceinline__ PartialSum groupSum(PartialSum x)
{
#pragma unroll
    for (int32_t offset = kWIDTH / 2; offset > 0; offset /= 2)
    {
        PartialSum const other{
            __shfl_xor_sync(kFULL_MASK, x.hi, offset), kCompensated ? __shfl_xor_sync(kFULL_MASK, x.lo, offset) : 0.F};
        combine<kCompensated>(x, other);
    }
    return x;
}

//! Max over the block; every warp reduces the per-warp partials itself, so one barrier suffices.
__device__ __forceinline__ float blockMax(float x, float* scratch)
{
    int32_t const lane = static_cast<int32_t>(threadIdx.x) % kWARP_SIZE;
    int32_t const warp = static_cast<int32_t>(threadIdx.x) / kWARP_SIZE;
    int32_t const nbWarps = static_cast<int32_t>(blockDim.x) / kWARP_SIZE;
    x = groupMax<kWARP_SIZE>(x);
    if (lane == 0)
    {
        scratch[warp] = x;
    }
    __syncthreads();
    x = lane < nbWarps ? scratch[lane] : -INFINITY;
    return groupMax<kWARP_SIZE>(x);
}

template <bool kCompensated>
__device__ __forceinline__ PartialSum blockSum(PartialSum x, float* scratchHi, float* scratchLo)
{
    int32_t const lane = static_cast<int32_t>(threadIdx.x) % kWARP_SIZE;
    int32_t const warp = static_cast<int32_t>(threadIdx.x) / kWARP_SIZE;
    int32_t const nbWarps = static_cast<int32_t>(blockDim.x) / kWARP_SIZE;
    x = groupSum<kWARP_SIZE, kCompensated>(x);
    if (lane == 0)
    {
        scratchHi[warp] = x.hi;
        scratchLo[warp] = x.lo;
    }
    __syncthreads();
    x = lane < nbWarps ? PartialSum{scratchHi[lane], scratchLo[lane]} : PartialSum{0.F, 0.F};
    return groupSum<kWARP_SIZE, kCompensated>(x);
}

//! Elements before the row's first element in its aligned 16-byte chunk.
template <typename T, int32_t kE>
__device__ __forceinline__ int32_t chunkLead(T const* row)
{
    if constexpr (kE == 1)
    {
        return 0;
    }
    else
    {
        return static_cast<int32_t>((reinterpret_cast<uintptr_t>(row) % kCHUNK_BYTES) / sizeof(T));
    }
}

template <typename T, int32_t kE>
__device__ __forceinline__ void loadChunk(T const* p, float (&v)[kE])
{
    if constexpr (kE == 1)
    {
        v[0] = toFloat(p[0]);
    }
    else
    {
        static_assert(kE * sizeof(T) == kCHUNK_BYTES, "a chunk is 16 bytes");
        alignas(kCHUNK_BYTES) T elements[kE];
        *reinterpret_cast<uint4*>(elements) = __ldg(reinterpret_cast<uint4 const*>(p));
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            v[j] = toFloat(elements[j]);
        }
    }
}

//! Rounds a chunk's kE values to T (round to nearest even) and packs them into a 16-byte word;
//! 16-bit types convert pairs with one instruction (cvt.rn.{f16,bf16}x2.f32).
template <typename T, int32_t kE>
__device__ __forceinline__ uint4 packChunk(float const (&v)[kE])
{
    static_assert(kE * sizeof(T) == kCHUNK_BYTES, "a chunk is 16 bytes");
    uint32_t w[4];
#pragma unroll
    for (int32_t i = 0; i < 4; ++i)
    {
        if constexpr (std::is_same_v<T, float>)
        {
            w[i] = __float_as_uint(v[i]);
        }
        else if constexpr (std::is_same_v<T, __half>)
        {
            __half2 const pair = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
            w[i] = *reinterpret_cast<uint32_t const*>(&pair);
        }
        else
        {
            __nv_bfloat162 const pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
            w[i] = *reinterpret_cast<uint32_t const*>(&pair);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T, int32_t kE>
__device__ __forceinline__ void storeChunk(T* p, float const (&v)[kE])
{
    if constexpr (kE == 1)
    {
        p[0] = fromFloat<T>(v[0]);
    }
    else
    {
        *reinterpret_cast<uint4*>(p) = packChunk<T, kE>(v);
    }
}

//! 32-bit word `index` (0..3) of a chunk, selected without indexing a register array.
__device__ __forceinline__ uint32_t chunkWord(uint4 const& w, int32_t index)
{
    uint32_t const even = (index & 1) != 0 ? w.y : w.x;
    uint32_t const odd = (index & 1) != 0 ? w.w : w.z;
    return (index & 2) != 0 ? odd : even;
}

//! Stores bytes [a, b) of the chunk `w` to the 16-byte aligned address `base` (0 <= a < b <= 16,
//! multiples of kELEMENT_BYTES, not the whole chunk) in naturally aligned pieces of 2, 4 and 8
//! bytes: at most three when a or b is a chunk boundary, as for the first and last chunk of a
//! misaligned row.
template <int32_t kELEMENT_BYTES>
__device__ __forceinline__ void storeChunkBytes(void* base, uint4 const& w, int32_t a, int32_t b)
{
    char* const p = static_cast<char*>(base);
    auto const store2 = [&](int32_t at) {
        uint32_t const word = chunkWord(w, at >> 2);
        *reinterpret_cast<uint16_t*>(p + at) = static_cast<uint16_t>((at & 2) != 0 ? word >> 16 : word);
    };
    auto const store4 = [&](int32_t at) { *reinterpret_cast<uint32_t*>(p + at) = chunkWord(w, at >> 2); };
    auto const store8 = [&](int32_t at) {
        *reinterpret_cast<uint2*>(p + at) = (at & 8) != 0 ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
    };
    // Up to the next 16-byte boundary: each piece aligns `a` to twice its size.
    if constexpr (kELEMENT_BYTES < 4)
    {
        if ((a & 2) != 0 && a + 2 <= b)
        {
            store2(a);
            a += 2;
        }
    }
    if ((a & 4) != 0 && a + 4 <= b)
    {
        store4(a);
        a += 4;
    }
    if ((a & 8) != 0 && a + 8 <= b)
    {
        store8(a);
        a += 8;
    }
    // What is left starts aligned to the largest piece that fits in it.
    if (a + 8 <= b)
    {
        store8(a);
        a += 8;
    }
    if (a + 4 <= b)
    {
        store4(a);
        a += 4;
    }
    if constexpr (kELEMENT_BYTES < 4)
    {
        if (a + 2 <= b)
        {
            store2(a);
        }
    }
}

//! Loads chunks first, first + stride, ... of a row of n elements into registers. Chunk c holds
//! row elements [c * kE - lead, c * kE - lead + kE); elements outside the row read as -inf.
template <typename T, int32_t kE, int32_t kK, typename I>
__device__ __forceinline__ void loadRowChunks(T const* row, I n, int32_t lead, I first, I stride, float (&v)[kK][kE])
{
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
        I const start = (first + k * stride) * kE - lead;
        if (start >= 0 && start + kE <= n)
        {
            loadChunk<T, kE>(row + start, v[k]);
        }
        else
        {
#pragma unroll
            for (int32_t j = 0; j < kE; ++j)
            {
                I const index = start + j;
                v[k][j] = (index >= 0 && index < n) ? toFloat(row[index]) : -INFINITY;
            }
        }
    }
}

//! Loads the same chunks as loadRowChunks as raw 16-byte words, so that a thread issues all its
//! loads before the first conversion waits on one (measured: up to 25% faster than converting as
//! each chunk arrives; notes/plugin_perf.md). A chunk that holds only part of the row is still read
//! with one aligned 16-byte load when it lies inside the tensor [begin, end): its other elements
//! belong to the neighbouring rows, and maskRowChunks sets them to -inf after conversion. Only the
//! tensor's own first and last chunk, when the tensor is misaligned, are read element by element.
template <typename T, int32_t kE, int32_t kK>
__device__ __forceinline__ void loadRowRaw(T const* row, int32_t n, int32_t lead, int32_t first, int32_t stride,
    T const* begin, T const* end, uint4 (&raw)[kK])
{
    static_assert(kE * sizeof(T) == kCHUNK_BYTES, "raw fragments hold 16-byte chunks");
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
        int32_t const start = (first + k * stride) * kE - lead;
        T const* const chunk = row + start;
        bool const overlaps = start < n && start + kE > 0;
        if ((start >= 0 && start + kE <= n)
            || (kWHOLE_EDGE_CHUNKS<T> && overlaps && chunk >= begin && chunk + kE <= end))
        {
            raw[k] = __ldg(reinterpret_cast<uint4 const*>(chunk));
        }
        else if (kWHOLE_EDGE_CHUNKS<T> && !overlaps)
        {
            alignas(kCHUNK_BYTES) T elements[kE];
#pragma unroll
            for (int32_t j = 0; j < kE; ++j)
            {
                elements[j] = fromFloat<T>(-INFINITY);
            }
            raw[k] = *reinterpret_cast<uint4 const*>(elements);
        }
        else
        {
            alignas(kCHUNK_BYTES) T elements[kE];
#pragma unroll
            for (int32_t j = 0; j < kE; ++j)
            {
                int32_t const index = start + j;
                elements[j] = (index >= 0 && index < n) ? row[index] : fromFloat<T>(-INFINITY);
            }
            raw[k] = *reinterpret_cast<uint4 const*>(elements);
        }
    }
}

template <typename T, int32_t kE, int32_t kK>
__device__ __forceinline__ void fillRaw(uint4 (&raw)[kK])
{
    alignas(kCHUNK_BYTES) T elements[kE];
#pragma unroll
    for (int32_t j = 0; j < kE; ++j)
    {
        elements[j] = fromFloat<T>(-INFINITY);
    }
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
        raw[k] = *reinterpret_cast<uint4 const*>(elements);
    }
}

template <typename T, int32_t kE, int32_t kK>
__device__ __forceinline__ void convertRaw(uint4 const (&raw)[kK], float (&v)[kK][kE])
{
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
        alignas(kCHUNK_BYTES) T elements[kE];
        *reinterpret_cast<uint4*>(elements) = raw[k];
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            v[k][j] = toFloat(elements[j]);
        }
    }
}

//! Sets the elements outside the row of the chunks that loadRowRaw read whole to -inf.
template <typename T, int32_t kE, int32_t kK>
__device__ __forceinline__ void maskRowChunks(
    float (&v)[kK][kE], int32_t n, int32_t lead, int32_t first, int32_t stride)
{
    // Without kWHOLE_EDGE_CHUNKS, loadRowRaw already set the elements outside the row to -inf.
    if constexpr (kWHOLE_EDGE_CHUNKS<T>)
    {
#pragma unroll
        for (int32_t k = 0; k < kK; ++k)
        {
            int32_t const start = (first + k * stride) * kE - lead;
            if (start < 0 || start + kE > n)
            {
#pragma unroll
                for (int32_t j = 0; j < kE; ++j)
                {
                    // index < 0 or index >= n
                    if (static_cast<uint32_t>(start + j) >= static_cast<uint32_t>(n))
                    {
                        v[k][j] = -INFINITY;
                    }
                }
            }
        }
    }
}

//! Stores what loadRowChunks loaded, skipping elements outside the row: whole chunks with one
//! 16-byte store, a chunk that holds part of the row in at most three aligned pieces.
template <typename T, int32_t kE, int32_t kK, typename I>
__device__ __forceinline__ void storeRowChunks(T* row, I n, int32_t lead, I first, I stride, float const (&v)[kK][kE])
{
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
        I const start = (first + k * stride) * kE - lead;
        if constexpr (kE == 1 || !kWHOLE_EDGE_CHUNKS<T>)
        {
            if (start >= 0 && start + kE <= n)
            {
                storeChunk<T, kE>(row + start, v[k]);
            }
            else
            {
#pragma unroll
                for (int32_t j = 0; j < kE; ++j)
                {
                    I const index = start + j;
                    if (index >= 0 && index < n)
                    {
                        row[index] = fromFloat<T>(v[k][j]);
                    }
                }
            }
        }
        else
        {
            uint4 const packed = packChunk<T, kE>(v[k]);
            if (start >= 0 && start + kE <= n)
            {
                *reinterpret_cast<uint4*>(row + start) = packed;
            }
            else if (start < n && start + kE > 0)
            {
                auto const a = static_cast<int32_t>(start < 0 ? -start : I{0}) * static_cast<int32_t>(sizeof(T));
                auto const b = static_cast<int32_t>(n - start < kE ? n - start : I{kE}) * static_cast<int32_t>(sizeof(T));
                storeChunkBytes<static_cast<int32_t>(sizeof(T))>(row + start, packed, a, b);
            }
        }
    }
}

//! exp(x - max). For float32 inputs x - max is rounded, an error of up to |x - max| * 2^-24 in the
//! exponent; TwoSum recovers the rounding error and one FMA applies it (exp(d + lo) ~ e + e * lo).
//! 16-bit inputs need no correction: their outputs round far more coarsely.
template <typename T>
__device__ __forceinline__ float expShifted(float x, float max)
{
    float const d = x - max;
    float const e = expf(d);
    if constexpr (std::is_same_v<T, float>)
    {
        float const bp = d - x;
        float const lo = (x - (d - bp)) + (-max - bp);
        return isfinite(lo) ? fmaf(e, lo, e) : e;
    }
    else
    {
        return e;
    }
}

//! e / sum. float32: correctly rounded through Markstein's correction of e * RN(1 / sum) (exact
//! residual by FMA), three operations instead of a division. 16-bit outputs: e * (1 / sum).
template <typename T>
__device__ __forceinline__ float normalize(float e, float sum, float inverse)
{
    if constexpr (std::is_same_v<T, float>)
    {
        float const q = e * inverse;
        return fmaf(fmaf(-q, sum, e), inverse, q);
    }
    else
    {
        return e * inverse;
    }
}

template <int32_t kK, int32_t kE>
__device__ __forceinline__ float fragmentMax(float const (&v)[kK][kE])
{
    float m = -INFINITY;
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            m = fmaxf(m, v[k][j]);
        }
    }
    return m;
}

//! Replaces each value by exp(value - max) and adds it to `sum`.
template <typename T, int32_t kK, int32_t kE>
__device__ __forceinline__ void fragmentExp(float (&v)[kK][kE], float max, PartialSum& sum)
{
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            v[k][j] = expShifted<T>(v[k][j], max);
            accumulate<std::is_same_v<T, float>>(sum, v[k][j]);
        }
    }
}

//! Replaces each value by exp(value - max) / sum.
template <typename T, int32_t kK, int32_t kE>
__device__ __forceinline__ void fragmentExpNormalize(float (&v)[kK][kE], float max, float sum)
{
    float const inverse = 1.F / sum;
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            v[k][j] = normalize<T>(expShifted<T>(v[k][j], max), sum, inverse);
        }
    }
}

template <typename T, int32_t kK, int32_t kE>
__device__ __forceinline__ void fragmentNormalize(float (&v)[kK][kE], float sum)
{
    float const inverse = 1.F / sum;
#pragma unroll
    for (int32_t k = 0; k < kK; ++k)
    {
#pragma unroll
        for (int32_t j = 0; j < kE; ++j)
        {
            v[k][j] = normalize<T>(v[k][j], sum, inverse);
        }
    }
}

//! Rows held in the registers of kLANES lanes each; kWARP_ROWS_THREADS / kLANES rows per block.
template <typename T, int32_t kLANES, int32_t kK>
__global__ void __launch_bounds__(kWARP_ROWS_THREADS)
    softmaxWarpRowsKernel(T const* __restrict__ input, T* __restrict__ output, int64_t rows, int32_t n)
{
    constexpr int32_t kE = kVECTOR_ELEMENTS<T>;
    constexpr int32_t kROWS_PER_BLOCK = kWARP_ROWS_THREADS / kLANES;
    constexpr bool kCOMPENSATED = std::is_same_v<T, float>;
    int32_t const lane = static_cast<int32_t>(threadIdx.x) % kLANES;
    int32_t const group = static_cast<int32_t>(threadIdx.x) / kLANES;

    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kROWS_PER_BLOCK; base < rows;
         base += static_cast<int64_t>(gridDim.x) * kROWS_PER_BLOCK)
    {
        int64_t const row = base + group;
        bool const active = row < rows;
        T const* rowIn = input + (active ? row : 0) * n;
        int32_t const lead = chunkLead<T, kE>(rowIn);
        // All of a lane's loads are issued before the first conversion.
        uint4 raw[kK];
        if (active)
        {
            loadRowRaw<T, kE, kK>(rowIn, n, lead, lane, kLANES, input, input + rows * n, raw);
        }
        else
        {
            fillRaw<T, kE, kK>(raw);
        }
        float v[kK][kE];
        convertRaw<T, kE, kK>(raw, v);
        maskRowChunks<T, kE, kK>(v, n, lead, lane, kLANES);
        float const max = groupMax<kLANES>(fragmentMax(v));
        PartialSum sum{0.F, 0.F};
        fragmentExp<T>(v, max, sum);
        sum = groupSum<kLANES, kCOMPENSATED>(sum);
        fragmentNormalize<T>(v, sum.hi + sum.lo);
        if (active)
        {
            storeRowChunks<T, kE, kK, int32_t>(output + row * n, n, lead, lane, kLANES, v);
        }
    }
}

//! One row per block, held in registers: kK chunks per thread.
template <typename T, int32_t kK, int32_t kMAX_THREADS>
__global__ void __launch_bounds__(kMAX_THREADS)
    softmaxBlockRowsKernel(T const* __restrict__ input, T* __restrict__ output, int64_t rows, int32_t n)
{
    constexpr int32_t kE = kVECTOR_ELEMENTS<T>;
    constexpr bool kCOMPENSATED = std::is_same_v<T, float>;
    __shared__ float scratchMax[kWARP_SIZE];
    __shared__ float scratchHi[kWARP_SIZE];
    __shared__ float scratchLo[kWARP_SIZE];
    auto const first = static_cast<int32_t>(threadIdx.x);
    auto const stride = static_cast<int32_t>(blockDim.x);

    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    {
        T const* rowIn = input + row * n;
        int32_t const lead = chunkLead<T, kE>(rowIn);
        uint4 raw[kK];
        loadRowRaw<T, kE, kK>(rowIn, n, lead, first, stride, input, input + rows * n, raw);
        float v[kK][kE];
        convertRaw<T, kE, kK>(raw, v);
        maskRowChunks<T, kE, kK>(v, n, lead, first, stride);
        float const max = blockMax(fragmentMax(v), scratchMax);
        PartialSum sum{0.F, 0.F};
        fragmentExp<T>(v, max, sum);
        sum = blockSum<kCOMPENSATED>(sum, scratchHi, scratchLo);
        fragmentNormalize<T>(v, sum.hi + sum.lo);
        storeRowChunks<T, kE, kK, int32_t>(output + row * n, n, lead, first, stride, v);
    }
}

//! One row per block in three passes over the row (max, sum, write); kE is 1 when input and
//! output are misaligned to each other.
template <typename T, int32_t kE>
__global__ void __launch_bounds__(kLOOP_THREADS)
    softmaxLoopRowsKernel(T const* __restrict__ input, T* __restrict__ output, int64_t rows, int64_t n)
{
    constexpr bool kCOMPENSATED = std::is_same_v<T, float>;
    __shared__ float scratchMax[kWARP_SIZE];
    __shared__ float scratchHi[kWARP_SIZE];
    __shared__ float scratchLo[kWARP_SIZE];
    int64_t const stride = blockDim.x;
    int64_t const step = stride * kLOOP_UNROLL;

    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    {
        T const* rowIn = input + row * n;
        T* rowOut = output + row * n;
        int32_t const lead = chunkLead<T, kE>(rowIn);
        int64_t const chunks = (lead + n + kE - 1) / kE;

        float max = -INFINITY;
        for (int64_t first = threadIdx.x; first < chunks; first += step)
        {
            float v[kLOOP_UNROLL][kE];
            loadRowChunks<T, kE, kLOOP_UNROLL, int64_t>(rowIn, n, lead, first, stride, v);
            max = fmaxf(max, fragmentMax(v));
        }
        max = blockMax(max, scratchMax);

        PartialSum sum{0.F, 0.F};
        for (int64_t first = threadIdx.x; first < chunks; first += step)
        {
            float v[kLOOP_UNROLL][kE];
            loadRowChunks<T, kE, kLOOP_UNROLL, int64_t>(rowIn, n, lead, first, stride, v);
            fragmentExp<T>(v, max, sum);
        }
        sum = blockSum<kCOMPENSATED>(sum, scratchHi, scratchLo);
        float const total = sum.hi + sum.lo;

        for (int64_t first = threadIdx.x; first < chunks; first += step)
        {
            float v[kLOOP_UNROLL][kE];
            loadRowChunks<T, kE, kLOOP_UNROLL, int64_t>(rowIn, n, lead, first, stride, v);
            fragmentExpNormalize<T>(v, max, total);
            storeRowChunks<T, kE, kLOOP_UNROLL, int64_t>(rowOut, n, lead, first, stride, v);
        }
    }
}

//! inner > 1: a block takes kSTRIDED_COLUMNS adjacent inner columns of one outer index; its
//! kSTRIDED_SPLIT warps split the axis and combine through shared memory.
template <typename T>
__global__ void __launch_bounds__(kSTRIDED_COLUMNS* kSTRIDED_SPLIT) softmaxStridedKernel(
    T const* __restrict__ input, T* __restrict__ output, int64_t outer, int64_t n, int64_t inner)
{
    constexpr bool kCOMPENSATED = std::is_same_v<T, float>;
    __shared__ float scratchA[kSTRIDED_SPLIT][kSTRIDED_COLUMNS + 1];
    __shared__ float scratchB[kSTRIDED_SPLIT][kSTRIDED_COLUMNS + 1];
    int32_t const column = static_cast<int32_t>(threadIdx.x) % kSTRIDED_COLUMNS;
    int32_t const part = static_cast<int32_t>(threadIdx.x) / kSTRIDED_COLUMNS;
    int64_t const tiles = (inner + kSTRIDED_COLUMNS - 1) / kSTRIDED_COLUMNS;

    for (int64_t block = blockIdx.x; block < outer * tiles; block += gridDim.x)
    {
        int64_t const o = block / tiles;
        int64_t const c = (block % tiles) * kSTRIDED_COLUMNS + column;
        bool const active = c < inner;
        int64_t const offset = o * n * inner + c;
        T const* in = input + offset;
        T* out = output + offset;

        float max = -INFINITY;
        if (active)
        {
#pragma unroll 4
            for (int64_t i = part; i < n; i += kSTRIDED_SPLIT)
            {
                max = fmaxf(max, toFloat(in[i * inner]));
            }
        }
        scratchA[part][column] = max;
        __syncthreads();
#pragma unroll
        for (int32_t p = 0; p < kSTRIDED_SPLIT; ++p)
        {
            max = fmaxf(max, scratchA[p][column]);
        }

        PartialSum sum{0.F, 0.F};
        if (active)
        {
#pragma unroll 4
            for (int64_t i = part; i < n; i += kSTRIDED_SPLIT)
            {
                accumulate<kCOMPENSATED>(sum, expShifted<T>(toFloat(in[i * inner]), max));
            }
        }
        __syncthreads();
        scratchA[part][column] = sum.hi;
        scratchB[part][column] = sum.lo;
        __syncthreads();
        PartialSum total{0.F, 0.F};
#pragma unroll
        for (int32_t p = 0; p < kSTRIDED_SPLIT; ++p)
        {
            combine<kCOMPENSATED>(total, PartialSum{scratchA[p][column], scratchB[p][column]});
        }
        float const denominator = total.hi + total.lo;
        float const inverse = 1.F / denominator;
        if (active)
        {
#pragma unroll 4
            for (int64_t i = part; i < n; i += kSTRIDED_SPLIT)
            {
                float const e = expShifted<T>(toFloat(in[i * inner]), max);
                out[i * inner] = fromFloat<T>(normalize<T>(e, denominator, inverse));
            }
        }
        __syncthreads();
    }
}

int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

int32_t maxBlockThreads(int32_t chunksPerThread)
{
    return chunksPerThread >= 8 ? 512 : 1024;
}

template <typename T, int32_t kLANES, int32_t kK>
cudaError_t launchWarpRowsKernel(
    SoftmaxPlan const& plan, T const* input, T* output, SoftmaxShape const& shape, cudaStream_t stream)
{
    softmaxWarpRowsKernel<T, kLANES, kK><<<static_cast<uint32_t>(plan.blocks), kWARP_ROWS_THREADS, 0, stream>>>(
        input, output, shape.outer, static_cast<int32_t>(shape.axisLength));
    return cudaSuccess;
}

template <typename T, int32_t kK, int32_t kMAX_THREADS>
cudaError_t launchBlockRowsKernel(
    SoftmaxPlan const& plan, T const* input, T* output, SoftmaxShape const& shape, cudaStream_t stream)
{
    softmaxBlockRowsKernel<T, kK, kMAX_THREADS>
        <<<static_cast<uint32_t>(plan.blocks), static_cast<uint32_t>(plan.threadsPerBlock), 0, stream>>>(
            input, output, shape.outer, static_cast<int32_t>(shape.axisLength));
    return cudaSuccess;
}

template <typename T, int32_t kLANES>
cudaError_t launchWarpRows(
    SoftmaxPlan const& plan, T const* input, T* output, SoftmaxShape const& shape, cudaStream_t stream)
{
    if constexpr (kLANES < kMIN_LANES_FOR_CHUNKS)
    {
        return plan.chunksPerThread == 1 ? launchWarpRowsKernel<T, kLANES, 1>(plan, input, output, shape, stream)
                                         : cudaErrorInvalidConfiguration;
    }
    else
    {
        switch (plan.chunksPerThread)
        {
        case 1: return launchWarpRowsKernel<T, kLANES, 1>(plan, input, output, shape, stream);
        case 2: return launchWarpRowsKernel<T, kLANES, 2>(plan, input, output, shape, stream);
        case 3: return launchWarpRowsKernel<T, kLANES, 3>(plan, input, output, shape, stream);
        case 4: return launchWarpRowsKernel<T, kLANES, 4>(plan, input, output, shape, stream);
        case 5: return launchWarpRowsKernel<T, kLANES, 5>(plan, input, output, shape, stream);
        case 6: return launchWarpRowsKernel<T, kLANES, 6>(plan, input, output, shape, stream);
        case 7: return launchWarpRowsKernel<T, kLANES, 7>(plan, input, output, shape, stream);
        case 8: return launchWarpRowsKernel<T, kLANES, 8>(plan, input, output, shape, stream);
        default: return cudaErrorInvalidConfiguration;
        }
    }
}

template <typename T>
cudaError_t launchPlan(SoftmaxPlan const& plan, T const* input, T* output, SoftmaxShape const& shape,
    cudaStream_t stream)
{
    dim3 const grid(static_cast<uint32_t>(plan.blocks));
    dim3 const block(static_cast<uint32_t>(plan.threadsPerBlock));
    int64_t const rows = shape.outer;
    int64_t const n = shape.axisLength;
    switch (plan.path)
    {
    case SoftmaxPath::kEmpty: return cudaSuccess;
    case SoftmaxPath::kWarpRows:
        switch (plan.lanesPerRow)
        {
        case 1: return launchWarpRows<T, 1>(plan, input, output, shape, stream);
        case 2: return launchWarpRows<T, 2>(plan, input, output, shape, stream);
        case 4: return launchWarpRows<T, 4>(plan, input, output, shape, stream);
        case 8: return launchWarpRows<T, 8>(plan, input, output, shape, stream);
        case 16: return launchWarpRows<T, 16>(plan, input, output, shape, stream);
        case 32: return launchWarpRows<T, 32>(plan, input, output, shape, stream);
        default: return cudaErrorInvalidConfiguration;
        }
    case SoftmaxPath::kBlockRows:
        switch (plan.chunksPerThread)
        {
        case 1: return launchBlockRowsKernel<T, 1, 1024>(plan, input, output, shape, stream);
        case 2: return launchBlockRowsKernel<T, 2, 1024>(plan, input, output, shape, stream);
        case 4: return launchBlockRowsKernel<T, 4, 1024>(plan, input, output, shape, stream);
        case 8: return launchBlockRowsKernel<T, 8, 512>(plan, input, output, shape, stream);
        default: return cudaErrorInvalidConfiguration;
        }
    case SoftmaxPath::kLoopRows:
        if (plan.vectorElements == 1)
        {
            softmaxLoopRowsKernel<T, 1><<<grid, block, 0, stream>>>(input, output, rows, n);
        }
        else
        {
            softmaxLoopRowsKernel<T, kVECTOR_ELEMENTS<T>><<<grid, block, 0, stream>>>(input, output, rows, n);
        }
        return cudaSuccess;
    case SoftmaxPath::kStrided:
        softmaxStridedKernel<T><<<grid, block, 0, stream>>>(input, output, shape.outer, n, shape.inner);
        return cudaSuccess;
    }
    return cudaErrorInvalidConfiguration;
}

} // namespace

SoftmaxPlan planSoftmax(SoftmaxShape const& shape, int32_t elementSize, void const* input, void const* output,
    SoftmaxTuning const& tuning) noexcept
{
    SoftmaxPlan plan;
    if (shape.outer <= 0 || shape.axisLength <= 0 || shape.inner <= 0)
    {
        return plan;
    }
    int64_t const n = shape.axisLength;
    if (shape.inner > 1)
    {
        plan.path = SoftmaxPath::kStrided;
        plan.threadsPerBlock = kSTRIDED_COLUMNS * kSTRIDED_SPLIT;
        plan.blocks = std::min(shape.outer * ceilDiv(shape.inner, kSTRIDED_COLUMNS), kMAX_BLOCKS);
        return plan;
    }

    auto const inAddress = reinterpret_cast<uintptr_t>(input);
    auto const outAddress = reinterpret_cast<uintptr_t>(output);
    bool const vectorizable = inAddress % kCHUNK_BYTES == outAddress % kCHUNK_BYTES;
    if (!vectorizable)
    {
        plan.path = SoftmaxPath::kLoopRows;
        plan.vectorElements = 1;
        plan.threadsPerBlock = kLOOP_THREADS;
        plan.blocks = std::min(shape.outer, kMAX_BLOCKS);
        return plan;
    }

    int32_t const e = kCHUNK_BYTES / elementSize;
    plan.vectorElements = e;
    bool const rowsAligned = inAddress % kCHUNK_BYTES == 0 && n % e == 0;
    // Chunks a row can touch: a misaligned row straddles one more chunk.
    int64_t const maxChunks = rowsAligned ? n / e : ceilDiv(n + e - 1, e);
    // Defaults from the tuning sweeps in notes/plugin_perf.md (H200).
    bool const wide = elementSize >= 4;
    int32_t const maxWarpChunks = std::clamp(
        tuning.maxWarpChunksPerLane > 0 ? tuning.maxWarpChunksPerLane : (wide ? 8 : 4), 1, kMAX_WARP_CHUNKS_PER_LANE);
    int32_t const laneChunks = std::clamp(
        tuning.warpChunksPerLane > 0 ? tuning.warpChunksPerLane : (wide ? 3 : 6), 1, kMAX_WARP_CHUNKS_PER_LANE);
    int32_t const blockChunks = tuning.blockChunksPerThread > 0 ? tuning.blockChunksPerThread : (wide ? 8 : 4);

    if (maxChunks <= kWARP_SIZE * maxWarpChunks)
    {
        // The fewest lanes that hold the row in at most laneChunks chunks each.
        int32_t lanes = 1;
        while (lanes < kWARP_SIZE
            && (ceilDiv(maxChunks, lanes) > laneChunks || (lanes < kMIN_LANES_FOR_CHUNKS && maxChunks > lanes)))
        {
            lanes *= 2;
        }
        plan.path = SoftmaxPath::kWarpRows;
        plan.lanesPerRow = lanes;
        plan.chunksPerThread = static_cast<int32_t>(ceilDiv(maxChunks, lanes));
        plan.threadsPerBlock = kWARP_ROWS_THREADS;
        plan.blocks = std::min(ceilDiv(shape.outer, kWARP_ROWS_THREADS / lanes), kMAX_BLOCKS);
        return plan;
    }
    if (maxChunks <= kMAX_BLOCK_CHUNKS)
    {
        for (int32_t const k : {blockChunks, 1, 2, 4, 8})
        {
            if (k != 1 && k != 2 && k != 4 && k != 8)
            {
                continue;
            }
            int64_t const threads = ceilDiv(ceilDiv(maxChunks, k), kWARP_SIZE) * kWARP_SIZE;
            if (threads <= maxBlockThreads(k))
            {
                plan.path = SoftmaxPath::kBlockRows;
                plan.chunksPerThread = k;
                plan.lanesPerRow = static_cast<int32_t>(threads);
                plan.threadsPerBlock = static_cast<int32_t>(threads);
                plan.blocks = std::min(shape.outer, kMAX_BLOCKS);
                return plan;
            }
        }
    }
    plan.path = SoftmaxPath::kLoopRows;
    plan.lanesPerRow = kLOOP_THREADS;
    plan.threadsPerBlock = kLOOP_THREADS;
    plan.blocks = std::min(shape.outer, kMAX_BLOCKS);
    return plan;
}

template <typename T>
cudaError_t launchSoftmax(T const* input, T* output, SoftmaxShape const& shape, cudaStream_t stream,
    SoftmaxTuning const& tuning) noexcept
{
    SoftmaxPlan const plan = planSoftmax(shape, static_cast<int32_t>(sizeof(T)), input, output, tuning);
    if (plan.path == SoftmaxPath::kEmpty)
    {
        return cudaSuccess;
    }
    if (input == nullptr || output == nullptr)
    {
        return cudaErrorInvalidDevicePointer;
    }
    cudaError_t const status = launchPlan<T>(plan, input, output, shape, stream);
    if (status != cudaSuccess)
    {
        return status;
    }
    return cudaGetLastError();
}

template cudaError_t launchSoftmax<float>(
    float const*, float*, SoftmaxShape const&, cudaStream_t, SoftmaxTuning const&) noexcept;
template cudaError_t launchSoftmax<__half>(
    __half const*, __half*, SoftmaxShape const&, cudaStream_t, SoftmaxTuning const&) noexcept;
template cudaError_t launchSoftmax<__nv_bfloat16>(
    __nv_bfloat16 const*, __nv_bfloat16*, SoftmaxShape const&, cudaStream_t, SoftmaxTuning const&) noexcept;

} // namespace plugin
} // namespace graphfix
