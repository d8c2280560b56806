"""`graphfix locate` on planted float16 faults in real exports, against ModelOpt AutoCast.

    python benchmarks/locate_bench.py                       # the planted-fault table
    python benchmarks/locate_bench.py --only bert,gpt2      # entries whose name contains these
    python benchmarks/locate_bench.py --memory              # peak RSS on ~500 MB of activations

Per case: one weight of a MatMul/Gemm/Conv in the middle of the graph is scaled so its output peaks
at 3e5 on the test inputs (finite in float32, beyond float16's 65504).  A case is kept only when
the unplanted model converted to float16 agrees with float32 and the planted one does not.  Then
`graphfix.locate(planted, precision="float16", apply=True)` must rank the planted node or a
direct consumer in its top 3, and its repaired model must agree with float32 within float16
tolerance.  ModelOpt AutoCast (default data_max=512, keep_io_types, calibrated on the same inputs)
converts the same planted model in /work/venvs/peers; both results are validated by onnxruntime
and their float32 compute nodes counted by the same function.  Agreement is judged with float16
materialised at every node output (validate's default) and float16 tolerance (atol = rtol = 1e-2).  The cost
column is the wall time of
`locate(..., remedies=False)` (conversion included) over one `graphfix validate` run of the
planted model against its float16 conversion (already on disk), best of 3 each, in this process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphfix.precision.locate import locate  # noqa: E402
from graphfix.precision.locate.candidate import build_candidate  # noqa: E402
from graphfix.precision.locate.remedies import float32_compute_nodes  # noqa: E402
from graphfix.validation.inputs import make_inputs  # noqa: E402
from graphfix.validation.validate import validate  # noqa: E402
from tests.locate_faults import plant_overflow  # noqa: E402
from tests.model_corpus import CORPUS, model_path  # noqa: E402

PEERS_PYTHON = Path(os.environ.get("GRAPHFIX_PEERS_PYTHON", "/work/venvs/peers/bin/python"))
FAMILIES = (
    "bert_eager",
    "gpt2_eager",
    "gpt2_sdpa",
    "llama_eager",
    "llama_sdpa",
    "gemma2_eager",
    "clip_text_eager",
    "clip_vision_eager",
    "t5_eager",
    "whisper_eager",
    "timm_vit_tiny",
    "timm_siglip",
    "open_clip_image",
    "open_clip_text",
    "vae",
    "unet_sdpa",
    "bert_sdpa",
)
AUTOCAST = """
import sys, numpy as np, onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
model = convert_to_mixed_precision(sys.argv[1], low_precision_type="fp16", keep_io_types=True,
                                   calibration_data=sys.argv[2])
