/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "graphfixAttentionPlugin.h"

#include "pluginLogging.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace graphfix
{
namespace plugin
{
namespace
{

using nvinfer1::DataType;
using nvinfer1::TensorFormat;

constexpr int64_t kSCRATCH_ALIGNMENT{256};
//! Bytes of the enqueue workspace set aside for cuDNN's own workspace; a shape whose graph needs
//! more runs on the own kernels (enqueue allocates nothing).
constexpr int64_t kCUDNN_WORKSPACE_RESERVE{int64_t{8} << 20};
//! sm_80's opt-in shared memory per block: what the flash kernels are planned for when no device
//! is visible (the host harness).
constexpr int64_t kASSUMED_SHARED_BYTES{166912};
//! cuDNN's fused attention wants head dimensions in multiples of 8, at most 256.
constexpr int64_t kCUDNN_HEAD_DIM_MULTIPLE{8};
constexpr int64_t kCUDNN_MAX_HEAD_DIM{256};
//! Bias rows are padded to 16 bytes for cuDNN.
constexpr int64_t kBIAS_ROW_MULTIPLE{8};

bool isFloatType(DataType type)
{
    return type == DataType::kFLOAT || type == DataType::kHALF || type == DataType::kBF16;
}

std::string typeName(DataType type)
{
    switch (type)
    {
    case DataType::kFLOAT: return "kFLOAT";
    case DataType::kHALF: return "kHALF";
    case DataType::kBF16: return "kBF16";
    case DataType::kBOOL: return "kBOOL";
    default: return "DataType " + std::to_string(static_cast<int32_t>(type));
    }
}

int64_t elementSize(DataType type)
{
    return type == DataType::kFLOAT ? 4 : type == DataType::kBOOL ? 1 : 2;
}

int64_t roundUp(int64_t value, int64_t multiple)
{
    return (value + multiple - 1) / multiple * multiple;
}

void checkIoCounts(int32_t nbInputs, int32_t nbOutputs)
{
    check((nbInputs == 3 || nbInputs == 4) && nbOutputs == 1,
        "GraphfixAttention takes Q, K, V and an optional mask and gives one output; got " + std::to_string(nbInputs)
            + " inputs and " + std::to_string(nbOutputs) + " outputs");
}

//! Q, K and V share one float type; a mask is BOOL, of Q's type or float32.
void checkInputTypes(DataType const* types, int32_t nbInputs)
{
    check(isFloatType(types[0]), "Q has type " + typeName(types[0]) + "; allowed: kFLOAT, kHALF, kBF16");
    check(types[1] == types[0] && types[2] == types[0],
        "Q, K and V must share one type; got " + typeName(types[0]) + ", " + typeName(types[1]) + ", "
            + typeName(types[2]));
    if (nbInputs == 4)
    {
        check(types[3] == DataType::kBOOL || types[3] == types[0] || types[3] == DataType::kFLOAT,
            "the mask has type " + typeName(types[3]) + "; allowed: kBOOL, Q's type (" + typeName(types[0])
                + ") or kFLOAT");
    }
}

bool known(int64_t dim)
{
    return dim >= 0;
}

void checkDim(int64_t actual, int64_t expected, std::string const& what)
{
    check(!known(actual) || !known(expected) || actual == expected,
        what + " is " + std::to_string(actual) + ", expected " + std::to_string(expected));
}

//! Reads the problem from the input dimensions; -1 (unknown, at build time) skips a check.
AttentionProblem describe(nvinfer1::Dims const* dims, DataType const* types, int32_t nbInputs, bool kTransposed)
{
    AttentionProblem p;
    nvinfer1::Dims const& q = dims[0];
    nvinfer1::Dims const& k = dims[1];
    nvinfer1::Dims const& v = dims[2];
    int32_t const rank = q.nbDims;
    check(rank == 3 || rank == 4,
        "Q has rank " + std::to_string(rank) + "; GraphfixAttention takes rank 4 [B, H, S, D] or rank 3 [N, S, D]");
    check(k.nbDims == rank && v.nbDims == rank,
        "Q, K and V must have one rank; got " + std::to_string(rank) + ", " + std::to_string(k.nbDims) + ", "
            + std::to_string(v.nbDims));
    p.rank = rank;
    p.type = types[0];
    AttentionShape& s = p.shape;
    s.batch = q.d[0];
    s.headsQ = rank == 4 ? q.d[1] : 1;
    s.seqQ = q.d[rank - 2];
    s.headDim = q.d[rank - 1];
    s.headsKV = rank == 4 ? k.d[1] : 1;
    s.seqK = kTransposed ? k.d[rank - 1] : k.d[rank - 2];
    s.valueDim = v.d[rank - 1];
    checkDim(k.d[0], s.batch, "K's batch dimension");
    checkDim(v.d[0], s.batch, "V's batch dimension");
    checkDim(kTransposed ? k.d[rank - 2] : k.d[rank - 1], s.headDim, "K's head dimension (Q's is D)");
    checkDim(v.d[rank - 2], s.seqK, "V's sequence dimension (K's is T)");
    if (rank == 4)
    {
        checkDim(v.d[1], s.headsKV, "V's head count (K's is Hkv)");
        check(!known(s.headsKV) || !known(s.headsQ) || (s.headsKV > 0 && s.headsQ % s.headsKV == 0),
            "Q has " + std::to_string(s.headsQ) + " heads and K/V " + std::to_string(s.headsKV)
                + "; Hq must be a multiple of Hkv");
    }
    check(!known(s.headDim) || s.headDim > 0, "the head dimension D is 0");
    check(!known(s.valueDim) || s.valueDim > 0, "V's head dimension Dv is 0");
    if (nbInputs == 4)
    {
        nvinfer1::Dims const& m = dims[3];
        check(m.nbDims >= 0 && m.nbDims <= rank,
            "the mask has rank " + std::to_string(m.nbDims) + "; it must broadcast to the scores' rank "
                + std::to_string(rank));
        p.hasMask = true;
        p.maskType = types[3];
        // the scores' shape, [B, H, S, T] (rank 4) or [N, S, T] (rank 3), and its 4-D slots
        std::array<int64_t, 4> const target{s.batch, s.headsQ, s.seqQ, s.seqK};
        std::array<int32_t, 4> const slots = rank == 4 ? std::array<int32_t, 4>{0, 1, 2, 3}
                                                       : std::array<int32_t, 4>{0, 2, 3, -1};
        int64_t stride = 1;
        for (int32_t i = m.nbDims - 1; i >= 0; --i)
        {
            int32_t const slot = slots[rank - m.nbDims + i];
            int64_t const extent = m.d[i];
            check(!known(extent) || extent == 1 || !known(target[slot]) || extent == target[slot],
                "mask dimension " + std::to_string(i) + " is " + std::to_string(extent)
                    + "; it must be 1 or the scores' " + std::to_string(target[slot]));
            p.maskDims[slot] = extent;
            p.maskStrides[slot] = extent == 1 ? 0 : stride;
            stride *= extent;
        }
    }
    return p;
}

AttentionMaskView maskView(AttentionProblem const& p, void const* data)
{
    AttentionMaskView view;
    if (!p.hasMask)
    {
        return view;
    }
    view.kind = p.maskType == DataType::kBOOL ? AttentionMaskKind::kBool : AttentionMaskKind::kAdditive;
    switch (p.maskType)
    {
    case DataType::kBOOL: view.type = AttentionMaskType::kBool; break;
    case DataType::kFLOAT: view.type = AttentionMaskType::kFloat; break;
    case DataType::kHALF: view.type = AttentionMaskType::kHalf; break;
    case DataType::kBF16: view.type = AttentionMaskType::kBFloat16; break;
    default: check(false, "mask type " + typeName(p.maskType));
    }
    view.data = data;
    for (int32_t i = 0; i < 4; ++i)
    {
        view.stride[i] = p.maskStrides[i];
    }
    return view;
}

//! Whether the Hopper kernel's float16 P·V (kHOPPER_VARIANT_HALF_VALUES) may run `p`: bfloat16
//! without mask and softcap (the warp-specialised kernel's shapes).
bool halfValuesMayRun(AttentionProblem const& p, float softcap)
{
    return p.type == DataType::kBF16 && !p.hasMask && softcap == 0.F;
}

//! The scratch for `p`: K transposed (both paths), cuDNN's workspace and the mask as a bias
//! (`withCudnn`), bfloat16's V in float16 (`withHalfValues`). Monotone in every dimension, so the
//! layout of the largest shapes bounds that of every smaller one.
AttentionWorkspace workspaceLayout(AttentionProblem const& p, bool kTransposed, bool withCudnn, bool withHalfValues)
{
    AttentionShape const& s = p.shape;
    int64_t const size = elementSize(p.type);
    AttentionWorkspace w;
    w.cudnnBytes = withCudnn ? kCUDNN_WORKSPACE_RESERVE : 0;
    int64_t at = w.cudnnBytes;
    w.keysOffset = at;
    if (kTransposed)
    {
        at += roundUp(s.batch * s.headsKV * s.seqK * s.headDim * size, kSCRATCH_ALIGNMENT);
    }
    w.biasOffset = at;
    if (withCudnn && p.hasMask)
    {
        at += roundUp(p.maskDims[0] * p.maskDims[1] * s.seqQ * roundUp(s.seqK, kBIAS_ROW_MULTIPLE) * size,
            kSCRATCH_ALIGNMENT);
    }
    w.firstOffset = at;
    if (withCudnn && p.hasMask)
    {
        at += roundUp(p.maskDims[0] * p.maskDims[1] * p.maskDims[2] * 4, kSCRATCH_ALIGNMENT);
    }
    w.halfValuesOffset = at;
    if (withHalfValues)
    {
        w.halfValuesBytes = hopperHalfValuesBytes(s);
        at += roundUp(w.halfValuesBytes, kSCRATCH_ALIGNMENT);
    }
    w.slotsOffset = at;
    if (withHalfValues)
    {
        w.slotCount = hopperHalfValueSlots(s);
        at += roundUp(w.slotCount * 4, kSCRATCH_ALIGNMENT);
    }
    w.total = at;
    return w;
}

template <typename Launch>
cudaError_t forType(DataType type, Launch&& launch)
{
    switch (type)
    {
    case DataType::kFLOAT: return launch(float{});
    case DataType::kHALF: return launch(__half{});
    case DataType::kBF16: return launch(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
    }
}

void checkLaunch(cudaError_t status, char const* what)
{
    check(status == cudaSuccess, std::string{what} + " failed: " + cudaGetErrorString(status));
}

AttentionBackend backendFromEnvironment()
{
    char const* const value = std::getenv(kGRAPHFIX_ATTENTION_BACKEND_ENV);
    std::string const text = value == nullptr ? "" : value;
    if (text.empty() || text == "auto")
    {
        return AttentionBackend::kAuto;
    }
    if (text == "cudnn")
    {
        return AttentionBackend::kCudnn;
    }
    if (text == "portable")
    {
        return AttentionBackend::kPortable;
    }
    throw PluginError(std::string{kGRAPHFIX_ATTENTION_BACKEND_ENV} + "=" + text
        + " is not a backend; allowed: auto (default), cudnn, portable");
}

//! The current device's compute capability major and opt-in shared memory per block; {0,
//! kASSUMED_SHARED_BYTES} when no device is visible.
std::pair<int32_t, int64_t> deviceLimits()
{
    int32_t device = 0;
    int32_t major = 0;
    int32_t shared = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess
        || cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    {
        cudaGetLastError(); // clear the error a host without a GPU leaves
        return {0, kASSUMED_SHARED_BYTES};
    }
    return {major, shared};
}

FlashPlan flashPlanFor(AttentionProblem const& p)
{
    auto const [major, shared] = deviceLimits();
    return planFlashAttention(p.shape, static_cast<int32_t>(elementSize(p.type)), shared, major);
}

//! GRAPHFIX_ATTENTION_HOPPER=0 keeps the Hopper kernel off (the mma.sync flash kernel runs instead).
constexpr char const* kGRAPHFIX_ATTENTION_HOPPER_ENV{"GRAPHFIX_ATTENTION_HOPPER"};
//! GRAPHFIX_ATTENTION_HOPPER_VARIANT=<bits> overrides the Hopper kernel's options (kHOPPER_VARIANT_*).
constexpr char const* kGRAPHFIX_ATTENTION_HOPPER_VARIANT_ENV{"GRAPHFIX_ATTENTION_HOPPER_VARIANT"};
//! GRAPHFIX_ATTENTION_TF32_SHORT=0 keeps float32's persistent short-key kernel off (for measuring it).
constexpr char const* kGRAPHFIX_ATTENTION_TF32_SHORT_ENV{"GRAPHFIX_ATTENTION_TF32_SHORT"};

//! The Hopper kernel's plan for `p` on the current device, with its shared-memory attribute set;
//! keys 0 when it does not run (reason says why).
HopperPlan hopperPlanFor(AttentionProblem const& p)
{
    HopperPlan plan;
    char const* const env = std::getenv(kGRAPHFIX_ATTENTION_HOPPER_ENV);
    if (env != nullptr && std::string{env} == "0")
    {
        plan.reason = "GRAPHFIX_ATTENTION_HOPPER=0";
        return plan;
    }
    int32_t device = 0;
    int32_t major = 0;
    int32_t minor = 0;
    int32_t shared = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess
        || cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess
        || cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    {
        cudaGetLastError();
        plan.reason = "no GPU visible";
        return plan;
    }
    plan = planHopperAttention(p.shape, static_cast<int32_t>(elementSize(p.type)), shared, major, minor);
    if (p.type == DataType::kBF16 && plan.paddedDim != 80)
    {
        // measured on the H200: loads after the wgmmas 4-12% faster in bfloat16 (which waits for
        // P V before the softmax), except head dim 80 (SigLIP: 1-3% slower); in float16 up to 17%
        // slower (BERT)
        plan.variant |= kHOPPER_VARIANT_LATE_LOADS;
    }
    if (p.type == DataType::kBF16 && p.shape.seqK <= kHOPPER_CONVERT_IN_KERNEL_KEYS)
    {
        // short rows (BERT): V converted inside the kernel, not by a pass before it (acts at
        // padded head dim 64 only)
        plan.variant |= kHOPPER_VARIANT_CONVERT_IN_KERNEL;
    }
    // GRAPHFIX_ATTENTION_HOPPER_VARIANT=<bits>: the kernel's options (kHOPPER_VARIANT_*), for measuring them
    char const* const variant = std::getenv(kGRAPHFIX_ATTENTION_HOPPER_VARIANT_ENV);
    if (variant != nullptr && *variant != '\0')
    {
        plan.variant = static_cast<int32_t>(std::strtol(variant, nullptr, 10));
    }
    // GRAPHFIX_ATTENTION_TF32_SHORT=0: float32 runs its long kernel on short key sequences too
    char const* const shortKeys = std::getenv(kGRAPHFIX_ATTENTION_TF32_SHORT_ENV);
    if (plan.shortKeys && shortKeys != nullptr && std::string{shortKeys} == "0")
    {
        plan.shortKeys = false;
        plan.sharedBytes = (2 * plan.blockRows + 8 * plan.keys) * plan.paddedDim * 4;
    }
    if (plan.keys != 0 && (plan.variant & kHOPPER_VARIANT_TMA) != 0)
    {
        // TMA loads only in the 16-bit kernels, and only where the driver encodes this shape's
        // tensor maps (tried here with a stand-in 256-byte-aligned address; each enqueue encodes
        // them again with the real ones and loads with cp.async should that fail)
        HopperMaps maps{};
        void const* const aligned = reinterpret_cast<void const*>(uintptr_t{256});
        if (p.type == DataType::kFLOAT
            || !encodeHopperMaps(maps, aligned, aligned, aligned, p.shape, plan, plan.keys, false))
        {
            plan.variant &= ~kHOPPER_VARIANT_TMA;
        }
    }
    if (plan.keys != 0)
    {
        cudaError_t const prepared = p.type == DataType::kFLOAT ? prepareHopperTf32Attention(plan)
            : p.type == DataType::kHALF                          ? prepareHopperAttention<__half>(plan)
                                                                 : prepareHopperAttention<__nv_bfloat16>(plan);
        if (prepared != cudaSuccess)
        {
            cudaGetLastError();
            plan.keys = 0;
            plan.reason = "the sm_90a kernel cannot run on this GPU";
        }
    }
    return plan;
}

std::string hopperText(HopperPlan const& plan, DataType type)
{
    char const* const kind = type == DataType::kFLOAT ? "3xTF32 float32"
        : type == DataType::kBF16                     ? "bfloat16"
                                                      : "float16";
    return std::string{"Hopper kernel wgmma "} + kind
        + ", head dim padded to " + std::to_string(plan.paddedDim) + ", " + std::to_string(plan.blockRows) + "x"
        + std::to_string(plan.keys) + " tiles, " + std::to_string(plan.sharedBytes) + " bytes of shared memory"
        + (plan.shortKeys ? ", persistent over query tiles (keys in <= 2 tiles)" : "")
        + (plan.shortSharedBytes > 0 && (plan.variant & kHOPPER_VARIANT_SHORT_KEYS) != 0
                  && (plan.variant & kHOPPER_VARIANT_TMA) != 0
              ? ", persistent over query tiles without mask or softcap (keys in <= 2 tiles, "
                  + std::to_string(plan.shortSharedBytes) + " bytes)"
              : "")
        + (plan.producerStages > 0 && (plan.variant & kHOPPER_VARIANT_PRODUCER) != 0
                  && (plan.variant & kHOPPER_VARIANT_TMA) != 0
              ? ", warp-specialised without mask or softcap (" + std::to_string(plan.blockRows) + "x"
                  + std::to_string(plan.producerKeys) + " tiles, " + std::to_string(plan.producerStages)
                  + " K/V stages, " + std::to_string(plan.producerSharedBytes) + " bytes"
                  + ((plan.variant & kHOPPER_VARIANT_SWIZZLE) != 0 ? ", 128-byte swizzled" : "")
                  + (type == DataType::kBF16 && (plan.variant & kHOPPER_VARIANT_HALF_VALUES) != 0
                          ? ", float16 PV unless a |V| exceeds 65504"
                          : "")
                  + ")"
              : "")
        + ((plan.variant & kHOPPER_VARIANT_TMA) != 0 ? ", TMA loads" : "");
}

std::string flashText(FlashPlan const& plan, DataType type)
{
    std::string const kind = plan.kernel == FlashKernel::kTf32x3 ? "mma.sync m16n8k8 3xTF32"
        : type == DataType::kBF16                               ? "mma.sync m16n8k16 bfloat16"
                                                                : "mma.sync m16n8k16 float16";
    return "flash kernel " + kind + ", head dim padded to " + std::to_string(plan.paddedDim) + ", "
        + std::to_string(plan.blockRows) + "x" + std::to_string(plan.blockKeys) + " tiles, "
        + std::to_string(plan.sharedBytes) + " bytes of shared memory";
}

std::string dimsText(AttentionShape const& s)
{
    return "[B=" + std::to_string(s.batch) + ", Hq=" + std::to_string(s.headsQ) + ", Hkv=" + std::to_string(s.headsKV)
        + ", S=" + std::to_string(s.seqQ) + ", T=" + std::to_string(s.seqK) + ", D=" + std::to_string(s.headDim)
        + ", Dv=" + std::to_string(s.valueDim) + "]";
}

} // namespace

bool AttentionProblem::operator==(AttentionProblem const& o) const
{
    return type == o.type && rank == o.rank && shape.batch == o.shape.batch && shape.headsQ == o.shape.headsQ
        && shape.headsKV == o.shape.headsKV && shape.seqQ == o.shape.seqQ && shape.seqK == o.shape.seqK
        && shape.headDim == o.shape.headDim && shape.valueDim == o.shape.valueDim && hasMask == o.hasMask
        && maskType == o.maskType && maskDims == o.maskDims && maskStrides == o.maskStrides;
}

GraphfixAttentionPlugin::GraphfixAttentionPlugin(AttentionAttributes const& attributes, AttentionBackend backend)
    : mAttributes(attributes)
    , mBackend(backend)
{
    AttentionAttributes const& a = attributes;
    check(std::isfinite(a.scale), "scale is " + std::to_string(a.scale) + "; it must be finite");
    check(a.kTransposed == 0 || a.kTransposed == 1, "k_transposed is " + std::to_string(a.kTransposed) + "; allowed 0, 1");
    check(a.causal == 0 || a.causal == 1, "causal is " + std::to_string(a.causal) + "; allowed 0, 1");
    check(a.nanToZero == 0 || a.nanToZero == 1, "nan_to_zero is " + std::to_string(a.nanToZero) + "; allowed 0, 1");
    check(std::isfinite(a.softcap) && a.softcap >= 0.F,
        "softcap is " + std::to_string(a.softcap) + "; it must be finite and >= 0 (0: no softcap)");
    check(!std::isnan(a.maskFill) && a.maskFill != std::numeric_limits<float>::infinity(),
        "mask_fill is " + std::to_string(a.maskFill) + "; it must be a number below +inf");
    if (backend != AttentionBackend::kPortable)
    {
        std::string const& reason = cudnnUnavailableReason();
        check(backend != AttentionBackend::kCudnn || reason.empty(),
            std::string{kGRAPHFIX_ATTENTION_BACKEND_ENV} + "=cudnn, but " + reason);
        static std::atomic<bool> warned{false};
        if (!reason.empty() && !warned.exchange(true))
        {
            reportMessage(nvinfer1::ILogger::Severity::kWARNING, "GraphfixAttention",
                ("the cuDNN path is unavailable, attention runs on graphfix's own kernels (slower): " + reason).c_str());
        }
    }
}

GraphfixAttentionPlugin::~GraphfixAttentionPlugin() = default;

// IPluginV3

nvinfer1::IPluginCapability* GraphfixAttentionPlugin::getCapabilityInterface(
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

nvinfer1::IPluginV3* GraphfixAttentionPlugin::clone() noexcept
{
    try
    {
        return new GraphfixAttentionPlugin(mAttributes, mBackend);
    }
    catch (...)
    {
        reportCurrentException("clone");
    }
    return nullptr;
}

// IPluginV3OneCore

char const* GraphfixAttentionPlugin::getPluginName() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_NAME;
}

char const* GraphfixAttentionPlugin::getPluginVersion() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_VERSION;
}

char const* GraphfixAttentionPlugin::getPluginNamespace() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_NAMESPACE;
}

// IPluginV3OneBuild

int32_t GraphfixAttentionPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(in != nullptr && out != nullptr, "null tensor descriptions");
        nvinfer1::Dims dims[4];
        DataType types[4];
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[i] = in[i].desc.dims;
            types[i] = in[i].desc.type;
        }
        checkInputTypes(types, nbInputs);
        check(out[0].desc.type == types[0], "the output type must be Q's type");
        describe(dims, types, nbInputs, mAttributes.kTransposed != 0);
        check(out[0].desc.dims.nbDims == dims[0].nbDims, "the output rank must be Q's rank");
        return 0;
    }
    catch (...)
    {
        reportCurrentException("configurePlugin");
    }
    return -1;
}

