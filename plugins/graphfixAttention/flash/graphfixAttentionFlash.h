/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixAttention's fast own kernels, FlashAttention-2 style, on the tensor cores through
 * mma.sync (sm_80 and newer): what runs without cuDNN, for float32, for softcap, for masks cuDNN
 * cannot take. Nothing here knows TensorRT.
 *
 *  - float16 / bfloat16: mma.sync m16n8k16 with float32 accumulation; float16 rounds the
 *    probabilities once before P·V, as cuDNN and FlashAttention do (the row sums are taken before
 *    rounding); bfloat16 splits them into two terms (p = hi + lo, 16 bits instead of 8: 2x the
 *    P·V tensor work) so that its error stays at or below cuDNN SDPA's;
 *  - float32: mma.sync m16n8k8 on TF32 with 3xTF32 split products (a = hi + lo;
 *    hi·hi + hi·lo + lo·hi, each 8- or 16-term step summed into a zeroed accumulator and added in
 *    float32), float32-level accuracy for both products.
 *
 * Both: blocks of 4 warps, 64 query rows (16 per warp), 64 keys per tile, K and V tiles
 * loaded with cp.async while the previous product runs, online softmax in float32 registers,
 * every feature of the node contract (grouped heads, causal, bool/additive masks broadcast to
 * [B, Hq, S, T], softcap, mask_fill, nan_to_zero). K must be given as [.., T, D] rows (the plugin
 * transposes a k_transposed K into its workspace first). Head dimensions are padded in shared
 * memory to the next of 32, 64, 80, 96, 128, 160, 192, 256 (where the tiles fit the GPU's
 * opt-in shared memory: every width on sm_90; on sm_80 all but float32 above 192).
 */
#ifndef GRAPHFIX_ATTENTION_FLASH_H
#define GRAPHFIX_ATTENTION_FLASH_H

#include "../graphfixAttentionTypes.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace graphfix
{
namespace plugin
{

enum class FlashKernel : int32_t
{
    kNone = 0,   //!< the shape needs the fallback kernel (launchAttention)
    kMma16 = 1,  //!< float16 / bfloat16, mma.sync m16n8k16
    kTf32x3 = 2, //!< float32, mma.sync m16n8k8 TF32 with 3xTF32 split products
};

//! What planFlashAttention chose, and why not when it chose kNone.
struct FlashPlan
{
    FlashKernel kernel{FlashKernel::kNone};
    int32_t paddedDim{0};   //!< D and Dv padded to this in shared memory
    int32_t blockRows{0};   //!< query rows per block
    int32_t blockKeys{0};   //!< keys per tile
    int32_t sharedBytes{0}; //!< dynamic shared memory per block
    char const* reason{""}; //!< why kNone
};

//! The flash kernel for `shape` with elements of `elementBytes` (4: float32, 2: float16/bfloat16)
//! on a device with `maxSharedBytes` of opt-in shared memory per block and compute capability
//! `computeMajor` (0: unknown, planned as for sm_80+). Pure host logic.
FlashPlan planFlashAttention(
    AttentionShape const& shape, int32_t elementBytes, int64_t maxSharedBytes, int32_t computeMajor) noexcept;

//! Sets the kernel's shared-memory limit for `plan` (once per plan, outside any stream capture).
template <typename T>
cudaError_t prepareFlashAttention(FlashPlan const& plan) noexcept;

//! Runs the planned kernel: out = softmax(mask(softcap(scale * Q Kᵀ))) V. q, k, v and out must be
//! 16-byte aligned (cudaErrorMisalignedAddress otherwise) and K in [.., T, D] rows
//! (params.kTransposed must be false). Allocation-free and capture-safe.
template <typename T>
cudaError_t launchFlashAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, FlashPlan const& plan, cudaStream_t stream) noexcept;

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_FLASH_H
