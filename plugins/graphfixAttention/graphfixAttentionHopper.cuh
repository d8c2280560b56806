/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The Hopper attention kernel (graphfixAttentionHopper.h), included by one translation unit per
 * element type (graphfixAttentionHopper{Half,BFloat16}.cu), which CMake compiles for sm_90a only
 * (-gencode=arch=compute_90a,code=sm_90a): wgmma exists nowhere else.
 *
 * Per block: kWG warpgroups x 64 query rows; per key tile of kN keys, in every warpgroup:
 *
 *   wait tile j (cp.async) | barrier | issue K_j+1, V_j+1 (cp.async, other stage)
 *   | S = Q K_jᵀ (wgmma, A and B in shared memory) | online softmax on S in registers
 *   | O += P V_j (wgmma, A = P in registers, B = V N-major in shared memory)
 *
 * Shared memory holds every tile in the wgmma no-swizzle canonical layout: 16-byte chunks of 8
 * elements, chunk-major ([chunk][row]), so each 8x8 core matrix (8 rows of one chunk) is 128
 * contiguous bytes. For Q and K (K-major operands): rows 16 bytes apart, 8-row groups 128 bytes
 * apart (SBO), the next 8 elements of the head dimension rows*16 bytes on (LBO). For V (N-major
 * operand of P·V, N = the value dimension): 8 keys of one 8-element chunk are one core matrix,
 * the next 8 keys 128 bytes on (LBO), the next chunk keys*16 bytes on (SBO). Writes of 16 rows x 2
 * chunks per warp are conflict-free; any head dimension that is a multiple of 16 works (72 is
 * padded to 80, zero-filled by cp.async).
 */
#ifndef GRAPHFIX_ATTENTION_HOPPER_CUH
#define GRAPHFIX_ATTENTION_HOPPER_CUH

#include "graphfixAttentionFlash.cuh"
#include "graphfixAttentionHopper.h"
#include "graphfixAttentionHopperWgmma.cuh"

namespace graphfix
{
namespace plugin
{
namespace
{

namespace hp = hopper;

__device__ __forceinline__ void fenceProxyAsync()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmmaFence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmmaCommit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int32_t N>
__device__ __forceinline__ void wgmmaWait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

//! Keeps the compiler from moving reads or writes of the accumulators across the asynchronous
//! wgmma (whose asm statements it sees as done when issued).
template <int32_t kN>
__device__ __forceinline__ void fenceOperands(float (&d)[kN][4])
{
#pragma unroll
    for (int32_t n = 0; n < kN; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            asm volatile("" : "+f"(d[n][e])::"memory");
        }
    }
}

template <int32_t kN>
__device__ __forceinline__ void fenceOperands(uint32_t (&a)[kN][4])
{
#pragma unroll
    for (int32_t n = 0; n < kN; ++n)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            asm volatile("" : "+r"(a[n][e])::"memory");
        }
    }
}

//! A shared-memory matrix descriptor, no swizzle: start address, leading and stride byte offsets.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading, uint32_t stride)
{
    return static_cast<uint64_t>((address & 0x3FFFFU) >> 4) | (static_cast<uint64_t>((leading & 0x3FFFFU) >> 4) << 16)
        | (static_cast<uint64_t>((stride & 0x3FFFFU) >> 4) << 32);
}

//! Copies rows [row0, row0 + kRows) x [0, kD) of a [rows, cols] matrix into the chunk-major
//! layout ([kD / 8][kRows] chunks of 16 bytes), zeros past `rows` and past `cols`.
template <typename T, int32_t kD, int32_t kRows, int32_t kThreads>
__device__ __forceinline__ void loadChunkMajor(T* shared, T const* global, int64_t row0, int64_t rows, int32_t cols)
{
    constexpr int32_t kCHUNKS = kD / 8;
    constexpr int32_t kPAIRS = kCHUNKS / 2;
    constexpr int32_t kUNITS = kRows * kCHUNKS;
    static_assert(kCHUNKS % 2 == 0 && kRows % 16 == 0, "whole 16-row, 2-chunk units");
#pragma unroll
    for (int32_t i = 0; i < (kUNITS + kThreads - 1) / kThreads; ++i)
    {
        if (kUNITS % kThreads != 0 && static_cast<int32_t>(threadIdx.x) + i * kThreads >= kUNITS)
        {
            break;
        }
        // a warp takes 16 rows x 2 chunks: 32-byte pieces of global rows, 2 x 256 contiguous bytes
        // of shared memory
        int32_t const u = static_cast<int32_t>(threadIdx.x) + i * kThreads;
        int32_t const rest = u / 32;
        int32_t const r = (rest / kPAIRS) * 16 + u % 16;
        int32_t const c = (rest % kPAIRS) * 2 + (u / 16) % 2;
        int64_t const row = row0 + r;
        bool const valid = row < rows && c * 8 < cols;
        copyAsync16(shared + (c * kRows + r) * 8, valid ? global + row * cols + c * 8 : global, valid);
    }
}

