/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The softmax CUDA kernels behind a templated launcher. Nothing here knows TensorRT: the plugin
 * (graphfixSoftmaxPlugin.h) turns tensor descriptors into a SoftmaxShape and calls launchSoftmax.
 */
#ifndef GRAPHFIX_SOFTMAX_KERNEL_H
#define GRAPHFIX_SOFTMAX_KERNEL_H

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace graphfix
{
namespace plugin
{

//! A contiguous tensor seen as [outer, axisLength, inner]; softmax runs over axisLength.
struct SoftmaxShape
{
    int64_t outer;
    int64_t axisLength;
    int64_t inner;
};

//! Knobs of the launch heuristic, exposed for the tuning tool; 0 means the plugin's choice.
struct SoftmaxTuning
{
    //! Rows of at most 32 * maxWarpChunksPerLane 16-byte chunks run in (part of) a warp.
    int32_t maxWarpChunksPerLane{0};
    //! In the warp kernel, the fewest lanes per row that hold at most this many chunks each.
    int32_t warpChunksPerLane{0};
    //! 16-byte chunks each thread keeps in registers in the one-block-per-row kernel (1, 2, 4, 8).
    int32_t blockChunksPerThread{0};
};

//! Which kernel a launch uses, for reports and tests.
enum class SoftmaxPath : int32_t
{
    kEmpty = 0,     //!< nothing to do (a zero-sized tensor)
    kWarpRows = 1,  //!< last axis, a row held in the registers of 1..32 lanes
    kBlockRows = 2, //!< last axis, a row held in the registers of one block
    kLoopRows = 3,  //!< last axis, a row too long for registers: three passes, the later ones from L2
    kStrided = 4,   //!< inner > 1: columns of the axis, coalesced along the inner dimension
};

//! The kernel and launch geometry chosen for one call.
struct SoftmaxPlan
{
    SoftmaxPath path{SoftmaxPath::kEmpty};
    int32_t vectorElements{1};  //!< elements per load: 16 bytes' worth, or 1 when in/out misalign
    int32_t lanesPerRow{0};     //!< threads that share one row
    int32_t chunksPerThread{0}; //!< register-held chunks per thread (register paths)
    int32_t threadsPerBlock{0};
    int64_t blocks{0};
};

//! Plans a softmax of `shape` from `input` to `output` with elements of `elementSize` bytes.
SoftmaxPlan planSoftmax(SoftmaxShape const& shape, int32_t elementSize, void const* input, void const* output,
    SoftmaxTuning const& tuning = SoftmaxTuning{}) noexcept;

//! Softmax over the middle dimension of `shape`, float32 math, ONNX Softmax-13 semantics (a row
//! whose elements are all -inf gives NaN). T is float, __half or __nv_bfloat16. `input` and
//! `output` must not overlap. Returns the launch error, if any; the kernels run on `stream`.
template <typename T>
cudaError_t launchSoftmax(T const* input, T* output, SoftmaxShape const& shape, cudaStream_t stream,
    SoftmaxTuning const& tuning = SoftmaxTuning{}) noexcept;

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_SOFTMAX_KERNEL_H
