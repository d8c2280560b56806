/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The Hopper attention kernel (graphfixAttentionHopper.h), included by one translation unit per
 * element type (graphfixAttentionHopper{Half,BFloat16}.cu), which CMake compiles for sm_90a only
 * (-gencode=arch=compute_90a,code=sm_90a): wgmma exists nowhere else.
 *
 * hopperAttentionKernel, per block: kWG warpgroups x 64 query rows (2 x 64 as built), tiles of
 * kN = 64 keys (hopperProducerKernel, the warp-specialised kernel for unmasked shapes at padded
 * head dims 64, 128 and 256, and hopperShortKernel, the persistent kernel for unmasked shapes with
 * every key in two tiles, are described where they are defined). All
 * threads load with cp.async, K one tile ahead of V (two stages each); or (kTMA, the default
 * where the tensor maps can be encoded) thread 0 issues TMA box loads of the same tiles right
 * after the barrier and every thread waits on the stage's mbarrier instead of its own cp.async
 * group (kTMA in hopperAttentionKernel; encodeHopperMaps). In every warpgroup, with
 * P_j (the probabilities of tile j, O already rescaled to their maximum) in registers:
 *
 *   wait own loads | fence.proxy.async | barrier | issue K_j+2, V_j+1 (cp.async)
 *   | issue S_j+1 = Q K_j+1ᵀ (wgmma, A and B in shared memory)
 *   | issue O += P_j V_j (wgmma, A = P_j in registers, B = V_j N-major in shared memory)
 *   (kLATE_LOADS: the cp.async loads after the two wgmma issues instead)
 *   | wait S_j+1 | online softmax of S_j+1 in registers -> P_j+1 (overlaps P_j V_j)
 *   | wait P_j V_j | rescale O
 *
 * (FlashAttention-3's intra-warpgroup overlap; without it, one product at a time, the same kernel
 * measured 5% slower on SDXL self float16.) The accumulators keep the mma.sync m16n8 layout, so the
 * per-score code of the mma.sync flash kernel (OnlineSoftmax: masks, causal, softcap, mask_fill)
 * runs unchanged; kPLAIN instantiations (no mask, no softcap) compile without it.
 *
 * Shared memory holds every tile in the wgmma no-swizzle canonical layout: 16-byte chunks of 8
 * elements, chunk-major ([chunk][row]), so each 8x8 core matrix (8 rows of one chunk) is 128
 * contiguous bytes. For Q and K (K-major operands): rows 16 bytes apart, 8-row groups 128 bytes
 * apart (SBO), the next 8 elements of the head dimension rows*16 bytes on (LBO). For V (N-major
 * operand of P·V, N = the value dimension): 8 keys of one 8-element chunk are one core matrix,
 * the next 8 keys 128 bytes on (LBO), the next chunk keys*16 bytes on (SBO). Writes of 16 rows x 2
 * chunks per warp are conflict-free; any head dimension that is a multiple of 16 works (72 is
 * padded to 80, zero-filled by cp.async). TMA writes the same layout without swizzle: each matrix
 * is the 4-d tensor {8 elements, rows, D/8 chunks, batch*heads} (byte strides 2D, 16, 2TD) read in
 * boxes {8, tile rows, kD/8, 1}, which land innermost-first as [chunk][row][8], zero-filled past
 * the sequence and past D.
 */
#ifndef GRAPHFIX_ATTENTION_HOPPER_CUH
#define GRAPHFIX_ATTENTION_HOPPER_CUH

#include "../flash/graphfixAttentionFlash.cuh"
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

//! mbarrier and TMA (kTMA): `bar` and `shared` are shared-memory addresses (sharedAddress).
__device__ __forceinline__ void mbarrierInit(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

//! Makes the barriers' initialisation visible to the tensor memory accelerator (async proxy).
__device__ __forceinline__ void fenceBarrierInit()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

//! This thread's arrival, expecting `bytes` of transactions (the TMA loads that complete on it).
__device__ __forceinline__ void mbarrierArriveExpect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

//! Waits until the barrier's phase of parity `parity` has completed (the loop inside the asm: a
//! C++ loop here made ptxas serialise the wgmmas of the plain kernels, C7513).
__device__ __forceinline__ void mbarrierWait(uint32_t bar, uint32_t parity)
{
    asm volatile(
        "{\n"
        ".reg .pred ready;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
        "@!ready bra WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

//! This thread's arrival (no transactions): a consumer thread done reading a stage. Every
//! consumer thread arrives: one lane per warp, predicated, made ptxas serialise the float16
//! kernels' wgmmas (C7513).
__device__ __forceinline__ void mbarrierArrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

//! The warpgroup's registers a thread lowered (producer) or raised (consumers) to kREGISTERS.
template <int32_t kREGISTERS>
__device__ __forceinline__ void lowerRegisters()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kREGISTERS));
}

template <int32_t kREGISTERS>
__device__ __forceinline__ void raiseRegisters()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kREGISTERS));
}

//! Programmatic dependent launch: the grid launched after this one on the stream (with
//! cudaLaunchAttributeProgrammaticStreamSerialization) may start now; its reads of what this
//! grid writes wait in waitForPrimaryGrid.
__device__ __forceinline__ void allowDependentGrid()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

//! Waits until the grid before this one on the stream has completed and its writes are visible
//! (returns at once where this grid was launched without programmatic serialisation).
__device__ __forceinline__ void waitForPrimaryGrid()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

//! A barrier of `threads` threads on hardware barrier `id` (1-15; 0 is __syncthreads').
__device__ __forceinline__ void namedBarrier(uint32_t id, uint32_t threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

//! A barrier of kTHREADS threads (whole warps) on hardware barrier kID that returns whether any
//! of them passed `value`.
template <uint32_t kID, uint32_t kTHREADS>
__device__ __forceinline__ bool namedBarrierOr(bool value)
{
    uint32_t any = 0;
    asm volatile(
        "{\n"
        ".reg .pred given, result;\n"
        "setp.ne.u32 given, %1, 0;\n"
        "bar.red.or.pred result, %2, %3, given;\n"
        "selp.u32 %0, 1, 0, result;\n"
        "}\n"
        : "=r"(any)
        : "r"(static_cast<uint32_t>(value)), "n"(kID), "n"(kTHREADS)
        : "memory");
    return any != 0;
}

//! One box of a 4-d tensor map into shared memory, completing on `bar` (bytes counted there).
__device__ __forceinline__ void tmaLoad(
    uint32_t shared, CUtensorMap const* map, int32_t c1, int32_t c3, uint32_t bar)
{
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %2, "
        "%4}], [%5];\n" ::"r"(shared),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(c1), "r"(c3), "r"(bar)
        : "memory");
}

//! One box of a 3-d tensor map (the 128-byte swizzled maps: column c0, row c1, head c2).
__device__ __forceinline__ void tmaLoad3d(
    uint32_t shared, CUtensorMap const* map, int32_t c0, int32_t c1, int32_t c2, uint32_t bar)
{
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(shared),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void prefetchTensorMap(CUtensorMap const* map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

//! A shared-memory matrix descriptor, no swizzle: start address, leading and stride byte offsets.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading, uint32_t stride)
{
    return static_cast<uint64_t>((address & 0x3FFFFU) >> 4) | (static_cast<uint64_t>((leading & 0x3FFFFU) >> 4) << 16)
        | (static_cast<uint64_t>((stride & 0x3FFFFU) >> 4) << 32);
}

//! The same in the 128-byte swizzle mode (layout type 1 in bits 62-63). K-major operands (Q, K):
//! rows of 128 bytes (64 elements), the next 8 rows 1024 bytes on (SBO); LBO unused (1). N-major
//! (V): the next 8 keys 1024 bytes on (SBO), the next 64 value-dim elements `leading` bytes on.
__device__ __forceinline__ uint64_t swizzledDescriptor(uint32_t address, uint32_t leading)
{
    return descriptor(address, leading, 1024) | (uint64_t{1} << 62);
}

//! Where the wgmma chain's step kk (head-dim elements 16 kk .. 16 kk + 15) of a K-major operand
//! of `rows` rows starts, in the descriptor's 16-byte units: no swizzle, 2 chunk columns of rows
//! x 16 bytes a step; 128-byte swizzle, 64-element column blocks of rows x 128 bytes, 32 bytes a
//! step within one (the hardware applies the swizzle to the address it computes, so a step inside
//! a swizzled row is a plain offset from the 1024-byte-aligned block).
template <bool kSWIZZLE>
__device__ __forceinline__ uint64_t kMajorStep(int32_t kk, int32_t rows)
{
    return static_cast<uint64_t>(kSWIZZLE ? (kk / 4) * rows * 8 + (kk % 4) * 2 : 2 * kk * rows);
}

//! A K-major operand of `rows` rows starting at `address` (Q as A, K as B of S = Q Kᵀ): no
//! swizzle, LBO = the next 8 head-dim elements (rows x 16 bytes on), SBO = 8 rows (128 bytes);
//! 128-byte swizzle, swizzledDescriptor's. A warpgroup's Q rows start kMajorRowBytes<> x row on.
template <bool kSWIZZLE>
__device__ __forceinline__ uint64_t kMajorDescriptor(uint32_t address, int32_t rows)
{
    return kSWIZZLE ? swizzledDescriptor(address, 16) : descriptor(address, static_cast<uint32_t>(rows) * 16U, 128);
}

template <bool kSWIZZLE>
__device__ __forceinline__ constexpr uint32_t kMajorRowBytes()
{
    return kSWIZZLE ? 128U : 16U;
}

//! V as the N-major B operand of P V, a tile of kN keys at `address`: no swizzle, LBO = the next 8
//! keys (128 bytes), SBO = the next 8 value-dim elements (kN keys of 16 bytes); 128-byte swizzle,
//! SBO = the next 8 keys (1024 bytes), LBO = the next 64 value-dim elements (the next column
//! block, kN rows of 128 bytes on).
template <bool kSWIZZLE, int32_t kN>
__device__ __forceinline__ uint64_t valueDescriptor(uint32_t address)
{
    return kSWIZZLE ? swizzledDescriptor(address, kN * 128) : descriptor(address, 128, kN * 16);
}

//! A tile of `rows` rows of a [heads, rows, kD] matrix from row `row0` of head `head` into
//! `shared` by TMA, completing on `full` (which expects rows x kD elements' bytes): no swizzle,
//! one box of the 4-d chunk-major map; kSWIZZLE, one box of {64, rows} per 64-element column
//! block, block b at b x rows x 64 elements (each 1024-byte aligned when `shared` is).
template <typename T, int32_t kD, bool kSWIZZLE>
__device__ __forceinline__ void loadTile(
    T* shared, CUtensorMap const* map, int32_t rows, int32_t row0, int32_t head, uint32_t full)
{
    if constexpr (kSWIZZLE)
    {
#pragma unroll
        for (int32_t b = 0; b < kD / 64; ++b)
        {
            tmaLoad3d(sharedAddress(shared + b * rows * 64), map, b * 64, row0, head, full);
        }
    }
    else
    {
        tmaLoad(sharedAddress(shared), map, row0, head, full);
    }
}

//! Copies rows [row0, row0 + kRows) x [0, kD) of a [rows, cols] matrix into the chunk-major
//! layout ([kD / 8][kRows] chunks of 16 bytes), zeros past `rows` and past `cols` (row0 < rows).
//! The tile's first row is addressed once (64-bit); each chunk adds a 32-bit offset that depends on
//! the thread and on how many rows the tile has, clamped to the last row and to column 0 where
//! the chunk is zero-filled (so the address is always inside the matrix).
template <typename T, int32_t kD, int32_t kRows, int32_t kThreads>
__device__ __forceinline__ void loadChunkMajor(T* shared, T const* global, int64_t row0, int64_t rows, int32_t cols)
{
    constexpr int32_t kCHUNKS = kD / 8;
    constexpr int32_t kPAIRS = kCHUNKS / 2;
    constexpr int32_t kUNITS = kRows * kCHUNKS;
    static_assert(kCHUNKS % 2 == 0 && kRows % 16 == 0, "whole 16-row, 2-chunk units");
    T const* const tile = global + row0 * cols;
    int64_t const left = rows - row0;
    int32_t const last = left < kRows ? static_cast<int32_t>(left) - 1 : kRows - 1; // last row present
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
        bool const columnPresent = c * 8 < cols;
        bool const valid = r <= last && columnPresent;
        int32_t const offset = (r < last ? r : last) * cols + (columnPresent ? c * 8 : 0);
        copyAsync16(shared + (c * kRows + r) * 8, tile + offset, valid);
    }
}

template <int32_t kN>
__device__ __forceinline__ void clearAccumulators(float (&o)[kN][4])
{
#pragma unroll
    for (int32_t n = 0; n < kN; ++n)
    {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.F;
    }
}

//! S = Q K_jᵀ into s, issued and committed (not waited for): one chain of wgmma with both
//! operands in shared memory, 16 head-dim elements a step (kMajorStep). Q (A, K-major, kRows rows
//! in the block): LBO = the next 8 head-dim elements (kRows rows of 16 bytes), SBO = 8 rows;
//! K (B, K-major, N = kN keys): LBO = kN rows of 16 bytes, SBO = 8 rows (kSWIZZLE:
//! swizzledDescriptor's).
template <typename T, int32_t kD, int32_t kN, int32_t kRows, bool kSWIZZLE = false>
__device__ __forceinline__ void issueScoreChain(float (&s)[kN / 8][4], uint64_t qDesc, uint64_t kDesc)
{
    fenceOperands(s);
    wgmmaFence();
#pragma unroll
    for (int32_t kk = 0; kk < kD / 16; ++kk)
    {
        hp::Wgmma<T, kN>::ss(s, qDesc + kMajorStep<kSWIZZLE>(kk, kRows), kDesc + kMajorStep<kSWIZZLE>(kk, kN), kk > 0);
    }
    wgmmaCommit();
}

//! O += P V_j, issued and committed: p (and with kSPLIT_P<T> lo, first) as the register A operand,
//! V (B, N-major, N = the value dim) in shared memory: LBO = the next 8 keys (128 bytes), SBO =
//! the next 8 value-dim elements (kN keys of 16 bytes); 16 keys a step = 256 bytes (kSWIZZLE:
//! rows of 128 bytes, 16 keys a step = 2048 bytes).
template <typename T, int32_t kD, int32_t kN, bool kSWIZZLE = false>
__device__ __forceinline__ void issueValueChain(
    float (&o)[kD / 8][4], uint32_t (&p)[kN / 16][4], uint32_t (&lo)[kN / 16][4], uint64_t vDesc)
{
    constexpr int32_t kVALUE_STEP = kSWIZZLE ? 128 : 16; // 16 keys, in the descriptor's 16-byte units
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
            hp::Wgmma<T, kD>::rs(o, lo[kk], vDesc + static_cast<uint64_t>(kk * kVALUE_STEP), true);
        }
        hp::Wgmma<T, kD>::rs(o, p[kk], vDesc + static_cast<uint64_t>(kk * kVALUE_STEP), true);
    }
    wgmmaCommit();
}

