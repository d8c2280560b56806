#!/usr/bin/env bash
# GraphfixAttention on a GPU in one go: build for this GPU (with the cuDNN path), the GPU tests,
# the benchmark. Logs go to $OUT (default benchmarks/out/).
#
#   bash benchmarks/run_attention_on_gpu.sh
#
# Headers, for a machine without internet: TensorRT's in .cache/tensorrt-headers/include (else
# $TENSORRT_ROOT or what graphfix.plugins.build finds or fetches); cuDNN's in
# .cache/cudnn-headers/cudnn-*/include and the cuDNN frontend's in
# .cache/cudnn-headers/frontend-*/include (else an installed nvidia-cudnn wheel's and the frontend
# wheel, fetched). cuDNN itself is loaded at run time from the installed nvidia-cudnn wheel.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh

$PY - <<PYEOF 2>&1 | tee "$OUT/attention_build.log" || status=1
from graphfix.plugins.build import ATTENTION_HARNESS_NAME, build_plugins, build_plugin_harness
b = build_plugins(build_dir="$BUILD", cuda_archs="$ARCH")
print(b)
print(build_plugin_harness(build_dir="$BUILD", target=ATTENTION_HARNESS_NAME))
PYEOF
grep -h "graphfix plugins" "$BUILD/graphfix-plugin-build.log" | tee -a "$OUT/attention_build.log"

$PY -m pytest tests/test_attention_plugin_gpu.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/attention_gpu_tests.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1

# Every shape and dtype, each contender timed by CUDA events and by CUDA-graph replay.
$PY benchmarks/attention_bench.py --cuda-archs "$ARCH" --build-dir "$BUILD" ${BENCH_ARGS:-} \
  --json "$OUT/attention_bench.json" 2>&1 | tee "$OUT/attention_bench.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
exit $status