int32_t GraphfixAttentionPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(outputTypes != nullptr && inputTypes != nullptr, "null type arrays");
        checkInputTypes(inputTypes, nbInputs);
        outputTypes[0] = inputTypes[0];
        return 0;
    }
    catch (...)
    {
        reportCurrentException("getOutputDataTypes");
    }
    return -1;
}

int32_t GraphfixAttentionPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
    nvinfer1::DimsExprs const* /*shapeInputs*/, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
    int32_t nbOutputs, nvinfer1::IExprBuilder& /*exprBuilder*/) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(nbShapeInputs == 0, "GraphfixAttention takes no shape inputs");
        check(inputs != nullptr && outputs != nullptr, "null shape arrays");
        int32_t const rank = inputs[0].nbDims;
        check(rank == 3 || rank == 4,
            "Q has rank " + std::to_string(rank) + "; GraphfixAttention takes rank 4 [B, H, S, D] or rank 3 [N, S, D]");
        check(inputs[1].nbDims == rank && inputs[2].nbDims == rank, "Q, K and V must have one rank");
        check(nbInputs == 3 || inputs[3].nbDims <= rank,
            "the mask has rank " + std::to_string(inputs[nbInputs - 1].nbDims) + "; at most Q's rank "
                + std::to_string(rank));
        outputs[0] = inputs[0];
        outputs[0].d[rank - 1] = inputs[2].d[rank - 1];
        return 0;
    }
    catch (...)
    {
        reportCurrentException("getOutputShapes");
    }
    return -1;
}