//! The probabilities in s as P·V's register A operand: keys 16 kk .. 16 kk + 15 are the scores'
//! tiles 2 kk and 2 kk + 1 (float16: rounded once into p; bfloat16: hi in p, lo in lo).
template <typename T, int32_t kN>
__device__ __forceinline__ void probabilityFragments(
    float const (&s)[kN / 8][4], uint32_t (&p)[kN / 16][4], uint32_t (&lo)[kN / 16][4])
{
#pragma unroll
    for (int32_t kk = 0; kk < kN / 16; ++kk)
    {
        probabilityPair<T>(s[2 * kk][0], s[2 * kk][1], p[kk][0], lo[kk][0]);
        probabilityPair<T>(s[2 * kk][2], s[2 * kk][3], p[kk][1], lo[kk][1]);
        probabilityPair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1], p[kk][2], lo[kk][2]);
        probabilityPair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3], p[kk][3], lo[kk][3]);
    }
}

//! P (and with kSPLIT_P<T> lo) copied for O += P V_j, so that the softmax of the next tile can
//! write p and lo while the product still reads the copy.
template <typename T, int32_t kN>
__device__ __forceinline__ void copyProbabilities(uint32_t const (&p)[kN / 16][4], uint32_t const (&lo)[kN / 16][4],
    uint32_t (&pv)[kN / 16][4], uint32_t (&lov)[kN / 16][4])
{
#pragma unroll
    for (int32_t kk = 0; kk < kN / 16; ++kk)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            pv[kk][e] = p[kk][e];
            if constexpr (kSPLIT_P<T>)
            {
                lov[kk][e] = lo[kk][e];
            }
        }
    }
}

//! Waits for O += P V_j (issued from the copies pv and lov), then rescales O by the next tile's
//! alpha; the fences keep the compiler from touching o, pv and lov while the product runs.
template <typename T, int32_t kO, int32_t kP>
__device__ __forceinline__ void rescaleAfterValues(
    float (&o)[kO][4], uint32_t (&pv)[kP][4], uint32_t (&lov)[kP][4], float const (&alpha)[2])
{
    wgmmaWait<0>();
    fenceOperands(o);
    fenceOperands(pv);
    if constexpr (kSPLIT_P<T>)
    {
        fenceOperands(lov);
    }
    rescale(o, alpha);
}

//! The output of one warp's 16 rows (o / sum, NaN or 0 where no key was allowed) into shared
//! memory, row-major with rows padded by 16 bytes (conflict-free pair writes); `row` is the
//! thread's first row there (its second is 8 on).
template <typename T, int32_t kD>
__device__ __forceinline__ void stageOutput(
    float const (&o)[kD / 8][4], OnlineSoftmax const& softmax, T* sOut, int32_t row, bool nanToZero)
{
    constexpr int32_t kOUT_ROW = kD + 8;
    int32_t const t = static_cast<int32_t>(threadIdx.x % 4);
    float const blocked = nanToZero ? 0.F : CUDART_NAN_F;
#pragma unroll
    for (int32_t i = 0; i < 2; ++i)
    {
        float const sum = softmax.rowSum[i];
        float const inverse = sum > 0.F ? 1.F / sum : 0.F;
#pragma unroll
        for (int32_t n = 0; n < kD / 8; ++n)
        {
            float const a = sum > 0.F ? o[n][2 * i] * inverse : blocked;
            float const b = sum > 0.F ? o[n][2 * i + 1] * inverse : blocked;
            storePair(sOut + (row + 8 * i) * kOUT_ROW + n * 8 + 2 * t, a, b);
        }
    }
}

//! The block's kRows staged output rows (stageOutput) to global memory in 16-byte coalesced
//! stores, by `threads` threads of which this is `thread`.
template <typename T, int32_t kD, int32_t kRows>
__device__ __forceinline__ void storeStagedOutput(
    T const* sOut, BlockSetup<T> const& block, AttentionShape const& shape, int32_t thread, int32_t threads)
{
    constexpr int32_t kOUT_ROW = kD + 8;
    constexpr int32_t kCHUNKS = kD / 8;
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    for (int32_t u = thread; u < kRows * kCHUNKS; u += threads)
    {
        int32_t const r = u / kCHUNKS;
        int32_t const c = u - r * kCHUNKS;
        int64_t const row = block.q0 + r;
        if (row < shape.seqQ && c * 8 < valueDim)
        {
            *reinterpret_cast<uint4*>(block.outBase + row * valueDim + c * 8)
                = *reinterpret_cast<uint4 const*>(sOut + r * kOUT_ROW + c * 8);
        }
    }
}

//! kPLAIN: no mask and no softcap (the common case), which compiles the per-score code without
//! them (fewer registers).
template <typename T, int32_t kD, int32_t kN, int32_t kWG, bool kPLAIN>
//! Two blocks per multiprocessor (128 registers a thread) for the plain kernels up to head dim
//! 80: ptxas then spills 8 bytes (64) to 56 bytes (80, bfloat16), a few address reloads a tile;
//! wider heads would spill hundreds of bytes and keep one block (up to 255 registers).
constexpr int32_t kHOPPER_MIN_BLOCKS = kPLAIN && kD <= 80 && kN == 64 && kWG == 2 ? 2 : 1;

//! bfloat16 waits for P_j V_j before the softmax of S_j+1 writes p and lo: overlapping them, ptxas
//! serialised every wgmma of the bfloat16 kernels (C7513). Except the plain head-dim-80 kernel:
//! at its two blocks' 128 registers ptxas serialises it either way (C7512 when it waits), and
//! measured on the H200 (SigLIP-384 b32) two serialised blocks beat one pipelined block, 0.487
//! against 0.585 ms, so it keeps the overlap and its two blocks.
template <typename T, int32_t kD, int32_t kN, int32_t kWG, bool kPLAIN>
constexpr bool kWAIT_PV = kSPLIT_P<T> && !(kHOPPER_MIN_BLOCKS<T, kD, kN, kWG, kPLAIN> == 2 && kD == 80);

