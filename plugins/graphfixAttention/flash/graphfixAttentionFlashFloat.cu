/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The flash kernels for float32 (3xTF32) (graphfixAttentionFlash.cuh).
 */
#include "graphfixAttentionFlash.cuh"

namespace graphfix
{
namespace plugin
{

template cudaError_t prepareFlashAttention<float>(FlashPlan const&) noexcept;
template cudaError_t launchFlashAttention<float>(float const*, float const*, float const*, AttentionMaskView const&, float*,
    AttentionShape const&, AttentionParams const&, FlashPlan const&, cudaStream_t) noexcept;

} // namespace plugin
} // namespace graphfix
