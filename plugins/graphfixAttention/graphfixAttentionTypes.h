/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * What every GraphfixAttention kernel path takes, with no TensorRT type: the plugin
 * (graphfixAttentionPlugin.h) turns tensor descriptors into an AttentionShape, an
 * AttentionMaskView and AttentionParams, and hands them to the path plan() chose (cudnn/, hopper/,
 * flash/, fallback/).
 */
#ifndef GRAPHFIX_ATTENTION_TYPES_H
#define GRAPHFIX_ATTENTION_TYPES_H

#include <cstdint>

namespace graphfix
{
namespace plugin
{

//! Q [batch, headsQ, seqQ, headDim]; K [batch, headsKV, seqK, headDim] (or its transpose
//! [.., headDim, seqK]); V [batch, headsKV, seqK, valueDim]; out [batch, headsQ, seqQ, valueDim].
//! All contiguous. headsQ % headsKV == 0.
struct AttentionShape
{
    int64_t batch;
    int64_t headsQ;
    int64_t headsKV;
    int64_t seqQ;
    int64_t seqK;
    int64_t headDim;
    int64_t valueDim;
};

enum class AttentionMaskKind : int32_t
{
    kNone = 0,
    kBool = 1,     //!< true keeps the score; false replaces it by maskFill
    kAdditive = 2, //!< added to the score
};

enum class AttentionMaskType : int32_t
{
    kBool = 0, //!< one byte, nonzero is true
    kFloat = 1,
    kHalf = 2,
    kBFloat16 = 3,
};

//! A mask broadcast to [batch, headsQ, seqQ, seqK]: element strides, 0 along broadcast dimensions.
struct AttentionMaskView
{
    AttentionMaskKind kind{AttentionMaskKind::kNone};
    AttentionMaskType type{AttentionMaskType::kBool};
    void const* data{nullptr};
    int64_t stride[4]{0, 0, 0, 0};
};

struct AttentionParams
{
    float scale{1.F};
    float softcap{0.F};     //!< > 0: s = softcap * tanh(s / softcap)
    float maskFill{0.F};    //!< the score of a key a bool mask blocks
    bool causal{false};     //!< key j > query i is blocked (-inf)
    bool kTransposed{false}; //!< K is given as [.., headDim, seqK]
    bool nanToZero{false};  //!< a row whose scores are all -inf gives 0 instead of NaN
};

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_ATTENTION_TYPES_H