//! `variant`: the kHOPPER_VARIANT_* bits the kernel reads at run time (the causal order).
//! kTMA: Q, K and V loaded by TMA (maps), issued by thread 0 right after each tile barrier, each
//! stage's completion on its own mbarrier (kLATE_LOADS then unused).
//! kLATE_LOADS: each tile's cp.async loads are issued after its wgmmas, not before them, so the
//! tensor cores start right after the barrier and the loads' address arithmetic overlaps them.
//! kKEYMASK (with kPLAIN): a mask that is the same for every query row ([.., 1, T], key padding)
//! and no softcap; each lane loads two mask values per key tile (one load per key and warp instead
//! of one per score) and the softmax takes its keys' values by shuffles, so the kernel keeps the
//! plain kernel's registers (two blocks per SM up to head dim 80) where the general masked kernel
//! needs up to 255 and one block.
template <typename T, int32_t kD, int32_t kN, int32_t kWG, bool kPLAIN, bool kLATE_LOADS, bool kKEYMASK, bool kTMA>
__global__ void __launch_bounds__(kWG * 128, (kHOPPER_MIN_BLOCKS<T, kD, kN, kWG, kPLAIN>)) hopperAttentionKernel(T const* __restrict__ q,
    T const* __restrict__ k, T const* __restrict__ v, AttentionMaskView const givenMask, T* __restrict__ out,
    AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles, int32_t const variant,
    __grid_constant__ HopperMaps const maps)
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
    // kTMA: the mbarriers of Q, K stages 0-1 and V stages 0-1 (8 bytes each)
    __shared__ __align__(8) uint64_t tmaBarriers[5];

    // (not in the two-block kernels: ptxas spilled 44 bytes more in the head-dim-80 one)
    BlockSetup<T> const block(q, k, v, out, kKEYMASK ? givenMask : mask, shape, params, kRows, qTiles,
        kHOPPER_MIN_BLOCKS<T, kD, kN, kWG, kPLAIN> == 1 && params.causal
            && (variant & kHOPPER_VARIANT_CAUSAL_ORDER) != 0);
    int32_t const headDim = static_cast<int32_t>(shape.headDim);
    int32_t const valueDim = static_cast<int32_t>(shape.valueDim);
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);
    // kKEYMASK: the mask value of key j kN + i, 0 past the end (blocked there by the end-of-keys
    // check); the row stride is 0, so it is row 0's. Each lane holds keys lane and lane + 32 of a
    // tile, and the softmax takes its keys' values by shuffles (a shared-memory copy, stored while
    // the loop's wgmmas were in flight, made ptxas serialise them: C7513).
    auto const keyMaskValue = [&](int32_t j, int32_t i) -> float {
        int64_t const kj = static_cast<int64_t>(j) * kN + i;
        if (!kKEYMASK || kj >= shape.seqK)
        {
            return 0.F;
        }
        int64_t const at = block.maskBase + kj * givenMask.stride[3];
        switch (givenMask.type)
        {
        case AttentionMaskType::kBool: return maskElement(static_cast<uint8_t const*>(givenMask.data)[at]);
        case AttentionMaskType::kFloat: return static_cast<float const*>(givenMask.data)[at];
        case AttentionMaskType::kHalf: return maskElement(static_cast<__half const*>(givenMask.data)[at]);
        case AttentionMaskType::kBFloat16:
            return maskElement(static_cast<__nv_bfloat16 const*>(givenMask.data)[at]);
        }
        return 0.F;
    };
    static_assert(!kKEYMASK || kN == 64, "two mask values per lane");
    float maskLo = keyMaskValue(0, lane);
    float maskHi = keyMaskValue(0, lane + 32);

    // kTMA: barrier of Q, K_j (stage j % 2) and V_j; tile j is its stage's phase j / 2. Thread 0
    // issues every load; a box's bytes all count, zero-filled ones too.
    uint32_t const barrierQ = sharedAddress(tmaBarriers);
    auto const barrierK = [&](int32_t j) { return barrierQ + static_cast<uint32_t>(8 + 8 * (j % 2)); };
    auto const barrierV = [&](int32_t j) { return barrierQ + static_cast<uint32_t>(24 + 8 * (j % 2)); };
    auto const parity = [](int32_t j) { return static_cast<uint32_t>((j / 2) % 2); };
    bool const producer = threadIdx.x == 0;
    // the maps' (batch, head) coordinate of this block's Q and of its K/V (GQA: the KV head)
    int32_t const qHead = kTMA ? static_cast<int32_t>((block.qBase - q) / (shape.seqQ * shape.headDim)) : 0;
    int32_t const kvHead = kTMA ? static_cast<int32_t>((block.kBase - k) / (shape.seqK * shape.headDim)) : 0;
    auto const tmaKey = [&](int32_t j) {
        mbarrierArriveExpect(barrierK(j), kTILE * sizeof(T));
        tmaLoad(sharedAddress(sK + (j % 2) * kTILE), &maps.k, j * kN, kvHead, barrierK(j));
    };
    auto const tmaValue = [&](int32_t j) {
        mbarrierArriveExpect(barrierV(j), kTILE * sizeof(T));
        tmaLoad(sharedAddress(sV + (j % 2) * kTILE), &maps.v, j * kN, kvHead, barrierV(j));
    };

    // Stages: K_j in sK[j % 2], V_j in sV[j % 2]. Tile j + 1's K is needed one iteration before
    // its V (S_j+1 is issued while P_j V_j runs), so K runs one tile ahead of V.
    if constexpr (kTMA)
    {
        if (producer)
        {
            prefetchTensorMap(&maps.q);
            prefetchTensorMap(&maps.k);
            prefetchTensorMap(&maps.v);
#pragma unroll
            for (int32_t i = 0; i < 5; ++i)
            {
                mbarrierInit(barrierQ + static_cast<uint32_t>(8 * i), 1);
            }
            fenceBarrierInit();
        }
        __syncthreads();
        if (producer && keyTiles > 0)
        {
            mbarrierArriveExpect(barrierQ, kRows * kD * sizeof(T));
            tmaLoad(sharedAddress(sQ), &maps.q, static_cast<int32_t>(block.q0), qHead, barrierQ);
            tmaKey(0);
            tmaValue(0);
            if (keyTiles > 1)
            {
                tmaKey(1);
            }
        }
    }
    else
    {
        loadChunkMajor<T, kD, kRows, kThreads>(sQ, block.qBase, block.q0, shape.seqQ, headDim);
        if (keyTiles > 0)
        {
            loadChunkMajor<T, kD, kN, kThreads>(sK, block.kBase, 0, shape.seqK, headDim);
            loadChunkMajor<T, kD, kN, kThreads>(sV, block.vBase, 0, shape.seqK, valueDim);
        }
        if (keyTiles > 1)
        {
            loadChunkMajor<T, kD, kN, kThreads>(sK + kTILE, block.kBase, kN, shape.seqK, headDim);
        }
        commitAsync();
    }

    uint32_t const qAddress = sharedAddress(sQ) + static_cast<uint32_t>(group * 64 * 16);
    uint32_t const kAddress = sharedAddress(sK);
    uint32_t const vAddress = sharedAddress(sV);
    // Q (A, K-major): LBO = the next 8 head-dim elements (kRows rows of 16 bytes), SBO = 8 rows.
    uint64_t const qDesc = descriptor(qAddress, kRows * 16, 128);

    float o[kD / 8][4];
    clearAccumulators(o);
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warp * 16;

    // S = Q K_jᵀ into s (issued, not waited for), K_j in stage j % 2
    auto const issueScores = [&](float (&s)[kN / 8][4], int32_t j) {
        issueScoreChain<T, kD, kN, kRows>(
            s, qDesc, descriptor(kAddress + static_cast<uint32_t>((j % 2) * kTILE * 2), kN * 16, 128));
    };
    // The online softmax of tile j's scores, then P as the A operand (probabilityFragments).
    auto const probabilities = [&](float (&s)[kN / 8][4], float (&alpha)[2], uint32_t (&p)[kN / 16][4],
                                   uint32_t (&lo)[kN / 16][4], int32_t j) {
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        if constexpr (kKEYMASK)
        {
            // scale, then the mask as the general kernel applies it (bool: keep or mask_fill;
            // additive: +), then the softmax of scores already scaled
            bool const isBool = givenMask.kind == AttentionMaskKind::kBool;
#pragma unroll
            for (int32_t n = 0; n < kN / 8; ++n)
            {
                int32_t const from = (8 * n + 2 * (lane % 4)) % 32;
                float const m[2]{__shfl_sync(kFULL_MASK, n < 4 ? maskLo : maskHi, from),
                    __shfl_sync(kFULL_MASK, n < 4 ? maskLo : maskHi, from + 1)};
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    float const me = m[e % 2];
                    s[n][e] = isBool ? (me != 0.F ? s[n][e] * params.scale : params.maskFill)
                                     : fmaf(s[n][e], params.scale, me);
                }
            }
            AttentionParams scaled = params;
            scaled.scale = 1.F;
            softmax.template update<true>(
                s, alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape, scaled, checkEach);
        }
        else
        {
            softmax.template update<true>(
                s, alpha, warpRow0 + lane / 4, k0, mask, block.maskBase, shape, params, checkEach);
        }
        probabilityFragments<T, kN>(s, p, lo);
    };

    float s[kN / 8][4];
    float alpha[2];
    uint32_t p[kN / 16][4];
    uint32_t lo[kN / 16][4];
    if (keyTiles > 0)
    {
        if constexpr (kTMA)
        {
            mbarrierWait(barrierQ, 0);
            mbarrierWait(barrierK(0), 0);
        }
        else
        {
            waitAsync<0>();
            fenceProxyAsync();
            __syncthreads();
        }
        issueScores(s, 0);
        wgmmaWait<0>();
        fenceOperands(s);
        probabilities(s, alpha, p, lo, 0);
    }
    // O += P_j V_j (issued and committed, issueValueChain). The probabilities are copied first:
    // the softmax of the next tile rewrites p and lo while this product still reads them.
    uint32_t pv[kN / 16][4];
    uint32_t lov[kN / 16][4];
    auto const issueValues = [&](int32_t j) {
        uint64_t const vDesc = descriptor(vAddress + static_cast<uint32_t>((j % 2) * kTILE * 2), 128, kN * 16);
        copyProbabilities<T, kN>(p, lo, pv, lov);
        issueValueChain<T, kD, kN>(o, pv, lov, vDesc);
    };
    // Waits for this thread's loads, publishes them to the tensor cores, and meets the block.
    auto const tileBarrier = [&]() {
        waitAsync<0>();
        fenceProxyAsync();
        __syncthreads();
    };
    // K_j+2 and V_j+1 (cp.async, committed as one group)
    auto const issueLoads = [&](int32_t j) {
        if (j + 2 < keyTiles)
        {
            loadChunkMajor<T, kD, kN, kThreads>(
                sK + (j % 2) * kTILE, block.kBase, static_cast<int64_t>(j + 2) * kN, shape.seqK, headDim);
        }
        loadChunkMajor<T, kD, kN, kThreads>(
            sV + ((j + 1) % 2) * kTILE, block.vBase, static_cast<int64_t>(j + 1) * kN, shape.seqK, valueDim);
        commitAsync();
    };
    for (int32_t j = 0; j + 1 < keyTiles; ++j)
    {
        // Here: P_j in p (O already scaled to its maximum), K_j+1 and V_j loaded by this thread.
        if constexpr (kTMA)
        {
            // every warpgroup done with S_j (K stage j % 2) and P_j-1 V_j-1 (V stage (j + 1) % 2):
            // their next tiles can go there
            __syncthreads();
            if (producer)
            {
                if (j + 2 < keyTiles)
                {
                    tmaKey(j + 2);
                }
                tmaValue(j + 1);
            }
            // (V_j, issued with K_j+1, waited for here too: a wait between the two wgmma issues
            // made ptxas serialise them, C7513)
            mbarrierWait(barrierK(j + 1), parity(j + 1));
            mbarrierWait(barrierV(j), parity(j));
        }
        else
        {
            tileBarrier(); // also: every warpgroup done with S_j and P_j-1 V_j-1
        }
        if constexpr (kKEYMASK)
        {
            maskLo = keyMaskValue(j + 1, lane); // for the softmax of S_j+1, loaded while it computes
            maskHi = keyMaskValue(j + 1, lane + 32);
        }
        if constexpr (!kLATE_LOADS && !kTMA)
        {
            issueLoads(j);
        }
        issueScores(s, j + 1); // S_j+1 on the tensor cores, then P_j V_j, while ...
        issueValues(j);
        if constexpr (kLATE_LOADS && !kTMA)
        {
            issueLoads(j); // (K_j+2 and V_j+1 go where S_j and P_j-1 V_j-1 read, done at the barrier)
        }
        // bfloat16 waits for P_j V_j too (kWAIT_PV): S_j+1 and P_j V_j stay in flight together
        // and the wgmmas of each batch pipelined, where overlapping the softmax serialised them.
        if constexpr (kWAIT_PV<T, kD, kN, kWG, kPLAIN>)
        {
            wgmmaWait<0>();
        }
        else
        {
            wgmmaWait<1>();
        }
        fenceOperands(s);
        probabilities(s, alpha, p, lo, j + 1); // ... the softmax of S_j+1 runs here
        rescaleAfterValues<T>(o, pv, lov, alpha);
    }
    if (keyTiles > 0)
    {
        if constexpr (kTMA)
        {
            mbarrierWait(barrierV(keyTiles - 1), parity(keyTiles - 1));
        }
        else
        {
            tileBarrier(); // V of the last tile
        }
        issueValues(keyTiles - 1);
        wgmmaWait<0>();
        fenceOperands(o);
    }
    waitAsync<0>();
    softmax.finish();

    // The output through shared memory, where K and V were: every warpgroup is done with them
    // after the barrier.
    static_assert(kRows * (kD + 8) <= 4 * kTILE, "the output fits where K and V were");
    T* const sOut = sK;
    __syncthreads();
    stageOutput<T, kD>(o, softmax, sOut, warp * 16 + lane / 4, params.nanToZero);
    __syncthreads();
    storeStagedOutput<T, kD, kRows>(sOut, block, shape, static_cast<int32_t>(threadIdx.x), kThreads);
