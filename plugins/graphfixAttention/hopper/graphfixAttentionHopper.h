/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * GraphfixAttention's Hopper kernels (sm_90a only): float16 / bfloat16 attention on wgmma (head dims
 * up to 256), what runs without cuDNN on an H100/H200, and float32 on tf32 wgmma with 3xTF32 products
 * (graphfixAttentionHopperFloat.cu, head dims up to 256). Nothing here knows TensorRT.
 *
 * A block is 2 warpgroups, each owning 64 query rows of one (batch, head); Q, K and V tiles
 * of 64 keys live in shared memory in the wgmma "no swizzle" core-matrix layout (8 rows x 16
 * bytes contiguous), loaded by TMA (one thread, an mbarrier per stage; kHOPPER_VARIANT_TMA) or by
 * all threads with cp.async, two stages of K and V, K one tile ahead.
 * S = Q K_jᵀ is one chain of wgmma m64n64k16 with both operands in shared memory; S_j+1 and
 * O += P_j V_j are issued together, and the softmax of S_j+1 runs while P_j V_j is on the tensor
 * cores.
 * The online softmax runs on the accumulators in registers (the per-score code of the mma.sync
 * flash kernel: masks, causal, softcap, mask_fill, nan_to_zero); the probabilities become the
 * register A operand of O += P V_j (wgmma with V N-major in shared memory). float16 rounds P
 * once; bfloat16 splits it into two terms, as the mma.sync kernel does (kSPLIT_P), or, in the
 * warp-specialised kernel with kHOPPER_VARIANT_HALF_VALUES, rounds it once to float16 against V
 * converted to float16 (HopperHalfValues).
 * Without mask and softcap a warp-specialised kernel runs instead at padded head dims 128 (Dv
 * 128), 64 (float16, more than 128 keys) and 256 (D and Dv above 192, more than 64 keys)
 * (hopperProducerKernel, kHOPPER_VARIANT_PRODUCER): a producer warpgroup issues the TMA loads of
 * 128-key tiles (64 at 256) in the 128-byte swizzled layout into a two-stage ring paced by
 * mbarriers, and the two consumer warpgroups run at 240 registers (setmaxnreg) with no
 * block-wide barrier per tile. Without mask and softcap with every key in two 64-key tiles (T <=
 * 128, padded head dims 32 and 64) a persistent kernel runs instead (hopperShortKernel,
 * kHOPPER_VARIANT_SHORT_KEYS): blocks walk runs of query tiles, K and V loaded once per (batch, kv
 * head), the next tiles' Q loaded while the current one computes.
 *
 * Built only when the build's CUDA architectures include 90 (GRAPHFIX_WITH_HOPPER); otherwise
 * planHopperAttention always answers keys = 0, and the mma.sync flash kernel runs instead.
 */
#ifndef GRAPHFIX_ATTENTION_HOPPER_H
#define GRAPHFIX_ATTENTION_HOPPER_H

#include "../graphfixAttentionTypes.h"

#include <cuda_runtime_api.h>

#include <cuda.h> // CUtensorMap, the type only: the encoder is found at run time (no libcuda link)

#include <cstdint>

