#!/usr/bin/env bash
# The Hopper kernel's options (GRAPHFIX_ATTENTION_HOPPER_VARIANT) on an H100/H200 in one go: build
# (as run_attention_on_gpu.sh), the GPU tests (TEST_K: a -k filter) once per variant in TEST_VARIANTS, then
# benchmarks/attention_variants.py (VARIANT_ARGS) with optional Nsight Compute profiles. Logs to $OUT.
#
#   TEST_VARIANTS="6 14" VARIANT_ARGS="--variants 0,6,14" bash benchmarks/run_hopper_variants_on_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
SECONDS=0
$PY - <<PYEOF 2>&1 | tee "$OUT/build.log" || status=1
from graphfix.plugins.build import ATTENTION_HARNESS_NAME, build_plugins, build_plugin_harness
print(build_plugins(build_dir="$BUILD", cuda_archs="$ARCH"))
print(build_plugin_harness(build_dir="$BUILD", target=ATTENTION_HARNESS_NAME))
PYEOF
grep -h "graphfix plugins" "$BUILD/graphfix-plugin-build.log" | tee -a "$OUT/build.log"
echo "build: ${SECONDS}s"
for variant in ${TEST_VARIANTS:-}; do
  SECONDS=0
  # "default": the plugin's own choice (the variable unset)
  env $([[ $variant == default ]] && echo -u GRAPHFIX_ATTENTION_HOPPER_VARIANT || echo GRAPHFIX_ATTENTION_HOPPER_VARIANT=$variant) \
    $PY -m pytest tests/test_attention_plugin_gpu.py -q -rfEs \
    -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -n 80 | tee "$OUT/tests_v$variant.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  echo "tests, variant $variant: ${SECONDS}s"
done
if [[ -n "${VARIANT_ARGS:-}" ]]; then
  SECONDS=0
  $PY benchmarks/attention_variants.py --cuda-archs "$ARCH" --build-dir "$BUILD" $VARIANT_ARGS \
    ${NCU_CASES:+--ncu-cases "$NCU_CASES"} --ncu-dir "$OUT" --json "$OUT/variants.json" 2>&1 | tee "$OUT/variants.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  echo "variants: ${SECONDS}s"
fi
exit $status
