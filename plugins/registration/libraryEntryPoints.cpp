/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * libgraphfix_plugins_dynamic.so: registers nothing by itself; TensorRT asks it for its creators
 * through the two exported entry points. For `trtexec --dynamicPlugins`,
 * IPluginRegistry::loadLibrary and Python's `trt.get_plugin_registry().load_library(...)`.
 */
#include "graphfixAttentionPlugin.h"
#include "graphfixSoftmaxPlugin.h"
#include "pluginLogging.h"

#include <cstdint>

#define GRAPHFIX_EXPORT __attribute__((visibility("default")))

extern "C" GRAPHFIX_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    graphfix::plugin::setPluginLoggerFinder(finder);
}

extern "C" GRAPHFIX_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    try
    {
        static graphfix::plugin::GraphfixSoftmaxPluginCreator softmaxCreator;
        static graphfix::plugin::GraphfixAttentionPluginCreator attentionCreator;
        static nvinfer1::IPluginCreatorInterface* const creators[] = {&softmaxCreator, &attentionCreator};
        nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
        return creators;
    }
    catch (...)
    {
        graphfix::plugin::reportCurrentException("getCreators");
    }
    nbCreators = 0;
    return nullptr;
}
