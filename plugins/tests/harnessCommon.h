/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * What the two host harnesses (pluginHarness.cpp, attentionHarness.cpp) share besides the test
 * doubles of harnessDoubles.h: the harness error, JSON building, TensorRT enum names, argument
 * and text parsing, plugin capabilities and tensor descriptions, CUDA error checks.
 *
 * Each harness defines, in graphfix::harness, the three functions declared below under "defined by
 * each harness": the two harnesses write strings, non-finite numbers and field values differently.
 */
#ifndef GRAPHFIX_PLUGIN_TESTS_HARNESS_COMMON_H
#define GRAPHFIX_PLUGIN_TESTS_HARNESS_COMMON_H

#include "harnessDoubles.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace graphfix
{
namespace harness
{

using nvinfer1::DataType;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

class HarnessError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

// ---- defined by each harness -------------------------------------------------------------------

std::string quote(std::string const& s);

template <typename T>
std::string number(T value);

std::string fieldsJson(nvinfer1::PluginFieldCollection const* fc);

// ---- JSON ----------------------------------------------------------------------------------

inline std::string object(std::vector<std::pair<std::string, std::string>> const& members)
{
    std::string out = "{";
    for (size_t i = 0; i < members.size(); ++i)
    {
        out += (i == 0 ? "" : ", ") + quote(members[i].first) + ": " + members[i].second;
    }
    return out + "}";
}

inline std::string array(std::vector<std::string> const& items)
{
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i)
    {
        out += (i == 0 ? "" : ", ") + items[i];
    }
    return out + "]";
}

inline std::string boolean(bool value)
{
    return value ? "true" : "false";
}

// ---- TensorRT enum names -----------------------------------------------------------------------

char const* const kDATA_TYPE_NAMES[]
    = {"kFLOAT", "kHALF", "kINT8", "kINT32", "kBOOL", "kUINT8", "kFP8", "kBF16", "kINT64", "kINT4", "kFP4", "kE8M0"};
char const* const kFORMAT_NAMES[] = {"kLINEAR", "kCHW2", "kHWC8", "kCHW4", "kCHW16", "kCHW32", "kDHWC8", "kCDHW32",
    "kHWC", "kDLA_LINEAR", "kDLA_HWC4", "kHWC16", "kDHWC"};
char const* const kFIELD_TYPE_NAMES[] = {"kFLOAT16", "kFLOAT32", "kFLOAT64", "kINT8", "kINT16", "kINT32", "kCHAR",
    "kDIMS", "kUNKNOWN", "kBF16", "kINT64", "kFP8", "kINT4", "kFP4"};

template <size_t N>
std::string enumName(char const* const (&names)[N], int32_t value)
{
    return value >= 0 && static_cast<size_t>(value) < N ? names[value] : "#" + std::to_string(value);
}

inline std::string dataTypeName(DataType t)
{
    return enumName(kDATA_TYPE_NAMES, static_cast<int32_t>(t));
}

inline std::string formatName(TensorFormat f)
{
    return enumName(kFORMAT_NAMES, static_cast<int32_t>(f));
}

inline std::string fieldTypeName(PluginFieldType t)
{
    return enumName(kFIELD_TYPE_NAMES, static_cast<int32_t>(t));
}

inline PluginFieldType fieldTypeFromName(std::string const& name)
{
    for (size_t i = 0; i < sizeof(kFIELD_TYPE_NAMES) / sizeof(kFIELD_TYPE_NAMES[0]); ++i)
    {
        if (name == kFIELD_TYPE_NAMES[i])
        {
            return static_cast<PluginFieldType>(i);
        }
    }
    throw HarnessError("unknown field type " + name);
}

inline std::string interfaceJson(nvinfer1::IVersionedInterface const* versioned)
{
    if (versioned == nullptr)
    {
        return "null";
    }
    nvinfer1::InterfaceInfo const info = versioned->getInterfaceInfo();
    return object({{"kind", quote(info.kind == nullptr ? "" : info.kind)}, {"major", number(info.major)},
        {"minor", number(info.minor)}});
}

// ---- arguments ------------------------------------------------------------------------------

struct Arguments
{
    std::string command;
    std::map<std::string, std::string> options;
    std::vector<std::string> fields;

    std::string get(std::string const& key) const
    {
        auto const it = options.find(key);
        if (it == options.end())
        {
            throw HarnessError("missing --" + key);
        }
        return it->second;
    }
    std::string get(std::string const& key, std::string const& fallback) const
    {
        auto const it = options.find(key);
        return it == options.end() ? fallback : it->second;
    }
};

//! `COMMAND --key value ...`, every --field collected in order; `usage` is the error without a command.
inline Arguments parseArguments(int argc, char** argv, char const* usage)
{
    if (argc < 2)
    {
        throw HarnessError(usage);
    }
    Arguments args;
    args.command = argv[1];
    for (int i = 2; i < argc; ++i)
    {
        std::string const key = argv[i];
        if (key.rfind("--", 0) != 0 || i + 1 >= argc)
        {
            throw HarnessError("expected --key value, got " + key);
        }
        std::string const value = argv[++i];
        if (key == "--field")
        {
            args.fields.push_back(value);
        }
        else
        {
            args.options[key.substr(2)] = value;
        }
    }
    return args;
}

inline std::vector<std::string> split(std::string const& text, char separator)
{
    std::vector<std::string> parts;
    std::string part;
    std::istringstream stream(text);
    while (std::getline(stream, part, separator))
    {
        parts.push_back(part);
    }
    if (!text.empty() && text.back() == separator)
    {
        parts.emplace_back();
    }
    return parts;
}

inline int64_t volume(nvinfer1::Dims const& dims)
{
    int64_t n = 1;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        n *= dims.d[i];
    }
    return n;
}

