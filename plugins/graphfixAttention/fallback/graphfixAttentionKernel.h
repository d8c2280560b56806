/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixAttention's fallback kernel and the small kernels around the cuDNN path, behind
 * templated launchers that know no TensorRT type (graphfixAttentionTypes.h has what they take).
 *
 *  - launchAttention: the fallback kernel, flash-style (online softmax, float32 scores,
 *    statistics and accumulation), covering every feature of the node contract for every head
 *    dimension and GPU the flash kernels (graphfixAttentionFlash.h) cannot take;
 *  - launchTransposeKeys, launchMaskToBias, launchFirstAllowedKey, launchBlockedRows: the small
 *    kernels around the cuDNN path (graphfixAttentionCudnn.h), which takes K as [T, D] rows, an
 *    additive bias of Q's type, and gives unspecified values for rows whose keys are all blocked.
 */
#ifndef GRAPHFIX_ATTENTION_KERNEL_H
#define GRAPHFIX_ATTENTION_KERNEL_H

#include "../graphfixAttentionTypes.h"

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace graphfix
{
namespace plugin
{

//! The fallback kernel: out = softmax(mask(softcap(scale * Q Kᵀ))) V with float32 scores,
//! statistics and accumulation. T is float, __half or __nv_bfloat16. Returns
//! cudaErrorInvalidConfiguration when the head dimensions need more shared memory than the
//! device has (headDim + valueDim above about 1500 floats on a 227 KiB device).
template <typename T>
cudaError_t launchAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, cudaStream_t stream) noexcept;

//! Whether launchAttention can run these head dimensions on the current device.
bool fallbackAttentionFits(int64_t headDim, int64_t valueDim) noexcept;

//! [matrices, rows, cols] -> [matrices, cols, rows].
template <typename T>
cudaError_t launchTransposeKeys(
    T const* input, T* output, int64_t matrices, int64_t rows, int64_t cols, cudaStream_t stream) noexcept;

//! Writes the mask as an additive bias of type T, [biasBatch, biasHeads, seqQ, rowStride]
//! (columns seqK..rowStride-1 untouched), where biasBatch is 1 or batch and biasHeads 1 or headsQ.
//! A bool mask becomes 0 / -inf (use only when maskFill is -inf).
template <typename T>
cudaError_t launchMaskToBias(AttentionMaskView const& mask, T* bias, int64_t biasBatch, int64_t biasHeads,
    int64_t seqQ, int64_t seqK, int64_t rowStride, cudaStream_t stream) noexcept;

//! The rows of the mask at its own broadcast shape [maskBatch, maskHeads, maskRows] (each 1 where
//! the mask's stride is 0): the index of the first key it does not block (-inf additive, false
//! bool when maskFill is -inf), or seqK.
cudaError_t launchFirstAllowedKey(AttentionMaskView const& mask, int32_t* first, int64_t maskBatch,
    int64_t maskHeads, int64_t maskRows, int64_t seqK, cudaStream_t stream) noexcept;

//! Sets to NaN (0 with nanToZero) every output row all of whose keys are blocked, from
//! launchFirstAllowedKey's result and the causal rule.
template <typename T>
cudaError_t launchBlockedRows(int32_t const* first, int64_t maskBatch, int64_t maskHeads, int64_t maskRows, T* out,
    AttentionShape const& shape, bool causal, bool nanToZero, cudaStream_t stream) noexcept;

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_KERNEL_H
