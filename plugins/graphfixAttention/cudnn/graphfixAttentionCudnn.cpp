/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * With GRAPHFIX_WITH_CUDNN (CMake found cudnn.h and the cuDNN frontend headers): cuDNN SDPA
 * through the frontend in dynamic-loading mode (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): every
 * backend call resolves through cudnn_frontend::cudnn_dlhandle, which this file sets by dlopen.
 * Without it: a stub that reports the build has no cuDNN path.
 */
#include "graphfixAttentionCudnn.h"

#if GRAPHFIX_WITH_CUDNN

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cstdlib>
#include <exception>
#include <unordered_map>

namespace cudnn_frontend
{
// The library handle the frontend's dynamic-loading shim resolves every backend symbol through.
void* cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend

namespace graphfix
{
namespace plugin
{
namespace
{

namespace fe = cudnn_frontend;

constexpr int64_t kUID_Q{1};
constexpr int64_t kUID_K{2};
constexpr int64_t kUID_V{3};
constexpr int64_t kUID_O{4};
constexpr int64_t kUID_BIAS{5};
//! cuDNN 9.0 is the first with the graph API's fused flash attention on Hopper for all of the
//! features used here; older versions are treated as absent.
constexpr size_t kMIN_CUDNN_VERSION{90000};

std::string loadCudnn()
{
    char const* const configured = std::getenv("GRAPHFIX_CUDNN_LIBRARY");
    char const* const name = configured != nullptr && configured[0] != '\0' ? configured : "libcudnn.so.9";
    dlerror();
    void* const handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
    {
        char const* const why = dlerror();
        return std::string{"cannot load cuDNN: dlopen(\""} + name + "\") failed (" + (why == nullptr ? "" : why)
            + "); install cuDNN 9 (e.g. `pip install nvidia-cudnn-cu13`) and put its lib folder on LD_LIBRARY_PATH, "
              "or set GRAPHFIX_CUDNN_LIBRARY to the path of libcudnn.so.9";
    }
    void* const getVersion = dlsym(handle, "cudnnGetVersion");
    if (getVersion == nullptr)
    {
        dlclose(handle);
        return std::string{name} + " exports no cudnnGetVersion; it is not a cuDNN library";
    }
    size_t const version = reinterpret_cast<size_t (*)()>(getVersion)();
    if (version < kMIN_CUDNN_VERSION)
    {
        dlclose(handle);
        return std::string{name} + " is cuDNN " + std::to_string(version) + "; GraphfixAttention's cuDNN path needs "
            + std::to_string(kMIN_CUDNN_VERSION) + " or newer";
    }
    fe::cudnn_dlhandle = handle;
    return "";
}

std::string errorText(fe::error_t status)
{
    return std::to_string(static_cast<int32_t>(status.get_code())) + " " + status.get_message();
}

} // namespace

std::string const& cudnnUnavailableReason() noexcept
{
    static std::string const reason = []() noexcept {
        try
        {
            return loadCudnn();
        }
        catch (std::exception const& e)
        {
            return std::string{"cannot load cuDNN: "} + e.what();
        }
        catch (...)
        {
            return std::string{"cannot load cuDNN: unknown exception"};
        }
    }();
    return reason;
}

struct CudnnSdpa::Impl
{
    struct Entry
    {
        std::shared_ptr<fe::graph::Graph> graph;
        int64_t workspace{0};
        std::string failure;
    };

    cudnnHandle_t handle{nullptr};
    std::map<CudnnSdpaConfig, Entry> graphs;

    ~Impl()
    {
        graphs.clear();
        if (handle != nullptr)
        {
            fe::detail::destroy_handle(handle);
        }
    }

