"""`graphfix demo`: the whole job on the built-in example, offline, in a few seconds.

Generates the example ViT, shows its attention blocks, rewrites them with the plugin strategy,
validates the rewrite (TensorRT where installed, else onnxruntime with graphfix's reference ops)
and says what to run next.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphfix.attention.matcher import scan_attention
from graphfix.attention.report import FixReport
from graphfix.attention.rewrite import fix_attention
from graphfix.attention.table import match_table
from graphfix.errors import OutputPathError
from graphfix.examples import vit_example
from graphfix.model_io import save_model
from graphfix.validation.validate import ValidationReport, validate

EXAMPLE_NAME = "vit_example.onnx"
FIXED_NAME = "vit_example.fixed.onnx"


@dataclass(frozen=True)
class DemoResult:
    original: Path
    fixed: Path
    fix_report: FixReport
    validation: ValidationReport


def run_demo(directory: str | os.PathLike[str], *, overwrite: bool | None = None) -> DemoResult:
    """Write the example and its fixed version into `directory`, and validate the fix."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(
            f"--dir {folder} is a file; give a folder for the demo's files (e.g. --dir graphfix-demo)"
        )
    original, fixed = folder / EXAMPLE_NAME, folder / FIXED_NAME
    for path in (original, fixed):
        if path.exists() and not overwrite:
            raise OutputPathError(
                f"{path} already exists; pass --overwrite to replace the demo's files or choose "
                "another --dir"
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(vit_example(), original)
    except OSError as exc:
        raise OutputPathError(
            f"cannot write the demo's files into {folder}: {exc.strerror or exc}; choose a "
            "writable folder with --dir"
        ) from exc
    result = fix_attention(original)
    save_model(result.model, fixed, source=original, overwrite=overwrite)
    report = validate(original, fixed)
    return DemoResult(original=original, fixed=fixed, fix_report=result.report, validation=report)


def demo_text(result: DemoResult, *, trtexec: str) -> str:
    """What the demo prints: the table, the fix, the verdict, and the next commands."""

    scan = scan_attention(result.original)
    q = shlex.quote
    lines = [
        f"1. generated the example model {result.original}",
        "",
        f"2. graphfix inspect {q(str(result.original))}",
        match_table(scan.matches),
        *(f"skipped {s.softmax}: {s.reason}" for s in scan.skipped),
        "",
        f"3. graphfix fix {q(str(result.original))} -o {q(str(result.fixed))}",
        result.fix_report.summary(),
        "",
        f"4. graphfix validate {q(str(result.original))} {q(str(result.fixed))}",
        result.validation.summary(histograms=False),
        "",
        "next: build the TensorRT engine with graphfix's plugin library (needs nvcc and TensorRT)",
        f"  {trtexec}",
        "then your own model:",
        "  graphfix inspect MODEL.onnx && graphfix fix MODEL.onnx -o MODEL.fixed.onnx",
    ]
    return "\n".join(lines)