#endif
}

//! The warp-specialised kernel (FlashAttention-3's structure) for what needs neither mask nor
//! softcap, loads by TMA: warpgroup 0 is the producer, whose one thread issues every TMA load
//! into a ring of kSTAGES K and kSTAGES V stages (a "full" mbarrier per stage that the load
//! completes, an "empty" one that each consumer thread arrives on once the wgmma reading the
//! stage has completed), and lowers its registers to 24 so that warpgroups 1 and 2, 64 query rows each,
//! run at 240: enough for 128-key tiles (S is 64 registers a thread) beside O at head dim 128,
//! and for 64-key tiles beside O at 256 (128 registers).
//! No block-wide barrier per tile: a consumer waits only for the stages it reads. Each consumer
//! warpgroup runs the overlap of hopperAttentionKernel (S_j+1 and P_j V_j issued together, the
//! softmax of S_j+1 under P_j V_j; bfloat16, whose split P doubles the P registers, waits for
//! both first, kWAIT_PV's reason).
//! kSWIZZLE (kHOPPER_VARIANT_SWIZZLE): Q, K and V tiles as column blocks of 64 elements, [block]
//! [row][64] with the 128-byte swizzle (each 16-byte chunk of row r at chunk c ^ (r % 8) of its
//! 128-byte row), written by TMA boxes of {64, rows} and read by wgmma in the same mode
//! (swizzledDescriptor); where the no-swizzle layout has 16-byte rows, 2048 of them per 32 KB tile,
//! more than the copy engine moved in the time the tensor cores took for a tile.
//! TP: the type of P·V's operands, T or, for bfloat16 (kHOPPER_VARIANT_HALF_VALUES), __half: P
//! rounded once to float16 and V already converted to float16 by convertValuesToHalf (maps.v
//! describes the converted copy); S = Q Kᵀ stays in T.
//! gate (kHOPPER_VARIANT_HALF_VALUES; empty otherwise): the conversion's overflow slots. Three
//! launches, each programmatic on the one before, with no host synchronisation: the conversion,
//! this kernel with TP = __half, which waits for the conversion, reads the slots, lets the next
//! launch start and returns where one is raised (a finite |v| above 65504); then this kernel with
//! TP = T (the split bfloat16 P·V on V as given), whose blocks start as the float16 one's drain,
//! read the same slots and return where none is raised, else wait for the float16 grid (both
//! write the output) and run. (Both P·V bodies in one kernel, choosing at run time, was built in
//! session 9: it spilled at head dim 256, and the long bfloat16 rows ran 10-16% slower than in
//! session 8's run.)
//! kCONVERT (kHOPPER_VARIANT_CONVERT_IN_KERNEL; TP = __half with T = __nv_bfloat16): maps.v is V
//! as given (bfloat16) and warps 1-3 of the producer warpgroup (at its 24 registers) convert each
//! V tile to float16 in place once its load lands (elementwise, so the swizzle does not matter;
//! exact as convertValuesToHalf), then make their writes visible to wgmma's async proxy and
//! arrive on that stage's "converted" barrier, which the consumers wait on instead of the load's.
//! They keep the largest |v| they met (bfloat16 max, NaN-ignoring) and the block writes
//! gate.slots[blockIdx.x]: 1 where it exceeds 65504 (infinities too: the fallback gives them
//! what this one would), else 0; hopperSplitFallbackKernel, launched after it, waits for this
//! grid and recomputes the blocks whose slot is 1.
template <typename T, typename TP, int32_t kD, int32_t kN, int32_t kSTAGES, bool kSWIZZLE, bool kCONVERT = false>
__global__ void __launch_bounds__(384, 1) hopperProducerKernel(T const* __restrict__ q, T const* __restrict__ k,
    T const* __restrict__ v, T* __restrict__ out, AttentionShape const shape, AttentionParams const givenParams,
    int32_t const qTiles, int32_t const variant, __grid_constant__ HopperMaps const maps, HopperGate const gate)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(std::is_same_v<TP, T> || (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<TP, __half>),
        "P·V in the I/O type, or bfloat16's in float16");
    static_assert(!kCONVERT || !std::is_same_v<TP, T>, "only the float16 P·V converts V");
    constexpr int32_t kRows = 128; // two consumer warpgroups
    constexpr int32_t kTILE = kN * kD;
    constexpr uint32_t kTILE_BYTES = kTILE * sizeof(T);
    static_assert(!kSWIZZLE || kD % 64 == 0, "whole 64-element column blocks");
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    // (kSWIZZLE: the tiles start on a 1024-byte boundary, kHOPPER_SWIZZLE_ALIGN's reason; the
    // plan's producerSharedBytes holds the slack)
    uint32_t const skip = kSWIZZLE ? (0U - sharedAddress(sharedRaw)) % uint32_t{kHOPPER_SWIZZLE_ALIGN} : 0U;
    T* const sQ = reinterpret_cast<T*>(sharedRaw + skip);
    T* const sK = sQ + kRows * kD; // kSTAGES stages
    T* const sV = sK + kSTAGES * kTILE;
    // Q's; then per stage: K full, V full, K empty, V empty (kCONVERT: V converted)
    __shared__ __align__(8) uint64_t barriers[1 + (kCONVERT ? 5 : 4) * kSTAGES];
    AttentionParams params = givenParams;
    params.softcap = 0.F;
    AttentionMaskView const noMask{};
    BlockSetup<T> const block(q, k, v, out, noMask, shape, params, kRows, qTiles,
        params.causal && (variant & kHOPPER_VARIANT_CAUSAL_ORDER) != 0);
    int32_t const keyTiles = static_cast<int32_t>((block.keyEnd + kN - 1) / kN);
    uint32_t const barrierQ = sharedAddress(barriers);
    auto const fullK = [&](int32_t j) { return barrierQ + static_cast<uint32_t>(8 + 8 * (j % kSTAGES)); };
    auto const fullV = [&](int32_t j) { return fullK(j) + 8U * kSTAGES; };
    auto const emptyK = [&](int32_t j) { return fullK(j) + 16U * kSTAGES; };
    auto const emptyV = [&](int32_t j) { return fullK(j) + 24U * kSTAGES; };
    auto const convertedV = [&](int32_t j) { return fullK(j) + 32U * kSTAGES; };
    constexpr uint32_t kCONVERTERS = 96; // warps 1-3
    // tile j is its stage's (j / kSTAGES)-th use: that phase of its full barrier, and the phase
    // before of its empty one
    auto const parity = [](int32_t j) { return static_cast<uint32_t>((j / kSTAGES) % 2); };
    if (threadIdx.x == 0)
    {
        mbarrierInit(barrierQ, 1);
#pragma unroll
        for (int32_t i = 0; i < kSTAGES; ++i)
        {
            mbarrierInit(fullK(i), 1);
            mbarrierInit(fullV(i), 1);
            mbarrierInit(emptyK(i), 256); // the consumer threads
            mbarrierInit(emptyV(i), 256);
            if constexpr (kCONVERT)
            {
                mbarrierInit(convertedV(i), kCONVERTERS);
            }
        }
        fenceBarrierInit();
    }
    if (gate.slots == nullptr || kCONVERT)
    {
        __syncthreads();
        if constexpr (kCONVERT)
        {
            // the fallback's blocks (hopperSplitFallbackKernel) may start on SMs this grid leaves
            // idle: they wait for its completion before reading a slot
            allowDependentGrid();
        }
    }
    else
    {
        // float16 P·V: whether a conversion block raised its slot, read as 16-byte groups from L2
        // (written by another grid) after the block barrier the initialisation needs anyway
        if constexpr (!std::is_same_v<TP, T>)
        {
            waitForPrimaryGrid(); // the conversion
        }
        int4 any{0, 0, 0, 0};
        for (int32_t i = static_cast<int32_t>(threadIdx.x); i < gate.count / 4; i += static_cast<int32_t>(blockDim.x))
        {
            int4 const group = __ldcg(reinterpret_cast<int4 const*>(gate.slots) + i);
            any.x |= group.x | group.y | group.z | group.w;
        }
        bool const raised = __syncthreads_or(any.x) != 0;
        if constexpr (!std::is_same_v<TP, T>)
        {
            allowDependentGrid(); // the split kernel's blocks may start: the slots are final
            if (raised)
            {
                return;
            }
        }
        else
        {
            if (!raised)
            {
                return;
            }
            waitForPrimaryGrid(); // the float16 kernel, which returned at once
        }
    }

    if (threadIdx.x < 128)
    {
        lowerRegisters<24>();
        if (threadIdx.x == 0 && keyTiles > 0)
        {
            prefetchTensorMap(&maps.q);
            prefetchTensorMap(&maps.k);
            prefetchTensorMap(&maps.v);
            // the maps' (batch, head) coordinate of this block's Q and of its K/V (GQA: the KV head)
            int32_t const qHead = static_cast<int32_t>((block.qBase - q) / (shape.seqQ * shape.headDim));
            int32_t const kvHead = static_cast<int32_t>((block.kBase - k) / (shape.seqK * shape.headDim));
            mbarrierArriveExpect(barrierQ, kRows * kD * sizeof(T));
            loadTile<T, kD, kSWIZZLE>(sQ, &maps.q, kRows, static_cast<int32_t>(block.q0), qHead, barrierQ);
            auto const load = [&](CUtensorMap const* map, T* stages, uint32_t full, uint32_t empty, int32_t j) {
                if (j >= kSTAGES)
                {
                    mbarrierWait(empty, parity(j) ^ 1U);
                }
                mbarrierArriveExpect(full, kTILE_BYTES);
                loadTile<T, kD, kSWIZZLE>(stages + (j % kSTAGES) * kTILE, map, kN, j * kN, kvHead, full);
            };
            // in the order the consumers read them: K_j+1 before V_j
            for (int32_t j = 0; j < keyTiles; ++j)
            {
                load(&maps.k, sK, fullK(j), emptyK(j), j);
                if (j > 0)
                {
                    load(&maps.v, sV, fullV(j - 1), emptyV(j - 1), j - 1);
                }
            }
            load(&maps.v, sV, fullV(keyTiles - 1), emptyV(keyTiles - 1), keyTiles - 1);
        }
        if constexpr (kCONVERT)
        {
            if (threadIdx.x >= 32)
            {
                __nv_bfloat162 top = __floats2bfloat162_rn(0.F, 0.F);
                for (int32_t j = 0; j < keyTiles; ++j)
                {
                    mbarrierWait(fullV(j), parity(j));
                    uint4* const tile = reinterpret_cast<uint4*>(sV + (j % kSTAGES) * kTILE);
                    for (int32_t c = static_cast<int32_t>(threadIdx.x) - 32; c < kTILE / 8;
                         c += static_cast<int32_t>(kCONVERTERS))
                    {
                        uint4 chunk = tile[c];
                        uint32_t* const words = reinterpret_cast<uint32_t*>(&chunk);
#pragma unroll
                        for (int32_t e = 0; e < 4; ++e)
                        {
                            __nv_bfloat162 const pair = *reinterpret_cast<__nv_bfloat162 const*>(&words[e]);
                            top = __hmax2(top, __habs2(pair));
                            float2 const f = __bfloat1622float2(pair);
                            __half2 const h = __floats2half2_rn(f.x, f.y);
                            words[e] = *reinterpret_cast<uint32_t const*>(&h);
                        }
                        tile[c] = chunk;
                    }
                    fenceProxyAsync(); // the float16 tile to wgmma's async proxy
                    mbarrierArrive(convertedV(j));
                }
                float2 const largest = __bfloat1622float2(top);
                bool const raised
                    = namedBarrierOr<2, kCONVERTERS>(largest.x > 65504.F || largest.y > 65504.F);
                if (threadIdx.x == 32)
                {
                    *const_cast<int32_t*>(gate.slots + blockIdx.x) = raised ? 1 : 0;
                }
            }
        }
        return;
    }

    raiseRegisters<240>();
    int32_t const group = static_cast<int32_t>(threadIdx.x / 128) - 1;
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32) - 4; // of the 8 consumer warps
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    // a consumer thread done with tile j's K or V (the wgmma that read it has completed)
    auto const release = [&](uint32_t empty) { mbarrierArrive(empty); };
    // Q (A, K-major): this warpgroup's 64 rows of the block's kRows
    uint64_t const qDesc = kMajorDescriptor<kSWIZZLE>(
        sharedAddress(sQ) + static_cast<uint32_t>(group * 64) * kMajorRowBytes<kSWIZZLE>(), kRows);
    uint32_t const kAddress = sharedAddress(sK);
    uint32_t const vAddress = sharedAddress(sV);

    float o[kD / 8][4];
    clearAccumulators(o);
    OnlineSoftmax softmax;
    int64_t const warpRow0 = block.q0 + warp * 16;

    // S = Q K_jᵀ into s (issued, not waited for), K_j in stage j % kSTAGES
    auto const issueScores = [&](float (&s)[kN / 8][4], int32_t j) {
        uint32_t const address = kAddress + static_cast<uint32_t>((j % kSTAGES) * kTILE_BYTES);
        issueScoreChain<T, kD, kN, kRows, kSWIZZLE>(s, qDesc, kMajorDescriptor<kSWIZZLE>(address, kN));
    };
    auto const probabilities = [&](float (&s)[kN / 8][4], float (&alpha)[2], uint32_t (&p)[kN / 16][4],
                                   uint32_t (&lo)[kN / 16][4], int32_t j) {
        int64_t const k0 = static_cast<int64_t>(j) * kN;
        bool const checkEach = k0 + kN > shape.seqK || (params.causal && k0 + kN - 1 > warpRow0);
        softmax.template update<true>(s, alpha, warpRow0 + lane / 4, k0, noMask, 0, shape, params, checkEach);
        probabilityFragments<TP, kN>(s, p, lo);
    };

    float s[kN / 8][4];
    float alpha[2];
    uint32_t p[kN / 16][4];
    uint32_t lo[kN / 16][4];
    if (keyTiles > 0)
    {
        mbarrierWait(barrierQ, 0);
        mbarrierWait(fullK(0), 0);
        issueScores(s, 0);
        wgmmaWait<0>();
        fenceOperands(s);
        release(emptyK(0));
        probabilities(s, alpha, p, lo, 0);
    }
    // O += P_j V_j (issued and committed, issueValueChain). A float16 P is copied first (the
    // softmax of the next tile rewrites p while this product still reads it); bfloat16's split P
    // is read in place (p and lo), waited for before that softmax.
    uint32_t pv[kN / 16][4];
    auto const issueValues = [&](int32_t j) {
        uint32_t const address = vAddress + static_cast<uint32_t>((j % kSTAGES) * kTILE_BYTES);
        uint64_t const vDesc = valueDescriptor<kSWIZZLE, kN>(address);
        if constexpr (kSPLIT_P<TP>)
        {
            issueValueChain<TP, kD, kN, kSWIZZLE>(o, p, lo, vDesc);
        }
        else
        {
#pragma unroll
            for (int32_t kk = 0; kk < kN / 16; ++kk)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    pv[kk][e] = p[kk][e];
                }
            }
            issueValueChain<TP, kD, kN, kSWIZZLE>(o, pv, pv, vDesc);
        }
    };
    for (int32_t j = 0; j + 1 < keyTiles; ++j)
    {
        // Here: P_j in p (O already scaled to its maximum). (V_j waited for with K_j+1: a wait
        // between the two wgmma issues made ptxas serialise them, C7513.)
        mbarrierWait(fullK(j + 1), parity(j + 1));
        mbarrierWait(kCONVERT ? convertedV(j) : fullV(j), parity(j));
        issueScores(s, j + 1); // S_j+1 on the tensor cores, then P_j V_j, while ...
        issueValues(j);
        if constexpr (kSPLIT_P<TP>)
        {
            wgmmaWait<0>();
            fenceOperands(p);
            fenceOperands(lo);
            release(emptyV(j));
        }
        else
        {
            wgmmaWait<1>();
        }
        fenceOperands(s);
        release(emptyK(j + 1));
        probabilities(s, alpha, p, lo, j + 1); // ... the softmax of S_j+1 runs here (float16 P)
        wgmmaWait<0>();
        fenceOperands(o);
        if constexpr (!kSPLIT_P<TP>)
        {
            fenceOperands(pv);
            release(emptyV(j));
        }
        rescale(o, alpha);
    }
    if (keyTiles > 0)
    {
        mbarrierWait(kCONVERT ? convertedV(keyTiles - 1) : fullV(keyTiles - 1), parity(keyTiles - 1));
        issueValues(keyTiles - 1);
        wgmmaWait<0>();
        fenceOperands(o);
    }
    softmax.finish();

    // The output through shared memory, where K and V were: both consumer warpgroups are done
    // with them after the barrier, and every load was waited for.
    static_assert(kRows * (kD + 8) <= 2 * kSTAGES * kTILE, "the output fits where K and V were");
    T* const sOut = sK;
    namedBarrier(1, 256);
    stageOutput<T, kD>(o, softmax, sOut, warp * 16 + lane / 4, params.nanToZero);
    namedBarrier(1, 256);
    storeStagedOutput<T, kD, kRows>(sOut, block, shape, static_cast<int32_t>(threadIdx.x) - 128, 256);
