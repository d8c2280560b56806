/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * libgraphfix_plugins.so: registers its creators when it is loaded (dlopen), through the
 * getPluginRegistry() of the process that loads it. For `trtexec --staticPlugins`, polygraphy
 * `--plugins` and onnxruntime's `trt_extra_plugin_lib_paths`. Exports no symbols, so
 * IPluginRegistry::loadLibrary cannot register the same creators a second time.
 */
#include "graphfixAttentionPlugin.h"
#include "graphfixSoftmaxPlugin.h"

namespace graphfix
{
namespace plugin
{

REGISTER_TENSORRT_PLUGIN(GraphfixSoftmaxPluginCreator);
REGISTER_TENSORRT_PLUGIN(GraphfixAttentionPluginCreator);

} // namespace plugin
} // namespace graphfix