bool GraphfixAttentionPlugin::supportsFormatCombination(
    int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(inOut != nullptr, "null tensor descriptions");
        check(pos >= 0 && pos < nbInputs + nbOutputs, "position " + std::to_string(pos) + " is out of range");
        nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
        if (desc.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        DataType const qType = inOut[0].desc.type;
        if (pos == 0)
        {
            return isFloatType(desc.type);
        }
        if (pos == 3 && nbInputs == 4)
        {
            return desc.type == DataType::kBOOL || desc.type == qType || desc.type == DataType::kFLOAT;
        }
        return desc.type == qType;
    }
    catch (...)
    {
        reportCurrentException("supportsFormatCombination");
    }
    return false;
}

int32_t GraphfixAttentionPlugin::getNbOutputs() const noexcept
{
    return 1;
}

size_t GraphfixAttentionPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* /*outputs*/, int32_t nbOutputs) const noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(inputs != nullptr, "null tensor descriptions");
        nvinfer1::Dims dims[4];
        DataType types[4];
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[i] = inputs[i].max;
            types[i] = inputs[i].desc.type;
        }
        AttentionProblem const p = describe(dims, types, nbInputs, mAttributes.kTransposed != 0);
        return static_cast<size_t>(
            workspaceLayout(p, mAttributes.kTransposed != 0, cudnnMayRun(p.type, p.hasMask, p.maskType),
                halfValuesMayRun(p, mAttributes.softcap)).total);
    }
    catch (...)
    {
        reportCurrentException("getWorkspaceSize");
    }
    return 0;
}

