/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Host harness for GraphfixAttention, the sibling of pluginHarness.cpp (whose test doubles it
 * shares): loads a plugin library the way TensorRT does and drives GraphfixAttention through
 * TensorRT's plugin interfaces, printing one JSON document on stdout.
 *
 *   describe --library L --loading static|dynamic
 *       the creators the library offers, GraphfixAttention's fields, a plugin's interfaces
 *   probe --library L --loading M [--field name:type:length:values]... --inputs SPEC
 *       createPlugin from the fields, then output types and shapes, supportsFormatCombination,
 *       configurePlugin, getWorkspaceSize, onShapeChange and the serialisation round trip
 *   run --library L --loading M --manifest FILE [--capture 1] [--stale-shape 1] (needs a GPU)
 *       one case per line, `FIELDS|INPUTS|OUTPUT|ITERATIONS`: FIELDS as --field values joined
 *       by ';', INPUTS as `dtype:d0,d1,..:path` joined by ';' (Q, K, V[, mask]; raw little-endian
 *       files; dtype float32, float16, bfloat16 or bool), OUTPUT a path; ITERATIONS > 0 also times
 *       that many enqueues (median, CUDA events): each one on its own (median_ms) and each one
 *       captured once into a CUDA graph and replayed (graph_median_ms, no host overhead).
 *       --capture 1: the enqueue whose output is written runs under stream capture
 *       (cudaStreamCaptureModeGlobal, which refuses allocation and synchronisation) and the graph
 *       is then launched, as trtexec --useCudaGraph does. --stale-shape 1: onShapeChange is given
 *       a batch one larger than enqueue then runs (a plan made for other shapes).
 *
 * SPEC for probe: `dtype:d0,d1,..` joined by ';'. The plugin is made as TensorRT makes one: a
 * build-phase plugin configured with dynamic dimensions, its serialised fields given to
 * createPlugin in the runtime phase, attachToContext; then onShapeChange and enqueue with a
 * workspace of getWorkspaceSize bytes. Everything the plugin logs (any severity) is reported.
 */
#include "harnessCommon.h"
#include "harnessDoubles.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

using graphfix::harness::RecordingRegistry;
using nvinfer1::DataType;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

RecordingRegistry gRegistry;

//! Records every message with its severity.
class MessageLogger final : public nvinfer1::ILogger
{
public:
    std::vector<std::pair<int32_t, std::string>> messages;

    void log(Severity severity, char const* msg) noexcept override
    {
        messages.emplace_back(static_cast<int32_t>(severity), msg == nullptr ? "" : msg);
    }
};

class MessageLoggerFinder final : public nvinfer1::ILoggerFinder
{
public:
    MessageLogger logger;

    nvinfer1::ILogger* findLogger() override
    {
        return &logger;
    }
};

MessageLoggerFinder gLoggerFinder;

} // namespace

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginRegistry* getPluginRegistry() noexcept
{
    return &gRegistry;
}

namespace graphfix
{
namespace harness
{

// ---- JSON: the parts this harness writes its own way ---------------------------------------

std::string quote(std::string const& s)
{
    std::string out = "\"";
    for (char const c : s)
    {
        if (c == '"' || c == '\\')
        {
            out += '\\';
            out += c;
        }
        else if (static_cast<unsigned char>(c) < 0x20)
        {
            char buffer[8];
            std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
            out += buffer;
        }
        else
        {
            out += c;
        }
    }
    return out + "\"";
}

template <typename T>
std::string number(T value)
{
    if constexpr (std::is_floating_point_v<T>)
    {
        if (!std::isfinite(value))
        {
            return quote(std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf");
        }
    }
    std::ostringstream s;
    s.precision(9);
    s << value;
    return s.str();
}

std::string fieldsJson(nvinfer1::PluginFieldCollection const* fc)
{
    if (fc == nullptr)
    {
        return "null";
    }
    std::vector<std::string> items;
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        nvinfer1::PluginField const& f = fc->fields[i];
        std::vector<std::string> values;
        for (int32_t k = 0; f.data != nullptr && k < f.length; ++k)
        {
            if (f.type == PluginFieldType::kINT32)
            {
                values.push_back(number(static_cast<int32_t const*>(f.data)[k]));
            }
            else if (f.type == PluginFieldType::kFLOAT32)
            {
                values.push_back(number(static_cast<float const*>(f.data)[k]));
            }
        }
        items.push_back(object({{"name", quote(f.name == nullptr ? "" : f.name)}, {"type", quote(fieldTypeName(f.type))},
            {"length", number(f.length)}, {"values", f.data == nullptr ? "null" : array(values)}}));
    }
    return array(items);
}

} // namespace harness
} // namespace graphfix