#endif
}

//! One work item of the persistent short-key kernel: query tile `tile` of (batch, head) `bh`,
//! items numbered tile-fastest ((batch, head)-major), so that a contiguous run of them meets few
//! (batch, kv head)s.
struct ShortKeysItem
{
    int64_t bh;
    int64_t q0;
    int64_t keyEnd; //!< keys past this are never allowed (causal) or absent
    int64_t kv;     //!< b * headsKV + hkv: the K/V maps' head coordinate

    __device__ ShortKeysItem(int64_t id, AttentionShape const& shape, bool causal, int32_t qTiles)
    {
        bh = id / qTiles;
        int64_t const b = bh / shape.headsQ;
        int64_t const h = bh - b * shape.headsQ;
        kv = b * shape.headsKV + h / (shape.headsQ / shape.headsKV);
        q0 = (id - bh * qTiles) * kHOPPER_ROWS;
        keyEnd = causal && q0 + kHOPPER_ROWS < shape.seqK ? q0 + kHOPPER_ROWS : shape.seqK;
    }
};

//! The persistent short-key kernel (kHOPPER_VARIANT_SHORT_KEYS) for shapes without mask and
//! softcap whose keys fit kHOPPER_SHORT_TILES = 2 tiles of 64 (SDXL's cross-attention, 77 keys),
//! loads by TMA. In hopperAttentionKernel each block of 128 query rows loads Q, K and V, computes
//! two tiles and stores in series, so every block waits out a load and a store (SDXL cross: 640
//! blocks, Q and O 21 MB, about 6 us of memory time, against 27 us measured). Here a block walks
//! a contiguous run of the B x H x qTiles items: thread 0 loads both tiles of K and V once for
//! each (batch, kv head) the run meets (the loop's only block barrier: heads sharing K and V keep
//! them), and each warpgroup's first thread loads the Q of its own 64 rows of the next
//! kHOPPER_SHORT_Q_STAGES - 1 items into its own ring of stages while it computes the current
//! one, so the two warpgroups meet only there. The tile steps are hopperAttentionKernel's without
//! loads (S_0, softmax; S_1 with P_0 V_0, the softmax of S_1 under it; P_1 V_1), and the output
//! goes from registers to global memory (the stores do not wait; staging it would need a barrier
//! per item). Two blocks per SM (128 registers), each with (4 x 64 keys + 2 x 3 x 64 rows) x kD x
//! 2 bytes of shared memory (80 KB at kD = 64); a warpgroup whose rows all lie past the last
//! query row computes on a copy of the last rows and stores nothing. kSWIZZLE (kD = 64 only,
//! kHOPPER_VARIANT_SWIZZLE): the tiles in the 128-byte swizzled layout, one TMA box row of 128
//! bytes per row instead of 8 of 16 bytes (SDXL cross 18-21% faster on the H200).
constexpr int32_t kSHORT_BLOCKS_PER_SM{2};

