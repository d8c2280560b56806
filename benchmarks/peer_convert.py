"""Run a peer float16 converter over a list of models; executed by the peers venv's Python.

    /work/venvs/peers/bin/python benchmarks/peer_convert.py TOOL JOBS.json RESULTS.json

TOOL is `onnxconverter-common` (`convert_float_to_float16(model, keep_io_types=True)`) or
`autocast` (ModelOpt AutoCast, `convert_to_mixed_precision` with its default data_max and
keep_io_types=True so every tool's output takes the same float32 inputs).  JOBS is a JSON list
of [input, output] paths; RESULTS gets {input: null | "error text"}.  Only the peers venv has
these packages (ModelOpt pulls onnxruntime-gpu, which must not share graphfix's venv).
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def _convert(tool: str, source: str, target: str) -> None:
    import onnx

    if tool == "onnxconverter-common":
        from onnxconverter_common import float16

        converted = float16.convert_float_to_float16(onnx.load(source), keep_io_types=True)
    elif tool == "autocast":
        from modelopt.onnx.autocast import convert_to_mixed_precision

        converted = convert_to_mixed_precision(
            onnx_path=source, low_precision_type="fp16", keep_io_types=True, providers=["cpu"]
        )
    else:
        raise SystemExit(f"unknown tool {tool!r}; use onnxconverter-common or autocast")
    onnx.save(converted, target)


def main(argv: list[str]) -> int:
    tool, jobs_file, results_file = argv
    with open(jobs_file) as handle:
        jobs = json.load(handle)
    results: dict[str, dict] = {}
    for source, target in jobs:
        start = time.perf_counter()
        try:
            _convert(tool, source, target)
            error = None
        except Exception as exc:  # a peer's failure is a result of the benchmark, kept as text
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            traceback.print_exc(file=sys.stderr)
        results[source] = {"error": error, "seconds": time.perf_counter() - start}
    with open(results_file, "w") as handle:
        json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
