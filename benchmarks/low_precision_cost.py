"""What materialising every float16 tensor costs `graphfix validate`, against onnxruntime as is.

For each corpus model: convert it with `graphfix precision` (float16, written to a temporary
folder), then time `graphfix.validate(original, converted, backend="onnxruntime")` with
`low_precision="materialise"` (the default) and `"as-is"` — the whole call, loading and session
building included, as a user waits for it — alternating the two modes, best of `--repeat` each,
in this process.  Prints per model both times, their ratio and both verdicts; the target is a
ratio of at most 2.  Besides the corpus's small exports, where building the session weighs as
much as running, a synthetic MLP (8 × MatMul 1024×1024 + Add + Tanh on a 512×1024 batch) shows a
model where compute dominates.

    python benchmarks/low_precision_cost.py
    python benchmarks/low_precision_cost.py --only unet_sdpa-legacy17 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import model_corpus  # noqa: E402

from graphfix.precision.convert import convert_precision  # noqa: E402
from graphfix.validation.validate import validate  # noqa: E402

DEFAULT_MODELS = (
    "bert_eager-legacy17",
    "llama_sdpa-dynamo18",
    "timm_vit_tiny-legacy17",
    "unet_sdpa-legacy17",
)
MODES = ("materialise", "as-is")


def synthetic_mlp(path: Path, *, width: int = 1024, layers: int = 8, batch: int = 512) -> None:
    """A float32 MLP whose activations cost more than its session: MatMul + Add + Tanh layers."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Tanh", [f"a{i}"], [f"t{i}"]),
        ]
        x = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, width])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def time_modes(original: Path, converted: Path, repeat: int) -> dict[str, tuple[float, bool]]:
    """Best wall time of validate per mode, and its verdict."""
    best = dict.fromkeys(MODES, float("inf"))
    passed = dict.fromkeys(MODES, False)
    for _ in range(repeat):
        for mode in MODES:
            start = time.perf_counter()
            report = validate(original, converted, backend="onnxruntime", low_precision=mode)
            best[mode] = min(best[mode], time.perf_counter() - start)
            passed[mode] = report.passed
    return {mode: (best[mode], passed[mode]) for mode in MODES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a corpus entry name (repeatable)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    names = args.only or DEFAULT_MODELS
    by_name = {e.name: e for e in model_corpus.CORPUS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"no corpus entry {', '.join(unknown)}; see tests/model_corpus.py")
    print(f"{'model':28s} {'materialise':>12s} {'as-is':>8s} {'ratio':>6s}  verdicts")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="graphfix-lp-bench-") as folder:
        synthetic = Path(folder) / "mlp.onnx"
        synthetic_mlp(synthetic)
        for name in [*names, "synthetic MLP"]:
            original = (
                synthetic if name == "synthetic MLP" else model_corpus.model_path(by_name[name])
            )
            converted = Path(folder) / f"{name}.fp16.onnx"
            onnx.save(convert_precision(original, to="float16").model, converted)
            times = time_modes(original, converted, args.repeat)
            (slow, slow_ok), (fast, fast_ok) = times["materialise"], times["as-is"]
            ratios.append(slow / fast)
            verdicts = f"{'PASS' if slow_ok else 'FAIL'} / {'PASS' if fast_ok else 'FAIL'}"
            print(f"{name:28s} {slow:11.3f}s {fast:7.3f}s {slow / fast:5.2f}x  {verdicts}")
    print(f"largest ratio {max(ratios):.2f}x (target: at most 2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