// IPluginV3OneRuntime

int32_t GraphfixAttentionPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        checkIoCounts(nbInputs, nbOutputs);
        check(in != nullptr && out != nullptr, "null tensor descriptions");
        nvinfer1::Dims dims[4];
        DataType types[4];
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[i] = in[i].dims;
            types[i] = in[i].type;
        }
        checkInputTypes(types, nbInputs);
        check(out[0].type == types[0], "the output type must be Q's type");
        AttentionProblem const p = describe(dims, types, nbInputs, mAttributes.kTransposed != 0);
        check(out[0].dims.nbDims == p.rank && out[0].dims.d[p.rank - 1] == p.shape.valueDim,
            "the output shape must be Q's with V's last dimension");
        plan(p);
        return 0;
    }
    catch (...)
    {
        reportCurrentException("onShapeChange");
    }
    return -1;
}

int32_t GraphfixAttentionPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
    nvinfer1::PluginTensorDesc const* /*outputDesc*/, void const* const* inputs, void* const* outputs, void* workspace,
    cudaStream_t stream) noexcept
{
    try
    {
        check(inputDesc != nullptr && inputs != nullptr && outputs != nullptr, "null enqueue arguments");
        int32_t const nbInputs = mPlanned && mProblem.hasMask ? 4 : 3;
        nvinfer1::Dims dims[4];
        DataType types[4];
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[i] = inputDesc[i].dims;
            types[i] = inputDesc[i].type;
        }
        check(mPlanned, "enqueue before onShapeChange");
        AttentionProblem const p = describe(dims, types, nbInputs, mAttributes.kTransposed != 0);
        AttentionShape const& s = p.shape;
        if (s.batch == 0 || s.headsQ == 0 || s.seqQ == 0)
        {
            return 0;
        }
        if (!(p == mProblem))
        {
            // Shapes onShapeChange did not see: no re-planning here (no cuDNN graph build, no
            // allocation, capture-safe); the own kernels need only a host-side plan.
            AttentionWorkspace const scratch
                = workspaceLayout(p, mAttributes.kTransposed != 0, cudnnMayRun(p.type, p.hasMask, p.maskType),
                    halfValuesMayRun(p, mAttributes.softcap));
            FlashPlan const flash = flashPlanFor(p);
            if (flash.kernel != FlashKernel::kNone)
            {
                // a function attribute, not a stream operation: allowed under capture
                checkLaunch(forType(p.type,
                                [&](auto tag) {
                                    using T = decltype(tag);
                                    return prepareFlashAttention<T>(flash);
                                }),
                    "setting the flash kernel's shared memory");
            }
            enqueueOwn(p, hopperPlanFor(p), flash, scratch, inputs, outputs[0], workspace, stream);
            return 0;
        }
        bool const directBiasAligned
            = !mDirectBias || reinterpret_cast<uintptr_t>(inputs[3]) % (kBIAS_ROW_MULTIPLE * 2) == 0;
        if (mUseCudnn && workspace != nullptr && directBiasAligned)
        {
            enqueueCudnn(inputs, outputs[0], workspace, stream);
        }
        else
        {
            enqueueOwn(mProblem, mHopper, mFlash, mWorkspace, inputs, outputs[0], workspace, stream);
        }
        return 0;
    }
    catch (...)
    {
        reportCurrentException("enqueue");
    }
    return -1;
}