// ---- loading and plugins ------------------------------------------------------------------------

using GetCreatorsFn = nvinfer1::IPluginCreatorInterface* const* (*) (int32_t&);
using SetLoggerFinderFn = void (*)(nvinfer1::ILoggerFinder*);

//! The IPluginCreatorV3One called `name` among `creators`.
inline nvinfer1::IPluginCreatorV3One* findCreator(
    std::vector<nvinfer1::IPluginCreatorInterface*> const& creators, char const* name)
{
    for (auto* creator : creators)
    {
        if (creator != nullptr && std::strcmp(creator->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0)
        {
            auto* v3 = static_cast<nvinfer1::IPluginCreatorV3One*>(creator);
            if (std::strcmp(v3->getPluginName(), name) == 0)
            {
                return v3;
            }
        }
    }
    throw HarnessError("no IPluginCreatorV3One named " + std::string{name} + " was found");
}

struct Capabilities
{
    nvinfer1::IPluginV3OneCore* core;
    nvinfer1::IPluginV3OneBuild* build;
    nvinfer1::IPluginV3OneRuntime* runtime;
};

inline Capabilities capabilities(nvinfer1::IPluginV3* plugin)
{
    return Capabilities{
        static_cast<nvinfer1::IPluginV3OneCore*>(plugin->getCapabilityInterface(nvinfer1::PluginCapabilityType::kCORE)),
        static_cast<nvinfer1::IPluginV3OneBuild*>(
            plugin->getCapabilityInterface(nvinfer1::PluginCapabilityType::kBUILD)),
        static_cast<nvinfer1::IPluginV3OneRuntime*>(
            plugin->getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME))};
}

using PluginPtr = std::unique_ptr<nvinfer1::IPluginV3>;

