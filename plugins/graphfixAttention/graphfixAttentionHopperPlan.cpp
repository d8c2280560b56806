/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * planHopperAttention: whether the Hopper kernel (graphfixAttentionHopper.cuh) runs a shape (host
 * logic only), and the stand-ins for a build without sm_90a.
 */
#include "graphfixAttentionHopper.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kHOPPER_DIMS[]{32, 64, 80, 96, 128};
//! The float32 kernel's head dims: tf32 steps are 8 wide, so 72 needs no padding; 80 and above
//! would not fit its shared memory (graphfixAttentionHopperFloat.cu).
constexpr int32_t kHOPPER_TF32_DIMS[]{32, 64, 72};

} // namespace

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
        // float32: 3xTF32; Q hi/lo (128 rows) and two stages of K and Vᵀ hi/lo (64 keys each)
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
            plan.reason = "float32 head dimensions above 72";
            return plan;
        }
        plan.keys = kHOPPER_KEYS;
        plan.blockRows = kHOPPER_ROWS;
        plan.sharedBytes = (2 * plan.blockRows + 8 * plan.keys) * plan.paddedDim * elementBytes;
        if (plan.sharedBytes > maxSharedBytes)
        {
            plan.keys = 0;
            plan.reason = "the Hopper kernel's tiles need more shared memory than this GPU has";
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
        plan.reason = "head dimensions above 128";
        return plan;
    }
    plan.keys = kHOPPER_KEYS;
    plan.blockRows = kHOPPER_ROWS;
    plan.sharedBytes = (plan.blockRows + 4 * plan.keys) * plan.paddedDim * elementBytes;
    if (plan.sharedBytes > maxSharedBytes)
    {
        plan.keys = 0;
        plan.reason = "the Hopper kernel's tiles need more shared memory than this GPU has";
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
    AttentionParams const&, HopperPlan const&, cudaStream_t) noexcept
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
    cudaStream_t) noexcept;
template cudaError_t launchHopperAttention<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*,
    __nv_bfloat16 const*, AttentionMaskView const&, __nv_bfloat16*, AttentionShape const&, AttentionParams const&,
    HopperPlan const&, cudaStream_t) noexcept;

#endif

} // namespace plugin
} // namespace graphfix
