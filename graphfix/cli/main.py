"""`graphfix` command line: inspect, fix, precision, validate, locate, plugins, qdq."""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from graphfix.cli.options import Option, add_options, api_kwargs
from graphfix.errors import GraphfixError, SelectionError
from graphfix.progress import reporting

# A command's modules load when it runs (and its parser is built only for it, see `main`):
# `graphfix precision` starts without the rewrite strategies' tables, validation, locate or the
# Q/DQ lint.


def _parse_select(text: str) -> list[int | str]:
    # Commas separate selectors, except inside {} (a regex quantifier such as re:h{1,2}).
    parts = [
        int(p) if p.strip().lstrip("-").isdigit() else p.strip()
        for p in re.split(r",(?![^{]*\})", text)
        if p.strip()
    ]
    if not parts:
        raise SelectionError(
            f"--select {text!r} names no block; give block indices as `graphfix inspect` numbers "
            "them, Softmax node names or regexes (e.g. --select 0,2), or leave --select out to "
            "rewrite every block"
        )
    return parts


def _fix_options() -> tuple[Option, ...]:
    from graphfix.attention.strategies import DEFAULT_STRATEGY, STRATEGIES

    return (
        Option(
            ("--strategy", "-s"),
            "strategy",
            f"how to break each chain (default {DEFAULT_STRATEGY}): "
            + "; ".join(f"{name}: {s.summary}" for name, s in STRATEGIES.items()),
            {"choices": tuple(STRATEGIES)},
        ),
        Option(
            ("--select",),
            "select",
            "comma-separated selectors: block indices, attention:N, node names, re:REGEX, "
            "op:OpType, #N (an unnamed node as graphfix shows it, <Softmax #N>); a block is "
            "rewritten when picked by index or through its Softmax node (default: every block)",
            convert=_parse_select,
        ),
        Option(
            ("--accumulate",),
            "accumulate",
            "with --strategy native_attention: float32 casts float16/bfloat16 Q, K, V to float32 "
            "around each Attention node (TensorRT ≥ 11.3 keeps the FP16 fused kernel and "
            "accumulates in float32)",
            {"choices": ("float32",)},
        ),
        Option(
            ("--decompose-attention",),
            "decompose_attention_ops",
            "decompose ONNX Attention ops (opset 23+) into the explicit chain, then rewrite them",
            {"action": "store_const", "const": True},
        ),
    )


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graphfix.attention.matcher import scan_attention
    from graphfix.attention.table import match_table, native_op_line

    scan = scan_attention(args.model)
    if args.json:
        from graphfix.jsonable import plain

        print(json.dumps(plain(scan), indent=2))
        return 0
    if scan.matches:
        print(match_table(scan.matches))
    elif not scan.attention_ops:
        print(f"no attention blocks found in {args.model}")
    for op in scan.attention_ops:
        print(native_op_line(op))
    for skipped in scan.skipped:
        print(f"skipped {skipped.softmax}: {skipped.reason}")
    if scan.shape_inference_problem:
        print(
            "note: onnx shape inference failed, so sizes it would have given show as ?: "
            + scan.shape_inference_problem
        )
    return 0