    Entry build(CudnnSdpaConfig const& c)
    {
        Entry entry;
        auto graph = std::make_shared<fe::graph::Graph>();
        graph->set_io_data_type(c.bfloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
        auto q = graph->tensor(fe::graph::Tensor_attributes()
                .set_name("Q")
                .set_uid(kUID_Q)
                .set_dim({c.batch, c.headsQ, c.seqQ, c.headDim})
                .set_stride({c.headsQ * c.seqQ * c.headDim, c.seqQ * c.headDim, c.headDim, 1}));
        auto k = graph->tensor(fe::graph::Tensor_attributes()
                .set_name("K")
                .set_uid(kUID_K)
                .set_dim({c.batch, c.headsKV, c.seqK, c.headDim})
                .set_stride({c.headsKV * c.seqK * c.headDim, c.seqK * c.headDim, c.headDim, 1}));
        auto v = graph->tensor(fe::graph::Tensor_attributes()
                .set_name("V")
                .set_uid(kUID_V)
                .set_dim({c.batch, c.headsKV, c.seqK, c.valueDim})
                .set_stride({c.headsKV * c.seqK * c.valueDim, c.seqK * c.valueDim, c.valueDim, 1}));
        auto options = fe::graph::SDPA_attributes()
                           .set_name("graphfix_attention")
                           .set_generate_stats(false)
                           .set_attn_scale(c.scale);
        if (c.causal)
        {
            options.set_causal_mask(true);
        }
        if (c.hasBias)
        {
            auto bias = graph->tensor(fe::graph::Tensor_attributes()
                    .set_name("bias")
                    .set_uid(kUID_BIAS)
                    .set_dim({c.biasBatch, c.biasHeads, c.seqQ, c.seqK})
                    .set_stride({c.biasBatchStride, c.biasHeadStride, c.biasRowStride, 1}));
            options.set_bias(bias);
        }
        auto outputs = graph->sdpa(q, k, v, options);
        outputs[0]->set_output(true).set_uid(kUID_O).set_dim({c.batch, c.headsQ, c.seqQ, c.valueDim}).set_stride(
            {c.headsQ * c.seqQ * c.valueDim, c.seqQ * c.valueDim, c.valueDim, 1});

        fe::error_t status = graph->validate();
        if (status.is_good())
        {
            status = graph->build_operation_graph(handle);
        }
        if (status.is_good())
        {
            status = graph->create_execution_plans({fe::HeurMode_t::A});
        }
        if (status.is_good())
        {
            status = graph->check_support(handle);
        }
        if (status.is_good())
        {
            status = graph->build_plans(handle);
        }
        if (status.is_good())
        {
            status = graph->get_workspace_size(entry.workspace);
        }
        if (!status.is_good())
        {
            entry.failure = "cuDNN does not support this attention: " + errorText(status);
            return entry;
        }
        entry.graph = std::move(graph);
        return entry;
    }
};

CudnnSdpa::CudnnSdpa()
    : mImpl(std::make_unique<Impl>())
{
}

CudnnSdpa::~CudnnSdpa() = default;

bool CudnnSdpa::prepare(CudnnSdpaConfig const& config, std::string& reason) noexcept
{
    try
    {
        if (!cudnnUnavailableReason().empty())
        {
            reason = cudnnUnavailableReason();
            return false;
        }
        auto found = mImpl->graphs.find(config);
        if (found == mImpl->graphs.end())
        {
            if (mImpl->handle == nullptr)
            {
                cudnnStatus_t const created = fe::detail::create_handle(&mImpl->handle);
                if (created != CUDNN_STATUS_SUCCESS)
                {
                    mImpl->handle = nullptr;
                    reason = std::string{"cudnnCreate failed: "} + fe::detail::get_error_string(created);
                    return false;
                }
            }
            found = mImpl->graphs.emplace(config, mImpl->build(config)).first;
        }
        reason = found->second.failure;
        return found->second.graph != nullptr;
    }
    catch (std::exception const& e)
    {
        reason = std::string{"cuDNN graph build failed: "} + e.what();
    }
    catch (...)
    {
        reason = "cuDNN graph build failed: unknown exception";
    }
    try
    {
        Impl::Entry failed;
        failed.failure = reason;
        mImpl->graphs[config] = failed;
    }
    catch (...)
    {
        // Not remembering the failure only costs a second attempt later.
    }
    return false;
}

int64_t CudnnSdpa::workspaceSize(CudnnSdpaConfig const& config) const noexcept
{
    auto const found = mImpl->graphs.find(config);
    return found == mImpl->graphs.end() ? 0 : found->second.workspace;
}

bool CudnnSdpa::run(CudnnSdpaConfig const& config, void const* q, void const* k, void const* v, void const* bias,
    void* out, void* workspace, cudaStream_t stream, std::string& error) noexcept
{
    try
    {
        auto const found = mImpl->graphs.find(config);
        if (found == mImpl->graphs.end() || found->second.graph == nullptr)
        {
            error = "no cuDNN graph was prepared for this shape";
            return false;
        }
        cudnnStatus_t const bound = fe::detail::set_stream(mImpl->handle, stream);
        if (bound != CUDNN_STATUS_SUCCESS)
        {
            error = std::string{"cudnnSetStream failed: "} + fe::detail::get_error_string(bound);
            return false;
        }
        std::unordered_map<int64_t, void*> pack{{kUID_Q, const_cast<void*>(q)}, {kUID_K, const_cast<void*>(k)},
            {kUID_V, const_cast<void*>(v)}, {kUID_O, out}};
        if (config.hasBias)
        {
            pack.emplace(kUID_BIAS, const_cast<void*>(bias));
        }
        fe::error_t const status = found->second.graph->execute(mImpl->handle, pack, workspace);
        if (!status.is_good())
        {
            error = "cuDNN execute failed: " + errorText(status);
            return false;
        }
        return true;
    }
    catch (std::exception const& e)
    {
        error = std::string{"cuDNN execute failed: "} + e.what();
    }
    catch (...)
    {
        error = "cuDNN execute failed: unknown exception";
    }
    return false;
}

} // namespace plugin
} // namespace graphfix

#else // GRAPHFIX_WITH_CUDNN

namespace graphfix
{
namespace plugin
{

std::string const& cudnnUnavailableReason() noexcept
{
    static std::string const reason{
        "this build of the plugin library has no cuDNN path (CMake found no cudnn.h / cudnn_frontend.h; "
        "see plugins/README.md, \"GraphfixAttention and cuDNN\")"};
    return reason;
}

struct CudnnSdpa::Impl
{
};

CudnnSdpa::CudnnSdpa() = default;

CudnnSdpa::~CudnnSdpa() = default;

bool CudnnSdpa::prepare(CudnnSdpaConfig const& /*config*/, std::string& reason) noexcept
{
    try
    {
        reason = cudnnUnavailableReason();
    }
    catch (...)
    {
        // reason keeps its old text
    }
    return false;
}

int64_t CudnnSdpa::workspaceSize(CudnnSdpaConfig const& /*config*/) const noexcept
{
    return 0;
}

bool CudnnSdpa::run(CudnnSdpaConfig const& /*config*/, void const* /*q*/, void const* /*k*/, void const* /*v*/,
    void const* /*bias*/, void* /*out*/, void* /*workspace*/, cudaStream_t /*stream*/, std::string& error) noexcept
{
    try
    {
        error = cudnnUnavailableReason();
    }
    catch (...)
    {
        // error keeps its old text
    }
    return false;
}

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_WITH_CUDNN
