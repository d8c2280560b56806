/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The Hopper attention kernels for __nv_bfloat16 (graphfixAttentionHopper.cuh; sm_90a only).
 */
#include "graphfixAttentionHopper.cuh"

namespace graphfix
{
namespace plugin
{

template cudaError_t prepareHopperAttention<__nv_bfloat16>(HopperPlan const&) noexcept;
template cudaError_t launchHopperAttention<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, AttentionMaskView const&,
    __nv_bfloat16*, AttentionShape const&, AttentionParams const&, HopperPlan const&, HopperHalfValues const&,
    cudaStream_t) noexcept;

} // namespace plugin
} // namespace graphfix
