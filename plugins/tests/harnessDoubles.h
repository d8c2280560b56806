/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Test doubles for the few TensorRT objects a plugin library touches: a plugin registry that
 * records registrations (exported from the harness as getPluginRegistry, which is all a
 * self-registering library asks of libnvinfer), a logger finder that records messages, and
 * constant dimension expressions. None of them is TensorRT: they let the harness drive the plugin
 * through TensorRT's interfaces the way TensorRT does, without libnvinfer.
 *
 * IPluginRegistry differs between the header sets graphfix builds against: TensorRT 10.10 added
 * getAllCreatorsRecursive, TensorRT 11 removed the IPluginCreator (V2) overloads. The guards
 * below follow NvInferVersion.h, so the doubles compile against TensorRT 10.0 through 11.x.
 */
#ifndef GRAPHFIX_HARNESS_DOUBLES_H
#define GRAPHFIX_HARNESS_DOUBLES_H

#include "NvInferRuntime.h"
#include "NvInferVersion.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace graphfix
{
namespace harness
{

//! What one registerCreator call received.
struct Registration
{
    nvinfer1::IPluginCreatorInterface* creator;
    std::string namespaceArgument;
};

class RecordingRegistry final : public nvinfer1::IPluginRegistry
{
public:
    std::vector<Registration> registrations;
    //! Answer every registerCreator with false, as TensorRT does for a creator registered twice.
    bool refuse{false};

    bool registerCreator(nvinfer1::IPluginCreatorInterface& creator, char const* const pluginNamespace) noexcept override
    {
        registrations.push_back(Registration{&creator, pluginNamespace == nullptr ? "" : pluginNamespace});
        return !refuse;
    }

    // Everything below is unused by a self-registering plugin library; it reports failure.
#if NV_TENSORRT_MAJOR < 11
    bool registerCreator(nvinfer1::IPluginCreator& /*creator*/, char const* const /*ns*/) noexcept override
    {
        return false;
    }
    nvinfer1::IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    nvinfer1::IPluginCreator* getPluginCreator(
        char const* const /*name*/, char const* const /*version*/, char const* const /*ns*/) noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(nvinfer1::IPluginCreator const& /*creator*/) noexcept override
    {
        return false;
    }
#endif
    void setErrorRecorder(nvinfer1::IErrorRecorder* const /*recorder*/) noexcept override {}
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }
    bool isParentSearchEnabled() const override
    {
        return false;
    }
    void setParentSearchEnabled(bool const /*enabled*/) override {}
    PluginLibraryHandle loadLibrary(char const* /*pluginPath*/) noexcept override
    {
        return nullptr;
    }
    void deregisterLibrary(PluginLibraryHandle /*handle*/) noexcept override {}
    nvinfer1::IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    nvinfer1::IPluginCreatorInterface* getCreator(
        char const* const /*name*/, char const* const /*version*/, char const* const /*ns*/) noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(nvinfer1::IPluginCreatorInterface const& /*creator*/) noexcept override
    {
        return false;
    }
    nvinfer1::IPluginResource* acquirePluginResource(
        char const* /*key*/, nvinfer1::IPluginResource* /*resource*/) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(char const* /*key*/) noexcept override
    {
        return -1;
    }
#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 10)
    nvinfer1::IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const numCreators) noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
#endif
};

class RecordingLogger final : public nvinfer1::ILogger
{
public:
    std::vector<std::string> errors;

    void log(Severity severity, char const* msg) noexcept override
    {
        if (severity <= Severity::kERROR)
        {
            errors.emplace_back(msg == nullptr ? "" : msg);
        }
    }
};

class RecordingLoggerFinder final : public nvinfer1::ILoggerFinder
{
public:
    RecordingLogger logger;

    nvinfer1::ILogger* findLogger() override
    {
        return &logger;
    }
};

class ConstantDimensionImpl final : public nvinfer1::apiv::VDimensionExpr
{
public:
    explicit ConstantDimensionImpl(int64_t value)
        : mValue(value)
    {
    }
    bool isConstant() const override
    {
        return true;
    }
    int64_t getConstantValue() const override
    {
        return mValue;
    }
    bool isSizeTensor() const override
    {
        return false;
    }

private:
    int64_t mValue;
};

class ConstantDimension final : public nvinfer1::IDimensionExpr
{
public:
    explicit ConstantDimension(int64_t value)
        : mConstant(value)
    {
        mImpl = &mConstant;
    }
    ~ConstantDimension() noexcept override = default;

private:
    ConstantDimensionImpl mConstant;
};

//! An expression builder whose every call is counted and answered with constants.
class CountingExprBuilderImpl final : public nvinfer1::apiv::VExprBuilder
{
public:
    int32_t calls{0};
    std::vector<std::unique_ptr<ConstantDimension>> made;

    nvinfer1::IDimensionExpr const* constant(int64_t value) override
    {
        ++calls;
        made.push_back(std::make_unique<ConstantDimension>(value));
        return made.back().get();
    }
    nvinfer1::IDimensionExpr const* operation(nvinfer1::DimensionOperation /*op*/,
        nvinfer1::IDimensionExpr const& first, nvinfer1::IDimensionExpr const& /*second*/) override
    {
        ++calls;
        return &first;
    }
    nvinfer1::IDimensionExpr const* declareSizeTensor(int32_t /*outputIndex*/, nvinfer1::IDimensionExpr const& opt,
        nvinfer1::IDimensionExpr const& /*upper*/) override
    {
        ++calls;
        return &opt;
    }
};

class CountingExprBuilder final : public nvinfer1::IExprBuilder
{
public:
    CountingExprBuilderImpl counter;

    CountingExprBuilder()
    {
        mImpl = &counter;
    }
    ~CountingExprBuilder() noexcept override = default;
};

} // namespace harness
} // namespace graphfix

#endif // GRAPHFIX_HARNESS_DOUBLES_H