template <typename T, int32_t kD, bool kSWIZZLE>
__global__ void __launch_bounds__(256, kSHORT_BLOCKS_PER_SM) hopperShortKernel(T* __restrict__ out,
    AttentionShape const shape, AttentionParams const givenParams, int32_t const qTiles, int64_t const items,
    __grid_constant__ HopperMaps const maps)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int32_t kN = kHOPPER_KEYS;
    constexpr int32_t kGROUP_ROWS = 64;
    constexpr int32_t kTILE = kN * kD;
    constexpr int32_t kQ_TILE = kGROUP_ROWS * kD;
    static_assert(!kSWIZZLE || kD == 64, "swizzled: one 64-element column block (rows of 128 bytes)");
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    // (kSWIZZLE: the tiles start on a 1024-byte boundary, kHOPPER_SWIZZLE_ALIGN's reason; the
    // plan's shortSharedBytes holds the slack)
    uint32_t const skip = kSWIZZLE ? (0U - sharedAddress(sharedRaw)) % uint32_t{kHOPPER_SWIZZLE_ALIGN} : 0U;
    T* const sK = reinterpret_cast<T*>(sharedRaw + skip); // tiles 0 and 1
    T* const sV = sK + kHOPPER_SHORT_TILES * kTILE;
    T* const sQ = sV + kHOPPER_SHORT_TILES * kTILE; // [warpgroup][stage]
    constexpr int32_t kSTAGES = kHOPPER_SHORT_Q_STAGES;
    constexpr int32_t kBARRIERS = 1 + 2 * kSTAGES;
    // K and V's; then the Q stages of warpgroup 0, then of warpgroup 1
    __shared__ __align__(8) uint64_t barriers[kBARRIERS];
    AttentionParams params = givenParams;
    params.softcap = 0.F;
    AttentionMaskView const noMask{};
    int32_t const warp = static_cast<int32_t>(threadIdx.x / 32);
    int32_t const lane = static_cast<int32_t>(threadIdx.x % 32);
    int32_t const group = warp / 4;
    int64_t const first = static_cast<int64_t>(blockIdx.x) * items / gridDim.x;
    int64_t const last = static_cast<int64_t>(blockIdx.x + 1) * items / gridDim.x;
    uint32_t const barrierKV = sharedAddress(barriers);
    // tiles of K and V loaded (TMA boxes wholly past the end are avoided: the second tile of
    // T <= 64 keys is never loaded, its V zeroed once, below, and its scores masked)
    int32_t const kvTiles = shape.seqK > kN ? kHOPPER_SHORT_TILES : 1;
    // item number `it` of the run: its Q in stage it % kSTAGES, that stage's (it / kSTAGES)-th phase
    auto const fullQ = [&](int64_t it) {
        return barrierKV + static_cast<uint32_t>(8 + 8 * (kSTAGES * group + it % kSTAGES));
    };
    auto const stageQ = [&](int64_t it) { return sQ + (kSTAGES * group + it % kSTAGES) * kQ_TILE; };
    if (threadIdx.x == 0)
    {
        prefetchTensorMap(&maps.q);
        prefetchTensorMap(&maps.k);
        prefetchTensorMap(&maps.v);
#pragma unroll
        for (int32_t i = 0; i < kBARRIERS; ++i)
        {
            mbarrierInit(barrierKV + static_cast<uint32_t>(8 * i), 1);
        }
        fenceBarrierInit();
    }
    if (kvTiles < kHOPPER_SHORT_TILES)
    {
        // V's second tile zero, so that its probabilities (0) times V add exact zeros (0 times
        // whatever the memory held could be NaN)
        for (int32_t i = static_cast<int32_t>(threadIdx.x); i < kTILE / 8; i += 256)
        {
            reinterpret_cast<uint4*>(sV + kTILE)[i] = make_uint4(0U, 0U, 0U, 0U);
        }
        fenceProxyAsync();
    }
    __syncthreads();
    // this warpgroup's 64 rows of item `id`'s Q, issued by its first thread; a warpgroup whose rows
    // all lie past the last query row loads the box of the last row instead (a box wholly past
    // the end is avoided; its rows are computed and never stored)
    bool const issuer = threadIdx.x % 128 == 0;
    auto const loadQ = [&](int64_t id, int64_t it) {
        ShortKeysItem const item(id, shape, params.causal, qTiles);
        int64_t const row = item.q0 + group * kGROUP_ROWS;
        mbarrierArriveExpect(fullQ(it), kQ_TILE * sizeof(T));
        loadTile<T, kD, kSWIZZLE>(stageQ(it), &maps.q, kGROUP_ROWS,
            static_cast<int32_t>(row < shape.seqQ ? row : shape.seqQ - 1), static_cast<int32_t>(item.bh), fullQ(it));
    };
    if (issuer)
    {
#pragma unroll
        for (int32_t it = 0; it + 1 < kSTAGES; ++it)
        {
            if (first + it < last)
            {
                loadQ(first + it, it);
            }
        }
    }

    uint32_t const kAddress = sharedAddress(sK);
    uint32_t const vAddress = sharedAddress(sV);
    int64_t loadedKv = -1;
    uint32_t kvLoads = 0;
    for (int64_t id = first; id < last; ++id)
    {
        int64_t const it = id - first;
        ShortKeysItem const item(id, shape, params.causal, qTiles);
        bool const reload = item.kv != loadedKv;
        if (reload)
        {
            // both warpgroups done with the K and V they read (each waited for its wgmmas)
            __syncthreads();
            if (threadIdx.x == 0)
            {
                // (a box's bytes all count, those zero-filled past the keys too)
                mbarrierArriveExpect(barrierKV, 2 * kvTiles * kTILE * sizeof(T));
                for (int32_t j = 0; j < kvTiles; ++j)
                {
                    int32_t const head = static_cast<int32_t>(item.kv);
                    loadTile<T, kD, kSWIZZLE>(sK + j * kTILE, &maps.k, kN, j * kN, head, barrierKV);
                    loadTile<T, kD, kSWIZZLE>(sV + j * kTILE, &maps.v, kN, j * kN, head, barrierKV);
                }
            }
            loadedKv = item.kv;
        }
        if (issuer && id + kSTAGES - 1 < last)
        {
            // a later item's Q, where this warpgroup's wgmmas of item it - 1 read (all waited for)
            loadQ(id + kSTAGES - 1, it + kSTAGES - 1);
        }
        if (reload)
        {
            mbarrierWait(barrierKV, kvLoads % 2);
            ++kvLoads;
        }
        mbarrierWait(fullQ(it), static_cast<uint32_t>((it / kSTAGES) % 2));

        int64_t const warpRow0 = item.q0 + warp * 16;
        uint64_t const qDesc = kMajorDescriptor<kSWIZZLE>(sharedAddress(stageQ(it)), kGROUP_ROWS);
        float o[kD / 8][4];
        clearAccumulators(o);
        OnlineSoftmax softmax;
        float s[kN / 8][4];
        float alpha[2];
        uint32_t p[kN / 16][4];
        uint32_t lo[kN / 16][4];
        uint32_t pv[kN / 16][4];
        uint32_t lov[kN / 16][4];
        auto const issueScores = [&](int32_t j) {
            issueScoreChain<T, kD, kN, kGROUP_ROWS, kSWIZZLE>(
                s, qDesc, kMajorDescriptor<kSWIZZLE>(kAddress + static_cast<uint32_t>(j * kTILE * 2), kN));
        };
        auto const probabilities = [&](int32_t j) {
            int64_t const k0 = static_cast<int64_t>(j) * kN;
            bool const checkEach = k0 + kN > item.keyEnd || (params.causal && k0 + kN - 1 > warpRow0);
            softmax.template update<true>(s, alpha, warpRow0 + lane / 4, k0, noMask, 0, shape, params, checkEach);
            probabilityFragments<T, kN>(s, p, lo);
        };
        // O += P_j V_j from a copy of P (the softmax of the next tile rewrites p and lo)
        auto const issueValues = [&](int32_t j) {
            copyProbabilities<T, kN>(p, lo, pv, lov);
            issueValueChain<T, kD, kN, kSWIZZLE>(
                o, pv, lov, valueDescriptor<kSWIZZLE, kN>(vAddress + static_cast<uint32_t>(j * kTILE * 2)));
        };
        // Both tiles always (past T <= 64 keys the second tile's scores are masked and its V is
        // zero): a wgmma issued under a condition made ptxas serialise them all (C7513).
        issueScores(0);
        wgmmaWait<0>();
        fenceOperands(s);
        probabilities(0);
        issueScores(1); // S_1 on the tensor cores, then P_0 V_0, while ...
        issueValues(0);
        // (bfloat16 waits for P_0 V_0 too: kWAIT_PV's reason)
        if constexpr (kSPLIT_P<T>)
        {
            wgmmaWait<0>();
        }
        else
        {
            wgmmaWait<1>();
        }
        fenceOperands(s);
        probabilities(1); // ... the softmax of S_1 runs here
        rescaleAfterValues<T>(o, pv, lov, alpha);
        issueValues(1);
        wgmmaWait<0>();
        fenceOperands(o);
        softmax.finish();
        storeOutput<T, kD>(
            o, softmax, out + item.bh * shape.seqQ * shape.valueDim, warpRow0 + lane / 4, shape, params);
    }
#endif
}

