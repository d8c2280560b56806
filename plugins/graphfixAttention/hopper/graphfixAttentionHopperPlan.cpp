/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * planHopperAttention: whether the Hopper kernel (graphfixAttentionHopper.cuh) runs a shape (host
 * logic only), and the stand-ins for a build without sm_90a.
 */
#include "graphfixAttentionHopper.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kHOPPER_DIMS[]{32, 64, 80, 96, 128, 160, 192, 256};
//! The float32 kernels' head dims: tf32 steps are 8 wide, so 72 needs no padding; above 72 the
//! wide-head kernel (32-key tiles, one stage and a staging buffer) takes 96 and 128, since two
//! stages of 64-key tiles would not fit; above 128 the same kernel with one warpgroup of 64 rows
//! and 16-key tiles takes 192 (160 padded) and 256 (graphfixAttentionHopperFloat.cu).
constexpr int32_t kHOPPER_TF32_DIMS[]{32, 64, 72, 96, 128, 192, 256};
constexpr int32_t kHOPPER_TF32_WIDEST_LONG{72};
constexpr int32_t kHOPPER_TF32_WIDEST_TWO_GROUPS{128};

#if CUDART_VERSION >= 12000
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, cuuint64_t const*,
    cuuint64_t const*, cuuint32_t const*, cuuint32_t const*, CUtensorMapInterleave, CUtensorMapSwizzle,
    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

//! The driver's cuTensorMapEncodeTiled, looked up once (nullptr where the driver has none).
EncodeTiled tensorMapEncoder() noexcept
{
    static EncodeTiled const encoder = []() -> EncodeTiled {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
        cudaError_t const status
            = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
#else
        cudaError_t const status = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
        if (status != cudaSuccess || found != cudaDriverEntryPointSuccess)
        {
            cudaGetLastError();
            return nullptr;
        }
        return reinterpret_cast<EncodeTiled>(function);
    }();
    return encoder;
}

//! One matrix [heads, rows, cols] (16-bit, row-major) as {8, rows, cols / 8, heads}, boxes of
//! {8, boxRows, paddedDim / 8, 1}.
bool encodeChunkMajor(EncodeTiled encode, CUtensorMap& map, void const* data, int64_t heads, int64_t rows,
    int64_t cols, int32_t boxRows, int32_t paddedDim) noexcept
{
    if (cols % 8 != 0 || cols > paddedDim || rows <= 0 || heads <= 0 || boxRows > 256 || paddedDim / 8 > 256)
    {
        return false;
    }
    cuuint64_t const dims[4]{8, static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(cols / 8),
        static_cast<cuuint64_t>(heads)};
    cuuint64_t const strides[3]{static_cast<cuuint64_t>(cols * 2), 16, static_cast<cuuint64_t>(rows * cols * 2)};
    cuuint32_t const box[4]{8, static_cast<cuuint32_t>(boxRows), static_cast<cuuint32_t>(paddedDim / 8), 1};
    cuuint32_t const elementStrides[4]{1, 1, 1, 1};
    return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(data), dims, strides, box,
               elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        == CUDA_SUCCESS;
}

//! One matrix [heads, rows, cols] (16-bit, row-major) as {cols, rows, heads}, boxes of {64,
//! boxRows, 1} with the 128-byte swizzle (64 elements are the swizzle's 128-byte row), read
//! paddedDim / 64 times a tile. Refused where a box would lie wholly past the columns.
bool encodeSwizzled(EncodeTiled encode, CUtensorMap& map, void const* data, int64_t heads, int64_t rows,
    int64_t cols, int32_t boxRows, int32_t paddedDim) noexcept
{
    if (cols % 8 != 0 || cols > paddedDim || paddedDim % 64 != 0 || cols <= paddedDim - 64 || rows <= 0 || heads <= 0
        || boxRows > 256)
    {
        return false;
    }
    cuuint64_t const dims[3]{
        static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(heads)};
    cuuint64_t const strides[2]{static_cast<cuuint64_t>(cols * 2), static_cast<cuuint64_t>(rows * cols * 2)};
    cuuint32_t const box[3]{64, static_cast<cuuint32_t>(boxRows), 1};
    cuuint32_t const elementStrides[3]{1, 1, 1};
    return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(data), dims, strides, box,
               elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        == CUDA_SUCCESS;
}
#endif

} // namespace

