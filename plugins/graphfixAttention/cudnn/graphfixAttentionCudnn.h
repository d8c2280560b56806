/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixAttention's fast path: cuDNN's fused scaled-dot-product attention (flash attention with
 * float32 scores and statistics) built through the cuDNN frontend. No TensorRT types.
 *
 * cuDNN is never linked: the frontend runs in its dynamic-loading mode and this file dlopens
 * libcudnn.so.9 ($GRAPHFIX_CUDNN_LIBRARY first, when set) on first use, so the plugin library
 * builds and loads where cuDNN is absent. A build without the cuDNN headers
 * (GRAPHFIX_WITH_CUDNN off, e.g. CI) compiles a stub whose cudnnUnavailableReason() says so.
 */
#ifndef GRAPHFIX_ATTENTION_CUDNN_H
#define GRAPHFIX_ATTENTION_CUDNN_H

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace graphfix
{
namespace plugin
{

//! Everything a cuDNN SDPA graph depends on. Q [batch, headsQ, seqQ, headDim], K [batch, headsKV,
//! seqK, headDim], V [batch, headsKV, seqK, valueDim], O [batch, headsQ, seqQ, valueDim], all
//! contiguous; an optional bias [biasBatch, biasHeads, seqQ, seqK] with row stride biasRowStride
//! and batch/head strides biasBatchStride/biasHeadStride (elements).
struct CudnnSdpaConfig
{
    bool bfloat16{false}; //!< else float16
    int64_t batch{0};
    int64_t headsQ{0};
    int64_t headsKV{0};
    int64_t seqQ{0};
    int64_t seqK{0};
    int64_t headDim{0};
    int64_t valueDim{0};
    float scale{1.F};
    bool causal{false};
    bool hasBias{false};
    int64_t biasBatch{1};
    int64_t biasHeads{1};
    int64_t biasBatchStride{0};
    int64_t biasHeadStride{0};
    int64_t biasRowStride{0};

    auto key() const
    {
        return std::make_tuple(bfloat16, batch, headsQ, headsKV, seqQ, seqK, headDim, valueDim, scale, causal, hasBias,
            biasBatch, biasHeads, biasBatchStride, biasHeadStride, biasRowStride);
    }
    bool operator<(CudnnSdpaConfig const& other) const
    {
        return key() < other.key();
    }
};

//! "" when cuDNN is loaded and usable (loading it on first call), else why not: built without
//! cuDNN, libcudnn.so.9 not found, too old a version.
std::string const& cudnnUnavailableReason() noexcept;

//! cuDNN SDPA graphs, one per configuration, built once and cached, and the handle they run with.
//! Not thread-safe: one per plugin instance (TensorRT gives each execution context its own).
class CudnnSdpa
{
public:
    CudnnSdpa();
    ~CudnnSdpa();
    CudnnSdpa(CudnnSdpa const&) = delete;
    CudnnSdpa& operator=(CudnnSdpa const&) = delete;

    //! Builds (or finds) the graph for `config`. False, with the reason, when cuDNN cannot run it.
    bool prepare(CudnnSdpaConfig const& config, std::string& reason) noexcept;

    //! The workspace bytes a prepared graph needs.
    int64_t workspaceSize(CudnnSdpaConfig const& config) const noexcept;

    //! Runs a prepared graph on `stream`. False, with the error, on failure.
    bool run(CudnnSdpaConfig const& config, void const* q, void const* k, void const* v, void const* bias, void* out,
        void* workspace, cudaStream_t stream, std::string& error) noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> mImpl;
};

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_CUDNN_H
