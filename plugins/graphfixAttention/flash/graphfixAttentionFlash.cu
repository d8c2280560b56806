/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * planFlashAttention: which flash kernel runs a shape (host logic only; the kernels are in
 * graphfixAttentionFlash.cuh).
 */
#include "graphfixAttentionFlash.cuh"

namespace graphfix
{
namespace plugin
{

FlashPlan planFlashAttention(
    AttentionShape const& shape, int32_t elementBytes, int64_t maxSharedBytes, int32_t computeMajor) noexcept
{
    FlashPlan plan;
    int64_t const multiple = elementBytes == 4 ? 4 : 8; // 16-byte rows for cp.async
    int64_t const widest = std::max(shape.headDim, shape.valueDim);
    if (computeMajor != 0 && computeMajor < 8)
    {
        plan.reason = "the flash kernels need sm_80 or newer";
        return plan;
    }
    if (shape.headDim % multiple != 0 || shape.valueDim % multiple != 0)
    {
        plan.reason = elementBytes == 4 ? "head dimensions not multiples of 4" : "head dimensions not multiples of 8";
        return plan;
    }
    if (widest > kPADDED_DIMS[std::size(kPADDED_DIMS) - 1])
    {
        plan.reason = "head dimensions above 256";
        return plan;
    }
    for (int32_t const padded : kPADDED_DIMS)
    {
        if (widest <= padded)
        {
            plan.paddedDim = padded;
            break;
        }
    }
    plan.blockRows = blockRowsFor(elementBytes, plan.paddedDim);
    plan.blockKeys = kBLOCK_KEYS;
    plan.sharedBytes = sharedBytes(elementBytes, plan.paddedDim);
    if (elementBytes == 4 && plan.paddedDim == 128 && plan.sharedBytes > maxSharedBytes)
    {
        // float32, D = 128, a GPU of 99 KB per block (sm_86, sm_89): Q and K rows of 132 floats
        plan.sharedBytes = compactSharedBytesF32(plan.paddedDim);
    }
    if (plan.sharedBytes > maxSharedBytes)
    {
        plan.reason = "the flash kernel's tiles need more shared memory than this GPU has";
        return plan;
    }
    plan.kernel = elementBytes == 4 ? FlashKernel::kTf32x3 : FlashKernel::kMma16;
    return plan;
}

} // namespace plugin
} // namespace graphfix