def _strict_json(value: object) -> object:
    """`value` with non-finite floats (a -inf mask fill) as the strings "-inf", "inf", "nan":
    JSON has no such numbers, and strict parsers reject Python's -Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    return value


def _cmd_fix(args: argparse.Namespace) -> int:
    from graphfix.attention.rewrite import fix_attention
    from graphfix.model_io import check_output_path, load_model, save_model
    from graphfix.plugins.reference import has_plugin_ops

    source = Path(args.model)
    out = Path(args.output)
    loaded = load_model(source, load_weights=False, reference_embedded=True)
    check_output_path(loaded.model, args.output, source=loaded.path, overwrite=args.overwrite)
    result = fix_attention(loaded, **api_kwargs(args, _fix_options()))
    report = result.report
    lines = [report.summary()]
    saved = None
    if report.rewritten == 0 and not args.always_write:
        lines.append(
            f"nothing to rewrite in {source}; wrote nothing (pass --always-write to write anyway)"
        )
    else:
        saved = save_model(
            result.model,
            out,
            source=loaded.path,
            link_weights=args.link_weights,
            overwrite=args.overwrite,
        )
        lines.append(saved.describe())
    trtexec = _trtexec_hint(saved.path) if saved and has_plugin_ops(result.model) else None
    if trtexec:
        lines += ["run it with TensorRT:", "  " + trtexec]
    if args.json:
        document = {
            "report": report.to_dict(),
            "saved": None if saved is None else str(saved.path),
            "weights": None if saved is None else saved.weights,
            "created_folders": [] if saved is None else [str(p) for p in saved.created_folders],
            "trtexec": trtexec,
        }
        print(json.dumps(_strict_json(document), indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0


def _trtexec_hint(model: Path) -> str:
    """The trtexec line; when the plugin is not built yet, with the build step in front."""
    from graphfix.plugins import build as plugin_build

    try:
        return plugin_build.trtexec_command(model)
    except GraphfixError:
        build = plugin_build.default_build_dir()
        expected = plugin_build.PluginLibraries(
            static=build / plugin_build.STATIC_LIBRARY_NAME,
            dynamic=build / plugin_build.DYNAMIC_LIBRARY_NAME,
        )
        return "graphfix plugins build && " + plugin_build.trtexec_command(
            model, libraries=expected
        )


def _cmd_demo(args: argparse.Namespace) -> int:
    from graphfix.demo import demo_text, run_demo

    result = run_demo(args.dir, overwrite=args.overwrite)
    print(demo_text(result, trtexec=_trtexec_hint(result.fixed)))
    return 0 if result.validation.passed else 1


EXIT_CODES = (
    "exit codes (every command): 0 success; 1 the check ran and failed (validate, demo); 2 the "
    "input or options are wrong (missing file, bad flag, output exists); 3 the environment cannot "
    "do it (a runtime or TensorRT missing or unable to load the model, a build failed)"
)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse's errors as one line on stderr (no usage block), exit 2, as DESIGN.md asks;
    subcommand parsers inherit it (add_subparsers makes parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


_COMMANDS = ("inspect", "fix", "demo", "precision", "validate", "locate", "plugins", "qdq")
_MODULES = {
    name: f"graphfix.cli.{name}" for name in ("precision", "validate", "locate", "plugins", "qdq")
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `graphfix` parser; `only`: build just that command's subparser (what `main` does
    when the command word is known: the others' choices need their modules imported)."""
    import importlib

    def wanted(name: str) -> bool:
        return only is None or only == name

    parser = _OneLineErrorParser(
        prog="graphfix",
        description="Rewrite ONNX attention chains so TensorRT cannot fuse them into inaccurate kernels.",
        epilog=EXIT_CODES,
    )
    from graphfix import __version__

    parser.add_argument("--version", action="version", version=f"graphfix {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    if wanted("inspect"):
        inspect = sub.add_parser("inspect", help="list the attention blocks graphfix finds")
        inspect.add_argument("model", help="path to an .onnx file")
        inspect.add_argument("--json", action="store_true", help="print machine-readable JSON")
        inspect.set_defaults(func=_cmd_inspect)

    if wanted("fix"):
        fix = sub.add_parser("fix", help="rewrite attention blocks and save the fixed model")
        fix.add_argument("model", help="path to an .onnx file")
        fix.add_argument("-o", "--output", required=True, help="where to write the fixed .onnx")
        add_options(fix, _fix_options())
        fix.add_argument(
            "--overwrite",
            action="store_true",
            default=None,
            help="allow replacing an existing file (or the input)",
        )
        fix.add_argument(
            "--clone-weights",
            "--link-weights",
            dest="link_weights",
            action="store_true",
            default=None,
            help="clone external weight files into another output folder (copy-on-write: no extra "
            "disk space; needs btrfs, XFS with reflinks or similar) instead of copying them",
        )
        fix.add_argument(
            "--always-write",
            action="store_true",
            help="write the model even when nothing was rewritten",
        )
        fix.add_argument("--json", action="store_true", help="print the report as JSON")
        fix.set_defaults(func=_cmd_fix)

    if wanted("demo"):
        demo = sub.add_parser(
            "demo", help="run inspect → fix → validate on a built-in example model"
        )
        demo.add_argument(
            "--dir",
            default="graphfix-demo",
            help="folder for the demo's files (default ./graphfix-demo)",
        )
        demo.add_argument(
            "--overwrite",
            action="store_true",
            default=None,
            help="replace the demo's files from an earlier run",
        )
        demo.set_defaults(func=_cmd_demo)

    for name, module in _MODULES.items():
        if wanted(name):
            importlib.import_module(module).register(sub)
    for command in _leaf_parsers(sub):
        command.add_argument(
            "--quiet",
            "-q",
            action="store_true",
            help="no progress lines on stderr (they are shown only on a terminal, never with --json)",
        )
    return parser


def _leaf_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """The parsers of every command and sub-command (`qdq inspect`, `plugins build`)."""
    leaves = []
    for parser in dict.fromkeys(sub.choices.values()):
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        leaves += [leaf for n in nested for leaf in _leaf_parsers(n)] or [parser]
    return leaves


class _Terminated(BaseException):
    """SIGTERM, raised where the program is, so that its `finally` blocks clean up."""


def _raise_terminated(signum: int, frame: object) -> NoReturn:
    raise _Terminated


def _command_word(argv: Sequence[str]) -> str | None:
    """The command `argv` names, when its first word that is not an option is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in _COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # the `graphfix` process itself, not a caller in Python
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_word(argv)
    if command == "precision" and "numpy" not in sys.modules:
        # numpy's OpenBLAS starts a thread per core that spins for ~0.1 s of CPU after the
        # import; `graphfix precision` does no BLAS work, and its own threads want the cores.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if program:  # a library caller's own signal handling is its own
        signal.signal(signal.SIGTERM, _raise_terminated)
    shows_progress = not (args.quiet or getattr(args, "json", False)) and sys.stderr.isatty()
    try:
        with reporting(enabled=shows_progress):
            return int(args.func(args) or 0)
    except GraphfixError as exc:
        print(f"graphfix: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `graphfix inspect … | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("graphfix: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT
    except _Terminated:
        print("graphfix: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if program and command == "precision":
            # What the command wrote is closed and in place.  The interpreter's last garbage
            # collection at exit walks every object the imports and the graph passes made
            # (~30 ms); frozen, they are skipped by it and still freed by reference counting,
            # and atexit handlers and weakref finalizers still run.
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
