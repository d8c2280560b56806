"""float16 conversion of the test corpus by graphfix, onnxconverter-common and ModelOpt AutoCast.

All tools convert the same float32 corpus models in one run; every output is then judged by
this venv's onnxruntime (CPU) on one seeded input per model:

    loads   onnxruntime builds a session for it
    agrees  every float output is within float16 tolerance of the float32 model
            (graphfix.validation.compare, DEFAULT_TOLERANCES["fp16"]: atol 1e-2, rtol 1e-2)
    torch   the same, with the model run op by op through torch in its own types
            (tools/torch_onnx_eval.py, CPU): onnxruntime's CPU provider runs float16 ops that
            lack a kernel in float32 and drops Cast pairs, which can hide float16 overflow
    fp32    compute nodes left in float32 (graphfix.precision.census), summed over the models

The peers run as subprocesses of the peers venv (benchmarks/peer_convert.py), which holds
`nvidia-modelopt[onnx]` and `onnxconverter-common` (pip install -e '.[peers]' there).

    python benchmarks/precision_bench.py                    # every float32 corpus model
    python benchmarks/precision_bench.py --only bert --only unet
    python benchmarks/precision_bench.py --large            # + the 2 GB external-data timing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO))

from model_corpus import entries, model_path, random_feed  # noqa: E402

from graphfix.precision.census import is_float32_model, precision_census  # noqa: E402
from graphfix.precision.convert import convert_precision  # noqa: E402
from graphfix.validation.compare import DEFAULT_TOLERANCES, compare_output  # noqa: E402

PEERS_PYTHON = Path(os.environ.get("GRAPHFIX_PEERS_PYTHON", "/work/venvs/peers/bin/python"))
TOOLS = ("graphfix", "onnxconverter-common", "autocast")


@dataclass
class Outcome:
    converted: bool = False
    loads: bool = False
    agrees: bool = False
    torch_agrees: bool | None = None  # None: the interpreter cannot run it
    compute: int = 0
    float32: int = 0
    error: str = ""


@dataclass
class Tally:
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def row(self, tool: str) -> str:
        done = self.outcomes.values()
        n = len(self.outcomes)
        conv = sum(o.converted for o in done)
        loads = sum(o.loads for o in done)
        agrees = sum(o.agrees for o in done)
        ran = [o for o in done if o.torch_agrees is not None]
        torch_ok = f"{sum(o.torch_agrees for o in ran):>4}/{len(ran):<4}"
        compute = sum(o.compute for o in done if o.loads)
        fp32 = sum(o.float32 for o in done if o.loads)
        share = f"{100 * fp32 / compute:5.1f}%" if compute else "    -"
        return (
            f"{tool:22s} {conv:>4}/{n:<4} {loads:>4}/{n:<4} {agrees:>4}/{n:<4} {torch_ok} "
            f"{fp32:>6}/{compute:<6} {share}"
        )


def corpus_models(only: list[str]) -> list[tuple[str, Path]]:
    models = []
    for entry in entries(only=only):
        if entry.expected.dtype != "float32" or entry.export_error:
            continue
        path = model_path(entry)
        if is_float32_model(onnx.load(str(path), load_external_data=False)):
            models.append((entry.name, path))
    return models


def run_peer(tool: str, jobs: list[tuple[str, str]], work: Path) -> dict[str, dict]:
    jobs_file, results_file = work / f"{tool}-jobs.json", work / f"{tool}-results.json"
    jobs_file.write_text(json.dumps(jobs))
    if not PEERS_PYTHON.exists():
        return {src: {"error": f"no peers venv at {PEERS_PYTHON}"} for src, _ in jobs}
    log = work / f"{tool}.log"
    with open(log, "w") as handle:
        subprocess.run(
            [str(PEERS_PYTHON), str(REPO / "benchmarks" / "peer_convert.py"), tool,
             str(jobs_file), str(results_file)],
            stdout=handle, stderr=subprocess.STDOUT, check=False, cwd=work,
        )  # fmt: skip
    if not results_file.exists():
        return {src: {"error": f"{tool} crashed; see {log}"} for src, _ in jobs}
    return json.loads(results_file.read_text())


def evaluate(reference: Path, candidate: Path, feed: dict, expected: list) -> Outcome:
    import onnxruntime as ort

    outcome = Outcome(converted=True)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(candidate), options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feed)
    except Exception as exc:
        outcome.error = f"onnxruntime: {str(exc).splitlines()[0][:200]}"
        return outcome
    outcome.loads = True
    census = precision_census(onnx.load(str(candidate), load_external_data=False))
    outcome.compute, outcome.float32 = census.compute - census.untyped, census.float32
    tolerance = DEFAULT_TOLERANCES["fp16"]
    names = [o.name for o in session.get_outputs()]
    agrees = True
    for name, ref, got in zip(names, expected, outputs, strict=True):
        if np.asarray(ref).dtype.kind != "f":
            agrees &= bool(np.array_equal(ref, got))
            continue
        stats = compare_output(name, np.asarray(ref), np.asarray(got).astype(np.float32), tolerance)
        agrees &= stats.passed
    outcome.agrees = agrees
    if not agrees:
        outcome.error = "outputs differ beyond float16 tolerance"
    outcome.torch_agrees = _torch_agrees(candidate, feed, expected, tolerance)
    if outcome.agrees and outcome.torch_agrees is False:
        outcome.error = "run in float16 by torch: outputs differ beyond float16 tolerance"
    return outcome


def _torch_agrees(candidate: Path, feed: dict, expected: list, tolerance) -> bool | None:
    try:
        import torch_onnx_eval
    except ImportError:  # no torch here
        return None
    model = onnx.load(str(candidate))
    try:
        outputs = torch_onnx_eval.run_model(model, feed, "cpu")
    except NotImplementedError:
        return None
    except Exception:
        return None
    for output, ref, got in zip(model.graph.output, expected, outputs, strict=True):
        ref = np.asarray(ref)
        if ref.dtype.kind != "f":
            if not np.array_equal(ref, got):
                return False
        elif not compare_output(output.name, ref, got.astype(ref.dtype), tolerance).passed:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="corpus names containing this")
    parser.add_argument("--large", action="store_true", help="also time a 2 GB external-data model")
    parser.add_argument("--details", action="store_true", help="print each model's outcome")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    models = corpus_models(args.only)
    tallies = {tool: Tally() for tool in TOOLS}
    with tempfile.TemporaryDirectory(prefix="precision-bench-") as tmp:
        work = Path(tmp)
        outputs = {
            tool: {name: work / tool / f"{name}.onnx" for name, _ in models} for tool in TOOLS
        }
        for tool in TOOLS:
            (work / tool).mkdir()
        start = time.perf_counter()
        graphfix_errors = {}
        for name, path in models:
            try:
                result = convert_precision(str(path))
                onnx.save(result.model, outputs["graphfix"][name])
            except Exception as exc:
                graphfix_errors[name] = f"{type(exc).__name__}: {exc}"
        seconds = {"graphfix": time.perf_counter() - start}
        peer_results = {}
        for tool in TOOLS[1:]:
            start = time.perf_counter()
            jobs = [(str(path), str(outputs[tool][name])) for name, path in models]
            peer_results[tool] = run_peer(tool, jobs, work)
            seconds[tool] = time.perf_counter() - start
        options = ort.SessionOptions()
        options.log_severity_level = 4
        for name, path in models:
            reference = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feed = random_feed(
                onnx.load(str(path), load_external_data=False), np.random.default_rng(0)
            )
            expected = reference.run(None, feed)
            for tool in TOOLS:
                candidate = outputs[tool][name]
                error = (
                    graphfix_errors.get(name)
                    if tool == "graphfix"
                    else (peer_results[tool].get(str(path), {}).get("error"))
                )
                if error or not candidate.exists():
                    tallies[tool].outcomes[name] = Outcome(error=error or "no output written")
                else:
                    tallies[tool].outcomes[name] = evaluate(path, candidate, feed, expected)
                if args.details:
                    o = tallies[tool].outcomes[name]
                    print(f"  {name:38s} {tool:22s} load={o.loads:d} agree={o.agrees:d} torch={o.torch_agrees} "
                          f"fp32={o.float32}/{o.compute} {o.error[:120]}")  # fmt: skip
    print(
        f"{len(models)} float32 corpus models; float16 tolerance atol=rtol=1e-2; one seeded input"
    )
    print(
        f"{'tool':22s} {'converts':>9} {'loads':>9} {'agrees':>9} {'torch':>9} {'fp32 compute nodes':>20}"
    )
    for tool in TOOLS:
        print(tallies[tool].row(tool) + f"   ({seconds[tool]:.1f} s)")
    failures = {
        tool: sorted({o.error.split(":")[0] + ": " + o.error.split(":", 1)[-1][:80]
                      for o in tallies[tool].outcomes.values() if o.error})
        for tool in TOOLS
    }  # fmt: skip
    for tool, errors in failures.items():
        for error in errors[:4]:
            print(f"  {tool}: {error}")
    if args.large:
        from precision_large import run_large

        run_large()
    return 0


if __name__ == "__main__":
    sys.exit(main())
