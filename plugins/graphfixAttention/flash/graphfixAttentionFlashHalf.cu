/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The flash kernels for float16 (graphfixAttentionFlash.cuh).
 */
#include "graphfixAttentionFlash.cuh"

namespace graphfix
{
namespace plugin
{

template cudaError_t prepareFlashAttention<__half>(FlashPlan const&) noexcept;
template cudaError_t launchFlashAttention<__half>(__half const*, __half const*, __half const*, AttentionMaskView const&, __half*,
    AttentionShape const&, AttentionParams const&, FlashPlan const&, cudaStream_t) noexcept;

} // namespace plugin
} // namespace graphfix
