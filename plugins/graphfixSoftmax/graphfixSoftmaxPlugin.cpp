/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "graphfixSoftmaxPlugin.h"

#include "graphfixSoftmaxKernel.h"
#include "pluginLogging.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace graphfix
{
namespace plugin
{
namespace
{

using nvinfer1::DataType;
using nvinfer1::TensorFormat;

constexpr int32_t kMAX_RANK{nvinfer1::Dims::MAX_DIMS};

bool isSupportedType(DataType type)
{
    return type == DataType::kFLOAT || type == DataType::kHALF || type == DataType::kBF16;
}

//! `axis` as an index into a shape of `rank` dimensions, or PluginError.
int32_t normalizedAxis(int32_t axis, int32_t rank)
{
    check(rank >= 1, "the input has rank " + std::to_string(rank) + "; GraphfixSoftmax needs rank >= 1");
    check(axis >= -rank && axis < rank,
        "axis " + std::to_string(axis) + " is out of range for an input of rank " + std::to_string(rank)
            + " (allowed " + std::to_string(-rank) + ".." + std::to_string(rank - 1) + ")");
    return axis < 0 ? axis + rank : axis;
}

void checkIoCounts(int32_t nbInputs, int32_t nbOutputs)
{
    check(nbInputs == 1 && nbOutputs == 1,
        "GraphfixSoftmax has one input and one output, got " + std::to_string(nbInputs) + " inputs and "
            + std::to_string(nbOutputs) + " outputs");
}

void checkIoTypes(DataType input, DataType output)
{
    check(isSupportedType(input),
        "input type " + std::to_string(static_cast<int32_t>(input))
            + " is not supported (allowed: kFLOAT, kHALF, kBF16)");
    check(output == input, "the output type must equal the input type");
}

SoftmaxShape softmaxShape(nvinfer1::Dims const& dims, int32_t axis)
{
    SoftmaxShape shape{1, 1, 1};
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        check(dims.d[i] >= 0, "dimension " + std::to_string(i) + " is " + std::to_string(dims.d[i]) + " at enqueue");
        if (i < axis)
        {
            shape.outer *= dims.d[i];
        }
        else if (i == axis)
        {
            shape.axisLength = dims.d[i];
        }
        else
        {
            shape.inner *= dims.d[i];
        }
    }
    return shape;
}

template <typename T>
cudaError_t launchFor(void const* input, void* output, SoftmaxShape const& shape, cudaStream_t stream)
{
    return launchSoftmax<T>(static_cast<T const*>(input), static_cast<T*>(output), shape, stream);
}

} // namespace

GraphfixSoftmaxPlugin::GraphfixSoftmaxPlugin(int32_t axis)
    : mAxis(axis)
{
    check(axis >= -kMAX_RANK && axis < kMAX_RANK,
        "axis " + std::to_string(axis) + " is out of range for any TensorRT tensor (allowed "
            + std::to_string(-kMAX_RANK) + ".." + std::to_string(kMAX_RANK - 1) + ")");
}

// IPluginV3

nvinfer1::IPluginCapability* GraphfixSoftmaxPlugin::getCapabilityInterface(
    nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    reportError("getCapabilityInterface", "unknown capability type");
    return nullptr;
}

nvinfer1::IPluginV3* GraphfixSoftmaxPlugin::clone() noexcept
{
    try
    {
        return new GraphfixSoftmaxPlugin(mAxis);
    }
    catch (...)
    {
        reportCurrentException("clone");
    }
    return nullptr;
}

// IPluginV3OneCore

char const* GraphfixSoftmaxPlugin::getPluginName() const noexcept
{
    return kGRAPHFIX_SOFTMAX_PLUGIN_NAME;
}

char const* GraphfixSoftmaxPlugin::getPluginVersion() const noexcept
{
    return kGRAPHFIX_SOFTMAX_PLUGIN_VERSION;
}

char const* GraphfixSoftmaxPlugin::getPluginNamespace() const noexcept
{
    return kGRAPHFIX_PLUGIN_NAMESPACE;
}

// IPluginV3OneBuild

int32_t GraphfixSoftmaxPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(in != nullptr && out != nullptr, "null tensor descriptions");
        checkIoTypes(in[0].desc.type, out[0].desc.type);
        normalizedAxis(mAxis, in[0].desc.dims.nbDims);
        check(out[0].desc.dims.nbDims == in[0].desc.dims.nbDims, "the output rank must equal the input rank");
        return 0;
    }
    catch (...)
    {
        reportCurrentException("configurePlugin");
    }
    return -1;
}

int32_t GraphfixSoftmaxPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(outputTypes != nullptr && inputTypes != nullptr, "null type arrays");
        checkIoTypes(inputTypes[0], inputTypes[0]);
        outputTypes[0] = inputTypes[0];
        return 0;
    }
    catch (...)
    {
        reportCurrentException("getOutputDataTypes");
    }
    return -1;
}

int32_t GraphfixSoftmaxPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
    nvinfer1::DimsExprs const* /*shapeInputs*/, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
    int32_t nbOutputs, nvinfer1::IExprBuilder& /*exprBuilder*/) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(nbShapeInputs == 0, "GraphfixSoftmax takes no shape inputs");
        check(inputs != nullptr && outputs != nullptr, "null shape arrays");
        normalizedAxis(mAxis, inputs[0].nbDims);
        outputs[0] = inputs[0];
        return 0;
    }
    catch (...)
    {
        reportCurrentException("getOutputShapes");
    }
    return -1;
}

