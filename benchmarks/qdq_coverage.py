"""Q/DQ coverage of quantized diffusion models before and after `graphfix qdq fix`.

For each model of tests/qdq_corpus.py (SD-like UNet, SVD-like UNet, VAE; random weights) and each
quantizer (onnxruntime quantize_static INT8; ModelOpt ONNX PTQ INT8 and FP8, which need the peers
venv, see tests/qdq_corpus.py), it prints: the share of conv/matmul FLOPs that run quantized, the
findings that keep FLOPs in float and those that only slow things down, the fixer's changes, and
the error against the float model (onnxruntime CPU, same inputs) before and after — both measured
in this run.

    python benchmarks/qdq_coverage.py                       # ORT + ModelOpt where available
    python benchmarks/qdq_coverage.py --quantizers ort_int8 --models unet
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import qdq_corpus

from graphfix.qdq import Severity, inspect_qdq
from graphfix.qdq.fix import fix_qdq

QUANTIZERS = ("ort_int8", "modelopt_int8", "modelopt_fp8")


def quantized_path(model: str, quantizer: str) -> Path:
    if quantizer == "ort_int8":
        return qdq_corpus.ort_quantized_path(model)
    return qdq_corpus.modelopt_quantized_path(model, quantizer.split("_")[1])


def _counts(report) -> tuple[int, int]:
    slow = sum(1 for f in report.findings if f.severity is not Severity.FLOAT)
    return len(report.findings) - slow, slow


def row(model: str, quantizer: str, *, samples: int, max_trials: int) -> str:
    path = quantized_path(model, quantizer)
    start = time.perf_counter()
    report = inspect_qdq(path)
    inspect_s = time.perf_counter() - start
    float_path = qdq_corpus.float_path(model)
    feeds = qdq_corpus.calibration_feeds(float_path, count=samples)
    start = time.perf_counter()
    result = fix_qdq(path, reference=str(float_path), feeds=feeds, max_trials=max_trials)
    fix_s = time.perf_counter() - start
    after = result.report.after
    error = result.report.error
    before_float, before_slow = _counts(report)
    after_float, after_slow = _counts(after)
    return (
        f"| {model} | {quantizer} | {100 * report.coverage.fraction:.1f}% | "
        f"{100 * after.coverage.fraction:.1f}% | {report.coverage.flops_total / 1e6:.1f} | "
        f"{before_float} / {before_slow} | {after_float} / {after_slow} | "
        f"{len(result.report.changes)} | "
        f"{error.before_max_abs:.4f} → {error.after_max_abs:.4f} | "
        f"{error.before_mean_abs:.5f} → {error.after_mean_abs:.5f} | "
        f"{inspect_s:.1f} | {fix_s:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=qdq_corpus.MODELS)
    parser.add_argument("--quantizers", nargs="*", default=QUANTIZERS)
    parser.add_argument("--samples", type=int, default=2, help="inputs for the error check")
    parser.add_argument("--max-trials", type=int, default=24, help="fix guard's error evaluations")
    args = parser.parse_args(argv)
    print(
        "| model | quantizer | coverage | after fix | MFLOPs | findings float / slow | after fix "
        "| changes | max abs err vs float | mean abs err vs float | inspect s | fix s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        for quantizer in args.quantizers:
            try:
                print(
                    row(model, quantizer, samples=args.samples, max_trials=args.max_trials),
                    flush=True,
                )
            except RuntimeError as exc:  # ModelOpt missing or failing: say so in the table
                reason = str(exc).strip().splitlines()[-1][:120]
                print(f"| {model} | {quantizer} | not available: {reason} |||||||||||", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