bool encodeHopperMaps(HopperMaps& maps, void const* q, void const* k, void const* v, AttentionShape const& shape,
    HopperPlan const& plan, int32_t keys, bool swizzle128) noexcept
{
#if CUDART_VERSION >= 12000
    EncodeTiled const encode = tensorMapEncoder();
    auto const encodeOne = swizzle128 ? encodeSwizzled : encodeChunkMajor;
    return encode != nullptr && plan.keys != 0
        && encodeOne(encode, maps.q, q, shape.batch * shape.headsQ, shape.seqQ, shape.headDim, plan.blockRows,
            plan.paddedDim)
        && encodeOne(encode, maps.k, k, shape.batch * shape.headsKV, shape.seqK, shape.headDim, keys, plan.paddedDim)
        && encodeOne(
            encode, maps.v, v, shape.batch * shape.headsKV, shape.seqK, shape.valueDim, keys, plan.paddedDim);
#else
    static_cast<void>(maps), static_cast<void>(q), static_cast<void>(k), static_cast<void>(v);
    static_cast<void>(shape), static_cast<void>(plan), static_cast<void>(keys), static_cast<void>(swizzle128);
    return false;
#endif
}

bool hopperAttentionBuilt() noexcept
{
#ifdef GRAPHFIX_WITH_HOPPER
    return true;
#else
    return false;
#endif
}

HopperPlan planHopperAttention(AttentionShape const& shape, int32_t elementBytes, int64_t maxSharedBytes,
    int32_t computeMajor, int32_t computeMinor) noexcept
{
    HopperPlan plan;
    if (!hopperAttentionBuilt())
    {
        plan.reason = "not built for sm_90a";
        return plan;
    }
    if (computeMajor != 9 || computeMinor != 0)
    {
        plan.reason = "not an sm_90 GPU";
        return plan;
    }
    int64_t const widest = std::max(shape.headDim, shape.valueDim);
    if (elementBytes == 4)
    {
        // float32: 3xTF32; Q hi/lo (128 rows) and two stages of K and Vᵀ hi/lo (64 keys each) up to
        // head dim 72
        if (shape.headDim % 4 != 0 || shape.valueDim % 4 != 0)
        {
            plan.reason = "head dimensions not multiples of 4";
            return plan;
        }
        for (int32_t const padded : kHOPPER_TF32_DIMS)
        {
            if (widest <= padded)
            {
                plan.paddedDim = padded;
                break;
            }
        }
        if (plan.paddedDim == 0)
        {
            plan.reason = "float32 head dimensions above 256";
            return plan;
        }
        // above 128: one warpgroup of 64 rows, 16-key tiles (Q hi/lo of 128 rows would be 256 KB)
        bool const widest = plan.paddedDim > kHOPPER_TF32_WIDEST_TWO_GROUPS;
        plan.blockRows = widest ? kHOPPER_ROWS / 2 : kHOPPER_ROWS;
        bool const wide = plan.paddedDim > kHOPPER_TF32_WIDEST_LONG;
        // above 72: Q hi/lo, one stage of K and Vᵀ hi/lo and the staging buffer for the next raw K
        // and Vᵀ (32 keys each; 16 above 128)
        plan.keys = widest ? kHOPPER_TF32_WIDEST_KEYS : wide ? kHOPPER_TF32_WIDE_KEYS : kHOPPER_KEYS;
        plan.sharedBytes = (2 * plan.blockRows + (wide ? 6 : 8) * plan.keys) * plan.paddedDim * elementBytes;
        if (plan.sharedBytes > maxSharedBytes)
        {
            plan.keys = 0;
            plan.reason = "the Hopper kernel's tiles need more shared memory than this GPU has";
            return plan;
        }
        if (wide)
        {
            return plan;
        }
        // every key in at most two tiles (SDXL's cross-attention, 77 keys): the persistent
        // short-key kernel, with a third Q buffer for the next query tile (224 KB at D = 64)
        int32_t const shortBytes = (3 * plan.blockRows + 8 * plan.keys) * plan.paddedDim * elementBytes;
        if (shape.seqK <= 2 * plan.keys && plan.paddedDim <= 64 && shortBytes <= maxSharedBytes)
        {
            plan.shortKeys = true;
            plan.sharedBytes = shortBytes;
        }
        return plan;
    }
    if (elementBytes != 2)
    {
        plan.reason = "not a 16-bit or float32 type";
        return plan;
    }
    if (shape.headDim % 8 != 0 || shape.valueDim % 8 != 0)
    {
        plan.reason = "head dimensions not multiples of 8";
        return plan;
    }
    for (int32_t const padded : kHOPPER_DIMS)
    {
        if (widest <= padded)
        {
            plan.paddedDim = padded;
            break;
        }
    }
    if (plan.paddedDim == 0)
    {
        plan.reason = "head dimensions above 256";
        return plan;
    }
    plan.keys = kHOPPER_KEYS;
    plan.blockRows = kHOPPER_ROWS;
    plan.sharedBytes = (plan.blockRows + 4 * plan.keys) * plan.paddedDim * elementBytes;
    if (plan.sharedBytes > maxSharedBytes)
    {
        plan.keys = 0;
        plan.reason = "the Hopper kernel's tiles need more shared memory than this GPU has";
        return plan;
    }
    // the warp-specialised kernel (shapes without mask and softcap): Q and two stages each of K
    // and V (128-key tiles; 64 at padded head dim 256, where O takes 128 registers a thread),
    // and 1 KB to align the tiles for the 128-byte swizzle (kHOPPER_VARIANT_SWIZZLE). At padded
    // head dim 128 only with a value dim of 128: the GPU tests ran it at D 128 and D 64 (Q and K
    // zero-filled past D) with Dv 128, never with V zero-filled past a narrower Dv. At 64 and 256
    // only swizzled (every 64-column box holding a column: D and Dv above 192 at 256) and over
    // more than one key tile: without the swizzle, at 64, it was 5-50% slower than the two-block
    // 64-key kernel on every row but SDXL self float16, most where the keys fit one tile (SDXL
    // cross, 77 keys: +45%).
    int32_t const producerKeys = plan.paddedDim == 256 ? 64 : 128;
    int32_t const producerBytes
        = (plan.blockRows + 4 * producerKeys) * plan.paddedDim * elementBytes + kHOPPER_SWIZZLE_ALIGN;
    bool const producerShape = plan.paddedDim == 128 ? shape.valueDim == 128
        : plan.paddedDim == 64                      ? shape.seqK > producerKeys
        : plan.paddedDim == 256 ? shape.headDim > 192 && shape.valueDim > 192 && shape.seqK > producerKeys
                                : false;
    if (producerShape && producerBytes <= maxSharedBytes)
    {
        plan.producerStages = 2;
        plan.producerKeys = producerKeys;
        plan.producerSharedBytes = producerBytes;
    }
    // every key in at most two 64-key tiles (SDXL's cross-attention, 77 keys) at padded head dims
    // 32 and 64: the persistent short-key kernel for shapes without mask and softcap, both tiles of
    // K and V and kHOPPER_SHORT_Q_STAGES stages of each warpgroup's 64 Q rows (80 KB at 64, two
    // blocks per SM), and at 64 1 KB to align the tiles for the 128-byte swizzle
    // (kHOPPER_VARIANT_SWIZZLE)
    int32_t const shortBytes = (2 * kHOPPER_SHORT_TILES * plan.keys + kHOPPER_SHORT_Q_STAGES * plan.blockRows)
            * plan.paddedDim * elementBytes
        + (plan.paddedDim == 64 ? kHOPPER_SWIZZLE_ALIGN : 0);
    if (shape.seqK <= kHOPPER_SHORT_TILES * plan.keys && plan.paddedDim <= 64 && shortBytes <= maxSharedBytes)
    {
        plan.shortSharedBytes = shortBytes;
    }
    return plan;
}