//! kPLAIN: no mask and no softcap (the common case), which compiles the per-score code without
//! them (fewer registers).
template <typename T, int32_t kD, int32_t kN, int32_t kWG, bool kPLAIN>
constexpr int32_t kHOPPER_MIN_BLOCKS = kPLAIN && std::is_same_v<T, __half> && kD <= 64 && kN == 64 && kWG == 2 ? 2 : 1;

template <typename T, int32_t kD, int32_t kN, int32_t kWG, bool kPLAIN>
__global__ void __launch_bounds__(kWG * 128, (kHOPPER_MIN_BLOCKS<T, kD, kN, kWG, kPLAIN>)) hopperAttentionKernel(T const* __restrict__ q,
    T const* __restrict__ k, T const* __restrict__ v, AttentionMaskView const givenMask, T* __restrict__ out,
    AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    AttentionMaskView const noMask{};
    AttentionMaskView const& mask = kPLAIN ? noMask : givenMask;
    AttentionParams params = givenParams;
    if constexpr (kPLAIN)
    {
        params.softcap = 0.F;
    }
    constexpr int32_t kThreads = kWG * 128;
    constexpr int32_t kRows = kWG * 64;
    constexpr int32_t kTILE = kN * kD; // elements of one K or V tile
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    T* const sQ = reinterpret_cast<T*>(sharedRaw);
    T* const sK = sQ + kRows * kD; // two stages
    T* const sV = sK + 2 * kTILE;  // two stages

    BlockSetup<T> const block(q, k, v, out, mask, shape, params, kRows, qTiles);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);

    loadChunkMajor<T, kD, kRows, kThreads>(sQ, block.qBase, block.q0, shape.seqQ, headDim);
    if (keyTiles > 0)
    {
        loadChunkMajor<T, kD, kN, kThreads>(sK, block.kBase, 0, shape.seqK, headDim);
        loadChunkMajor<T, kD, kN, kThreads>(sV, block.vBase, 0, shape.seqK, valueDim);
    }
    commitAsync();

    uint32_t const qAddress = sharedAddress(sQ) + static_cast<uint32_t>(group * 64 * 16);
    uint32_t const kAddress = sharedAddress(sK);
    uint32_t const vAddress = sharedAddress(sV);
    // Q (A, K-major): LBO = the next 8 head-dim elements (kRows rows of 16 bytes), SBO = 8 rows.
    uint64_t const qDesc = descriptor(qAddress, kRows * 16, 128);

    float o[kD / 8][4];
#pragma unroll
    for (int32_t n = 0; n < kD / 8; ++n)
    {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
    }
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warp * 16;

    for (int32_t j = 0; j < keyTiles; ++j)
    {
        int32_t const stage = j % 2;
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        waitAsync<0>(); // tile j (this thread's part)
        fenceProxyAsync(); // made visible to the tensor cores' reads
        __syncthreads();   // everyone's part; and every warpgroup is done with the other stage
        if (j + 1 < keyTiles)
        {
            loadChunkMajor<T, kD, kN, kThreads>(sK + (1 - stage) * kTILE, block.kBase, k0 + kN, shape.seqK, headDim);
            loadChunkMajor<T, kD, kN, kThreads>(sV + (1 - stage) * kTILE, block.vBase, k0 + kN, shape.seqK, valueDim);
            commitAsync();
        }

        // S = Q K_jᵀ. K (B, K-major, N = keys): LBO = kN rows of 16 bytes, SBO = 8 rows.
        uint32_t const kStage = kAddress + static_cast<uint32_t>(stage * kTILE * 2);
        uint64_t const kDesc = descriptor(kStage, kN * 16, 128);
        float s[kN / 8][4];
        wgmmaFence();
#pragma unroll
        for (int32_t kk = 0; kk < kD / 16; ++kk)
        {
            // 2 chunks of 8 head-dim elements per step: (2 kk) * rows * 16 bytes, in units of 16
            hp::Wgmma<T, kN>::ss(s, qDesc + static_cast<uint64_t>(2 * kk * kRows),
                kDesc + static_cast<uint64_t>(2 * kk * kN), kk > 0);
        }
        wgmmaCommit();
        wgmmaWait<0>();
        fenceOperands(s);

        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        float alpha[2];
        softmax.template update<true>(s, alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape, params, checkEach);
        rescale(o, alpha);

        // P as the A operand: keys 16 kk .. 16 kk + 15 are the scores' tiles 2 kk and 2 kk + 1.
        uint32_t p[kN / 16][4];
        uint32_t lo[kN / 16][4];
#pragma unroll
        for (int32_t kk = 0; kk < kN / 16; ++kk)
        {
            probabilityPair<T>(s[2 * kk][0], s[2 * kk][1], p[kk][0], lo[kk][0]);
            probabilityPair<T>(s[2 * kk][2], s[2 * kk][3], p[kk][1], lo[kk][1]);
            probabilityPair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1], p[kk][2], lo[kk][2]);
            probabilityPair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3], p[kk][3], lo[kk][3]);
        }

        // O += P V_j. V (B, N-major, N = value dim): LBO = the next 8 keys (128 bytes), SBO = the
        // next 8 value-dim elements (kN keys of 16 bytes); 16 keys a step = 256 bytes.
        uint32_t const vStage = vAddress + static_cast<uint32_t>(stage * kTILE * 2);
        uint64_t const vDesc = descriptor(vStage, 128, kN * 16);
        fenceOperands(o);
        fenceOperands(p);
        if constexpr (kSPLIT_P<T>)
        {
            fenceOperands(lo);
        }
        wgmmaFence();
