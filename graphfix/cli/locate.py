"""`graphfix locate MODEL [CANDIDATE]`: where a lower-precision model diverges, and the fix.

Exit codes: 0 no divergence, or divergence repaired by --apply; 1 divergence found and not
repaired; 2 bad input or options; 3 the runtime cannot run a model (or TensorRT is missing).
"""

from __future__ import annotations

import argparse
import sys

from graphfix.cli.options import Option, add_options, api_kwargs, print_json
from graphfix.cli.validate import VALIDATE_OPTIONS
from graphfix.precision.locate.api import BACKENDS, PRECISIONS
from graphfix.precision.locate.candidate import BASES
from graphfix.precision.locate.plan import DEFAULT_MAX_TRIALS

_SHARED = {o.api: o for o in VALIDATE_OPTIONS}
LOCATE_OPTIONS = (
    Option(
        ("--precision",),
        "precision",
        "the candidate is MODEL converted to this type, run by onnxruntime on the CPU with the "
        "type's rounding and overflow made explicit at every stored tensor; enables the remedy "
        "search",
        {"choices": PRECISIONS},
    ),
    Option(
        ("--backend",),
        "backend",
        "what runs the candidate: onnxruntime (default) or tensorrt (through polygraphy)",
        {"choices": BACKENDS},
    ),
    *(
        _SHARED[name]
        for name in (
            "inputs",
            "shapes",
            "ranges",
            "atol",
            "rtol",
            "quantile",
            "seed",
            "low_precision",
            "allow_nonfinite",
            "pair_outputs",
        )
    ),
    Option(
        ("--apply",),
        "apply",
        "write MODEL with the remedies kept (needs --precision and -o)",
        {"action": "store_true", "default": None},
    ),
    Option(("-o", "--output"), "output", "where --apply writes the repaired model"),
    Option(
        ("--overwrite",),
        "overwrite",
        "allow replacing an existing output file",
        {"action": "store_true", "default": None},
    ),
    Option(
        ("--no-remedies",),
        "remedies",
        "locate only: skip the remedy search",
        {"action": "store_const", "const": False},
    ),
    Option(
        ("--remedy-base",),
        "remedy_base",
        "what each remedy trial converts with: minimal (default: only what a trial proves "
        "necessary stays float32) or convert_precision (its default float32 islands too)",
        {"choices": BASES},
    ),
    Option(
        ("--max-trials",),
        "max_trials",
        "most candidate runs (TensorRT: engine builds) the remedy search may make (default "
        + ", ".join(f"{n} with {b.value}" for b, n in DEFAULT_MAX_TRIALS.items())
        + ")",
        {"type": int},
    ),
    Option(
        ("--chunk-mb",),
        "chunk_bytes",
        "MiB of intermediate tensors held per side at once (default 256)",
        {"type": float, "metavar": "MIB"},
        convert=lambda mb: int(mb * (1 << 20)),
    ),
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "locate",
        help="find where a float16/bfloat16 (or TensorRT) model diverges, and the cheapest fix",
        description=(
            "Compare every intermediate tensor of CANDIDATE (or of MODEL converted by "
            "--precision) with MODEL run by onnxruntime in float32, rank the nodes where the "
            "error is created, and search the fewest float32 nodes / attention strategies that "
            "make the candidate pass validate's tolerance. Exit codes: 0 no divergence or "
            "repaired, 1 divergence not repaired, 2 usage error, 3 runtime cannot run it."
        ),
    )
    parser.add_argument("model", help="the float32 reference .onnx")
    parser.add_argument(
        "candidate", nargs="?", help="a candidate .onnx sharing MODEL's tensor names"
    )
    add_options(parser, LOCATE_OPTIONS)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.add_argument("--plot", metavar="DIR", help="write a PNG of error along graph depth")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from graphfix.errors import UsageError
    from graphfix.precision.locate.api import locate

    kwargs = api_kwargs(args, LOCATE_OPTIONS)
    if kwargs["apply"] and kwargs["output"] is None:
        raise UsageError("--apply writes the repaired model: pass -o OUT.onnx")
    if args.plot:  # an unusable folder or a missing matplotlib fails before the models run
        from graphfix.validation.plot import prepare_plot_folder

        prepare_plot_folder(args.plot)
    report = locate(args.model, args.candidate, **kwargs)
    plot = None
    if args.plot:
        from graphfix.precision.locate.plot import plot_locate

        plot = plot_locate(report, args.plot)
    if args.json:
        print_json(report, plot=plot)
    else:
        print(report.summary())
        if plot is not None:
            print(f"wrote {plot}")
    if not report.diverges:
        if kwargs["apply"]:  # said on stderr so that --json stays one document
            print(
                f"graphfix: nothing written to {kwargs['output']}: MODEL converted to "
                f"{report.precision} does not diverge, so there is nothing to repair; "
                f"`graphfix precision {args.model} -o {kwargs['output']}` writes that conversion",
                file=sys.stderr,
            )
        return 0
    if report.fixed is not None and report.fixed.passed:
        return 0
    if kwargs["apply"] and report.fixed is None:
        print(
            "graphfix: error: no remedy repaired the divergence; nothing written", file=sys.stderr
        )
    return 1