#ifndef GRAPHFIX_WITH_HOPPER

template <typename T>
cudaError_t prepareHopperAttention(HopperPlan const& /*plan*/) noexcept
{
    return cudaErrorNotSupported;
}

template <typename T>
cudaError_t launchHopperAttention(T const*, T const*, T const*, AttentionMaskView const&, T*, AttentionShape const&,
    AttentionParams const&, HopperPlan const&, HopperHalfValues const&, cudaStream_t) noexcept
{
    return cudaErrorNotSupported;
}

cudaError_t prepareHopperTf32Attention(HopperPlan const& /*plan*/) noexcept
{
    return cudaErrorNotSupported;
}

cudaError_t launchHopperTf32Attention(float const*, float const*, float const*, AttentionMaskView const&, float*,
    AttentionShape const&, AttentionParams const&, HopperPlan const&, cudaStream_t) noexcept
{
    return cudaErrorNotSupported;
}

template cudaError_t prepareHopperAttention<__half>(HopperPlan const&) noexcept;
template cudaError_t prepareHopperAttention<__nv_bfloat16>(HopperPlan const&) noexcept;
template cudaError_t launchHopperAttention<__half>(__half const*, __half const*, __half const*,
    AttentionMaskView const&, __half*, AttentionShape const&, AttentionParams const&, HopperPlan const&,
    HopperHalfValues const&, cudaStream_t) noexcept;
template cudaError_t launchHopperAttention<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*,
    __nv_bfloat16 const*, AttentionMaskView const&, __nv_bfloat16*, AttentionShape const&, AttentionParams const&,
    HopperPlan const&, HopperHalfValues const&, cudaStream_t) noexcept;

#endif

} // namespace plugin
} // namespace graphfix
