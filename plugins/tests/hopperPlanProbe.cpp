/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Host probe of planHopperAttention (graphfixAttentionHopperPlan.cpp), which chooses whether and
 * how the Hopper kernels run: compiled with GRAPHFIX_WITH_HOPPER (as a build for sm_90a is) but
 * without the kernels, so CI's machines without a GPU and without an sm_90a build check the plan
 * for any device. tests/test_attention_hopper_plan.py builds and runs it.
 *
 *   hopperPlanProbe ELEMENT_BYTES MAJOR MINOR MAX_SHARED B HQ HKV S T D DV
 *
 * prints the plan as one JSON object.
 */
#include "graphfixAttentionHopper.h"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv)
{
    if (argc != 12)
    {
        std::fprintf(stderr, "usage: %s ELEMENT_BYTES MAJOR MINOR MAX_SHARED B HQ HKV S T D DV\n", argv[0]);
        return 2;
    }
    auto const arg = [&](int i) { return std::strtoll(argv[i], nullptr, 10); };
    graphfix::plugin::AttentionShape const shape{arg(5), arg(6), arg(7), arg(8), arg(9), arg(10), arg(11)};
    graphfix::plugin::HopperPlan const plan = graphfix::plugin::planHopperAttention(shape,
        static_cast<int32_t>(arg(1)), arg(4), static_cast<int32_t>(arg(2)), static_cast<int32_t>(arg(3)));
    std::printf("{\"padded_dim\": %d, \"block_rows\": %d, \"keys\": %d, \"shared_bytes\": %d, \"variant\": %d, "
                "\"short_keys\": %s, \"producer_stages\": %d, \"producer_keys\": %d, \"producer_shared_bytes\": %d, "
                "\"short_shared_bytes\": %d, \"reason\": \"%s\"}\n",
        plan.paddedDim, plan.blockRows, plan.keys, plan.sharedBytes, plan.variant, plan.shortKeys ? "true" : "false",
        plan.producerStages, plan.producerKeys, plan.producerSharedBytes, plan.shortSharedBytes, plan.reason);
    return 0;
}
