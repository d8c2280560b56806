/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GPU probe of the warp-specialised Hopper kernel's tile path, one piece at a time, built so that
 * it cannot hang: the tensor maps that encodeHopperMaps makes (the 4-d chunk-major ones and the
 * 3-d 128-byte swizzled ones), the TMA box loads of one Q, K and V tile (loadTile), and the
 * wgmma chains that read them (issueScoreChain, issueValueChain with kMajorDescriptor and
 * valueDescriptor), checked against a float64 reference on the host. Every wait on a TMA
 * load's mbarrier gives up after a second and reports which load never completed (its bytes
 * never arrived) instead of spinning forever. tests/test_attention_hopper_tile_probe.py builds
 * (for sm_90a) and runs it.
 *
 *   hopperTileProbe      runs every case, prints one line each and "ok" or "FAILED" last
 *
 * Exit status 0 when every case matched, 1 when one did not or a load timed out.
 */
#include "graphfixAttentionHopper.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

namespace graphfix
{
namespace plugin
{
namespace
{

constexpr int32_t kD = 128;    // padded head dim of the warp-specialised kernel
constexpr int32_t kN = 128;    // its keys per tile at that head dim (HopperPlan::producerKeys)
constexpr int32_t kROWS = 128; // its query rows per block (2 consumer warpgroups)
constexpr float kP_SCALE = 1.F / 64.F; // S scaled into P's range before P V

//! try_wait on `bar` for phase `parity` for at most a second of %globaltimer; false on timeout.
__device__ bool boundedWait(uint32_t bar, uint32_t parity)
{
    uint64_t start = 0;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(start));
    for (;;)
    {
        uint32_t ready = 0;
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(ready)
            : "r"(bar), "r"(parity)
            : "memory");
        if (ready != 0)
        {
            return true;
        }
        uint64_t now = 0;
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
        if (now - start > 1000000000ULL)
        {
            return false;
        }
    }
}

//! One block of 2 warpgroups: thread 0 loads Q rows [q0, q0 + 128) of head qHead and the K and V
//! tiles of keys [k0, k0 + 128) of head kvHead; each warpgroup computes S = Q Kᵀ for its 64 rows
//! (written to sOut, [128][128]), then O = P V with P = S x kP_SCALE as the kernel forms it
//! (probabilityFragments: float16 rounded once, bfloat16 hi + lo), written to oOut ([128][128]).
//! timedOut[i] is set where load i (Q, K, V) never completed.
template <typename T, bool kSWIZZLE>
__global__ void __launch_bounds__(256, 1) tileProbeKernel(__grid_constant__ HopperMaps const maps, int32_t q0,
    int32_t qHead, int32_t k0, int32_t kvHead, float* sOut, float* oOut, int32_t* timedOut)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr uint32_t kTILE_BYTES = kN * kD * sizeof(T);
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    __shared__ __align__(8) uint64_t barriers[3];
    // as hopperProducerKernel: the swizzled tiles start on a 1024-byte boundary
    uint32_t const skip = kSWIZZLE ? (0U - sharedAddress(sharedRaw)) % uint32_t{kHOPPER_SWIZZLE_ALIGN} : 0U;
    T* const sQ = reinterpret_cast<T*>(sharedRaw + skip);
    T* const sK = sQ + kROWS * kD;
    T* const sV = sK + kN * kD;
    uint32_t const bar = sharedAddress(barriers);
    if (threadIdx.x == 0)
    {
        for (uint32_t i = 0; i < 3; ++i)
        {
            mbarrierInit(bar + 8 * i, 1);
        }
        fenceBarrierInit();
    }
    __syncthreads();
    if (threadIdx.x == 0)
    {
        mbarrierArriveExpect(bar, kROWS * kD * sizeof(T));
        loadTile<T, kD, kSWIZZLE>(sQ, &maps.q, kROWS, q0, qHead, bar);
        mbarrierArriveExpect(bar + 8, kTILE_BYTES);
        loadTile<T, kD, kSWIZZLE>(sK, &maps.k, kN, k0, kvHead, bar + 8);
        mbarrierArriveExpect(bar + 16, kTILE_BYTES);
        loadTile<T, kD, kSWIZZLE>(sV, &maps.v, kN, k0, kvHead, bar + 16);
    }
    bool arrived = true;
    for (uint32_t i = 0; i < 3; ++i)
    {
        if (!boundedWait(bar + 8 * i, 0))
        {
            timedOut[i] = 1;
            arrived = false;
        }
    }
    // every thread waited on the same three barriers: all of them leave here, or none
    if (!__syncthreads_and(arrived))
    {
        return;
    }
    int32_t const group = static_cast<int32_t>(threadIdx.x / 128);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32) % 4;
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const row = group * 64 + warp * 16 + lane / 4; // and row + 8
    int32_t const col = 2 * (lane % 4);

    float s[kN / 8][4];
    issueScoreChain<T, kD, kN, kROWS, kSWIZZLE>(s,
        kMajorDescriptor<kSWIZZLE>(sharedAddress(sQ) + static_cast<uint32_t>(group * 64) * kMajorRowBytes<kSWIZZLE>(),
            kROWS),
        kMajorDescriptor<kSWIZZLE>(sharedAddress(sK), kN));
    wgmmaWait<0>();
    fenceOperands(s);
