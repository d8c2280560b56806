/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Host harness: loads a graphfix plugin library the way TensorRT does and drives the plugin through
 * TensorRT's plugin interfaces, printing what it saw as one JSON document on stdout.
 *
 *   describe --library L --loading static|dynamic
 *       how the library registers, its creators and their fields, a plugin's capability interfaces
 *   probe --library L --loading M [--field name:type:length:values]... [--dims 2,3,4]
 *       createPlugin from the given fields (none: an empty collection), then output types and
 *       shapes, supportsFormatCombination, configurePlugin, onShapeChange and the serialisation
 *       round trip; errors the plugin logged
 *   run --library L --loading M --manifest FILE            (needs a GPU)
 *       one case per manifest line: `dtype axis inOffset outOffset input output d0 d1 ...`;
 *       raw little-endian files; offsets in elements shift the device pointers off alignment
 *   bench --library L --loading M --dtype T --dims D [--axis A] [--iterations N]   (needs a GPU)
 *       median enqueue time and median cudaMemcpyAsync time of the same bytes
 *
 * `static` dlopens the library and collects what it registers through getPluginRegistry() (this
 * executable exports a recording registry under that name, as libnvinfer does); `dynamic` dlopens
 * it and calls its exported setLoggerFinder and getCreators, as IPluginRegistry::loadLibrary does.
 * With GRAPHFIX_HARNESS_REFUSE_REGISTRATION set, the registry refuses every registerCreator (as
 * TensorRT refuses a creator that is already registered).
 */
#include "harnessCommon.h"
#include "harnessDoubles.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

using graphfix::harness::RecordingLoggerFinder;
using graphfix::harness::RecordingRegistry;
using nvinfer1::DataType;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

RecordingRegistry gRegistry;
RecordingLoggerFinder gLoggerFinder;

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
        switch (c)
        {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20)
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
    }
    return out + "\"";
}