nvinfer1::IPluginV3* GraphfixAttentionPlugin::attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

nvinfer1::PluginFieldCollection const* GraphfixAttentionPlugin::getFieldsToSerialize() noexcept
{
    using nvinfer1::PluginField;
    using nvinfer1::PluginFieldType;
    mSerializedFields = {
        PluginField{kGRAPHFIX_ATTENTION_FIELD_SCALE, &mAttributes.scale, PluginFieldType::kFLOAT32, 1},
        PluginField{kGRAPHFIX_ATTENTION_FIELD_K_TRANSPOSED, &mAttributes.kTransposed, PluginFieldType::kINT32, 1},
        PluginField{kGRAPHFIX_ATTENTION_FIELD_CAUSAL, &mAttributes.causal, PluginFieldType::kINT32, 1},
        PluginField{kGRAPHFIX_ATTENTION_FIELD_SOFTCAP, &mAttributes.softcap, PluginFieldType::kFLOAT32, 1},
        PluginField{kGRAPHFIX_ATTENTION_FIELD_MASK_FILL, &mAttributes.maskFill, PluginFieldType::kFLOAT32, 1},
        PluginField{kGRAPHFIX_ATTENTION_FIELD_NAN_TO_ZERO, &mAttributes.nanToZero, PluginFieldType::kINT32, 1},
    };
    mSerializedCollection.nbFields = static_cast<int32_t>(mSerializedFields.size());
    mSerializedCollection.fields = mSerializedFields.data();
    return &mSerializedCollection;
}