#pragma unroll
        for (int32_t kk = 0; kk < kN / 16; ++kk)
        {
            if constexpr (kSPLIT_P<T>)
            {
                hp::Wgmma<T, kD>::rs(o, lo[kk], vDesc + static_cast<uint64_t>(kk * 16), true);
            }
            hp::Wgmma<T, kD>::rs(o, p[kk], vDesc + static_cast<uint64_t>(kk * 16), true);
        }
        wgmmaCommit();
        wgmmaWait<0>();
        fenceOperands(o);
        fenceOperands(p);
        if constexpr (kSPLIT_P<T>)
        {
            fenceOperands(lo);
        }
    }
    waitAsync<0>();
    softmax.finish();
    storeOutput<T, kD>(o, softmax, block.outBase, warpRow0 + lane / 4, shape, params);
#endif
}

template <typename T, int32_t kD, int32_t kN, int32_t kWG, typename F>
cudaError_t withPlain(bool plain, F&& f)
{
    return plain ? f(hopperAttentionKernel<T, kD, kN, kWG, true>) : f(hopperAttentionKernel<T, kD, kN, kWG, false>);
}

template <typename T, int32_t kD, typename F>
cudaError_t withTile(HopperPlan const& plan, bool plain, F&& f)
{
#ifdef GRAPHFIX_HOPPER_QUICK
    return withPlain<T, kD, GRAPHFIX_HOPPER_QUICK, GRAPHFIX_HOPPER_QUICK_WG>(plain, f);
#else
    if (plan.keys == 64 && plan.blockRows == 128)
    {
        return withPlain<T, kD, 64, 2>(plain, f);
    }
    if constexpr (kD == 64)
    {
        if (plan.keys == 128 && plan.blockRows == 128)
        {
            return withPlain<T, kD, 128, 2>(plain, f);
        }
        if (plan.keys == 128 && plan.blockRows == 64)
        {
            return withPlain<T, kD, 128, 1>(plain, f);
        }
    }
    return cudaErrorInvalidConfiguration;
#endif
}

//! Calls f with the kernel for the plan, or returns cudaErrorInvalidConfiguration.
template <typename T, typename F>
cudaError_t withHopperKernel(HopperPlan const& plan, bool plain, F&& f)
{
    switch (plan.paddedDim)
    {
#ifndef GRAPHFIX_HOPPER_QUICK
    case 32: return withTile<T, 32>(plan, plain, f);
    case 80: return withTile<T, 80>(plan, plain, f);
    case 96: return withTile<T, 96>(plan, plain, f);
    case 128: return withTile<T, 128>(plan, plain, f);
#endif
    case 64: return withTile<T, 64>(plan, plain, f);
    default: return cudaErrorInvalidConfiguration;
    }
}

} // namespace

template <typename T>
cudaError_t prepareHopperAttention(HopperPlan const& plan) noexcept
{
    auto const prepare = [&](auto kernel) {
        cudaFuncAttributes attributes{};
        cudaError_t const status = cudaFuncGetAttributes(&attributes, kernel);
        if (status != cudaSuccess)
        {
            return status;
        }
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.sharedBytes);
    };
    cudaError_t const status = withHopperKernel<T>(plan, true, prepare);
    return status != cudaSuccess ? status : withHopperKernel<T>(plan, false, prepare);
}

template <typename T>
cudaError_t launchHopperAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, HopperPlan const& plan, cudaStream_t stream) noexcept
{
    if (plan.keys == 0 || params.kTransposed || shape.headsKV <= 0 || shape.headsQ % shape.headsKV != 0)
    {
        return cudaErrorInvalidValue;
    }
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out))
    {
        return cudaErrorMisalignedAddress;
    }
    if (shape.batch == 0 || shape.headsQ == 0 || shape.seqQ == 0)
    {
        return cudaSuccess;
    }
    int64_t const qTiles = (shape.seqQ + plan.blockRows - 1) / plan.blockRows;
    int64_t const blocks = qTiles * shape.batch * shape.headsQ;
    if (blocks > kMAX_GRID_BLOCKS)
    {
        return cudaErrorInvalidConfiguration;
    }
    uint32_t const threads = static_cast<uint32_t>(plan.blockRows / 64 * 128);
    bool const plain = mask.kind == AttentionMaskKind::kNone && params.softcap == 0.F;
    return withHopperKernel<T>(plan, plain, [&](auto kernel) {
        kernel<<<static_cast<uint32_t>(blocks), threads, static_cast<size_t>(plan.sharedBytes), stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(qTiles));
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_HOPPER_CUH