template <typename T>
std::string number(T value)
{
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
        if (f.data != nullptr && f.type == PluginFieldType::kINT32)
        {
            auto const* data = static_cast<int32_t const*>(f.data);
            for (int32_t k = 0; k < f.length; ++k)
            {
                values.push_back(number(data[k]));
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

// ---- JSON ----------------------------------------------------------------------------------

std::string errorsJson()
{
    std::vector<std::string> items;
    for (auto const& e : gLoggerFinder.logger.errors)
    {
        items.push_back(quote(e));
    }
    return array(items);
}

// ---- arguments --------------------------------------------------------------------------------

nvinfer1::Dims parseDims(std::string const& text)
{
    nvinfer1::Dims dims{};
    for (auto const& part : split(text, ','))
    {
        if (dims.nbDims >= nvinfer1::Dims::MAX_DIMS)
        {
            throw HarnessError("more than 8 dimensions: " + text);
        }
        dims.d[dims.nbDims++] = std::stoll(part);
    }
    return dims;
}

//! Backing storage for PluginFields described as name:type:length:values ("null" for no data).
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
            if (!isNull)
            {
                for (auto const& value : split(parts[3], ','))
                {
                    appendValue(bytes, type, value);
                }
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
        case PluginFieldType::kINT8: append(static_cast<int8_t>(std::stoi(value))); break;
        case PluginFieldType::kCHAR: bytes.insert(bytes.end(), value.begin(), value.end()); break;
        default: throw HarnessError("field values of type " + fieldTypeName(type) + " are not supported here");
        }
    }
};

// ---- loading ----------------------------------------------------------------------------------

struct LoadedLibrary
{
    std::string loading;
    std::vector<graphfix::harness::Registration> registrations;
    std::vector<nvinfer1::IPluginCreatorInterface*> creators;
    bool exportsGetCreators{false};
    bool exportsSetLoggerFinder{false};
};

LoadedLibrary loadLibrary(Arguments const& args)
{
    LoadedLibrary lib;
    lib.loading = args.get("loading");
    if (lib.loading != "static" && lib.loading != "dynamic")
    {
        throw HarnessError("--loading must be static or dynamic, got " + lib.loading);
    }
    std::string const path = args.get("library");
    size_t const before = gRegistry.registrations.size();
    gRegistry.refuse = std::getenv("GRAPHFIX_HARNESS_REFUSE_REGISTRATION") != nullptr;
    void* const handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
    {
        char const* const reason = dlerror();
        throw HarnessError("dlopen failed: " + std::string{reason == nullptr ? "" : reason});
    }
    lib.registrations.assign(gRegistry.registrations.begin() + static_cast<std::ptrdiff_t>(before),
        gRegistry.registrations.end());
    auto const getCreators = reinterpret_cast<GetCreatorsFn>(dlsym(handle, "getCreators"));
    auto const setLoggerFinder = reinterpret_cast<SetLoggerFinderFn>(dlsym(handle, "setLoggerFinder"));
    lib.exportsGetCreators = getCreators != nullptr;
    lib.exportsSetLoggerFinder = setLoggerFinder != nullptr;

    if (lib.loading == "static")
    {
        for (auto const& r : lib.registrations)
        {
            lib.creators.push_back(r.creator);
        }
        return lib;
    }
    if (getCreators == nullptr)
    {
        throw HarnessError("the library exports no getCreators");
    }
    if (setLoggerFinder != nullptr)
    {
        setLoggerFinder(&gLoggerFinder);
    }
    int32_t nbCreators = 0;
    nvinfer1::IPluginCreatorInterface* const* const creators = getCreators(nbCreators);
    for (int32_t i = 0; i < nbCreators && creators != nullptr; ++i)
    {
        lib.creators.push_back(creators[i]);
    }
    return lib;
}

nvinfer1::IPluginCreatorV3One* softmaxCreator(LoadedLibrary const& lib)
{
    return findCreator(lib.creators, "GraphfixSoftmax");
}

PluginPtr createWithAxis(nvinfer1::IPluginCreatorV3One* creator, int32_t axis, nvinfer1::TensorRTPhase phase)
{
    nvinfer1::PluginField const field{"axis", &axis, PluginFieldType::kINT32, 1};
    nvinfer1::PluginFieldCollection const fc{1, &field};
    return PluginPtr(creator->createPlugin("harness", &fc, phase));
}

// ---- describe ---------------------------------------------------------------------------------

int describe(Arguments const& args)
{
    LoadedLibrary const lib = loadLibrary(args);
    std::vector<std::string> registrations;
    for (auto const& r : lib.registrations)
    {
        registrations.push_back(
            object({{"namespace_argument", quote(r.namespaceArgument)}, {"creator", creatorJson(r.creator)}}));
    }
    std::vector<std::string> creators;
    for (auto* c : lib.creators)
    {
        creators.push_back(creatorJson(c));
    }
    nvinfer1::IPluginCreatorV3One* const creator = softmaxCreator(lib);
    PluginPtr const plugin = createWithAxis(creator, -1, nvinfer1::TensorRTPhase::kBUILD);
    std::printf("%s\n",
        object({{"loading", quote(lib.loading)}, {"registrations", array(registrations)},
                   {"creators", array(creators)}, {"exports_get_creators", boolean(lib.exportsGetCreators)},
                   {"exports_set_logger_finder", boolean(lib.exportsSetLoggerFinder)},
                   {"plugin", pluginJson(plugin.get())}, {"errors", errorsJson()}})
            .c_str());
    return 0;
}

// ---- probe ------------------------------------------------------------------------------------

std::string outputTypesJson(nvinfer1::IPluginV3OneBuild* build)
{
    std::vector<std::pair<std::string, std::string>> members;
    for (int32_t t = 0; t < nvinfer1::EnumMax<DataType>(); ++t)
    {
        auto const input = static_cast<DataType>(t);
        auto output = static_cast<DataType>(-1);
        int32_t const status = build->getOutputDataTypes(&output, 1, &input, 1);
        members.emplace_back(dataTypeName(input),
            object({{"status", number(status)}, {"type", status == 0 ? quote(dataTypeName(output)) : "null"}}));
    }
    return object(members);
}

std::string outputShapesJson(nvinfer1::IPluginV3OneBuild* build, nvinfer1::Dims const& dims)
{
    std::vector<std::unique_ptr<graphfix::harness::ConstantDimension>> owned;
    nvinfer1::DimsExprs inputs{};
    inputs.nbDims = dims.nbDims;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        owned.push_back(std::make_unique<graphfix::harness::ConstantDimension>(dims.d[i]));
        inputs.d[i] = owned.back().get();
    }
    nvinfer1::DimsExprs outputs{};
    graphfix::harness::CountingExprBuilder builder;
    int32_t const status = build->getOutputShapes(&inputs, 1, nullptr, 0, &outputs, 1, builder);
    std::vector<std::string> values;
    bool sameExpressions = status == 0 && outputs.nbDims == inputs.nbDims;
    if (status == 0)
    {
        for (int32_t i = 0; i < outputs.nbDims; ++i)
        {
            values.push_back(outputs.d[i] == nullptr ? "null" : number(outputs.d[i]->getConstantValue()));
            sameExpressions = sameExpressions && outputs.d[i] == inputs.d[i];
        }
    }
    return object({{"status", number(status)}, {"dims", status == 0 ? array(values) : "null"},
        {"same_expressions", boolean(sameExpressions)}, {"builder_calls", number(builder.counter.calls)}});
}