// private

bool GraphfixAttentionPlugin::cudnnMayRun(DataType type, bool hasMask, DataType maskType) const
{
    if (mBackend == AttentionBackend::kPortable || type == DataType::kFLOAT || mAttributes.softcap > 0.F)
    {
        return false;
    }
    if (!hasMask)
    {
        return true;
    }
    if (maskType == DataType::kBOOL)
    {
        return mAttributes.maskFill == -std::numeric_limits<float>::infinity();
    }
    return maskType == type;
}

void GraphfixAttentionPlugin::plan(AttentionProblem const& p)
{
    mProblem = p;
    mPlanned = true;
    mUseCudnn = false;
    mDirectBias = false;
    mWorkspace = workspaceLayout(p, mAttributes.kTransposed != 0, cudnnMayRun(p.type, p.hasMask, p.maskType),
        halfValuesMayRun(p, mAttributes.softcap));
    mFlash = flashPlanFor(p);
    mHopper = hopperPlanFor(p);
    std::string reason = cudnnRefusal(p);
    bool const cudnnAttempted = reason.empty();
    if (cudnnAttempted)
    {
        planCudnn(p, reason);
    }
    prepareOwnKernels(p, reason);
    reportPath(p, reason, cudnnAttempted);
}

std::string GraphfixAttentionPlugin::cudnnRefusal(AttentionProblem const& p) const
{
    AttentionShape const& s = p.shape;
    if (mBackend == AttentionBackend::kPortable)
    {
        return std::string{kGRAPHFIX_ATTENTION_BACKEND_ENV} + "=portable";
    }
    if (!cudnnMayRun(p.type, p.hasMask, p.maskType))
    {
        return p.type == DataType::kFLOAT ? "float32 I/O"
            : mAttributes.softcap > 0.F   ? "softcap"
            : p.maskType == DataType::kBOOL ? "a bool mask with a finite mask_fill"
                                            : "a float32 mask with 16-bit inputs";
    }
    if (s.headDim % kCUDNN_HEAD_DIM_MULTIPLE != 0 || s.valueDim % kCUDNN_HEAD_DIM_MULTIPLE != 0
        || s.headDim > kCUDNN_MAX_HEAD_DIM || s.valueDim > kCUDNN_MAX_HEAD_DIM)
    {
        return "head dimensions not multiples of 8 up to 256";
    }
    if (s.batch == 0 || s.seqQ == 0 || s.seqK == 0)
    {
        return "an empty tensor";
    }
    return {};
}

void GraphfixAttentionPlugin::planCudnn(AttentionProblem const& p, std::string& reason)
{
    AttentionShape const& s = p.shape;
    CudnnSdpaConfig c;
    c.bfloat16 = p.type == DataType::kBF16;
    c.batch = s.batch;
    c.headsQ = s.headsQ;
    c.headsKV = s.headsKV;
    c.seqQ = s.seqQ;
    c.seqK = s.seqK;
    c.headDim = s.headDim;
    c.valueDim = s.valueDim;
    c.scale = mAttributes.scale;
    c.causal = mAttributes.causal != 0;
    mBiasRows = s.seqQ;
    if (p.hasMask)
    {
        c.hasBias = true;
        c.biasBatch = p.maskDims[0];
        c.biasHeads = p.maskDims[1];
        mDirectBias = p.maskType == p.type && p.maskStrides[3] == 1 && p.maskStrides[2] != 0
            && p.maskStrides[2] % kBIAS_ROW_MULTIPLE == 0;
        c.biasRowStride = mDirectBias ? p.maskStrides[2] : roundUp(s.seqK, kBIAS_ROW_MULTIPLE);
        c.biasHeadStride = mDirectBias && p.maskStrides[1] != 0 ? p.maskStrides[1] : s.seqQ * c.biasRowStride;
        c.biasBatchStride
            = mDirectBias && p.maskStrides[0] != 0 ? p.maskStrides[0] : c.biasHeads * s.seqQ * c.biasRowStride;
    }
    if (!mCudnn)
    {
        mCudnn = std::make_unique<CudnnSdpa>();
    }
    if (p.hasMask && p.maskStrides[2] == 0)
    {
        // A mask that broadcasts over the queries (key padding): one bias row per (batch, head),
        // given to cuDNN with row stride 0, instead of seqQ copies. Kept only if cuDNN takes it.
        CudnnSdpaConfig broadcast = c;
        int64_t const rowLength = roundUp(s.seqK, kBIAS_ROW_MULTIPLE);
        broadcast.biasRowStride = 0;
        broadcast.biasHeadStride = rowLength;
        broadcast.biasBatchStride = c.biasHeads * rowLength;
        std::string ignored;
        if (mCudnn->prepare(broadcast, ignored))
        {
            c = broadcast;
            mDirectBias = false;
            mBiasRows = 1;
        }
    }
    if (mCudnn->prepare(c, reason))
    {
        int64_t const needed = mCudnn->workspaceSize(c);
        if (needed <= mWorkspace.cudnnBytes)
        {
            mCudnnConfig = c;
            mUseCudnn = true;
        }
        else
        {
            reason = "cuDNN wants " + std::to_string(needed) + " bytes of workspace, more than the "
                + std::to_string(mWorkspace.cudnnBytes) + " reserved";
        }
    }
}

