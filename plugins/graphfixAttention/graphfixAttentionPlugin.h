/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixAttention: the whole attention chain MatMul(Q,Kᵀ) → scale → softcap → mask → Softmax →
 * MatMul(·,V) as one accurate fused node (graphfix/plugins/spec.py, ATTENTION, is the contract):
 * float32 scores, softmax statistics and accumulation for float32, float16 and bfloat16 I/O.
 * IPluginV3 with the V3One core, build and runtime capabilities, and its IPluginCreatorV3One.
 *
 * Four paths, one folder each (chosen per shape in onShapeChange, reported through the logger at
 * kVERBOSE; README.md beside this file says when each runs):
 *  - cudnn/: cuDNN's fused SDPA for float16/bfloat16 without softcap, with no mask, an additive
 *    mask of Q's type, or a bool mask whose fill is -inf; cuDNN is loaded at run time, graphs are
 *    built once per shape in onShapeChange and cached;
 *  - hopper/: the own wgmma kernels on sm_90 (16-bit head dims up to 256, float32 up to 128);
 *  - flash/: the own mma.sync kernels on sm_80+ (head dims up to 256 in multiples of 8, or 4 for
 *    float32, where their tiles fit the GPU's shared memory) for the rest;
 *  - fallback/: the fallback kernel for what the others cannot run.
 * enqueue allocates nothing, builds nothing and never synchronises: it can be captured into a
 * CUDA graph. Its scratch (K transposed, the mask as a bias, cuDNN's workspace) comes from
 * getWorkspaceSize.
 * $GRAPHFIX_ATTENTION_BACKEND picks: `auto` (default; the own kernels, with a warning at plugin
 * creation, when cuDNN cannot be loaded), `cudnn` (creation fails when cuDNN cannot be loaded) or
 * `portable` (never touches cuDNN).
 */
#ifndef GRAPHFIX_ATTENTION_PLUGIN_H
#define GRAPHFIX_ATTENTION_PLUGIN_H

#include "NvInferRuntime.h"
#include "cudnn/graphfixAttentionCudnn.h"
#include "flash/graphfixAttentionFlash.h"
#include "hopper/graphfixAttentionHopper.h"
#include "fallback/graphfixAttentionKernel.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace graphfix
{
namespace plugin
{

// The one place the C++ side spells the plugin's identity. graphfix/plugins/spec.py (ATTENTION)
// spells it for Python; tests/test_plugin_spec_agrees.py checks that the two agree.
constexpr char const* kGRAPHFIX_ATTENTION_PLUGIN_NAME{"GraphfixAttention"};
constexpr char const* kGRAPHFIX_ATTENTION_PLUGIN_VERSION{"1"};
constexpr char const* kGRAPHFIX_ATTENTION_PLUGIN_NAMESPACE{"graphfix"};
//! The creator's fields, in order: kFLOAT32, kINT32, kINT32, kFLOAT32, kFLOAT32, kINT32, length 1.
//! `scale` is required; the others default to 0 (mask_fill to -inf).
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_SCALE{"scale"};
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_K_TRANSPOSED{"k_transposed"};
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_CAUSAL{"causal"};
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_SOFTCAP{"softcap"};
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_MASK_FILL{"mask_fill"};
constexpr char const* kGRAPHFIX_ATTENTION_FIELD_NAN_TO_ZERO{"nan_to_zero"};
//! Environment variable choosing the backend: auto, cudnn or portable.
constexpr char const* kGRAPHFIX_ATTENTION_BACKEND_ENV{"GRAPHFIX_ATTENTION_BACKEND"};

//! The node's attributes.
struct AttentionAttributes
{
    float scale{1.F};
    int32_t kTransposed{0};
    int32_t causal{0};
    float softcap{0.F};
    float maskFill{0.F};
    int32_t nanToZero{0};
};

enum class AttentionBackend : int32_t
{
    kAuto = 0,
    kCudnn = 1,
    kPortable = 2,
};

//! One enqueue's problem, read from tensor descriptions.
struct AttentionProblem
{
    nvinfer1::DataType type{nvinfer1::DataType::kFLOAT};
    int32_t rank{0};
    AttentionShape shape{};
    bool hasMask{false};
    nvinfer1::DataType maskType{nvinfer1::DataType::kBOOL};
    //! The mask's dimensions aligned to [batch, headsQ, seqQ, seqK] (1 where it broadcasts).
    std::array<int64_t, 4> maskDims{1, 1, 1, 1};
    //! Element strides of the mask over [batch, headsQ, seqQ, seqK], 0 where it broadcasts.
    std::array<int64_t, 4> maskStrides{0, 0, 0, 0};

    bool operator==(AttentionProblem const& other) const;
};

//! Where the plugin keeps its scratch in the enqueue workspace (bytes from its start).
struct AttentionWorkspace
{
    int64_t cudnnOffset{0};
    int64_t cudnnBytes{0};  //!< reserved for cuDNN's own workspace (0 where cuDNN cannot run)
    int64_t keysOffset{0};  //!< K transposed to [.., seqK, headDim]
    int64_t biasOffset{0};  //!< the mask as an additive bias of Q's type
    int64_t firstOffset{0}; //!< the first key each mask row allows, int32
    //! bfloat16 without mask and softcap: V converted to float16 and the conversion's per-block
    //! slots of a |v| too large for it (HopperHalfValues: the Hopper kernel's float16 P·V,
    //! kHOPPER_VARIANT_HALF_VALUES)
    int64_t halfValuesOffset{0};
    int64_t halfValuesBytes{0};
    int64_t slotsOffset{0};
    int64_t slotCount{0};
    int64_t total{0};
};

class GraphfixAttentionPlugin final : public nvinfer1::IPluginV3,
                                      public nvinfer1::IPluginV3OneCore,
                                      public nvinfer1::IPluginV3OneBuild,
                                      public nvinfer1::IPluginV3OneRuntime
{
public:
    //! Throws PluginError for attributes outside the contract, or (backend kCudnn) when cuDNN cannot
    //! be loaded.
    GraphfixAttentionPlugin(AttentionAttributes const& attributes, AttentionBackend backend);
    GraphfixAttentionPlugin(GraphfixAttentionPlugin const&) = delete;
    GraphfixAttentionPlugin& operator=(GraphfixAttentionPlugin const&) = delete;
    ~GraphfixAttentionPlugin() override;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    //! Whether the attributes and element types allow the cuDNN path at all (shape aside).
    bool cudnnMayRun(nvinfer1::DataType type, bool hasMask, nvinfer1::DataType maskType) const;
    //! Chooses the path for `problem`, building its cuDNN graph when that path is taken.
    void plan(AttentionProblem const& problem);
    //! Why the cuDNN path is not tried for `problem` (backend, attributes, head dims, an empty
    //! tensor), or "" when it is.
    std::string cudnnRefusal(AttentionProblem const& problem) const;
    //! Builds (or finds cached) the cuDNN graph; sets mUseCudnn when cuDNN takes it within the
    //! workspace reserved, else says why in `reason`.
    void planCudnn(AttentionProblem const& problem, std::string& reason);
    //! Sets the flash kernel's shared-memory limit; fails when no own kernel fits and cuDNN does
    //! not run the shape.
    void prepareOwnKernels(AttentionProblem const& problem, std::string const& reason);
    //! Logs the path chosen (kVERBOSE; kWARNING when a loaded cuDNN refused the shape) when it or
    //! the shape changed.
    void reportPath(AttentionProblem const& problem, std::string const& reason, bool cudnnAttempted);
    void enqueueCudnn(void const* const* inputs, void* output, void* workspace, cudaStream_t stream);
    //! The own kernels: the Hopper kernel `hopper` plans, else the flash kernel `flash` plans,
    //! else the fallback kernel.
    void enqueueOwn(AttentionProblem const& problem, HopperPlan const& hopper, FlashPlan const& flash,
        AttentionWorkspace const& scratch, void const* const* inputs, void* output, void* workspace,
        cudaStream_t stream) const;

    AttentionAttributes mAttributes;
    AttentionBackend mBackend;

    // The plan onShapeChange made for the current shapes.
    AttentionProblem mProblem{};
    bool mPlanned{false};
    bool mUseCudnn{false};
    bool mDirectBias{false};
    //! Rows of the bias the cuDNN path materialises per (batch, head): seqQ, or 1 for a mask that
    //! broadcasts over the queries (given to cuDNN with row stride 0).
    int64_t mBiasRows{0};
    CudnnSdpaConfig mCudnnConfig{};
    FlashPlan mFlash{};
    HopperPlan mHopper{};
    AttentionWorkspace mWorkspace{};
    std::string mPathNote;
    std::unique_ptr<CudnnSdpa> mCudnn;

    std::array<nvinfer1::PluginField, 6> mSerializedFields{};
    nvinfer1::PluginFieldCollection mSerializedCollection{};
};

class GraphfixAttentionPluginCreator final : public nvinfer1::IPluginCreatorV3One
{
public:
    GraphfixAttentionPluginCreator();
    ~GraphfixAttentionPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    //! Accepts the six fields above (each of its type, length 1; `scale` required); anything else,
    //! or a value outside the contract, is an error.
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_PLUGIN_H