//! The split bfloat16 fallback after the converting float16 P·V kernel
//! (kHOPPER_VARIANT_CONVERT_IN_KERNEL), launched programmatically after it: a persistent grid
//! of the flash kernel's blocks (mma.sync, 128 threads, sharedBytesFor<T, kD>() of shared memory:
//! 27 KB at 64; P split into two bfloat16 terms, as on every GPU without this kernel). Each block
//! waits for the converting grid, reads the slots of its share of that grid's blocks
//! (gate.count of them, slot i block i's) and recomputes the 128 query rows of each raised one
//! as flash blocks. Where no V exceeds float16's range its blocks only read slots: one wave of
//! small blocks, where the warp-specialised split kernel gated per block (one block a SM at its
//! 168 registers x 384 threads) took three waves of no-ops on BERT, 4.1 us of its 35.6 by CUDA
//! graphs on the H200.
template <typename T, int32_t kD, int32_t kMT>
__global__ void __launch_bounds__(kTHREADS) hopperSplitFallbackKernel(T const* __restrict__ q,
    T const* __restrict__ k, T const* __restrict__ v, T* __restrict__ out, AttentionShape const shape,
    AttentionParams const params, int32_t const qTiles, int32_t const variant, HopperGate const gate)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int32_t kROWS = kBLOCK_ROWS<kMT>;
    extern __shared__ __align__(128) unsigned char sharedRaw[];
    static_assert(kHOPPER_ROWS % kROWS == 0, "whole flash blocks in a Hopper block");
    AttentionMaskView const noMask{};
    // the converting kernel's block order (hopperProducerKernel's BlockSetup)
    bool const acrossHeads = params.causal && (variant & kHOPPER_VARIANT_CAUSAL_ORDER) != 0;
    int64_t const flashTiles = (shape.seqQ + kROWS - 1) / kROWS;
    uint32_t const flashBlocks = static_cast<uint32_t>(flashTiles * shape.batch * shape.headsQ);
    waitForPrimaryGrid();
    for (int32_t slot = static_cast<int32_t>(blockIdx.x); slot < gate.count; slot += static_cast<int32_t>(gridDim.x))
    {
        if (__ldcg(gate.slots + slot) == 0) // the same value for every thread: the grid is done
        {
            continue;
        }
        int64_t tile = 0;
        int64_t bh = 0;
        BlockSetup<T>::tileOf(
            static_cast<uint32_t>(slot), static_cast<uint32_t>(gate.count), qTiles, acrossHeads, tile, bh);
        for (int64_t flashTile = tile * (kHOPPER_ROWS / kROWS);
             flashTile < (tile + 1) * (kHOPPER_ROWS / kROWS) && flashTile < flashTiles; ++flashTile)
        {
            // the flash block whose (tile, (batch, head)) this is (BlockSetup::tileOf, plain order)
            uint32_t const id = static_cast<uint32_t>(bh * flashTiles + (flashTiles - 1 - flashTile));
            BlockSetup<T> const block(
                q, k, v, out, noMask, shape, params, kROWS, static_cast<int32_t>(flashTiles), false, id, flashBlocks);
            flashMma16Block<T, kD, kMT>(block, noMask, shape, params, sharedRaw);
            __syncthreads(); // every warp is done with shared memory before the next block's loads
        }
    }
#endif
}

//! V (bfloat16, n elements, a multiple of 8, 16-byte aligned) converted to float16 into `values`
//! for the float16 P·V of hopperProducerKernel (kHOPPER_VARIANT_HALF_VALUES), 8 elements a thread
//! a step. Exact for every finite |v| <= 65504 down to float16's normal range (bfloat16's 8
//! significant bits fit float16's 11); below 2^-14 float16's subnormal spacing 2^-24 rounds v by
//! at most 2^-25, and since a row's probabilities sum to 1 an output moves by at most 2^-25 more.
//! Each block writes its slot of `slots` (at most kHOPPER_HALF_VALUE_SLOTS blocks): 1 where it
//! met a finite |v| above 65504 (float16 would give infinity or round it; the warp-specialised
//! kernel then runs the split bfloat16 P·V), else 0, so nothing needs clearing first. Infinities
//! and NaNs convert to themselves.
__global__ void __launch_bounds__(256) convertValuesToHalf(
    __nv_bfloat16 const* __restrict__ v, __half* __restrict__ values, int64_t const n, int32_t* __restrict__ slots)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // the attention kernel (launched programmatically after this one) may start its blocks;
    // it reads nothing of this grid's before waiting for it to complete
    allowDependentGrid();
#endif
    bool beyond = false;
    int64_t const stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 8;
    for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8; i < n; i += stride)
    {
        uint4 const raw = *reinterpret_cast<uint4 const*>(v + i);
        uint32_t const in[4]{raw.x, raw.y, raw.z, raw.w};
        uint32_t converted[4];
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            float2 const f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&in[e]));
            beyond = beyond || (isfinite(f.x) && fabsf(f.x) > 65504.F) || (isfinite(f.y) && fabsf(f.y) > 65504.F);
            __half2 const h = __floats2half2_rn(f.x, f.y);
            converted[e] = *reinterpret_cast<uint32_t const*>(&h);
        }
        *reinterpret_cast<uint4*>(values + i) = make_uint4(converted[0], converted[1], converted[2], converted[3]);
    }
    int32_t const raised = __syncthreads_or(beyond);
    if (threadIdx.x == 0)
    {
        slots[blockIdx.x] = raised;
    }
}

//! Which kernel: plain (no mask, no softcap), a key mask (kKEYMASK), or the general one.
enum class HopperKind : int32_t
{
    kPlain,
    kKeyMask,
    kGeneral,
};

template <typename T, int32_t kD, bool kLATE, bool kTMA, typename F>
cudaError_t withKind(HopperKind kind, F&& f)
{
    constexpr int32_t kWG = kHOPPER_ROWS / 64;
    constexpr int32_t kN = kHOPPER_KEYS;
    switch (kind)
    {
    case HopperKind::kPlain: return f(hopperAttentionKernel<T, kD, kN, kWG, true, kLATE, false, kTMA>);
    case HopperKind::kKeyMask: return f(hopperAttentionKernel<T, kD, kN, kWG, true, kLATE, true, kTMA>);
    case HopperKind::kGeneral: break;
    }
    return f(hopperAttentionKernel<T, kD, kN, kWG, false, kLATE, false, kTMA>);
}

//! The kernel for the plan's tiles (64 keys, 128 rows: the only ones built; see
//! notes/attention_plugin.md for the other tilings measured), its kind and loads (tma: TMA, else
//! cp.async before or after the wgmmas).
template <typename T, int32_t kD, typename F>
cudaError_t withTile(HopperPlan const& plan, HopperKind kind, bool tma, F&& f)
{
    if (plan.keys != kHOPPER_KEYS || plan.blockRows != kHOPPER_ROWS)
    {
        return cudaErrorInvalidConfiguration;
    }
    return tma                                                 ? withKind<T, kD, false, true>(kind, f)
        : (plan.variant & kHOPPER_VARIANT_LATE_LOADS) != 0 ? withKind<T, kD, true, false>(kind, f)
                                                            : withKind<T, kD, false, false>(kind, f);
}

//! Calls f with the kernel for the plan, or returns cudaErrorInvalidConfiguration.
template <typename T, typename F>
cudaError_t withHopperKernel(HopperPlan const& plan, HopperKind kind, bool tma, F&& f)
{
    switch (plan.paddedDim)
    {
    case 32: return withTile<T, 32>(plan, kind, tma, f);
    case 64: return withTile<T, 64>(plan, kind, tma, f);
    case 80: return withTile<T, 80>(plan, kind, tma, f);
    case 96: return withTile<T, 96>(plan, kind, tma, f);
    case 128: return withTile<T, 128>(plan, kind, tma, f);
    case 160: return withTile<T, 160>(plan, kind, tma, f);
    case 192: return withTile<T, 192>(plan, kind, tma, f);
    case 256: return withTile<T, 256>(plan, kind, tma, f);
    default: return cudaErrorInvalidConfiguration;
    }
}

//! Whether the warp-specialised kernel is built for the plan's padded head dim in this layout:
//! swizzled at 64, 128 and 256, unswizzled at 128 only.
inline bool producerKernelBuilt(HopperPlan const& plan, bool swizzle)
{
    return plan.paddedDim == 128 || (swizzle && (plan.paddedDim == 64 || plan.paddedDim == 256));
}

//! Calls f with the warp-specialised kernel for the plan (plan.producerStages > 0) in the layout
//! asked for, P·V in TP, or returns cudaErrorInvalidConfiguration where none is built.
template <typename T, typename TP, typename F>
cudaError_t withProducerKernel(HopperPlan const& plan, bool swizzle, F&& f)
{
    if (plan.producerStages != 2 || plan.blockRows != kHOPPER_ROWS || !producerKernelBuilt(plan, swizzle)
        || plan.producerKeys != (plan.paddedDim == 256 ? 64 : 128))
    {
        return cudaErrorInvalidConfiguration;
    }
    switch (plan.paddedDim)
    {
    case 64: return f(hopperProducerKernel<T, TP, 64, 128, 2, true>);
    case 128:
        return swizzle ? f(hopperProducerKernel<T, TP, 128, 128, 2, true>)
                       : f(hopperProducerKernel<T, TP, 128, 128, 2, false>);
    default: return f(hopperProducerKernel<T, TP, 256, 64, 2, true>);
    }
}

//! Calls f with the converting float16 P·V kernel for the plan (convertsInKernel), or returns
//! cudaErrorInvalidConfiguration.
template <typename T, typename F>
cudaError_t withConvertingKernel(HopperPlan const& plan, F&& f)
{
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
    {
        if (plan.producerStages == 2 && plan.blockRows == kHOPPER_ROWS && plan.producerKeys == 128)
        {
            return f(hopperProducerKernel<T, __half, 64, 128, 2, true, true>);
        }
    }
    return cudaErrorInvalidConfiguration;
}

//! Calls f with the short-key kernel for the plan (padded head dims 32 and 64; swizzled at 64
//! only), or returns cudaErrorInvalidConfiguration.
template <typename T, typename F>
cudaError_t withShortKernel(HopperPlan const& plan, bool swizzle, F&& f)
{
    if (plan.shortSharedBytes == 0 || plan.keys != kHOPPER_KEYS || plan.blockRows != kHOPPER_ROWS)
    {
        return cudaErrorInvalidConfiguration;
    }
    switch (plan.paddedDim)
    {
    case 32: return swizzle ? cudaErrorInvalidConfiguration : f(hopperShortKernel<T, 32, false>);
    case 64: return swizzle ? f(hopperShortKernel<T, 64, true>) : f(hopperShortKernel<T, 64, false>);
    default: return cudaErrorInvalidConfiguration;
    }
}

//! Whether the plan runs bfloat16's P·V in float16 (kHOPPER_VARIANT_HALF_VALUES) where it runs
//! the warp-specialised kernel.
template <typename T>
bool halfValuesPlanned(HopperPlan const& plan)
{
    return std::is_same_v<T, __nv_bfloat16> && (plan.variant & kHOPPER_VARIANT_HALF_VALUES) != 0;
}

//! Whether bfloat16's float16 P·V converts V inside the warp-specialised kernel for the plan
//! (kHOPPER_VARIANT_CONVERT_IN_KERNEL, built at padded head dim 64, swizzled).
template <typename T>
bool convertsInKernel(HopperPlan const& plan, bool swizzle)
{
    return halfValuesPlanned<T>(plan) && (plan.variant & kHOPPER_VARIANT_CONVERT_IN_KERNEL) != 0
        && plan.paddedDim == 64 && swizzle;
}

