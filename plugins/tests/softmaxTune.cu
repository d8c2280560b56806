/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Tuning tool for the softmax launcher (no TensorRT): times every distinct launch plan that the
 * SoftmaxTuning knobs give for one last-axis shape, one JSON line per plan.
 *
 *   graphfix_softmax_tune DTYPE ROWS N [ITERATIONS]      DTYPE: float32 | float16 | bfloat16
 */
#include "graphfixSoftmaxKernel.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace
{

using graphfix::plugin::SoftmaxPlan;
using graphfix::plugin::SoftmaxShape;
using graphfix::plugin::SoftmaxTuning;

bool ok(cudaError_t status, char const* what)
{
    if (status != cudaSuccess)
    {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
        return false;
    }
    return true;
}

__global__ void fillKernel(float* data, int64_t count)
{
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        uint32_t h = static_cast<uint32_t>(i) * 2654435761U;
        h ^= h >> 15;
        data[i] = static_cast<float>(h & 0xFFFFFF) / 16777216.F * 16.F - 8.F;
    }
}

template <typename T>
__global__ void convertKernel(float const* from, T* to, int64_t count)
{
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        to[i] = static_cast<T>(from[i]);
    }
}

template <typename T>
int tune(int64_t rows, int64_t n, int32_t iterations)
{
    SoftmaxShape const shape{rows, n, 1};
    int64_t const count = rows * n;
    size_t const bytes = static_cast<size_t>(count) * sizeof(T);
    int32_t const sets = static_cast<int32_t>(std::max<size_t>(1, (size_t{512} << 20) / (2 * bytes)));
    std::vector<T*> inputs(sets);
    std::vector<T*> outputs(sets);
    float* scratch = nullptr;
    if (!ok(cudaMalloc(&scratch, static_cast<size_t>(count) * sizeof(float)), "cudaMalloc"))
    {
        return 1;
    }
    fillKernel<<<1024, 256>>>(scratch, count);
    for (int32_t s = 0; s < sets; ++s)
    {
        if (!ok(cudaMalloc(&inputs[s], bytes), "cudaMalloc") || !ok(cudaMalloc(&outputs[s], bytes), "cudaMalloc"))
        {
            return 1;
        }
        convertKernel<T><<<1024, 256>>>(scratch, inputs[s], count);
    }
    if (!ok(cudaDeviceSynchronize(), "fill"))
    {
        return 1;
    }
    cudaEvent_t start{};
    cudaEvent_t stop{};
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    auto const planKey = [](SoftmaxPlan const& plan) {
        return std::to_string(static_cast<int32_t>(plan.path)) + "/" + std::to_string(plan.lanesPerRow) + "/"
            + std::to_string(plan.chunksPerThread) + "/" + std::to_string(plan.threadsPerBlock);
    };
    std::string const defaultKey
        = planKey(graphfix::plugin::planSoftmax(shape, static_cast<int32_t>(sizeof(T)), inputs[0], outputs[0]));
    std::vector<std::string> seen;
    for (int32_t maxWarpChunks : {1, 2, 4, 8})
    {
        for (int32_t laneChunks : {1, 2, 3, 4, 6, 8})
        {
          for (int32_t blockChunks : {1, 2, 4, 8})
          {
            SoftmaxTuning const tuning{maxWarpChunks, laneChunks, blockChunks};
            SoftmaxPlan const plan
                = graphfix::plugin::planSoftmax(shape, static_cast<int32_t>(sizeof(T)), inputs[0], outputs[0], tuning);
            std::string const key = planKey(plan);
            if (std::find(seen.begin(), seen.end(), key) != seen.end())
            {
                continue;
            }
            seen.push_back(key);
            std::vector<float> times;
            for (int32_t i = 0; i < iterations + 3; ++i)
            {
                int32_t const s = i % sets;
                cudaEventRecord(start);
                cudaError_t const status = graphfix::plugin::launchSoftmax<T>(inputs[s], outputs[s], shape, nullptr, tuning);
                cudaEventRecord(stop);
                if (!ok(status, "launchSoftmax") || !ok(cudaEventSynchronize(stop), "sync"))
                {
                    return 1;
                }
                float ms = 0.F;
                cudaEventElapsedTime(&ms, start, stop);
                if (i >= 3)
                {
                    times.push_back(ms);
                }
            }
            std::sort(times.begin(), times.end());
            double const ms = times[times.size() / 2];
            std::printf("{\"rows\": %lld, \"n\": %lld, \"bytes\": %zu, \"path\": %d, \"lanes\": %d, \"chunks\": %d, "
                        "\"threads\": %d, \"ms\": %.5f, \"gbps\": %.1f, \"default\": %s}\n",
                static_cast<long long>(rows), static_cast<long long>(n), sizeof(T), static_cast<int32_t>(plan.path),
                plan.lanesPerRow, plan.chunksPerThread, plan.threadsPerBlock, ms, 2.0 * bytes / ms / 1e6,
                key == defaultKey ? "true" : "false");
          }
        }
    }
    for (int32_t s = 0; s < sets; ++s)
    {
        cudaFree(inputs[s]);
        cudaFree(outputs[s]);
    }
    cudaFree(scratch);
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    if (argc < 4)
    {
        std::fprintf(stderr, "usage: graphfix_softmax_tune float32|float16|bfloat16 ROWS N [ITERATIONS]\n");
        return 2;
    }
    std::string const dtype = argv[1];
    int64_t const rows = std::atoll(argv[2]);
    int64_t const n = std::atoll(argv[3]);
    int32_t const iterations = argc > 4 ? std::atoi(argv[4]) : 20;
    if (dtype == "float32")
    {
        return tune<float>(rows, n, iterations);
    }
    if (dtype == "float16")
    {
        return tune<__half>(rows, n, iterations);
    }
    if (dtype == "bfloat16")
    {
        return tune<__nv_bfloat16>(rows, n, iterations);
    }
    std::fprintf(stderr, "unknown dtype %s\n", dtype.c_str());
    return 2;
}