std::string formatsJson(nvinfer1::IPluginV3OneBuild* build, nvinfer1::Dims const& dims)
{
    std::vector<std::string> accepted;
    int32_t const nbTypes = nvinfer1::EnumMax<DataType>();
    int32_t const nbFormats = nvinfer1::EnumMax<TensorFormat>();
    for (int32_t t0 = 0; t0 < nbTypes; ++t0)
    {
        for (int32_t f0 = 0; f0 < nbFormats; ++f0)
        {
            nvinfer1::DynamicPluginTensorDesc inOut[2]
                = {dynamicDesc(dims, static_cast<DataType>(t0), static_cast<TensorFormat>(f0)),
                    dynamicDesc(dims, static_cast<DataType>(t0), static_cast<TensorFormat>(f0))};
            if (!build->supportsFormatCombination(0, inOut, 1, 1))
            {
                continue;
            }
            accepted.push_back(array({"0", quote(dataTypeName(static_cast<DataType>(t0))),
                quote(formatName(static_cast<TensorFormat>(f0)))}));
            if (static_cast<TensorFormat>(f0) != TensorFormat::kLINEAR)
            {
                continue;
            }
            for (int32_t t1 = 0; t1 < nbTypes; ++t1)
            {
                for (int32_t f1 = 0; f1 < nbFormats; ++f1)
                {
                    inOut[1] = dynamicDesc(dims, static_cast<DataType>(t1), static_cast<TensorFormat>(f1));
                    if (build->supportsFormatCombination(1, inOut, 1, 1))
                    {
                        accepted.push_back(array({"1", quote(dataTypeName(static_cast<DataType>(t1))),
                            quote(formatName(static_cast<TensorFormat>(f1))),
                            quote(dataTypeName(static_cast<DataType>(t0)))}));
                    }
                }
            }
        }
    }
    return array(accepted);
}

