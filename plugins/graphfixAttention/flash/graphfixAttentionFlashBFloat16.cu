/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The flash kernels for bfloat16 (graphfixAttentionFlash.cuh).
 */
#include "graphfixAttentionFlash.cuh"

namespace graphfix
{
namespace plugin
{

template cudaError_t prepareFlashAttention<__nv_bfloat16>(FlashPlan const&) noexcept;
template cudaError_t launchFlashAttention<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, AttentionMaskView const&, __nv_bfloat16*,
    AttentionShape const&, AttentionParams const&, FlashPlan const&, cudaStream_t) noexcept;

} // namespace plugin
} // namespace graphfix