onnx.save(model, sys.argv[3])
"""


@dataclass
class Row:
    case: str
    planted: str
    rank: int | None
    graphfix_nodes: int | None
    graphfix_ok: bool
    autocast_nodes: int | None
    autocast_ok: bool | None
    cost: float  # wall time, locate / validate
    cost_cpu: float  # CPU time, locate / validate
    trials: int
    note: str = ""


def family(name: str) -> str:
    return name.split("-")[0].replace("_eager", "").replace("_sdpa", "")


def run_case(entry, folder: Path) -> Row | str:
    model = onnx.load(str(model_path(entry)))
    feeds = make_inputs(model).feeds
    fp16 = build_candidate(model, precision="float16").model
    if not agrees(model, fp16):
        return "unplanted float16 model already disagrees"
    fault = plant_overflow(model, feeds)
    planted = folder / f"{entry.name}-planted.onnx"
    onnx.save(fault.model, planted)
    planted16 = folder / f"{entry.name}-planted-fp16.onnx"
    onnx.save(build_candidate(fault.model, precision="float16").model, planted16)
    if agrees(fault.model, onnx.load(str(planted16))):
        return "planted float16 model still agrees"
    validate_wall, validate_cpu = best_of(
        3, lambda: validate(planted, planted16, backend="onnxruntime")
    )
    locate_wall, locate_cpu = best_of(
        3, lambda: locate(planted, precision="float16", remedies=False)
    )
    report = locate(planted, precision="float16", apply=True)
    hits = {fault.node, *fault.consumers}
    rank = next((s.rank for s in report.suspects if s.node in hits), None)
    ok = False
    nodes = None
    if report.fixed_model is not None:
        nodes = len(float32_compute_nodes(report.fixed_model))
        ok = agrees(fault.model, report.fixed_model)
    auto_nodes, auto_ok, note = autocast(planted, feeds, folder, fault.model)
    return Row(
        entry.name,
        fault.node,
        rank,
        nodes,
        ok,
        auto_nodes,
        auto_ok,
        locate_wall / validate_wall,
        locate_cpu / validate_cpu,
        len(report.remedies_tried),
        note,
    )


def best_of(repeat: int, call) -> tuple[float, float]:
    """The fastest of `repeat` runs: (wall seconds, CPU seconds of this process, all threads).

    The first run also pays one-time imports; CPU time is the steadier figure on a shared machine.
    """
    walls, cpus = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return min(walls), min(cpus)


def autocast(planted: Path, feeds, folder: Path, model) -> tuple[int | None, bool | None, str]:
    if not PEERS_PYTHON.exists():
        return None, None, f"AutoCast not run: {PEERS_PYTHON} missing"
    data = folder / f"{planted.stem}-inputs.npz"
    np.savez(data, **feeds)
    out = folder / f"{planted.stem}-autocast.onnx"
    done = subprocess.run(
        [str(PEERS_PYTHON), "-c", AUTOCAST, str(planted), str(data), str(out)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return None, None, "AutoCast failed: " + done.stderr.strip().splitlines()[-1][:120]
    converted = onnx.load(str(out))
    try:
        ok = agrees(model, converted)
    except Exception as exc:  # report the peer's failure in the table, keep benchmarking
        return len(float32_compute_nodes(converted)), False, f"AutoCast model: {exc}"[:120]
    return len(float32_compute_nodes(converted)), ok, ""


def agrees(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> bool:
    """`graphfix validate`, float16 materialised at every node output (its default: onnxruntime's
    CPU otherwise runs most float16 ops in float32, see graphfix/validation/low_precision.py)."""
    return validate(reference, candidate, backend="onnxruntime", atol=1e-2, rtol=1e-2).passed


def table(rows: list[Row]) -> str:
    head = (
        "case",
        "planted node",
        "hit rank",
        "f32 nodes graphfix",
        "f32 nodes AutoCast",
        "graphfix agrees",
        "AutoCast agrees",
        "locate/validate wall",
        "locate/validate CPU",
        "trials",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.planted} | {r.rank if r.rank else 'miss'} | {r.graphfix_nodes} | "
            f"{'n/a' if r.autocast_nodes is None else r.autocast_nodes} | "
            f"{'yes' if r.graphfix_ok else 'NO'} | "
            f"{'n/a' if r.autocast_ok is None else ('yes' if r.autocast_ok else 'no')} | "
            f"{r.cost:.2f}x | {r.cost_cpu:.2f}x | {r.trials} |" + (f" {r.note}" if r.note else "")
        )
    return "\n".join(lines)


def memory(activation_mb: int, chunk_mb: int) -> None:
    """Peak RSS of locate on a chain whose intermediates total `activation_mb`, in a child."""
    code = f"""
