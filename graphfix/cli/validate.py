"""`graphfix validate ORIGINAL FIXED`: exit 0 when the candidate agrees, 1 when it does not.

Usage errors (bad --shape, an npz missing an input, models taking different inputs) raise
`ValidationUsageError`, which `graphfix.cli` turns into exit code 2.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from graphfix.cli.options import Option, add_options, api_kwargs
from graphfix.validation.backends.tensorrt_backend import PRECISIONS
from graphfix.validation.compare import OUTPUT_PAIRINGS
from graphfix.validation.inputs import ValidationUsageError, ValueRange, parse_range, parse_shape
from graphfix.validation.low_precision import LOW_PRECISION_MODES
from graphfix.validation.validate import BACKENDS, validate


def _by_name(entries: Sequence[str], parse, flag: str) -> dict:
    result = {}
    for entry in entries:
        name, value = parse(entry)
        if name in result:
            raise ValidationUsageError(f"{flag} is given twice for '{name}'; give each input once")
        result[name] = value
    return result


def _shapes(entries: Sequence[str]) -> dict[str, tuple[int, ...]]:
    return _by_name(entries, parse_shape, "--shape")


def _ranges(entries: Sequence[str]) -> dict[str, ValueRange]:
    return _by_name(entries, parse_range, "--range")


VALIDATE_OPTIONS = (
    Option(
        ("--backend",),
        "backend",
        "what runs the fixed model: tensorrt (an engine with graphfix's plugins) or onnxruntime "
        "(with graphfix's reference ops); default: tensorrt where it is installed, else "
        "onnxruntime",
        {"choices": BACKENDS},
    ),
    Option(
        ("--precision",),
        "precision",
        "TensorRT precision: fp16/bf16 builder flags on TensorRT 10 (TensorRT 11 is strongly "
        "typed: put the precision in the ONNX instead); default fp32",
        {"choices": PRECISIONS},
    ),
    Option(
        ("--plugins",),
        "plugins",
        "a plugin library to load into TensorRT (repeatable; default: graphfix's built library)",
        {"action": "append", "metavar": "LIB"},
    ),
    Option(
        ("--inputs",),
        "inputs",
        "an .npz holding every model input by name (instead of random data)",
        {"metavar": "NPZ"},
    ),
    Option(
        ("--shape",),
        "shapes",
        "shape of an input with dynamic dimensions, e.g. pixel_values:1x3x384x384 (repeatable)",
        {"action": "append", "metavar": "NAME:DIMS"},
        convert=_shapes,
    ),
    Option(
        ("--range",),
        "ranges",
        "value range of an input, e.g. input_ids:0:49407 (integers inclusive; repeatable)",
        {"action": "append", "metavar": "NAME:LOW:HIGH"},
        convert=_ranges,
    ),
    Option(("--atol",), "atol", "absolute tolerance (default by precision)", {"type": float}),
    Option(("--rtol",), "rtol", "relative tolerance (default by precision)", {"type": float}),
    Option(
        ("--quantile",),
        "quantile",
        "check this quantile of the errors (e.g. 0.999) instead of every element",
        {"type": float},
    ),
    Option(
        ("--low-precision",),
        "low_precision",
        "how onnxruntime runs a float16/bfloat16 candidate: materialise (default: every "
        "float16/bfloat16 tensor rounded to its type at the node that produces it, as an engine "
        "stores it) or as-is (onnxruntime's CPU computes most float16 ops in float32, which can "
        "hide overflow)",
        {"choices": LOW_PRECISION_MODES},
    ),
    Option(
        ("--allow-nonfinite",),
        "allow_nonfinite",
        "count NaN/inf on both sides as agreement (by default it fails: the outputs mean nothing)",
        {"action": "store_true", "default": None},
    ),
    Option(
        ("--pair-outputs",),
        "pair_outputs",
        "match outputs by name (default) or by position (exports that number their outputs, "
        "e.g. 591 vs 600)",
        {"choices": OUTPUT_PAIRINGS},
    ),
    Option(
        ("--seed",), "seed", "seed of the random inputs (default 0)", {"type": int, "default": 0}
    ),
    Option(
        ("--engine-cache",),
        "engine_cache",
        "folder of cached TensorRT engines (default ~/.cache/graphfix/engines)",
        {"metavar": "DIR"},
    ),
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `validate` subcommand to the `graphfix` parser."""
    parser = subparsers.add_parser(
        "validate",
        help="compare the fixed model (TensorRT or onnxruntime) with the original on onnxruntime",
        description=(
            "Run ORIGINAL on onnxruntime (CPU, float32) and FIXED on TensorRT with graphfix's "
            "plugins (or onnxruntime with graphfix's reference ops where TensorRT is absent) on "
            "the same inputs; print per-output error statistics and the verdict. "
            "Exit codes: 0 pass, 1 the comparison failed, 2 usage error (bad input or option), "
            "3 the environment cannot run it (a runtime or TensorRT missing or failing)."
        ),
    )
    parser.add_argument("original", help="the reference .onnx (run by onnxruntime)")
    parser.add_argument("fixed", help="the candidate .onnx (e.g. the output of graphfix fix)")
    add_options(parser, VALIDATE_OPTIONS)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", metavar="DIR", help="write a PNG error histogram and heat map per output"
    )
    parser.add_argument("--no-histogram", action="store_true", help="leave the text histograms out")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.plugins and args.backend == "onnxruntime":
        raise ValidationUsageError(
            f"--plugins {' '.join(args.plugins)} loads libraries into TensorRT, but --backend "
            "onnxruntime runs graphfix's reference ops instead and loads no library; drop "
            "--plugins, or use --backend tensorrt"
        )
    if args.plot:  # an unusable folder fails before the models run
        from graphfix.validation.plot import prepare_plot_folder

        prepare_plot_folder(args.plot)
    report = validate(args.original, args.fixed, **api_kwargs(args, VALIDATE_OPTIONS))
    plots = ()
    if args.plot:
        from graphfix.validation.plot import plot_report

        plots = plot_report(report, args.plot)
    if args.json:
        data = report.to_dict()
        data["plots"] = [str(p) for p in plots]
        print(json.dumps(data, indent=2))
    else:
        print(report.summary(histograms=not args.no_histogram))
        for path in plots:
            print(f"wrote {path}")
    return 0 if report.passed else 1