#pragma unroll
    for (int32_t n = 0; n < kN / 8; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            sOut[(row + 8 * (e / 2)) * kN + n * 8 + col + e % 2] = s[n][e];
            s[n][e] *= kP_SCALE;
        }
    }
    uint32_t p[kN / 16][4];
    uint32_t lo[kN / 16][4];
    probabilityFragments<T, kN>(s, p, lo);
    float o[kD / 8][4];
    clearAccumulators(o);
    issueValueChain<T, kD, kN, kSWIZZLE>(o, p, lo, valueDescriptor<kSWIZZLE, kN>(sharedAddress(sV)));
    wgmmaWait<0>();
    fenceOperands(o);
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            oOut[(row + 8 * (e / 2)) * kD + n * 8 + col + e % 2] = o[n][e];
        }
    }
#endif
}

template <typename T>
T fromFloat(float x)
{
    if constexpr (std::is_same<T, __half>::value)
    {
        return __float2half_rn(x);
    }
    else
    {
        return __float2bfloat16_rn(x);
    }
}

template <typename T>
float toFloat(T x)
{
    if constexpr (std::is_same<T, __half>::value)
    {
        return __half2float(x);
    }
    else
    {
        return __bfloat162float(x);
    }
}

//! One shape: heads of Q and of K/V, rows, head dims; the tiles read (query row q0 of head qHead,
//! keys from k0 of head kvHead). Rows and columns past the matrices are the boxes' zero fill.
struct Case
{
    char const* name;
    int64_t headsQ, headsKV, seqQ, seqK, headDim, valueDim;
    int32_t q0, qHead, k0, kvHead;
};

#define CHECK_CUDA(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const status_ = (call);                                                                            \
        if (status_ != cudaSuccess)                                                                                    \
        {                                                                                                              \
            std::printf("%s: CUDA error %s at %s\n", label, cudaGetErrorString(status_), #call);                      \
            return false;                                                                                              \
        }                                                                                                              \
    } while (0)