void GraphfixAttentionPlugin::prepareOwnKernels(AttentionProblem const& p, std::string const& reason)
{
    AttentionShape const& s = p.shape;
    if (mFlash.kernel != FlashKernel::kNone)
    {
        cudaError_t const prepared = forType(p.type, [&](auto tag) {
            using T = decltype(tag);
            return prepareFlashAttention<T>(mFlash);
        });
        if (prepared != cudaSuccess)
        {
            cudaGetLastError(); // no device (the host harness): enqueue cannot run here anyway
        }
    }
    if (!mUseCudnn)
    {
        mDirectBias = false;
        check(mFlash.kernel != FlashKernel::kNone || fallbackAttentionFits(s.headDim, s.valueDim),
            "head dimensions D=" + std::to_string(s.headDim) + ", Dv=" + std::to_string(s.valueDim)
                + " need more shared memory than this GPU has for the fallback kernel, and the cuDNN path cannot run "
                  "them ("
                + reason + ")");
    }
}

void GraphfixAttentionPlugin::reportPath(AttentionProblem const& p, std::string const& reason, bool cudnnAttempted)
{
    AttentionShape const& s = p.shape;
    std::string const flash = mFlash.kernel != FlashKernel::kNone
        ? flashText(mFlash, p.type)
        : std::string{"fallback kernel, no flash kernel: "} + mFlash.reason;
    std::string const own = mHopper.keys != 0 ? hopperText(mHopper, p.type) + " (else " + flash + ")"
        : !hopperAttentionBuilt() ? flash
                                  : flash + " (no Hopper kernel: " + mHopper.reason + ")";
    std::string const note = std::string{"GraphfixAttention "} + typeName(p.type) + " " + dimsText(s)
        + (mUseCudnn ? std::string{": cuDNN SDPA"} : ": own kernels (" + reason + "); " + own);
    if (note != mPathNote)
    {
        mPathNote = note;
        // A shape the cuDNN path was meant for but a loaded cuDNN refused is worth a warning: the
        // own kernels are slower.
        bool const refused = !mUseCudnn && cudnnAttempted && cudnnUnavailableReason().empty();
        reportMessage(refused ? nvinfer1::ILogger::Severity::kWARNING : nvinfer1::ILogger::Severity::kVERBOSE,
            "onShapeChange", note.c_str());
    }
}

void GraphfixAttentionPlugin::enqueueCudnn(
    void const* const* inputs, void* output, void* workspace, cudaStream_t stream)
{
    AttentionProblem const& p = mProblem;
    AttentionShape const& s = p.shape;
    char* const scratch = static_cast<char*>(workspace);
    void const* keys = inputs[1];
    if (mAttributes.kTransposed != 0)
    {
        void* const transposed = scratch + mWorkspace.keysOffset;
        checkLaunch(forType(p.type,
                        [&](auto tag) {
                            using T = decltype(tag);
                            return launchTransposeKeys<T>(static_cast<T const*>(inputs[1]), static_cast<T*>(transposed),
                                s.batch * s.headsKV, s.headDim, s.seqK, stream);
                        }),
            "transposing K");
        keys = transposed;
    }
    AttentionMaskView const mask = maskView(p, p.hasMask ? inputs[3] : nullptr);
    void const* bias = nullptr;
    if (p.hasMask)
    {
        if (mDirectBias)
        {
            bias = inputs[3];
        }
        else
        {
            void* const materialised = scratch + mWorkspace.biasOffset;
            checkLaunch(forType(p.type,
                            [&](auto tag) {
                                using T = decltype(tag);
                                return launchMaskToBias<T>(mask, static_cast<T*>(materialised), p.maskDims[0],
                                    p.maskDims[1], mBiasRows, s.seqK, roundUp(s.seqK, kBIAS_ROW_MULTIPLE), stream);
                            }),
                "writing the mask as a bias");
            bias = materialised;
        }
    }
    std::string error;
    check(mCudnn->run(mCudnnConfig, inputs[0], keys, inputs[2], bias, output, scratch + mWorkspace.cudnnOffset, stream,
              error),
        error);
    if (p.hasMask)
    {
        auto* const first = reinterpret_cast<int32_t*>(scratch + mWorkspace.firstOffset);
        checkLaunch(launchFirstAllowedKey(mask, first, p.maskDims[0], p.maskDims[1], p.maskDims[2], s.seqK, stream),
            "finding fully masked rows");
        checkLaunch(forType(p.type,
                        [&](auto tag) {
                            using T = decltype(tag);
                            return launchBlockedRows<T>(first, p.maskDims[0], p.maskDims[1], p.maskDims[2],
                                static_cast<T*>(output), s, mAttributes.causal != 0, mAttributes.nanToZero != 0, stream);
                        }),
            "writing fully masked rows");
    }
}