inline std::string creatorJson(nvinfer1::IPluginCreatorInterface* creator)
{
    std::vector<std::pair<std::string, std::string>> members{{"interface", interfaceJson(creator)}};
    if (std::strcmp(creator->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0)
    {
        auto* v3 = static_cast<nvinfer1::IPluginCreatorV3One*>(creator);
        members.emplace_back("name", quote(v3->getPluginName()));
        members.emplace_back("version", quote(v3->getPluginVersion()));
        members.emplace_back("namespace", quote(v3->getPluginNamespace()));
        members.emplace_back("fields", fieldsJson(v3->getFieldNames()));
    }
    return object(members);
}

//! describe's `plugin`: a plugin's identity, capability interfaces and output count ("null" for none).
inline std::string pluginJson(nvinfer1::IPluginV3* plugin)
{
    if (!plugin)
    {
        return "null";
    }
    Capabilities const caps = capabilities(plugin);
    return object({{"interface", interfaceJson(plugin)}, {"name", quote(caps.core->getPluginName())},
        {"version", quote(caps.core->getPluginVersion())}, {"namespace", quote(caps.core->getPluginNamespace())},
        {"capabilities",
            object({{"core", interfaceJson(caps.core)}, {"build", interfaceJson(caps.build)},
                {"runtime", interfaceJson(caps.runtime)}})},
        {"nb_outputs", number(caps.build->getNbOutputs())}});
}

inline std::string serialisedFieldsOf(nvinfer1::IPluginV3* plugin)
{
    return plugin == nullptr ? "null" : fieldsJson(capabilities(plugin).runtime->getFieldsToSerialize());
}

//! probe's serialisation round trip: the fields `plugin` serialises, then those of the plugin
//! createPlugin makes from them in the runtime phase, of its clone and of attachToContext's plugin.
inline void appendRoundTrip(std::vector<std::pair<std::string, std::string>>& members,
    nvinfer1::IPluginCreatorV3One* creator, nvinfer1::IPluginV3* plugin)
{
    Capabilities const caps = capabilities(plugin);
    nvinfer1::PluginFieldCollection const* const serialised = caps.runtime->getFieldsToSerialize();
    members.emplace_back("serialized_fields", fieldsJson(serialised));
    PluginPtr const deserialised(creator->createPlugin("probe", serialised, nvinfer1::TensorRTPhase::kRUNTIME));
    members.emplace_back("deserialized_fields", serialisedFieldsOf(deserialised.get()));
    PluginPtr const cloned(plugin->clone());
    members.emplace_back("cloned_fields", serialisedFieldsOf(cloned.get()));
    PluginPtr const attached(caps.runtime->attachToContext(nullptr));
    members.emplace_back("attached_fields", serialisedFieldsOf(attached.get()));
}

// ---- tensor descriptions ------------------------------------------------------------------------

inline nvinfer1::DynamicPluginTensorDesc dynamicDesc(nvinfer1::Dims const& dims, DataType type, TensorFormat format)
{
    nvinfer1::DynamicPluginTensorDesc desc{};
    desc.desc.dims = dims;
    desc.desc.type = type;
    desc.desc.format = format;
    desc.desc.scale = -1.F;
    desc.min = dims;
    desc.max = dims;
    desc.opt = dims;
    return desc;
}

//! `rank` dimensions, each -1 (not known until run time).
inline nvinfer1::Dims unknownDims(int32_t rank)
{
    nvinfer1::Dims dims{};
    dims.nbDims = rank;
    std::fill(dims.d, dims.d + rank, int64_t{-1});
    return dims;
}

// ---- CUDA ---------------------------------------------------------------------------------------

inline void checkCuda(cudaError_t status, char const* what)
{
    if (status != cudaSuccess)
    {
        throw HarnessError(std::string{what} + ": " + cudaGetErrorString(status));
    }
}

//! Bytes poisoned with kPOISON before and after each output, checked untouched after a run.
constexpr size_t kGUARD_BYTES{256};
constexpr int kPOISON{0x7B};

} // namespace harness
} // namespace graphfix

#endif // GRAPHFIX_PLUGIN_TESTS_HARNESS_COMMON_H