template <typename T, bool kSWIZZLE>
bool runCase(Case const& c, char const* typeName)
{
    char label[160];
    std::snprintf(label, sizeof(label), "%s %s %s", c.name, typeName, kSWIZZLE ? "swizzle128" : "no-swizzle");
    std::mt19937 rng(12345);
    std::normal_distribution<float> normal;
    auto const fill = [&](std::vector<T>& x) {
        for (T& e : x)
        {
            e = fromFloat<T>(normal(rng));
        }
    };
    std::vector<T> q(c.headsQ * c.seqQ * c.headDim), k(c.headsKV * c.seqK * c.headDim),
        v(c.headsKV * c.seqK * c.valueDim);
    fill(q);
    fill(k);
    fill(v);
    T *dq = nullptr, *dk = nullptr, *dv = nullptr;
    float *dS = nullptr, *dO = nullptr;
    int32_t* dTimedOut = nullptr;
    CHECK_CUDA(cudaMalloc(&dq, q.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&dk, k.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&dv, v.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&dS, kROWS * kN * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dO, kROWS * kD * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dTimedOut, 3 * sizeof(int32_t)));
    CHECK_CUDA(cudaMemcpy(dq, q.data(), q.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dk, k.data(), k.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dv, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dS, 0xFF, kROWS * kN * sizeof(float))); // NaN where nothing was written
    CHECK_CUDA(cudaMemset(dO, 0xFF, kROWS * kD * sizeof(float)));
    CHECK_CUDA(cudaMemset(dTimedOut, 0, 3 * sizeof(int32_t)));

    AttentionShape const shape{1, c.headsQ, c.headsKV, c.seqQ, c.seqK, c.headDim, c.valueDim};
    HopperPlan plan{};
    plan.paddedDim = kD;
    plan.blockRows = kROWS;
    plan.keys = kHOPPER_KEYS;
    HopperMaps maps{};
    if (!encodeHopperMaps(maps, dq, dk, dv, shape, plan, kN, kSWIZZLE))
    {
        std::printf("%s: encodeHopperMaps refused the maps\n", label);
        return false;
    }
    int32_t const sharedBytes = (kROWS + 2 * kN) * kD * static_cast<int32_t>(sizeof(T)) + kHOPPER_SWIZZLE_ALIGN;
    auto const kernel = tileProbeKernel<T, kSWIZZLE>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sharedBytes));
    kernel<<<1, 256, sharedBytes>>>(maps, c.q0, c.qHead, c.k0, c.kvHead, dS, dO, dTimedOut);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    int32_t timedOut[3]{};
    std::vector<float> s(kROWS * kN), o(kROWS * kD);
    CHECK_CUDA(cudaMemcpy(timedOut, dTimedOut, sizeof(timedOut), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(s.data(), dS, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(o.data(), dO, o.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dS), cudaFree(dO), cudaFree(dTimedOut);
    if (timedOut[0] != 0 || timedOut[1] != 0 || timedOut[2] != 0)
    {
        std::printf("%s: TIMED OUT waiting for the TMA loads of Q %d, K %d, V %d (1: never completed)\n", label,
            timedOut[0], timedOut[1], timedOut[2]);
        return false;
    }

    // float64 references over the same 16-bit inputs, zero past the matrices (the boxes' fill)
    auto const at = [](std::vector<T> const& x, int64_t head, int64_t rows, int64_t cols, int64_t r, int64_t col) {
        return r < rows && col < cols ? static_cast<double>(toFloat<T>(x[(head * rows + r) * cols + col])) : 0.0;
    };
    double sError = 0, sScale = 0, oError = 0, oScale = 0;
    for (int32_t r = 0; r < kROWS; ++r)
    {
        for (int32_t j = 0; j < kN; ++j)
        {
            double exact = 0;
            for (int32_t d = 0; d < kD; ++d)
            {
                exact += at(q, c.qHead, c.seqQ, c.headDim, c.q0 + r, d) * at(k, c.kvHead, c.seqK, c.headDim, c.k0 + j, d);
            }
            float const got = s[r * kN + j];
            sError = std::isnan(got) ? INFINITY : std::fmax(sError, std::fabs(got - exact));
            sScale = std::fmax(sScale, std::fabs(exact));
        }
        for (int32_t d = 0; d < kD; ++d)
        {
            double exact = 0;
            for (int32_t j = 0; j < kN; ++j)
            {
                // P as the kernel forms it from the S it computed: float16 rounds it once;
                // bfloat16's hi + lo carries 16 bits, within the tolerance below
                float const pj = s[r * kN + j] * kP_SCALE;
                double const p = std::is_same<T, __half>::value
                    ? static_cast<double>(toFloat<T>(fromFloat<T>(pj)))
                    : static_cast<double>(pj);
                exact += p * at(v, c.kvHead, c.seqK, c.valueDim, c.k0 + j, d);
            }
            float const got = o[r * kD + d];
            oError = std::isnan(got) ? INFINITY : std::fmax(oError, std::fabs(got - exact));
            oScale = std::fmax(oScale, std::fabs(exact));
        }
    }
    // float32 accumulation of 128 products: far below 1e-4 of the largest value; a wrong layout,
    // offset or zero fill is off by the size of the values themselves
    bool const ok = sError <= 1e-4 * sScale && oError <= 1e-4 * oScale;
    std::printf("%s: S max error %.3g (max |S| %.3g), O max error %.3g (max |O| %.3g): %s\n", label, sError, sScale,
        oError, oScale, ok ? "ok" : "WRONG");
    return ok;
}

} // namespace
} // namespace plugin
} // namespace graphfix

int main()
{
    using graphfix::plugin::Case;
    using graphfix::plugin::runCase;
    Case const cases[]{
        // tile coordinates inside the matrices: a second head, a second key tile, partial last tiles
        {"d128_head1_rows128-199_keys256-299", 2, 2, 200, 300, 128, 128, 128, 1, 256, 1},
        // head dims padding to 128: the second 64-column box zero-filled past D = 112 and Dv = 104
        {"d112_dv104_head2_keys128-255", 3, 3, 128, 256, 112, 104, 0, 2, 128, 2},
    };
    bool ok = true;
    for (Case const& c : cases)
    {
        ok = runCase<__half, false>(c, "float16") && ok;
        ok = runCase<__nv_bfloat16, false>(c, "bfloat16") && ok;
        ok = runCase<__half, true>(c, "float16") && ok;
        ok = runCase<__nv_bfloat16, true>(c, "bfloat16") && ok;
    }
    std::printf("%s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
