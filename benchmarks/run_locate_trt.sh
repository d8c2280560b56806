#!/usr/bin/env bash
# `graphfix locate --backend tensorrt` where TensorRT and a GPU exist (never run on the dev VM,
# which has neither). Needs `pip install tensorrt polygraphy` next to graphfix. Logs go to $OUT.
#
#   bash benchmarks/run_locate_trt.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-benchmarks/out/locate-trt}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
status=0
$PY -c "import tensorrt, polygraphy; print('TensorRT', tensorrt.__version__, 'polygraphy', polygraphy.__version__)" \
  | tee "$OUT/versions.txt" || exit 3
$PY -m pytest -q -m trt tests/test_locate.py tests/test_locate_tensorrt.py 2>&1 | tee "$OUT/pytest.log" || status=1
# the README's planted fault: an MLP weight of the example ViT scaled so fc1 peaks near 1.4e5
$PY - <<'PYEOF' 2>&1 | tee "$OUT/plant.log" || status=1
import numpy as np, onnx
from onnx import numpy_helper
from graphfix.examples import vit_example
model = vit_example()
for w in model.graph.initializer:
    if w.name == "blocks.0.fc1.weight":
        w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(1e5), w.name))
import os; onnx.save(model, os.path.join(os.environ.get("OUT", "benchmarks/out/locate-trt"), "vit_planted.onnx"))
PYEOF
$PY -m graphfix locate "$OUT/vit_planted.onnx" --precision float16 --backend tensorrt --json \
  > "$OUT/locate_trt.json" 2> "$OUT/locate_trt.err"
echo "locate --backend tensorrt exit code $? (1 expected: it diverges)" | tee -a "$OUT/locate_trt.err"
exit $status