//! Launches `kernel` after the stream's previous kernel with programmatic stream serialisation
//! (its blocks may start before that kernel completes; the kernel waits for it in
//! waitForPrimaryGrid before reading what it wrote); a plain launch where the runtime refuses the
//! attribute, in which waitForPrimaryGrid returns at once and the stream orders the two.
template <typename... Parameters, typename... Arguments>
cudaError_t launchProgrammatic(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t sharedBytes,
    cudaStream_t stream, Arguments&&... arguments)
{
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = sharedBytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...) == cudaSuccess)
    {
        return cudaSuccess;
    }
    cudaGetLastError();
    kernel<<<grid, block, sharedBytes, stream>>>(std::forward<Arguments>(arguments)...);
    return cudaGetLastError();
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
    if (plan.producerStages > 0)
    {
        // both layouts where both are built: a shape the swizzled maps cannot take runs the
        // unswizzled kernel (encodeHopperMaps), else the kernel above
        for (bool const swizzle : {false, (plan.variant & kHOPPER_VARIANT_SWIZZLE) != 0})
        {
            if (!producerKernelBuilt(plan, swizzle))
            {
                continue;
            }
            auto const prepareProducer = [&](auto kernel) {
                return cudaFuncSetAttribute(
                    kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.producerSharedBytes);
            };
            cudaError_t status = withProducerKernel<T, T>(plan, swizzle, prepareProducer);
            if (status == cudaSuccess && halfValuesPlanned<T>(plan))
            {
                status = withProducerKernel<T, __half>(plan, swizzle, prepareProducer);
            }
            if (status == cudaSuccess && convertsInKernel<T>(plan, swizzle))
            {
                status = withConvertingKernel<T>(plan, prepareProducer);
            }
            if (status != cudaSuccess)
            {
                return status;
            }
        }
    }
    if (plan.shortSharedBytes > 0)
    {
        // both layouts at 64 (a shape the swizzled maps cannot take runs the other)
        for (bool const swizzle : {false, plan.paddedDim == 64})
        {
            cudaError_t const status = withShortKernel<T>(plan, swizzle, [&](auto kernel) {
                return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.shortSharedBytes);
            });
            if (status != cudaSuccess)
            {
                return status;
            }
        }
    }
    for (HopperKind const kind : {HopperKind::kPlain, HopperKind::kKeyMask, HopperKind::kGeneral})
    {
        // the cp.async kernels always (an enqueue whose maps cannot be encoded falls back to them)
        for (bool const tma : {false, (plan.variant & kHOPPER_VARIANT_TMA) != 0})
        {
            cudaError_t const status = withHopperKernel<T>(plan, kind, tma, prepare);
            if (status != cudaSuccess)
            {
                return status;
            }
        }
    }
    return cudaSuccess;
}

template <typename T>
cudaError_t launchHopperAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, HopperPlan const& plan,
    HopperHalfValues const& halfValues, cudaStream_t stream) noexcept
{
    if (plan.keys == 0)
    {
        return cudaErrorInvalidValue;
    }
    LaunchGrid const grid = launchGridFor(q, k, v, out, shape, params, plan.blockRows);
    if (!grid.launch)
    {
        return grid.status;
    }
    uint32_t const threads = static_cast<uint32_t>(plan.blockRows / 64 * 128);
    HopperKind const kind = params.softcap != 0.F ? HopperKind::kGeneral
        : mask.kind == AttentionMaskKind::kNone   ? HopperKind::kPlain
        : mask.stride[2] == 0 && (plan.variant & kHOPPER_VARIANT_KEY_MASK) != 0 ? HopperKind::kKeyMask
                                                                                : HopperKind::kGeneral;
    // TMA where the plan asks for it and the maps can be made (else cp.async): encoded here, on
    // the host, per enqueue (no allocation; the values travel in the launch)
    HopperMaps maps{};
    bool const tma = (plan.variant & kHOPPER_VARIANT_TMA) != 0;
    if (tma && kind == HopperKind::kPlain && plan.shortSharedBytes > 0
        && (plan.variant & kHOPPER_VARIANT_SHORT_KEYS) != 0 && shape.seqK <= kHOPPER_SHORT_TILES * kHOPPER_KEYS)
    {
        // the short-key kernel's Q boxes are one warpgroup's 64 rows; swizzled at padded head dim
        // 64 where the variant asks for it and the shape has the maps, else not
        HopperPlan halfRows = plan;
        halfRows.blockRows = kHOPPER_ROWS / 2;
        bool const swizzle = (plan.variant & kHOPPER_VARIANT_SWIZZLE) != 0 && plan.paddedDim == 64
            && encodeHopperMaps(maps, q, k, v, shape, halfRows, kHOPPER_KEYS, true);
        if (swizzle || encodeHopperMaps(maps, q, k, v, shape, halfRows, kHOPPER_KEYS, false))
        {
            int32_t const processors = multiprocessorCount();
            if (processors <= 0)
            {
                return cudaErrorInvalidDevice;
            }
            // persistent blocks, as many as fit at once (each takes an equal share of the items)
            int64_t const blocks = std::min<int64_t>(grid.blocks, int64_t{kSHORT_BLOCKS_PER_SM} * processors);
            return withShortKernel<T>(plan, swizzle, [&](auto kernel) {
                kernel<<<static_cast<uint32_t>(blocks), 256U, static_cast<size_t>(plan.shortSharedBytes), stream>>>(
                    out, shape, params, static_cast<int32_t>(grid.qTiles), grid.blocks, maps);
                return cudaGetLastError();
            });
        }
    }
    if (tma && kind == HopperKind::kPlain && plan.producerStages > 0
        && (plan.variant & kHOPPER_VARIANT_PRODUCER) != 0)
    {
        // the swizzled maps where the variant asks for them and the shape has them, else the
        // others where that kernel is built, else the kernel below
        bool const swizzle = (plan.variant & kHOPPER_VARIANT_SWIZZLE) != 0
            && encodeHopperMaps(maps, q, k, v, shape, plan, plan.producerKeys, true);
        if (swizzle
            || (producerKernelBuilt(plan, false)
                && encodeHopperMaps(maps, q, k, v, shape, plan, plan.producerKeys, false)))
        {
            auto const launchProducer = [&](auto kernel, HopperMaps const& kernelMaps, HopperGate const& gate) {
                kernel<<<static_cast<uint32_t>(grid.blocks), 384U, static_cast<size_t>(plan.producerSharedBytes),
                    stream>>>(q, k, v, out, shape, params, static_cast<int32_t>(grid.qTiles), plan.variant,
                    kernelMaps, gate);
                return cudaGetLastError();
            };
            // the same, programmatic on the stream's launch before it (launchProgrammatic)
            auto const launchProducerAfter = [&](auto kernel, HopperMaps const& kernelMaps, HopperGate const& gate) {
                return launchProgrammatic(kernel, dim3(static_cast<uint32_t>(grid.blocks)), dim3(384U),
                    static_cast<size_t>(plan.producerSharedBytes), stream, q, k, v, out, shape, params,
                    static_cast<int32_t>(grid.qTiles), plan.variant, kernelMaps, gate);
            };
            // bfloat16 with kHOPPER_VARIANT_HALF_VALUES: V to float16 in the workspace, the float16
            // P·V kernel on maps of the converted V, then the split kernel on V as given, which
            // runs only where the conversion raised a slot (the float16 one only where not); each
            // launch programmatic on the one before (hopperProducerKernel's gate)
            // (the SM count, for the fallback's one wave, read only where that path is planned)
            int32_t const processors = convertsInKernel<T>(plan, swizzle) ? multiprocessorCount() : 0;
            if (processors > 0 && halfValues.slots != nullptr && grid.blocks <= halfValues.slotCount)
            {
                // short rows: V converted inside the float16 kernel, each block's overflow in its
                // own slot; the flash blocks after it (one wave) recompute the blocks that raised theirs
                HopperGate gate{};
                gate.slots = halfValues.slots;
                gate.count = static_cast<int32_t>(grid.blocks);
                cudaError_t const status = withConvertingKernel<T>(
                    plan, [&](auto kernel) { return launchProducer(kernel, maps, gate); });
                if (status != cudaSuccess)
                {
                    return status;
                }
                if constexpr (std::is_same_v<T, __nv_bfloat16>)
                {
                    static_assert(sharedBytesFor<T, 64>() <= 48 * 1024, "no opt-in shared memory for the fallback");
                    return launchProgrammatic(hopperSplitFallbackKernel<T, 64, rowTilesFor(2, 64)>,
                        dim3(static_cast<uint32_t>(std::min<int64_t>(grid.blocks, processors))), dim3(kTHREADS),
                        static_cast<size_t>(sharedBytesFor<T, 64>()), stream, q, k, v, out, shape, params,
                        static_cast<int32_t>(grid.qTiles), plan.variant, gate);
                }
                return cudaErrorInvalidConfiguration; // (convertsInKernel: bfloat16 only)
            }
            HopperMaps halfMaps = maps;
            if (halfValuesPlanned<T>(plan) && halfValues.values != nullptr && halfValues.slots != nullptr
                && encodeHopperMaps(halfMaps, q, k, halfValues.values, shape, plan, plan.producerKeys, swizzle))
            {
                HopperGate gate{};
                gate.slots = halfValues.slots;
                int64_t const n = shape.batch * shape.headsKV * shape.seqK * shape.valueDim;
                // blocks in whole groups of 4 (the slots are read 16 bytes at a time)
                gate.count = static_cast<int32_t>(
                    std::min<int64_t>(((n / 8 + 255) / 256 + 3) / 4 * 4, int64_t{kHOPPER_HALF_VALUE_SLOTS}));
                convertValuesToHalf<<<static_cast<uint32_t>(gate.count), 256U, 0, stream>>>(
                    reinterpret_cast<__nv_bfloat16 const*>(v), static_cast<__half*>(halfValues.values), n,
                    halfValues.slots);
                cudaError_t status = cudaGetLastError();
                if (status != cudaSuccess)
                {
                    return status;
                }
                status = withProducerKernel<T, __half>(
                    plan, swizzle, [&](auto kernel) { return launchProducerAfter(kernel, halfMaps, gate); });
                if (status != cudaSuccess)
                {
                    return status;
                }
                return withProducerKernel<T, T>(
                    plan, swizzle, [&](auto kernel) { return launchProducerAfter(kernel, maps, gate); });
            }
            return withProducerKernel<T, T>(
                plan, swizzle, [&](auto kernel) { return launchProducer(kernel, maps, HopperGate{}); });
        }
    }
    bool const tmaMaps = tma && encodeHopperMaps(maps, q, k, v, shape, plan, plan.keys, false);
    return withHopperKernel<T>(plan, kind, tmaMaps, [&](auto kernel) {
        kernel<<<static_cast<uint32_t>(grid.blocks), threads, static_cast<size_t>(plan.sharedBytes), stream>>>(
            q, k, v, mask, out, shape, params, static_cast<int32_t>(grid.qTiles), plan.variant, maps);
        return cudaGetLastError();
    });
}

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_HOPPER_CUH
