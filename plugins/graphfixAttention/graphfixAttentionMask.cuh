/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Reading GraphfixAttention's mask on the device, shared by its kernels.
 */
#ifndef GRAPHFIX_ATTENTION_MASK_CUH
#define GRAPHFIX_ATTENTION_MASK_CUH

#include "graphfixAttentionKernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

namespace graphfix
{
namespace plugin
{
namespace mask_access
{

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

//! The score after the mask: a bool mask keeps it or replaces it by maskFill, an additive one adds.
__device__ __forceinline__ float applyMask(AttentionMaskView const& mask, int64_t offset, float score, float maskFill)
{
    float const m = maskValue(mask, offset);
    return mask.kind == AttentionMaskKind::kBool ? (m != 0.F ? score : maskFill) : score + m;
}

} // namespace mask_access
} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_MASK_CUH