namespace graphfix
{
namespace plugin
{

//! The Hopper kernel's tiles: 64 keys per tile, 128 query rows (2 warpgroups) per block.
constexpr int32_t kHOPPER_KEYS{64};
constexpr int32_t kHOPPER_ROWS{128};
//! The float32 kernel's key tiles above head dim 72 (hopperTf32WideKernel: one stage of K and V
//! hi / lo and a staging buffer, 224 KB at head dim 128).
constexpr int32_t kHOPPER_TF32_WIDE_KEYS{32};
//! ... and above head dim 128 (one warpgroup of 64 rows: Q hi / lo, one stage of K and V hi / lo
//! and the staging buffer, 224 KB at head dim 256).
constexpr int32_t kHOPPER_TF32_WIDEST_KEYS{16};

//! Options of the Hopper kernel (bits of HopperPlan::variant), each on by default where it measured
//! faster on the H200 (notes/attention_plugin.md, "16-bit Hopper kernel: key-mask kernel, causal
//! order, cheaper loads" and "TMA loads"): causal blocks ordered heavy-first over all
//! (batch, head)s, not within each (in the one-block kernels: the last wave then holds light
//! tiles); masks the same for every query row (key padding) on the plain kernel, two blocks per SM
//! up to head dim 80 (the general kernel's registers allow one); each tile's loads issued after its
//! wgmmas. GRAPHFIX_ATTENTION_HOPPER_VARIANT overrides them, for measurement only. (Bit 1, Q in
//! registers, was measured slower and removed.)
constexpr int32_t kHOPPER_VARIANT_CAUSAL_ORDER{2};
constexpr int32_t kHOPPER_VARIANT_KEY_MASK{4};
constexpr int32_t kHOPPER_VARIANT_LATE_LOADS{8};
//! K, V and Q loaded by the tensor memory accelerator (cp.async.bulk.tensor, one thread, an
//! mbarrier per stage) instead of every thread's cp.async; the load order bit (8) is then moot.
//! Falls back to cp.async where the tensor maps cannot be encoded (encodeHopperMaps).
constexpr int32_t kHOPPER_VARIANT_TMA{16};
//! Shapes without mask and softcap, loaded by TMA, run the warp-specialised kernel
//! (hopperProducerKernel: a producer warpgroup, HopperPlan::producerKeys-key tiles) where the plan
//! has one (HopperPlan::producerStages); else the kernel above.
constexpr int32_t kHOPPER_VARIANT_PRODUCER{32};
//! (Bit 64, the consumer warpgroups taking turns on the tensor cores, measured no faster on the
//! H200 and removed: notes/attention_plugin.md, "128-byte swizzled tiles".)
//! The warp-specialised kernel's Q, K and V tiles in the 128-byte swizzled layout (TMA boxes of
//! 64-element rows, wgmma descriptors in the 128-byte swizzle mode) instead of the no-swizzle
//! chunk-major one, whose 16-byte box rows (2048 per 32 KB tile) bound the copy engine: on the
//! H200 at head dim 128, 38-43% faster in float16 and 15-20% in bfloat16. Where a 64-column box
//! would hold no column of Q, K or V (D or Dv <= padded head dim - 64) the maps are not encoded
//! and the no-swizzle kernel runs; that one exists at padded head dim 128 only, so elsewhere (and
//! without this bit) the kernel above runs. The bit also swizzles the persistent short-key
//! kernel's tiles at padded head dim 64 (kHOPPER_VARIANT_SHORT_KEYS; unswizzled at 32 and where
//! the maps cannot be encoded): SDXL cross on the H200 by CUDA graphs, float16 0.0269 -> 0.0212 ms,
//! bfloat16 0.0293 -> 0.0240 ms (-21%, -18%).
constexpr int32_t kHOPPER_VARIANT_SWIZZLE{128};
//! bfloat16's warp-specialised kernel with P·V in float16: V converted to float16 in the plugin's
//! workspace by a memory-bound pass (HopperHalfValues), P rounded once to float16 (relative error
//! at most 2^-11, 8x below cuDNN's one bfloat16 rounding, 2^-8; the split bfloat16 P's two terms
//! cost 1.5x the tensor work), S = Q Kᵀ still bfloat16. A V holding a finite |v| above float16's
//! 65504 raises its conversion block's slot on the device (HopperGate) and the split kernel
//! launched after the float16 one runs instead (no host sync, no memset). Measured on the H200
//! against the split kernels: 22-28% faster on the long rows (Llama causal, Flux-like, SDXL self,
//! SD 1.5), 15% on Gemma-2-like, 7% on BERT by CUDA graphs (equal by events); at padded head dim
//! 64 it is what makes the warp-specialised kernel pay in bfloat16 (with the split P it measured
//! no faster there than the 64-key kernel).
constexpr int32_t kHOPPER_VARIANT_HALF_VALUES{256};
//! 16-bit shapes without mask and softcap whose keys all fit kHOPPER_SHORT_TILES tiles (at padded
//! head dims up to 64; HopperPlan::shortSharedBytes) run the persistent short-key kernel
//! (hopperShortKernel: K and V loaded once per (batch, kv head) a block meets, the next query
//! tile's Q loaded while the current one computes), loads by TMA; else the kernel above.
constexpr int32_t kHOPPER_VARIANT_SHORT_KEYS{512};
//! With kHOPPER_VARIANT_HALF_VALUES at padded head dim 64: V converted to float16 inside the
//! warp-specialised kernel, in shared memory after each V tile's load, by the producer
//! warpgroup's three warps that issue no loads, instead of by a pass over V before it; each block
//! writes its own overflow slot and the flash kernel's blocks launched after it
//! (hopperSplitFallbackKernel, one wave) recompute the blocks that raised theirs with P split.
//! hopperPlanFor sets it for bfloat16 over at most kHOPPER_CONVERT_IN_KERNEL_KEYS keys, where the
//! pass's fixed cost is a large part of the kernel's time. Measured on the H200 against the pass:
//! BERT (512 keys) 6% faster by CUDA graphs with the flash fallback (0.0356 -> 0.0335 ms; 2% with
//! session 9's gated split kernel), 11% by events; SDXL self (4096 keys) 21% slower (the
//! conversion competes with the softmax for issue slots on every tile), so the line is at the 512
//! measured to gain.
constexpr int32_t kHOPPER_VARIANT_CONVERT_IN_KERNEL{1024};
constexpr int64_t kHOPPER_CONVERT_IN_KERNEL_KEYS{512};
//! The short-key kernels' key tiles: every key in at most this many 64-key tiles (T <= 128).
constexpr int32_t kHOPPER_SHORT_TILES{2};
//! The 16-bit short-key kernel's Q stages per warpgroup: the current item's and the next two's in
//! flight (SDXL cross on 132 SMs: at most 3 items a block, all loading from the start).
constexpr int32_t kHOPPER_SHORT_Q_STAGES{3};
//! The options the plan takes unless GRAPHFIX_ATTENTION_HOPPER_VARIANT says otherwise; bfloat16 adds
//! kHOPPER_VARIANT_LATE_LOADS except at head dim 80 (hopperPlanFor in graphfixAttentionPlugin.cpp;
//! the load order is moot while TMA loads are on); the float32 kernel and shapes whose maps the
//! driver rejects drop kHOPPER_VARIANT_TMA there; kHOPPER_VARIANT_HALF_VALUES acts on bfloat16 only.
constexpr int32_t kHOPPER_DEFAULT_VARIANT{kHOPPER_VARIANT_CAUSAL_ORDER | kHOPPER_VARIANT_KEY_MASK
    | kHOPPER_VARIANT_TMA | kHOPPER_VARIANT_PRODUCER | kHOPPER_VARIANT_SWIZZLE | kHOPPER_VARIANT_HALF_VALUES
    | kHOPPER_VARIANT_SHORT_KEYS};
//! The 128-byte swizzle repeats every 1024 bytes, counted from 1024-byte boundaries by TMA and by
//! wgmma (descriptor base offset 0): the swizzled tiles start on one.
constexpr int32_t kHOPPER_SWIZZLE_ALIGN{1024};

//! What planHopperAttention chose; `keys` 0 means the Hopper kernel does not run (see reason).
struct HopperPlan
{
    int32_t paddedDim{0};   //!< D and Dv padded to this in shared memory
    int32_t blockRows{0};   //!< query rows per block (64 per warpgroup)
    int32_t keys{0};        //!< keys per tile
    int32_t sharedBytes{0}; //!< dynamic shared memory per block
    int32_t variant{kHOPPER_DEFAULT_VARIANT}; //!< kHOPPER_VARIANT_* bits
    //! float32 only: every key in at most two tiles (T <= 128) at head dims up to 64: the
    //! persistent short-key kernel (hopperTf32ShortKernel) runs, sharedBytes is its 3 Q buffers'
    bool shortKeys{false};
    //! 16-bit only: the K and V stages of the warp-specialised kernel (kHOPPER_VARIANT_PRODUCER;
    //! 0: none for this head dim) and its dynamic shared memory (with 1 KB to align the tiles to
    //! the 1024-byte period of the 128-byte swizzle, kHOPPER_VARIANT_SWIZZLE)
    int32_t producerStages{0};
    int32_t producerKeys{0}; //!< its keys per tile (its query rows: kHOPPER_ROWS)
    int32_t producerSharedBytes{0};
    //! 16-bit only: every key in at most kHOPPER_SHORT_TILES tiles at a padded head dim up to 64:
    //! the dynamic shared memory of the persistent short-key kernel (kHOPPER_VARIANT_SHORT_KEYS,
    //! shapes without mask and softcap); 0: not planned
    int32_t shortSharedBytes{0};
    char const* reason{""}; //!< why not, when keys is 0
};

//! Whether this library holds the Hopper kernel (built for sm_90a).
bool hopperAttentionBuilt() noexcept;

//! The 16-bit kernel's TMA tensor maps (kHOPPER_VARIANT_TMA), passed to it by value
//! (__grid_constant__: part of the launch, so capture-safe).
struct HopperMaps
{
    CUtensorMap q;
    CUtensorMap k;
    CUtensorMap v;
};

//! Most blocks of convertValuesToHalf, one overflow slot each (HopperHalfValues::slots).
constexpr int32_t kHOPPER_HALF_VALUE_SLOTS{1024};

//! bfloat16's float16 P·V (kHOPPER_VARIANT_HALF_VALUES) as the warp-specialised kernel reads it:
//! the conversion's `count` overflow slots (one int32 a block, a multiple of 4, each written, so
//! no reset is needed: raised where nonzero). The float16 P·V kernel runs where none is raised,
//! the split bfloat16 one launched after it where one is. With kHOPPER_VARIANT_CONVERT_IN_KERNEL
//! slot i is the converting kernel's block i's (count: its blocks), which that block writes and
//! hopperSplitFallbackKernel reads. Empty (slots null) for every other launch of the kernel.
struct HopperGate
{
    int32_t const* slots{nullptr};
    int32_t count{0};
};

//! bfloat16's float16 P·V scratch (kHOPPER_VARIANT_HALF_VALUES), in the caller's workspace:
//! `values` holds V converted to float16 ([B, Hkv, T, Dv], hopperHalfValuesBytes, 16-byte
//! aligned), `slots` slotCount int32 (hopperHalfValueSlots) the conversion, or the converting
//! kernel's blocks, write. Null: the split bfloat16 kernel runs.
struct HopperHalfValues
{
    void* values{nullptr};
    int32_t* slots{nullptr};
    int64_t slotCount{0}; //!< slots' int32 (hopperHalfValueSlots)
};

//! The overflow slots bfloat16's float16 P·V needs for `shape`: one per conversion block (at
//! most kHOPPER_HALF_VALUE_SLOTS), or one per block of 128 query rows with
//! kHOPPER_VARIANT_CONVERT_IN_KERNEL, whichever is more.
inline int64_t hopperHalfValueSlots(AttentionShape const& shape) noexcept
{
    int64_t const blocks = shape.batch * shape.headsQ * ((shape.seqQ + kHOPPER_ROWS - 1) / kHOPPER_ROWS);
    return blocks > kHOPPER_HALF_VALUE_SLOTS ? blocks : int64_t{kHOPPER_HALF_VALUE_SLOTS};
}

//! Bytes of HopperHalfValues::values for `shape` (V's elements, 2 bytes each).
inline int64_t hopperHalfValuesBytes(AttentionShape const& shape) noexcept
{
    return shape.batch * shape.headsKV * shape.seqK * shape.valueDim * 2;
}

//! Encodes the tensor maps of 16-bit q, k, v for `plan` (cuTensorMapEncodeTiled, found through
//! cudaGetDriverEntryPointByVersion; no allocation). Each matrix [B*H, T, D] is described as the
//! 4-d tensor {8 elements, T rows, D/8 chunks, B*H} with byte strides {-, 2 D, 16, 2 T D} and
//! read in boxes {8, rows of a tile (Q: plan.blockRows, K and V: `keys`), paddedDim/8, 1}: a box
//! lands in shared memory innermost first, [chunk][row][8 elements], the kernel's no-swizzle
//! chunk-major layout, zero-filled past T and D. With `swizzle128` (the warp-specialised
//! kernel's kHOPPER_VARIANT_SWIZZLE) each matrix is the 3-d tensor {D, T, B*H} read in boxes
//! {64, rows of a tile, 1} with CU_TENSOR_MAP_SWIZZLE_128B, paddedDim/64 boxes a tile, each
//! landing as rows of 128 bytes whose 16-byte chunks are permuted within each 8 rows; false where
//! one of those boxes would lie wholly past D (D <= paddedDim - 64). False (the kernel then loads
//! with cp.async, or without the swizzle) where the driver has no encoder or rejects a map
//! (addresses not 16-byte aligned, D not a multiple of 8).
bool encodeHopperMaps(HopperMaps& maps, void const* q, void const* k, void const* v, AttentionShape const& shape,
    HopperPlan const& plan, int32_t keys, bool swizzle128) noexcept;

//! The Hopper kernel's plan for `shape` with elements of `elementBytes` (2: the 16-bit kernel;
//! 4: the float32 3xTF32 kernel) on a device of compute capability `computeMajor`.`computeMinor`
//! (9.0 only) with `maxSharedBytes` of opt-in shared memory per block. Pure host logic.
HopperPlan planHopperAttention(AttentionShape const& shape, int32_t elementBytes, int64_t maxSharedBytes,
    int32_t computeMajor, int32_t computeMinor) noexcept;

//! Sets the kernel's shared-memory limit for `plan`; fails (cudaErrorInvalidDeviceFunction or
//! cudaErrorNoKernelImageForDevice) when the device cannot run it.
template <typename T>
cudaError_t prepareHopperAttention(HopperPlan const& plan) noexcept;

//! Runs the planned kernel (the contract of launchFlashAttention: q, k, v, out 16-byte aligned,
//! else cudaErrorMisalignedAddress; K in [.., T, D] rows). Allocation-free and capture-safe.
//! halfValues: bfloat16's float16 P·V scratch (read only by bfloat16 with
//! kHOPPER_VARIANT_HALF_VALUES; may be empty).
template <typename T>
cudaError_t launchHopperAttention(T const* q, T const* k, T const* v, AttentionMaskView const& mask, T* out,
    AttentionShape const& shape, AttentionParams const& params, HopperPlan const& plan,
    HopperHalfValues const& halfValues, cudaStream_t stream) noexcept;

//! The float32 kernel (3xTF32 on wgmma): prepareHopperAttention and launchHopperAttention for
//! float, with the same contracts.
cudaError_t prepareHopperTf32Attention(HopperPlan const& plan) noexcept;
cudaError_t launchHopperTf32Attention(float const* q, float const* k, float const* v, AttentionMaskView const& mask,
    float* out, AttentionShape const& shape, AttentionParams const& params, HopperPlan const& plan,
    cudaStream_t stream) noexcept;

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_HOPPER_H
