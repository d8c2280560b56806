# Sourced by the run_*_on_gpu.sh scripts (from the repository root): what every GPU run sets up.
# OUT (logs, default benchmarks/out/), PYTHONPATH, the headers a machine without internet
# carries in .cache/ (TensorRT's in .cache/tensorrt-headers/include unless $TENSORRT_ROOT is set;
# cuDNN's in .cache/cudnn-headers/cudnn-*/include and the cuDNN frontend's in
# .cache/cudnn-headers/frontend-*/include), PY, this GPU's ARCH (the build and the GPU tests are
# for it), BUILD (the GPU tests' own build folder: one build a run), status=0, and $OUT/gpu.txt.
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${TENSORRT_ROOT:-}" && -f .cache/tensorrt-headers/include/NvInferRuntime.h ]]; then
  export TENSORRT_ROOT="$PWD/.cache/tensorrt-headers"
fi
for dir in .cache/cudnn-headers/cudnn-*/include; do
  [[ -f $dir/cudnn.h ]] && export GRAPHFIX_CUDNN_INCLUDE_DIR="$PWD/$dir"
done
for dir in .cache/cudnn-headers/frontend-*/include; do
  [[ -f $dir/cudnn_frontend.h ]] && export GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR="$PWD/$dir"
done
PY=${PYTHON:-python3}
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
export GRAPHFIX_TEST_CUDA_ARCHS=$ARCH GRAPHFIX_CUDA_ARCHS=$ARCH
# the folder the GPU tests build in (tests/plugin_harness_support.py), so that they find it built
BUILD=$(PYTHONPATH="$PWD/tests:$PYTHONPATH" $PY -c "import plugin_harness_support as s; print(s.plugin_build_dir('$ARCH'))")
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
