/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixSoftmax: ONNX Softmax-13 over `axis` in float32 math, for float32, float16 and bfloat16
 * tensors of any rank >= 1 in linear format (DESIGN.md, "The plugin node"). IPluginV3 with the
 * V3One core, build and runtime capabilities, and its IPluginCreatorV3One creator.
 */
#ifndef GRAPHFIX_SOFTMAX_PLUGIN_H
#define GRAPHFIX_SOFTMAX_PLUGIN_H

#include "NvInferRuntime.h"

#include <cstdint>
#include <vector>

namespace graphfix
{
namespace plugin
{

// The one place the C++ side spells the plugin's identity. graphfix/plugins/spec.py spells it for
// Python; tests/test_plugin_spec_agrees.py checks that the two agree.
constexpr char const* kGRAPHFIX_SOFTMAX_PLUGIN_NAME{"GraphfixSoftmax"};
constexpr char const* kGRAPHFIX_SOFTMAX_PLUGIN_VERSION{"1"};
constexpr char const* kGRAPHFIX_PLUGIN_NAMESPACE{"graphfix"};
//! The creator's one field: kINT32, length 1 (the ONNX parser passes INT attributes as int32).
constexpr char const* kGRAPHFIX_SOFTMAX_FIELD_AXIS{"axis"};
//! ONNX Softmax-13's default axis.
constexpr int32_t kGRAPHFIX_SOFTMAX_DEFAULT_AXIS{-1};

class GraphfixSoftmaxPlugin final : public nvinfer1::IPluginV3,
                                    public nvinfer1::IPluginV3OneCore,
                                    public nvinfer1::IPluginV3OneBuild,
                                    public nvinfer1::IPluginV3OneRuntime
{
public:
    //! `axis` in [-Dims::MAX_DIMS, Dims::MAX_DIMS); checked against the input's rank later.
    explicit GraphfixSoftmaxPlugin(int32_t axis);
    GraphfixSoftmaxPlugin(GraphfixSoftmaxPlugin const&) = delete;
    GraphfixSoftmaxPlugin& operator=(GraphfixSoftmaxPlugin const&) = delete;
    ~GraphfixSoftmaxPlugin() override = default;

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

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    int32_t mAxis;
    nvinfer1::PluginField mSerializedField{};
    nvinfer1::PluginFieldCollection mSerializedFields{};
};

class GraphfixSoftmaxPluginCreator final : public nvinfer1::IPluginCreatorV3One
{
public:
    GraphfixSoftmaxPluginCreator();
    ~GraphfixSoftmaxPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    //! Accepts the field `axis` (kINT32, length 1; ONNX's -1 when absent); anything else is an error.
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_SOFTMAX_PLUGIN_H