int probe(Arguments const& args)
{
    LoadedLibrary const lib = loadLibrary(args);
    nvinfer1::IPluginCreatorV3One* const creator = softmaxCreator(lib);
    FieldStorage const fields(args.fields);
    PluginPtr const plugin(creator->createPlugin("probe", &fields.collection, nvinfer1::TensorRTPhase::kBUILD));
    std::vector<std::pair<std::string, std::string>> members{{"created", boolean(plugin != nullptr)}};
    if (plugin)
    {
        nvinfer1::Dims const dims = parseDims(args.get("dims", "2,3,4"));
        Capabilities const caps = capabilities(plugin.get());
        members.emplace_back("output_types", outputTypesJson(caps.build));
        members.emplace_back("output_shapes", outputShapesJson(caps.build, dims));
        members.emplace_back("formats", formatsJson(caps.build, dims));

        std::vector<std::pair<std::string, std::string>> configure;
        std::vector<std::pair<std::string, std::string>> shapeChange;
        for (DataType const type : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
        {
            auto const in = dynamicDesc(dims, type, TensorFormat::kLINEAR);
            auto const out = dynamicDesc(dims, type, TensorFormat::kLINEAR);
            configure.emplace_back(dataTypeName(type), number(caps.build->configurePlugin(&in, 1, &out, 1)));
            shapeChange.emplace_back(dataTypeName(type), number(caps.runtime->onShapeChange(&in.desc, 1, &out.desc, 1)));
        }
        members.emplace_back("configure", object(configure));
        members.emplace_back("on_shape_change", object(shapeChange));

        appendRoundTrip(members, creator, plugin.get());
    }
    members.emplace_back("errors", errorsJson());
    std::printf("%s\n", object(members).c_str());
    return 0;
}

// ---- device runs --------------------------------------------------------------------------------

char* deviceAlloc(size_t bytes)
{
    void* p = nullptr;
    checkCuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return static_cast<char*>(p);
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
    throw HarnessError("dtype must be float32, float16 or bfloat16, got " + name);
}

size_t elementSize(DataType type)
{
    return type == DataType::kFLOAT ? 4 : 2;
}

//! A runtime plugin made as TensorRT makes one: build-phase plugin, configurePlugin with dynamic
//! dimensions, getFieldsToSerialize, createPlugin in the runtime phase, attachToContext.
PluginPtr runtimePlugin(nvinfer1::IPluginCreatorV3One* creator, int32_t axis, int32_t rank, DataType type)
{
    PluginPtr const built = createWithAxis(creator, axis, nvinfer1::TensorRTPhase::kBUILD);
    if (!built)
    {
        throw HarnessError("createPlugin failed for axis " + std::to_string(axis));
    }
    auto const desc = dynamicDesc(unknownDims(rank), type, TensorFormat::kLINEAR);
    if (capabilities(built.get()).build->configurePlugin(&desc, 1, &desc, 1) != 0)
    {
        throw HarnessError("configurePlugin failed");
    }
    PluginPtr const deserialised(creator->createPlugin(
        "harness", capabilities(built.get()).runtime->getFieldsToSerialize(), nvinfer1::TensorRTPhase::kRUNTIME));
    if (!deserialised)
    {
        throw HarnessError("createPlugin from the serialised fields failed");
    }
    PluginPtr attached(capabilities(deserialised.get()).runtime->attachToContext(nullptr));
    if (!attached)
    {
        throw HarnessError("attachToContext failed");
    }
    return attached;
}

int32_t enqueueOnce(nvinfer1::IPluginV3* plugin, nvinfer1::Dims const& dims, DataType type, void const* input,
    void* output, cudaStream_t stream)
{
    nvinfer1::PluginTensorDesc desc{};
    desc.dims = dims;
    desc.type = type;
    desc.format = TensorFormat::kLINEAR;
    desc.scale = -1.F;
    nvinfer1::IPluginV3OneRuntime* const runtime = capabilities(plugin).runtime;
    if (runtime->onShapeChange(&desc, 1, &desc, 1) != 0)
    {
        return -1;
    }
    void const* inputs[] = {input};
    void* outputs[] = {output};
    return runtime->enqueue(&desc, &desc, inputs, outputs, nullptr, stream);
}


int run(Arguments const& args)
{
    LoadedLibrary const lib = loadLibrary(args);
    nvinfer1::IPluginCreatorV3One* const creator = softmaxCreator(lib);
    std::ifstream manifest(args.get("manifest"));
    if (!manifest)
    {
        throw HarnessError("cannot read the manifest " + args.get("manifest"));
    }
    cudaStream_t stream{};
    checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    std::map<std::string, PluginPtr> plugins;
    std::vector<std::string> results;
    std::string line;
    while (std::getline(manifest, line))
    {
        std::istringstream fields(line);
        std::string dtype;
        std::string inputPath;
        std::string outputPath;
        int32_t axis = 0;
        int64_t inOffset = 0;
        int64_t outOffset = 0;
        if (!(fields >> dtype >> axis >> inOffset >> outOffset >> inputPath >> outputPath))
        {
            continue;
        }
        nvinfer1::Dims dims{};
        int64_t d = 0;
        while (fields >> d)
        {
            dims.d[dims.nbDims++] = d;
        }
        DataType const type = dataTypeFromName(dtype);
        size_t const size = elementSize(type);
        size_t const bytes = static_cast<size_t>(volume(dims)) * size;

        std::string const key = dtype + "/" + std::to_string(axis) + "/" + std::to_string(dims.nbDims);
        if (plugins.find(key) == plugins.end())
        {
            plugins[key] = runtimePlugin(creator, axis, dims.nbDims, type);
        }

        std::vector<char> host(bytes);
        std::ifstream input(inputPath, std::ios::binary);
        if (!input.read(host.data(), static_cast<std::streamsize>(bytes)))
        {
            throw HarnessError("cannot read " + std::to_string(bytes) + " bytes from " + inputPath);
        }
        size_t const total = bytes + 2 * kGUARD_BYTES;
        char* const inBase = deviceAlloc(total);
        char* const outBase = deviceAlloc(total);
        char* const in = inBase + kGUARD_BYTES + inOffset * static_cast<int64_t>(size);
        char* const out = outBase + kGUARD_BYTES + outOffset * static_cast<int64_t>(size);
        checkCuda(cudaMemset(inBase, kPOISON, total), "cudaMemset");
        checkCuda(cudaMemset(outBase, kPOISON, total), "cudaMemset");
        checkCuda(cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");

        int32_t const status = enqueueOnce(plugins[key].get(), dims, type, in, out, stream);
        cudaError_t const sync = cudaStreamSynchronize(stream);
        std::vector<char> back(total);
        checkCuda(cudaMemcpy(back.data(), outBase, total, cudaMemcpyDeviceToHost), "cudaMemcpy");
        size_t const start = static_cast<size_t>(out - outBase);
        bool guardsIntact = std::all_of(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(start),
                                [](char c) { return c == kPOISON; })
            && std::all_of(back.begin() + static_cast<std::ptrdiff_t>(start + bytes), back.end(),
                [](char c) { return c == kPOISON; });
        std::ofstream output(outputPath, std::ios::binary);
        output.write(back.data() + start, static_cast<std::streamsize>(bytes));
        checkCuda(cudaFree(inBase), "cudaFree");
        checkCuda(cudaFree(outBase), "cudaFree");
        results.push_back(object({{"output", quote(outputPath)}, {"status", number(status)},
            {"cuda", quote(cudaGetErrorString(sync))}, {"guards_intact", boolean(guardsIntact)}}));
    }
    checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    std::printf("%s\n", object({{"cases", array(results)}, {"errors", errorsJson()}}).c_str());
    return 0;
}

//! Fills a device buffer with a repeating pattern of uniform values in [-8, 8).
void fillRandom(char* device, int64_t count, DataType type)
{
    int64_t const patternCount = std::min<int64_t>(count, int64_t{1} << 22);
    size_t const size = elementSize(type);
    std::vector<char> pattern(static_cast<size_t>(patternCount) * size);
    uint64_t state = 0x9E3779B97F4A7C15ULL;
    for (int64_t i = 0; i < patternCount; ++i)
    {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        float const value = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 16.F - 8.F;
        char* const slot = pattern.data() + i * static_cast<int64_t>(size);
        if (type == DataType::kFLOAT)
        {
            std::memcpy(slot, &value, size);
        }
        else if (type == DataType::kHALF)
        {
            __half const h = __float2half(value);
            std::memcpy(slot, &h, size);
        }
        else
        {
            __nv_bfloat16 const b = __float2bfloat16(value);
            std::memcpy(slot, &b, size);
        }
    }
    for (int64_t done = 0; done < count; done += patternCount)
    {
        int64_t const n = std::min(patternCount, count - done);
        checkCuda(cudaMemcpy(device + done * static_cast<int64_t>(size), pattern.data(), static_cast<size_t>(n) * size,
                      cudaMemcpyHostToDevice),
            "cudaMemcpy");
    }
}

template <typename Launch>
double medianMilliseconds(Launch&& launch, int32_t warmup, int32_t iterations, int32_t sets, cudaStream_t stream)
{
    for (int32_t i = 0; i < warmup; ++i)
    {
        launch(i % sets);
    }
    cudaEvent_t start{};
    cudaEvent_t stop{};
    checkCuda(cudaEventCreate(&start), "cudaEventCreate");
    checkCuda(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<float> times;
    for (int32_t i = 0; i < iterations; ++i)
    {
        checkCuda(cudaEventRecord(start, stream), "cudaEventRecord");
        launch(i % sets);
        checkCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
        checkCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0.F;
        checkCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        times.push_back(ms);
    }
    checkCuda(cudaEventDestroy(start), "cudaEventDestroy");
    checkCuda(cudaEventDestroy(stop), "cudaEventDestroy");
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

int bench(Arguments const& args)
{
    LoadedLibrary const lib = loadLibrary(args);
    nvinfer1::IPluginCreatorV3One* const creator = softmaxCreator(lib);
    DataType const type = dataTypeFromName(args.get("dtype"));
    nvinfer1::Dims const dims = parseDims(args.get("dims"));
    int32_t const axis = std::stoi(args.get("axis", "-1"));
    int32_t const iterations = std::stoi(args.get("iterations", "30"));
    int64_t const count = volume(dims);
    size_t const bytes = static_cast<size_t>(count) * elementSize(type);
    // Enough input/output pairs to cycle through 512 MiB, so that no run finds its data in L2.
    auto const sets = static_cast<int32_t>(std::max<size_t>(1, (size_t{512} << 20) / (2 * bytes)));

    PluginPtr const plugin = runtimePlugin(creator, axis, dims.nbDims, type);
    cudaStream_t stream{};
    checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    std::vector<char*> inputs(static_cast<size_t>(sets));
    std::vector<char*> outputs(static_cast<size_t>(sets));
    for (int32_t s = 0; s < sets; ++s)
    {
        inputs[s] = deviceAlloc(bytes);
        outputs[s] = deviceAlloc(bytes);
        fillRandom(inputs[s], count, type);
    }
    int32_t failures = 0;
    double const softmaxMs = medianMilliseconds(
        [&](int32_t s) { failures += enqueueOnce(plugin.get(), dims, type, inputs[s], outputs[s], stream) != 0; }, 3,
        iterations, sets, stream);
    double const copyMs = medianMilliseconds(
        [&](int32_t s) {
            checkCuda(cudaMemcpyAsync(outputs[s], inputs[s], bytes, cudaMemcpyDeviceToDevice, stream), "copy");
        },
        3, iterations, sets, stream);
    checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (int32_t s = 0; s < sets; ++s)
    {
        checkCuda(cudaFree(inputs[s]), "cudaFree");
        checkCuda(cudaFree(outputs[s]), "cudaFree");
    }
    checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    std::printf("%s\n",
        object({{"softmax_ms", number(softmaxMs)}, {"copy_ms", number(copyMs)}, {"bytes_moved", number(2 * bytes)},
                   {"buffer_sets", number(sets)}, {"failures", number(failures)}, {"errors", errorsJson()}})
            .c_str());
    return failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        Arguments const args = parseArguments(
            argc, argv, "usage: graphfix_plugin_harness describe|probe|run|bench --library PATH --loading MODE ...");
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
        if (args.command == "bench")
        {
            return bench(args);
        }
        throw HarnessError("unknown command " + args.command + " (describe, probe, run, bench)");
    }
    catch (std::exception const& e)
    {
        std::printf("%s\n", object({{"fatal", quote(e.what())}, {"errors", errorsJson()}}).c_str());
        return 2;
    }
}