namespace
{

using namespace graphfix::harness;

constexpr char const* kPLUGIN_NAME{"GraphfixAttention"};

// ---- JSON ----------------------------------------------------------------------------------

std::string messagesJson(size_t from = 0)
{
    std::vector<std::string> items;
    auto const& all = gLoggerFinder.logger.messages;
    for (size_t i = from; i < all.size(); ++i)
    {
        items.push_back(object({{"severity", number(all[i].first)}, {"text", quote(all[i].second)}}));
    }
    return array(items);
}

// ---- arguments ------------------------------------------------------------------------------

nvinfer1::Dims parseDims(std::string const& text)
{
    nvinfer1::Dims dims{};
    for (auto const& part : split(text, ','))
    {
        if (part.empty())
        {
            continue;
        }
        if (dims.nbDims >= nvinfer1::Dims::MAX_DIMS)
        {
            throw HarnessError("more than 8 dimensions: " + text);
        }
        dims.d[dims.nbDims++] = std::stoll(part);
    }
    return dims;
}

DataType dataTypeFromName(std::string const& name)
{
    if (name == "float32")
    {
        return DataType::kFLOAT;
    }
    if (name == "float16")
    {
        return DataType::kHALF;
    }
    if (name == "bfloat16")
    {
        return DataType::kBF16;
    }
    if (name == "bool")
    {
        return DataType::kBOOL;
    }
    if (name == "int32")
    {
        return DataType::kINT32;
    }
    throw HarnessError("dtype must be float32, float16, bfloat16, bool or int32, got " + name);
}

size_t elementSize(DataType type)
{
    return type == DataType::kFLOAT || type == DataType::kINT32 ? 4 : type == DataType::kBOOL ? 1 : 2;
}

struct FieldStorage
{
    std::vector<std::string> names;
    std::vector<std::vector<uint8_t>> data;
    std::vector<nvinfer1::PluginField> fields;
    nvinfer1::PluginFieldCollection collection{};

    explicit FieldStorage(std::vector<std::string> const& specs)
    {
        names.reserve(specs.size());
        data.reserve(specs.size());
        for (auto const& spec : specs)
        {
            auto const parts = split(spec, ':');
            if (parts.size() != 4)
            {
                throw HarnessError("field spec must be name:type:length:values, got " + spec);
            }
            PluginFieldType const type = fieldTypeFromName(parts[1]);
            names.push_back(parts[0]);
            std::vector<uint8_t> bytes;
            bool const isNull = parts[3] == "null";
            for (auto const& value : isNull ? std::vector<std::string>{} : split(parts[3], ','))
            {
                appendValue(bytes, type, value);
            }
            data.push_back(std::move(bytes));
            fields.emplace_back(names.back().c_str(), isNull ? nullptr : data.back().data(), type,
                static_cast<int32_t>(std::stol(parts[2])));
        }
        collection.nbFields = static_cast<int32_t>(fields.size());
        collection.fields = fields.data();
    }

