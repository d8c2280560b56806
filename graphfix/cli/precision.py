"""`graphfix precision MODEL -o OUT --to float16|bfloat16`: precision for strongly typed TensorRT."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from graphfix.cli.options import Option, add_options, api_kwargs
from graphfix.model_io import (
    check_output_path,
    external_data_files,
    load_model,
    save_model,
    temporary_name,
)
from graphfix.precision.convert import TARGETS, convert_precision
from graphfix.progress import step


class _StrategyNames:
    """`graphfix fix`'s strategy names for --attention-strategy's choices, loaded when argparse
    checks a value given (the metavar keeps argparse from listing them while it builds the
    parser): converting needs none of the strategies' modules, which cost ~20 ms a start."""

    def _names(self) -> tuple[str, ...]:
        from graphfix.attention.strategies import STRATEGIES

        return tuple(STRATEGIES)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


PRECISION_OPTIONS = (
    Option(
        ("--to",),
        "to",
        "the low-precision type (default float16)",
        {"choices": TARGETS},
    ),
    Option(
        ("--keep",),
        "keep",
        "nodes to keep in float32: a block index as `graphfix inspect` numbers it, attention:N, "
        "op:OpType, a node name, re:REGEX or #N (an unnamed node as graphfix shows it, "
        "<MatMul #N>) (repeatable)",
        {"action": "append", "metavar": "SEL"},
    ),
    Option(
        ("--no-fuse-norms",),
        "fuse_norms",
        "do not fuse decomposed norms first (they stay float32 islands)",
        {"action": "store_const", "const": False},
    ),
    Option(
        ("--opset",),
        "opset",
        "the default-domain opset norm fusion may raise the model to, e.g. 23 so that RMSNorms "
        "become RMSNormalization instead of float32 islands (TensorRT's ONNX parser reads it "
        "from 10.15); raised only where no op of the model changes meaning (default: the "
        "model's own, or 17 for LayerNormalization)",
        {"type": int, "metavar": "N"},
    ),
    Option(
        ("--convert-io",),
        "keep_io_types",
        "give float32 graph inputs and outputs the low-precision type too",
        {"action": "store_const", "const": False},
    ),
    Option(
        ("--attention-strategy",),
        "attention_strategy",
        "rewrite attention blocks that must stay float32 with this `graphfix fix` strategy "
        "(its plugin computes in float32; the names are in `graphfix fix --help`) instead of "
        "keeping them whole in float32",
        {"choices": _StrategyNames(), "metavar": "STRATEGY"},
    ),
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `precision` subcommand to the `graphfix` parser."""
    parser = subparsers.add_parser(
        "precision",
        help="convert a float32 model to float16/bfloat16 with float32 islands (TensorRT 11)",
        description=(
            "Write MODEL in float16 or bfloat16 with Casts only at the borders of float32 "
            "islands (range-sensitive ops, norm statistics, --keep selections), attention "
            "chains kept whole. TensorRT 11 builds strongly typed networks: the precision in "
            "the ONNX is the precision of the engine."
        ),
    )
    parser.add_argument("model", help="path to a float32 .onnx file")
    parser.add_argument("-o", "--output", required=True, help="where to write the converted .onnx")
    add_options(parser, PRECISION_OPTIONS)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="allow replacing an existing file (or the input)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    source = Path(args.model)
    out = Path(args.output)
    loaded = load_model(source, load_weights=False)
    check_output_path(loaded.model, args.output, source=loaded.path, overwrite=args.overwrite)
    # Converted weights of a model with external data are written once, into a staging folder
    # next to the output, and moved into place by save_model (no second copy).
    stage = None
    external = None
    if external_data_files(loaded.model):
        stage = temporary_name(out, "stage")
        external = stage / f"{out.name}.data"
    try:
        step(f"converting {source.name} to {args.to or 'float16'}")
        result = convert_precision(
            loaded, external_data=external, **api_kwargs(args, PRECISION_OPTIONS)
        )
        step(f"writing {out}")
        saved = save_model(
            result.model,
            out,
            source=result.source,
            move_weights=stage is not None or None,
            overwrite=args.overwrite,
        )
        if stage is not None:  # the staged file is gone below: the output's is the only link
            saved = dataclasses.replace(saved, weights="written as external data")
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    if args.json:
        document = {
            "report": result.report.to_dict(),
            "saved": str(saved.path),
            "weights": saved.weights,
        }
        print(json.dumps(document, indent=2, default=str))
    else:
        print(result.report.summary())
        print(saved.describe())
    return 0
