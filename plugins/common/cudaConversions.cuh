/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * float32 <-> element type conversions shared by the plugins' kernels (round to nearest even).
 */
#ifndef GRAPHFIX_CUDA_CONVERSIONS_CUH
#define GRAPHFIX_CUDA_CONVERSIONS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace graphfix
{
namespace plugin
{
namespace conversions
{

__device__ __forceinline__ float toFloat(float x)
{
    return x;
}

__device__ __forceinline__ float toFloat(__half x)
{
    return __half2float(x);
}

__device__ __forceinline__ float toFloat(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float x);

template <>
__device__ __forceinline__ float fromFloat<float>(float x)
{
    return x;
}

template <>
__device__ __forceinline__ __half fromFloat<__half>(float x)
{
    return __float2half_rn(x);
}

template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

} // namespace conversions
} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_CUDA_CONVERSIONS_CUH
