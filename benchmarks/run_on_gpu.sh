#!/usr/bin/env bash
# Everything the plugin needs a GPU for, in one go: build for this GPU, the kernel tuning sweep,
# the GPU tests, the benchmark. Logs go to $OUT (default benchmarks/out/).
#
#   bash benchmarks/run_on_gpu.sh
#
# TensorRT headers: $TENSORRT_ROOT, else .cache/tensorrt-headers/ (copy the extracted headers there
# on a machine without internet), else whatever graphfix.plugins.build finds or fetches.
set -uo pipefail
cd "$(dirname "$0")/.."
# the same build directory and headers as run_attention_on_gpu.sh (the cuDNN path too, where
# its headers are in .cache/)
source benchmarks/gpu_env.sh

$PY - <<EOF 2>&1 | tee "$OUT/build.log" || status=1
from graphfix.plugins.build import build_plugins, build_plugin_harness
b = build_plugins(build_dir="$BUILD", cuda_archs="$ARCH")
print(b)
print(build_plugin_harness(build_dir="$BUILD"))
EOF
cmake --build "$BUILD" --target graphfix_softmax_tune >>"$OUT/build.log" 2>&1 || status=1

if [[ "${SKIP_TUNE:-0}" != 1 ]]; then
  : >"$OUT/tune.jsonl"
  for dtype in float16 float32; do
    for rows_n in "81920 4096" "81920 77" "40960 1024" "373248 729" "131072 4096" "49152 512"; do
      "$BUILD/graphfix_softmax_tune" $dtype $rows_n 20 >>"$OUT/tune.jsonl" 2>&1 || status=1
    done
  done
  cat "$OUT/tune.jsonl"
fi

$PY -m pytest tests/test_plugin_gpu.py tests/test_plugin_host_harness.py tests/test_plugin_spec_agrees.py \
  -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1

$PY benchmarks/softmax_bench.py --cuda-archs "$ARCH" --build-dir "$BUILD" --json "$OUT/bench.json" \
  2>&1 | tee "$OUT/bench.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
exit $status