import resource, sys, time, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as T
sys.path.insert(0, {str(REPO)!r})
rows, width, layers = 4096, 1024, {max(2, activation_mb // 32)}
rng = np.random.default_rng(0)
nodes, inits, prev = [], [], "x"
for i in range(layers):
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{{i}}"))
    nodes += [helper.make_node("MatMul", [prev, f"w{{i}}"], [f"m{{i}}"], name=f"mm{{i}}"),
              helper.make_node("Tanh", [f"m{{i}}"], [f"t{{i}}"], name=f"tanh{{i}}")]
    prev = f"t{{i}}"
g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", T.FLOAT, [rows, width])],
                      [helper.make_tensor_value_info(prev, T.FLOAT, [rows, width])], inits)
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); model.ir_version = 9
mode = sys.argv[1]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if mode == "validate":
    from graphfix.precision.locate.candidate import build_candidate
    from graphfix.validation.validate import validate
    validate(model, build_candidate(model, precision="float16").model, backend="onnxruntime")
else:
    from graphfix.precision.locate import locate
    r = locate(model, precision="float16", remedies=False, chunk_bytes=int(sys.argv[2]) << 20)
    print("chunks", r.chunks, "tensors", len(r.tensors))
usage = resource.getrusage(resource.RUSAGE_SELF)
print("activations MB", 2 * layers * rows * width * 4 / 2**20, "weights MB", layers * 4,
      "peak RSS MB", round(usage.ru_maxrss / 1024),
      "after building MB", round(base / 1024), "seconds", round(time.perf_counter() - start, 2),
      "CPU seconds", round(usage.ru_utime + usage.ru_stime, 2))
"""
    for mode, chunk in (("validate", 0), ("locate", chunk_mb), ("locate", 4 * chunk_mb)):
        done = subprocess.run(
            [sys.executable, "-c", code, mode, str(chunk)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        label = "validate" if mode == "validate" else f"locate, chunk {chunk} MB"
        print(f"{label}: {done.stdout.strip()} {done.stderr.strip()[-300:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated substrings of entry names")
    parser.add_argument("--exporters", default="legacy17,dynamo18")
    parser.add_argument("--memory", action="store_true", help="measure peak memory instead")
    parser.add_argument("--activation-mb", type=int, default=512)
    parser.add_argument("--chunk-mb", type=int, default=64)
    args = parser.parse_args()
    if args.memory:
        memory(args.activation_mb, args.chunk_mb)
        return 0
    wanted = args.only.split(",") if args.only else FAMILIES
    exporters = args.exporters.split(",")
    entries = [
        e
        for e in CORPUS
        if e.export_error is None
        and f"{e.exporter}{e.opset}" in exporters
        and any(e.name.startswith(w + "-") or (args.only and w in e.name) for w in wanted)
    ]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="graphfix-locate-bench-") as tmp:
        for entry in entries:
            start = time.perf_counter()
            try:
                result = run_case(entry, Path(tmp))
            except Exception as exc:  # one case failing must not hide the others
                result = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            took = time.perf_counter() - start
            if isinstance(result, str):
                print(f"skip {entry.name}: {result} ({took:.1f}s)", file=sys.stderr)
            else:
                rows.append(result)
                print(f"done {entry.name} in {took:.1f}s", file=sys.stderr)
    print(table(rows))
    families = {family(r.case) for r in rows}
    hits = sum(1 for r in rows if r.rank is not None and r.rank <= 3)
    fixed = sum(r.graphfix_ok for r in rows)
    comparable = [r for r in rows if r.autocast_ok]
    fewer = sum(
        1
        for r in comparable
        if r.graphfix_nodes is not None and r.graphfix_nodes <= r.autocast_nodes
    )
    print(
        f"\n{len(rows)} cases from {len(families)} families; planted node or consumer in top 3: "
        f"{hits}/{len(rows)}; repaired: {fixed}/{len(rows)}; no more float32 compute nodes than "
        f"AutoCast where AutoCast agrees: {fewer}/{len(comparable)}; locate/validate wall time: "
        f"max {max((r.cost for r in rows), default=0):.2f}x, median "
        f"{float(np.median([r.cost for r in rows])) if rows else 0:.2f}x; CPU time: max "
        f"{max((r.cost_cpu for r in rows), default=0):.2f}x, median "
        f"{float(np.median([r.cost_cpu for r in rows])) if rows else 0:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