    static void appendValue(std::vector<uint8_t>& bytes, PluginFieldType type, std::string const& value)
    {
        auto append = [&bytes](auto v) {
            auto const* p = reinterpret_cast<uint8_t const*>(&v);
            bytes.insert(bytes.end(), p, p + sizeof(v));
        };
        switch (type)
        {
        case PluginFieldType::kINT32: append(static_cast<int32_t>(std::stol(value))); break;
        case PluginFieldType::kINT64: append(static_cast<int64_t>(std::stoll(value))); break;
        case PluginFieldType::kFLOAT32: append(std::stof(value)); break;
        case PluginFieldType::kFLOAT64: append(std::stod(value)); break;
        case PluginFieldType::kCHAR: bytes.insert(bytes.end(), value.begin(), value.end()); break;
        default: throw HarnessError("field values of type " + fieldTypeName(type) + " are not supported here");
        }
    }
};

struct TensorSpec
{
    DataType type;
    nvinfer1::Dims dims;
    std::string path;
};

//! `dtype:dims[:path]` joined by ';'.
std::vector<TensorSpec> parseTensors(std::string const& text, bool withPaths)
{
    std::vector<TensorSpec> tensors;
    for (auto const& item : split(text, ';'))
    {
        auto const parts = split(item, ':');
        if (parts.size() != (withPaths ? 3U : 2U))
        {
            throw HarnessError("tensor spec must be dtype:dims" + std::string{withPaths ? ":path" : ""} + ", got " + item);
        }
        tensors.push_back(TensorSpec{dataTypeFromName(parts[0]), parseDims(parts[1]), withPaths ? parts[2] : ""});
    }
    if (tensors.size() < 3 || tensors.size() > 4)
    {
        throw HarnessError("give Q, K, V and optionally a mask, got " + std::to_string(tensors.size()) + " tensors");
    }
    return tensors;
}

// ---- loading ------------------------------------------------------------------------------


std::vector<nvinfer1::IPluginCreatorInterface*> loadCreators(Arguments const& args)
{
    std::string const loading = args.get("loading");
    if (loading != "static" && loading != "dynamic")
    {
        throw HarnessError("--loading must be static or dynamic, got " + loading);
    }
    size_t const before = gRegistry.registrations.size();
    void* const handle = dlopen(args.get("library").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
    {
        char const* const reason = dlerror();
        throw HarnessError("dlopen failed: " + std::string{reason == nullptr ? "" : reason});
    }
    std::vector<nvinfer1::IPluginCreatorInterface*> creators;
    if (loading == "static")
    {
        for (size_t i = before; i < gRegistry.registrations.size(); ++i)
        {
            creators.push_back(gRegistry.registrations[i].creator);
        }
        return creators;
    }
    auto const getCreators = reinterpret_cast<GetCreatorsFn>(dlsym(handle, "getCreators"));
    auto const setLoggerFinder = reinterpret_cast<SetLoggerFinderFn>(dlsym(handle, "setLoggerFinder"));
    if (getCreators == nullptr)
    {
        throw HarnessError("the library exports no getCreators");
    }
    if (setLoggerFinder != nullptr)
    {
        setLoggerFinder(&gLoggerFinder);
    }
    int32_t nbCreators = 0;
    nvinfer1::IPluginCreatorInterface* const* const list = getCreators(nbCreators);
    for (int32_t i = 0; i < nbCreators && list != nullptr; ++i)
    {
        creators.push_back(list[i]);
    }
    return creators;
}

nvinfer1::IPluginCreatorV3One* attentionCreator(std::vector<nvinfer1::IPluginCreatorInterface*> const& creators)
{
    return findCreator(creators, kPLUGIN_NAME);
}

// ---- describe -------------------------------------------------------------------------------

int describe(Arguments const& args)
{
    auto const creators = loadCreators(args);
    std::vector<std::string> listed;
    for (auto* c : creators)
    {
        listed.push_back(creatorJson(c));
    }
    nvinfer1::IPluginCreatorV3One* const creator = attentionCreator(creators);
    float scale = 0.125F;
    nvinfer1::PluginField const field{"scale", &scale, PluginFieldType::kFLOAT32, 1};
    nvinfer1::PluginFieldCollection const fc{1, &field};
    PluginPtr const plugin(creator->createPlugin("harness", &fc, nvinfer1::TensorRTPhase::kBUILD));
    std::printf("%s\n",
        object({{"creators", array(listed)}, {"plugin", pluginJson(plugin.get())}, {"messages", messagesJson()}})
            .c_str());
    return 0;
}

// ---- probe ------------------------------------------------------------------------------------

std::string outputShapesJson(nvinfer1::IPluginV3OneBuild* build, std::vector<TensorSpec> const& tensors)
{
    std::vector<std::unique_ptr<graphfix::harness::ConstantDimension>> owned;
    std::vector<nvinfer1::DimsExprs> inputs(tensors.size());
    for (size_t t = 0; t < tensors.size(); ++t)
    {
        inputs[t].nbDims = tensors[t].dims.nbDims;
        for (int32_t i = 0; i < tensors[t].dims.nbDims; ++i)
        {
            owned.push_back(std::make_unique<graphfix::harness::ConstantDimension>(tensors[t].dims.d[i]));
            inputs[t].d[i] = owned.back().get();
        }
    }
    nvinfer1::DimsExprs outputs{};
    graphfix::harness::CountingExprBuilder builder;
    int32_t const status = build->getOutputShapes(
        inputs.data(), static_cast<int32_t>(inputs.size()), nullptr, 0, &outputs, 1, builder);
    std::vector<std::string> values;
    for (int32_t i = 0; status == 0 && i < outputs.nbDims; ++i)
    {
        values.push_back(outputs.d[i] == nullptr ? "null" : number(outputs.d[i]->getConstantValue()));
    }
    return object({{"status", number(status)}, {"dims", status == 0 ? array(values) : "null"},
        {"builder_calls", number(builder.counter.calls)}});
}

//! For each position: the (type, format) pairs accepted with every other tensor as given.
std::string formatsJson(nvinfer1::IPluginV3OneBuild* build, std::vector<TensorSpec> const& tensors, DataType outType)
{
    int32_t const nbInputs = static_cast<int32_t>(tensors.size());
    std::vector<nvinfer1::DynamicPluginTensorDesc> base;
    for (auto const& t : tensors)
    {
        base.push_back(dynamicDesc(t.dims, t.type, TensorFormat::kLINEAR));
    }
    base.push_back(dynamicDesc(tensors[0].dims, outType, TensorFormat::kLINEAR));
    std::vector<std::pair<std::string, std::string>> members;
    for (int32_t pos = 0; pos <= nbInputs; ++pos)
    {
        std::vector<std::string> accepted;
        for (int32_t t = 0; t < nvinfer1::EnumMax<DataType>(); ++t)
        {
            for (int32_t f = 0; f < nvinfer1::EnumMax<TensorFormat>(); ++f)
            {
                auto inOut = base;
                inOut[pos].desc.type = static_cast<DataType>(t);
                inOut[pos].desc.format = static_cast<TensorFormat>(f);
                if (build->supportsFormatCombination(pos, inOut.data(), nbInputs, 1))
                {
                    accepted.push_back(array({quote(dataTypeName(static_cast<DataType>(t))),
                        quote(enumName(kFORMAT_NAMES, f))}));
                }
            }
        }
        members.emplace_back(std::to_string(pos), array(accepted));
    }
    return object(members);
}

int probe(Arguments const& args)
{
    nvinfer1::IPluginCreatorV3One* const creator = attentionCreator(loadCreators(args));
    FieldStorage const fields(args.fields);
    PluginPtr const plugin(creator->createPlugin("probe", &fields.collection, nvinfer1::TensorRTPhase::kBUILD));
    std::vector<std::pair<std::string, std::string>> members{{"created", boolean(plugin != nullptr)}};
    if (plugin)
    {
        std::vector<TensorSpec> const tensors = parseTensors(args.get("inputs"), false);
        int32_t const nbInputs = static_cast<int32_t>(tensors.size());
        Capabilities const caps = capabilities(plugin.get());

        std::vector<std::pair<std::string, std::string>> types;
        for (int32_t t = 0; t < nvinfer1::EnumMax<DataType>(); ++t)
        {
            std::vector<DataType> inputTypes(tensors.size(), static_cast<DataType>(t));
            if (nbInputs == 4)
            {
                inputTypes[3] = tensors[3].type;
            }
            auto output = static_cast<DataType>(-1);
            int32_t const status = caps.build->getOutputDataTypes(&output, 1, inputTypes.data(), nbInputs);
            types.emplace_back(dataTypeName(static_cast<DataType>(t)),
                object({{"status", number(status)}, {"type", status == 0 ? quote(dataTypeName(output)) : "null"}}));
        }
        members.emplace_back("output_types", object(types));
        members.emplace_back("output_shapes", outputShapesJson(caps.build, tensors));
        members.emplace_back("formats", formatsJson(caps.build, tensors, tensors[0].type));

        std::vector<nvinfer1::DynamicPluginTensorDesc> in;
        for (auto const& t : tensors)
        {
            in.push_back(dynamicDesc(t.dims, t.type, TensorFormat::kLINEAR));
        }
        nvinfer1::Dims outDims = tensors[0].dims;
        outDims.d[outDims.nbDims - 1] = tensors[2].dims.d[tensors[2].dims.nbDims - 1];
        auto const out = dynamicDesc(outDims, tensors[0].type, TensorFormat::kLINEAR);
        members.emplace_back("configure", number(caps.build->configurePlugin(in.data(), nbInputs, &out, 1)));
        members.emplace_back(
            "workspace_size", number(caps.build->getWorkspaceSize(in.data(), nbInputs, &out, 1)));
        std::vector<nvinfer1::PluginTensorDesc> inDescs;
        for (auto const& d : in)
        {
            inDescs.push_back(d.desc);
        }
        members.emplace_back(
            "on_shape_change", number(caps.runtime->onShapeChange(inDescs.data(), nbInputs, &out.desc, 1)));

        appendRoundTrip(members, creator, plugin.get());
    }
    members.emplace_back("messages", messagesJson());
    std::printf("%s\n", object(members).c_str());
    return 0;
}

// ---- run ----------------------------------------------------------------------------------------

struct DeviceBuffer
{
    char* base{nullptr};
    size_t bytes{0};

    explicit DeviceBuffer(size_t size)
        : bytes(size)
    {
        void* p = nullptr;
        checkCuda(cudaMalloc(&p, std::max<size_t>(size, 1) + 2 * kGUARD_BYTES), "cudaMalloc");
        base = static_cast<char*>(p);
        checkCuda(cudaMemset(base, kPOISON, size + 2 * kGUARD_BYTES), "cudaMemset");
    }
    ~DeviceBuffer()
    {
        cudaFree(base);
    }
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
    char* data() const
    {
        return base + kGUARD_BYTES;
    }
};

//! Captures `enqueue` on `stream` into an executable graph; the capture status on failure.
template <typename Enqueue>
cudaError_t captureGraph(cudaStream_t stream, Enqueue&& enqueue, int32_t& status, cudaGraphExec_t& exec)
{
    cudaError_t error = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    if (error != cudaSuccess)
    {
        return error;
    }
    status = enqueue();
    cudaGraph_t graph{};
    error = cudaStreamEndCapture(stream, &graph);
    if (error != cudaSuccess)
    {
        return error;
    }
    error = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    return error;
}

//! Median of `iterations` CUDA-event-timed calls of `launch` on `stream`, after 3 warm-up calls.
template <typename Launch>
double medianMilliseconds(cudaStream_t stream, int32_t iterations, Launch&& launch)
{
    cudaEvent_t start{};
    cudaEvent_t stop{};
    checkCuda(cudaEventCreate(&start), "cudaEventCreate");
    checkCuda(cudaEventCreate(&stop), "cudaEventCreate");
    for (int32_t i = 0; i < 3; ++i)
    {
        launch();
    }
    std::vector<float> times;
    for (int32_t i = 0; i < iterations; ++i)
    {
        checkCuda(cudaEventRecord(start, stream), "cudaEventRecord");
        launch();
        checkCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
        checkCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0.F;
        checkCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        times.push_back(ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

std::string runCase(nvinfer1::IPluginCreatorV3One* creator, std::string const& line, cudaStream_t stream,
    bool capture, bool staleShape)
{
    auto const parts = split(line, '|');
    if (parts.size() != 4)
    {
        throw HarnessError("a manifest line is FIELDS|INPUTS|OUTPUT|ITERATIONS, got " + line);
    }
    size_t const firstMessage = gLoggerFinder.logger.messages.size();
    FieldStorage const fields(parts[0].empty() ? std::vector<std::string>{} : split(parts[0], ';'));
    std::vector<TensorSpec> const tensors = parseTensors(parts[1], true);
    int32_t const iterations = std::stoi(parts[3]);
    int32_t const nbInputs = static_cast<int32_t>(tensors.size());

    auto const fail = [&](std::string const& stage) {
        return object({{"output", quote(parts[2])}, {"status", "-1"}, {"stage", quote(stage)},
            {"messages", messagesJson(firstMessage)}});
    };
    PluginPtr const built(creator->createPlugin("harness", &fields.collection, nvinfer1::TensorRTPhase::kBUILD));
    if (!built)
    {
        return fail("createPlugin");
    }
    std::vector<nvinfer1::DynamicPluginTensorDesc> dynamicIn;
    std::vector<nvinfer1::DynamicPluginTensorDesc> exactIn;
    for (auto const& t : tensors)
    {
        auto desc = dynamicDesc(unknownDims(t.dims.nbDims), t.type, TensorFormat::kLINEAR);
        desc.min = t.dims;
        desc.max = t.dims;
        desc.opt = t.dims;
        dynamicIn.push_back(desc);
        exactIn.push_back(dynamicDesc(t.dims, t.type, TensorFormat::kLINEAR));
    }
    nvinfer1::Dims outDims = tensors[0].dims;
    outDims.d[outDims.nbDims - 1] = tensors[2].dims.d[tensors[2].dims.nbDims - 1];
    auto dynamicOut = dynamicDesc(unknownDims(outDims.nbDims), tensors[0].type, TensorFormat::kLINEAR);
    dynamicOut.min = dynamicOut.max = dynamicOut.opt = outDims;
    Capabilities const builtCaps = capabilities(built.get());
    if (builtCaps.build->configurePlugin(dynamicIn.data(), nbInputs, &dynamicOut, 1) != 0)
    {
        return fail("configurePlugin");
    }
    size_t const workspaceBytes = builtCaps.build->getWorkspaceSize(dynamicIn.data(), nbInputs, &dynamicOut, 1);
    PluginPtr const runtimePlugin(creator->createPlugin(
        "harness", builtCaps.runtime->getFieldsToSerialize(), nvinfer1::TensorRTPhase::kRUNTIME));
    if (!runtimePlugin)
    {
        return fail("createPlugin (runtime)");
    }
    PluginPtr const plugin(capabilities(runtimePlugin.get()).runtime->attachToContext(nullptr));
    if (!plugin)
    {
        return fail("attachToContext");
    }
    nvinfer1::IPluginV3OneRuntime* const runtime = capabilities(plugin.get()).runtime;
    std::vector<nvinfer1::PluginTensorDesc> inDescs;
    for (auto const& d : exactIn)
    {
        inDescs.push_back(d.desc);
    }
    nvinfer1::PluginTensorDesc const outDesc = dynamicDesc(outDims, tensors[0].type, TensorFormat::kLINEAR).desc;
    // --stale-shape 1: onShapeChange sees a batch one larger than enqueue then gets, so enqueue
    // meets shapes it was not planned for.
    std::vector<nvinfer1::PluginTensorDesc> shapeDescs = inDescs;
    nvinfer1::PluginTensorDesc shapeOut = outDesc;
    if (staleShape)
    {
        int32_t const rank = inDescs[0].dims.nbDims;
        int64_t const batch = inDescs[0].dims.d[0];
        for (auto& d : shapeDescs)
        {
            if (d.dims.nbDims == rank && d.dims.d[0] == batch)
            {
                d.dims.d[0] = batch + 1;
            }
        }
        shapeOut.dims.d[0] = batch + 1;
    }
    if (runtime->onShapeChange(shapeDescs.data(), nbInputs, &shapeOut, 1) != 0)
    {
        return fail("onShapeChange");
    }

    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    std::vector<void const*> inputPointers;
    for (auto const& t : tensors)
    {
        size_t const bytes = static_cast<size_t>(volume(t.dims)) * elementSize(t.type);
        std::vector<char> host(bytes);
        std::ifstream file(t.path, std::ios::binary);
        if (!file.read(host.data(), static_cast<std::streamsize>(bytes)))
        {
            throw HarnessError("cannot read " + std::to_string(bytes) + " bytes from " + t.path);
        }
        inputs.push_back(std::make_unique<DeviceBuffer>(bytes));
        checkCuda(cudaMemcpy(inputs.back()->data(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        inputPointers.push_back(inputs.back()->data());
    }
    size_t const outBytes = static_cast<size_t>(volume(outDims)) * elementSize(tensors[0].type);
    DeviceBuffer const output(outBytes);
    DeviceBuffer const workspace(workspaceBytes);
    void* outputs[] = {output.data()};
    void* const workspacePointer = workspaceBytes > 0 ? workspace.data() : nullptr;

    auto const enqueue = [&]() {
        return runtime->enqueue(inDescs.data(), &outDesc, inputPointers.data(), outputs, workspacePointer, stream);
    };
    int32_t status = 0;
    cudaError_t captured = cudaSuccess;
    if (capture)
    {
        cudaGraphExec_t exec{};
        captured = captureGraph(stream, enqueue, status, exec);
        if (captured == cudaSuccess)
        {
            captured = cudaGraphLaunch(exec, stream);
            cudaGraphExecDestroy(exec);
        }
    }
    else
    {
        status = enqueue();
    }
    cudaError_t const sync = captured != cudaSuccess ? captured : cudaStreamSynchronize(stream);
    std::vector<char> back(outBytes + 2 * kGUARD_BYTES);
    checkCuda(cudaMemcpy(back.data(), output.base, back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    auto const poisoned = [](char c) { return c == kPOISON; };
    bool const guardsIntact = std::all_of(back.begin(), back.begin() + kGUARD_BYTES, poisoned)
        && std::all_of(back.end() - kGUARD_BYTES, back.end(), poisoned);
    std::ofstream(parts[2], std::ios::binary)
        .write(back.data() + kGUARD_BYTES, static_cast<std::streamsize>(outBytes));

    double medianMs = 0.0;
    double graphMedianMs = 0.0;
    if (iterations > 0 && status == 0 && sync == cudaSuccess)
    {
        medianMs = medianMilliseconds(stream, iterations, [&]() { status |= enqueue(); });
        cudaGraphExec_t exec{};
        checkCuda(captureGraph(stream, enqueue, status, exec), "capturing enqueue into a CUDA graph");
        graphMedianMs = medianMilliseconds(
            stream, iterations, [&]() { checkCuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); });
        cudaGraphExecDestroy(exec);
    }
    return object({{"output", quote(parts[2])}, {"status", number(status)}, {"cuda", quote(cudaGetErrorString(sync))},
        {"guards_intact", boolean(guardsIntact)}, {"workspace_bytes", number(workspaceBytes)},
        {"median_ms", number(medianMs)}, {"graph_median_ms", number(graphMedianMs)}, {"captured", boolean(capture)},
        {"messages", messagesJson(firstMessage)}});
}

int run(Arguments const& args)
{
    nvinfer1::IPluginCreatorV3One* const creator = attentionCreator(loadCreators(args));
    std::ifstream manifest(args.get("manifest"));
    if (!manifest)
    {
        throw HarnessError("cannot read the manifest " + args.get("manifest"));
    }
    cudaStream_t stream{};
    checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    std::vector<std::string> results;
    std::string line;
    while (std::getline(manifest, line))
    {
        if (!line.empty())
        {
            results.push_back(runCase(
                creator, line, stream, args.get("capture", "0") == "1", args.get("stale-shape", "0") == "1"));
        }
    }
    checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    std::printf("%s\n", object({{"cases", array(results)}, {"messages", messagesJson()}}).c_str());
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        Arguments const args = parseArguments(
            argc, argv, "usage: graphfix_attention_harness describe|probe|run --library PATH --loading MODE ...");
        if (args.command == "describe")
        {
            return describe(args);
        }
        if (args.command == "probe")
        {
            return probe(args);
        }
        if (args.command == "run")
        {
            return run(args);
        }
        throw HarnessError("unknown command " + args.command + " (describe, probe, run)");
    }
    catch (std::exception const& e)
    {
        std::printf("%s\n", object({{"fatal", quote(e.what())}, {"messages", messagesJson()}}).c_str());
        return 2;
    }
}
