/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The Hopper attention kernels for __half (graphfixAttentionHopper.cuh; sm_90a only).
 */
#include "graphfixAttentionHopper.cuh"

namespace graphfix
{
namespace plugin
{

template cudaError_t prepareHopperAttention<__half>(HopperPlan const&) noexcept;
template cudaError_t launchHopperAttention<__half>(__half const*, __half const*, __half const*, AttentionMaskView const&,
    __half*, AttentionShape const&, AttentionParams const&, HopperPlan const&, HopperHalfValues const&,
    cudaStream_t) noexcept;

} // namespace plugin
} // namespace graphfix
