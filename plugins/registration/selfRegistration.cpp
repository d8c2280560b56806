/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * libgraphfix_plugins.so: registers its creators when it is loaded (dlopen), through the
 * getPluginRegistry() of the process that loads it. For `trtexec --staticPlugins`, polygraphy
 * `--plugins` and onnxruntime's `trt_extra_plugin_lib_paths`. Exports no symbols, so
 * IPluginRegistry::loadLibrary cannot register the same creators a second time.
 *
 * Not REGISTER_TENSORRT_PLUGIN: its PluginRegistrar calls registerCreator(creator, "") (library
 * namespace ""), while the ONNX parser looks creators up with the node's plugin_namespace
 * ("graphfix") and TensorRT's headers do not say whether the registry keys on that argument or
 * on the creator's getPluginNamespace(). Registering with the creator's own namespace, as
 * TensorRT's initLibNvInferPlugins does with its library namespace, makes both readings agree.
 */
#include "graphfixAttentionPlugin.h"
#include "graphfixSoftmaxPlugin.h"
#include "pluginLogging.h"

#include <string>

namespace graphfix
{
namespace plugin
{
namespace
{

//! Registers one `Creator` under its own namespace when the library is loaded; reports a refusal.
template <typename Creator>
class NamespacedRegistrar final
{
public:
    NamespacedRegistrar() noexcept
    {
        try
        {
            nvinfer1::IPluginRegistry* const registry = getPluginRegistry();
            check(registry != nullptr, "getPluginRegistry() returned no registry");
            if (!registry->registerCreator(mCreator, mCreator.getPluginNamespace()))
            {
                reportError("registerCreator",
                    (std::string{"TensorRT refused "} + mCreator.getPluginNamespace() + "::"
                        + mCreator.getPluginName() + " version " + mCreator.getPluginVersion()
                        + ": a creator of that name, version and namespace is already registered (load "
                          "one graphfix plugin library per process)")
                        .c_str());
            }
        }
        catch (...)
        {
            reportCurrentException("registerCreator");
        }
    }
    NamespacedRegistrar(NamespacedRegistrar const&) = delete;
    NamespacedRegistrar& operator=(NamespacedRegistrar const&) = delete;

private:
    Creator mCreator{};
};

NamespacedRegistrar<GraphfixSoftmaxPluginCreator> const gSoftmaxRegistrar{};
NamespacedRegistrar<GraphfixAttentionPluginCreator> const gAttentionRegistrar{};

} // namespace
} // namespace plugin
} // namespace graphfix