bool GraphfixSoftmaxPlugin::supportsFormatCombination(
    int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(inOut != nullptr, "null tensor descriptions");
        check(pos >= 0 && pos < nbInputs + nbOutputs, "position " + std::to_string(pos) + " is out of range");
        nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
        bool const linear = desc.format == TensorFormat::kLINEAR;
        if (pos == 0)
        {
            return linear && isSupportedType(desc.type);
        }
        return linear && desc.type == inOut[0].desc.type;
    }
    catch (...)
    {
        reportCurrentException("supportsFormatCombination");
    }
    return false;
}

int32_t GraphfixSoftmaxPlugin::getNbOutputs() const noexcept
{
    return 1;
}

// IPluginV3OneRuntime

int32_t GraphfixSoftmaxPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(in != nullptr && out != nullptr, "null tensor descriptions");
        checkIoTypes(in[0].type, out[0].type);
        normalizedAxis(mAxis, in[0].dims.nbDims);
        check(out[0].dims.nbDims == in[0].dims.nbDims
                && std::equal(in[0].dims.d, in[0].dims.d + in[0].dims.nbDims, out[0].dims.d),
            "the output shape must equal the input shape");
        return 0;
    }
    catch (...)
    {
        reportCurrentException("onShapeChange");
    }
    return -1;
}

int32_t GraphfixSoftmaxPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
    nvinfer1::PluginTensorDesc const* /*outputDesc*/, void const* const* inputs, void* const* outputs,
    void* /*workspace*/, cudaStream_t stream) noexcept
{
    try
    {
        check(inputDesc != nullptr && inputs != nullptr && outputs != nullptr, "null enqueue arguments");
        nvinfer1::Dims const& dims = inputDesc[0].dims;
        SoftmaxShape const shape = softmaxShape(dims, normalizedAxis(mAxis, dims.nbDims));
        cudaError_t status = cudaErrorInvalidValue;
        switch (inputDesc[0].type)
        {
        case DataType::kFLOAT: status = launchFor<float>(inputs[0], outputs[0], shape, stream); break;
        case DataType::kHALF: status = launchFor<__half>(inputs[0], outputs[0], shape, stream); break;
        case DataType::kBF16: status = launchFor<__nv_bfloat16>(inputs[0], outputs[0], shape, stream); break;
        default: check(false, "input type " + std::to_string(static_cast<int32_t>(inputDesc[0].type)) + " at enqueue");
        }
        check(status == cudaSuccess, std::string{"kernel launch failed: "} + cudaGetErrorString(status));
        return 0;
    }
    catch (...)
    {
        reportCurrentException("enqueue");
    }
    return -1;
}

nvinfer1::IPluginV3* GraphfixSoftmaxPlugin::attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

nvinfer1::PluginFieldCollection const* GraphfixSoftmaxPlugin::getFieldsToSerialize() noexcept
{
    mSerializedField
        = nvinfer1::PluginField{kGRAPHFIX_SOFTMAX_FIELD_AXIS, &mAxis, nvinfer1::PluginFieldType::kINT32, 1};
    mSerializedFields.nbFields = 1;
    mSerializedFields.fields = &mSerializedField;
    return &mSerializedFields;
}

// GraphfixSoftmaxPluginCreator

GraphfixSoftmaxPluginCreator::GraphfixSoftmaxPluginCreator()
    : mFields{nvinfer1::PluginField{kGRAPHFIX_SOFTMAX_FIELD_AXIS, nullptr, nvinfer1::PluginFieldType::kINT32, 1}}
{
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

char const* GraphfixSoftmaxPluginCreator::getPluginName() const noexcept
{
    return kGRAPHFIX_SOFTMAX_PLUGIN_NAME;
}

char const* GraphfixSoftmaxPluginCreator::getPluginVersion() const noexcept
{
    return kGRAPHFIX_SOFTMAX_PLUGIN_VERSION;
}

char const* GraphfixSoftmaxPluginCreator::getPluginNamespace() const noexcept
{
    return kGRAPHFIX_PLUGIN_NAMESPACE;
}

nvinfer1::PluginFieldCollection const* GraphfixSoftmaxPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* GraphfixSoftmaxPluginCreator::createPlugin(
    char const* /*name*/, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /*phase*/) noexcept
{
    try
    {
        int32_t axis = kGRAPHFIX_SOFTMAX_DEFAULT_AXIS;
        int32_t const nbFields = fc == nullptr ? 0 : fc->nbFields;
        check(nbFields == 0 || fc->fields != nullptr, "the field collection has no field array");
        for (int32_t i = 0; i < nbFields; ++i)
        {
            nvinfer1::PluginField const& field = fc->fields[i];
            std::string const name = field.name == nullptr ? "" : field.name;
            check(name == kGRAPHFIX_SOFTMAX_FIELD_AXIS,
                "unknown field '" + name + "' (GraphfixSoftmax takes only '" + kGRAPHFIX_SOFTMAX_FIELD_AXIS + "')");
            check(field.type == nvinfer1::PluginFieldType::kINT32,
                "field 'axis' has type " + std::to_string(static_cast<int32_t>(field.type)) + "; expected kINT32 ("
                    + std::to_string(static_cast<int32_t>(nvinfer1::PluginFieldType::kINT32)) + ")");
            check(field.length == 1 && field.data != nullptr,
                "field 'axis' must hold exactly one value, got length " + std::to_string(field.length)
                    + (field.data == nullptr ? " and no data" : ""));
            std::memcpy(&axis, field.data, sizeof(axis));
        }
        return new GraphfixSoftmaxPlugin(axis);
    }
    catch (...)
    {
        reportCurrentException("createPlugin");
    }
    return nullptr;
}

} // namespace plugin
} // namespace graphfix