void GraphfixAttentionPlugin::enqueueOwn(AttentionProblem const& p, HopperPlan const& hopper, FlashPlan const& flash,
    AttentionWorkspace const& scratch, void const* const* inputs, void* output, void* workspace,
    cudaStream_t stream) const
{
    AttentionParams params;
    params.scale = mAttributes.scale;
    params.softcap = mAttributes.softcap;
    params.maskFill = mAttributes.maskFill;
    params.causal = mAttributes.causal != 0;
    params.kTransposed = mAttributes.kTransposed != 0;
    params.nanToZero = mAttributes.nanToZero != 0;
    AttentionShape const& s = p.shape;
    AttentionMaskView const mask = maskView(p, p.hasMask ? inputs[3] : nullptr);
    if (flash.kernel != FlashKernel::kNone && (!params.kTransposed || workspace != nullptr))
    {
        void const* keys = inputs[1];
        cudaError_t status = cudaSuccess;
        if (params.kTransposed)
        {
            void* const transposed = static_cast<char*>(workspace) + scratch.keysOffset;
            status = forType(p.type, [&](auto tag) {
                using T = decltype(tag);
                return launchTransposeKeys<T>(static_cast<T const*>(inputs[1]), static_cast<T*>(transposed),
                    s.batch * s.headsKV, s.headDim, s.seqK, stream);
            });
            keys = transposed;
        }
        if (status == cudaSuccess)
        {
            AttentionParams rows = params;
            rows.kTransposed = false;
            status = cudaErrorInvalidConfiguration;
            if (hopper.keys != 0)
            {
                status = forType(p.type, [&](auto tag) {
                    using T = decltype(tag);
                    if constexpr (std::is_same_v<T, float>)
                    {
                        return launchHopperTf32Attention(static_cast<float const*>(inputs[0]),
                            static_cast<float const*>(keys), static_cast<float const*>(inputs[2]), mask,
                            static_cast<float*>(output), s, rows, hopper, stream);
                    }
                    else
                    {
                        HopperHalfValues halfValues;
                        if (scratch.halfValuesBytes != 0 && workspace != nullptr)
                        {
                            halfValues.values = static_cast<char*>(workspace) + scratch.halfValuesOffset;
                            halfValues.slots
                                = reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + scratch.slotsOffset);
                            halfValues.slotCount = scratch.slotCount;
                        }
                        return launchHopperAttention<T>(static_cast<T const*>(inputs[0]), static_cast<T const*>(keys),
                            static_cast<T const*>(inputs[2]), mask, static_cast<T*>(output), s, rows, hopper,
                            halfValues, stream);
                    }
                });
                if (status == cudaErrorMisalignedAddress || status == cudaErrorInvalidConfiguration)
                {
                    cudaGetLastError(); // the flash kernel takes what the Hopper kernel cannot
                }
            }
            if (status == cudaErrorInvalidConfiguration || status == cudaErrorMisalignedAddress)
            {
                status = forType(p.type, [&](auto tag) {
                    using T = decltype(tag);
                    return launchFlashAttention<T>(static_cast<T const*>(inputs[0]), static_cast<T const*>(keys),
                        static_cast<T const*>(inputs[2]), mask, static_cast<T*>(output), s, rows, flash, stream);
                });
            }
        }
        // Misaligned tensors or a transpose too large for its grid: the fallback kernel runs them.
        if (status != cudaErrorMisalignedAddress && status != cudaErrorInvalidConfiguration)
        {
            checkLaunch(status, "the flash attention kernel");
            return;
        }
        cudaGetLastError();
    }
    checkLaunch(forType(p.type,
                    [&](auto tag) {
                        using T = decltype(tag);
                        return launchAttention<T>(static_cast<T const*>(inputs[0]), static_cast<T const*>(inputs[1]),
                            static_cast<T const*>(inputs[2]), mask, static_cast<T*>(output), s, params, stream);
                    }),
        "the fallback attention kernel");
}

// GraphfixAttentionPluginCreator

GraphfixAttentionPluginCreator::GraphfixAttentionPluginCreator()
    : mFields{nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_SCALE, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1},
        nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_K_TRANSPOSED, nullptr, nvinfer1::PluginFieldType::kINT32, 1},
        nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_CAUSAL, nullptr, nvinfer1::PluginFieldType::kINT32, 1},
        nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_SOFTCAP, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1},
        nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_MASK_FILL, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1},
        nvinfer1::PluginField{kGRAPHFIX_ATTENTION_FIELD_NAN_TO_ZERO, nullptr, nvinfer1::PluginFieldType::kINT32, 1}}
{
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

char const* GraphfixAttentionPluginCreator::getPluginName() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_NAME;
}

char const* GraphfixAttentionPluginCreator::getPluginVersion() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_VERSION;
}

char const* GraphfixAttentionPluginCreator::getPluginNamespace() const noexcept
{
    return kGRAPHFIX_ATTENTION_PLUGIN_NAMESPACE;
}

nvinfer1::PluginFieldCollection const* GraphfixAttentionPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* GraphfixAttentionPluginCreator::createPlugin(
    char const* /*name*/, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /*phase*/) noexcept
{
    try
    {
        AttentionAttributes attributes;
        attributes.maskFill = -std::numeric_limits<float>::infinity();
        bool haveScale = false;
        int32_t const nbFields = fc == nullptr ? 0 : fc->nbFields;
        check(nbFields == 0 || fc->fields != nullptr, "the field collection has no field array");
        for (int32_t i = 0; i < nbFields; ++i)
        {
            nvinfer1::PluginField const& field = fc->fields[i];
            std::string const name = field.name == nullptr ? "" : field.name;
            void* target = nullptr;
            nvinfer1::PluginFieldType expected = nvinfer1::PluginFieldType::kINT32;
            for (nvinfer1::PluginField const& known : mFields)
            {
                if (name == known.name)
                {
                    expected = known.type;
                }
            }
            if (name == kGRAPHFIX_ATTENTION_FIELD_SCALE)
            {
                target = &attributes.scale;
                haveScale = true;
            }
            else if (name == kGRAPHFIX_ATTENTION_FIELD_K_TRANSPOSED)
            {
                target = &attributes.kTransposed;
            }
            else if (name == kGRAPHFIX_ATTENTION_FIELD_CAUSAL)
            {
                target = &attributes.causal;
            }
            else if (name == kGRAPHFIX_ATTENTION_FIELD_SOFTCAP)
            {
                target = &attributes.softcap;
            }
            else if (name == kGRAPHFIX_ATTENTION_FIELD_MASK_FILL)
            {
                target = &attributes.maskFill;
            }
            else if (name == kGRAPHFIX_ATTENTION_FIELD_NAN_TO_ZERO)
            {
                target = &attributes.nanToZero;
            }
            check(target != nullptr,
                "unknown field '" + name
                    + "' (GraphfixAttention takes scale, k_transposed, causal, softcap, mask_fill, nan_to_zero)");
            bool const isFloat = expected == nvinfer1::PluginFieldType::kFLOAT32;
            check(field.type == expected,
                "field '" + name + "' has type " + std::to_string(static_cast<int32_t>(field.type)) + "; expected "
                    + (isFloat ? "kFLOAT32" : "kINT32") + " (" + std::to_string(static_cast<int32_t>(expected)) + ")");
            check(field.length == 1 && field.data != nullptr,
                "field '" + name + "' must hold exactly one value, got length " + std::to_string(field.length)
                    + (field.data == nullptr ? " and no data" : ""));
            std::memcpy(target, field.data, 4);
        }
        check(haveScale, "the field 'scale' is missing (GraphfixAttention needs it)");
        return new GraphfixAttentionPlugin(attributes, backendFromEnvironment());
    }
    catch (...)
    {
        reportCurrentException("createPlugin");
    }
    return nullptr;
}

} // namespace plugin
} // namespace graphfix
