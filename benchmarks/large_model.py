"""`graphfix fix` on a model over 2 GB with external data, against its baselines in the same run.

Generates a SigLIP-so400m-sized vision transformer (36 blocks of width 1152, MLP 4304, 16 heads:
2.2 GB of float32 weights in one external data file, written sequentially in chunks), then
measures wall time and peak RSS of, each as a child process:

    fix, same folder    graphfix fix MODEL -o SRC/fixed.onnx      target < 5% of the round trip
    fix, other folder   graphfix fix MODEL -o OTHER/fixed.onnx    target < 1.5x the plain copy
    onnx round trip     onnx.load + onnx.save(save_as_external_data=True)
    plain copy          cp of the data file

and peak RSS of both fixes < 5% of the weights' size.  The page cache cannot be dropped without
root, so every run starts warm: its input files are read once (untimed) and dirty pages are
flushed (os.sync, untimed) before it starts.  Then the outputs are checked: both load with
`onnx.load(load_external_data=False)`, hold one GraphfixSoftmax per block, the same-folder one
references the input's data file (nothing copied, the input's files unchanged), the other-folder
copy is byte-identical, and onnxruntime gives the same outputs for the original and the fixed
model (plugin nodes lowered to standard ops).

    python benchmarks/large_model.py                     # ~9 GB of disk under .cache/, removed
    python benchmarks/large_model.py --dir /data/bench --keep
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_CHUNK_ELEMENTS = 4 << 20  # 16 MB of float32 per write while generating
_READ_CHUNK = 8 << 20
DATA_NAME = "model.onnx.data"


@dataclass(frozen=True)
class ModelShape:
    blocks: int = 36
    hidden: int = 1152
    heads: int = 16
    mlp: int = 4304
    seq: int = 8  # sequence length of the graph input (only for the onnxruntime check)

    @property
    def weight_bytes(self) -> int:
        h, m = self.hidden, self.mlp
        per_block = 4 * h * h + 4 * h + 2 * h * m + m + h + 4 * h
        return 4 * per_block * self.blocks


@dataclass(frozen=True)
class GeneratedModel:
    path: Path
    data_file: Path
    shape: ModelShape
    weight_bytes: int


@dataclass(frozen=True)
class Command:
    """A command to time, and what to do (untimed) before each run of it."""

    name: str
    argv: tuple[str, ...]
    before: Callable[[], None] | None = None


@dataclass(frozen=True)
class Measurement:
    name: str
    walls_s: tuple[float, ...]
    peak_rss_bytes: int  # largest over the runs
    output: str  # stdout + stderr of the last run

    @property
    def best_s(self) -> float:
        return min(self.walls_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.walls_s)


@dataclass(frozen=True)
class Row:
    """One line of the table: a measurement, judged against its baseline where it has one."""

    measurement: Measurement | None
    name: str
    compared: str = ""
    target: str = ""
    passed: bool | None = None


def generate_model(folder: Path, shape: ModelShape, *, seed: int = 0) -> GeneratedModel:
    """Write `folder/model.onnx` and its data file, streaming the weights (never all in memory)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, nh = shape.hidden, shape.heads
    if h % nh:
        raise ValueError(f"hidden {h} is not a multiple of heads {nh}")
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array([0, -1, nh, h // nh], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([0, -1, h], np.int64), "hidden_shape"),
        numpy_helper.from_array(np.array((h // nh) ** -0.5, np.float32), "scale"),
    ]
    data_file = folder / DATA_NAME
    with open(data_file, "wb") as stream:

        def weight(name: str, dims: tuple[int, ...], kind: str = "normal") -> str:
            inits.append(_stream_tensor(stream, rng, name, dims, kind))
            return name

        def node(op: str, inputs: list[str], name: str, **attrs) -> str:
            nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
            return name

        x = "pixels_embedded"
        for b in range(shape.blocks):
            p = f"blocks.{b}."
            ln1 = node(
                "LayerNormalization",
                [x, weight(p + "ln1.g", (h,), "ones"), weight(p + "ln1.b", (h,), "zeros")],
                p + "ln1",
                axis=-1,
            )
            heads = {}
            for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
                lin = node("MatMul", [ln1, weight(p + f"{n}.w", (h, h))], p + f"{n}.mm")
                lin = node("Add", [lin, weight(p + f"{n}.b", (h,), "zeros")], p + f"{n}.proj")
                split = node("Reshape", [lin, "heads_shape"], p + f"{n}.split")
                heads[n] = node("Transpose", [split], p + f"{n}.heads", perm=perm)
            scores = node("MatMul", [heads["q"], heads["k"]], p + "qk")
            scaled = node("Mul", [scores, "scale"], p + "qk.scaled")
            probs = node("Softmax", [scaled], p + "softmax", axis=-1)
            ctx = node("MatMul", [probs, heads["v"]], p + "pv")
            ctx = node("Transpose", [ctx], p + "ctx.t", perm=[0, 2, 1, 3])
            ctx = node("Reshape", [ctx, "hidden_shape"], p + "ctx")
            out = node("MatMul", [ctx, weight(p + "o.w", (h, h))], p + "o.mm")
            out = node("Add", [out, weight(p + "o.b", (h,), "zeros")], p + "o.proj")
            x = node("Add", [x, out], p + "attn.residual")
            ln2 = node(
                "LayerNormalization",
                [x, weight(p + "ln2.g", (h,), "ones"), weight(p + "ln2.b", (h,), "zeros")],
                p + "ln2",
                axis=-1,
            )
            up = node("MatMul", [ln2, weight(p + "fc1.w", (h, shape.mlp))], p + "fc1.mm")
            up = node("Add", [up, weight(p + "fc1.b", (shape.mlp,), "zeros")], p + "fc1")
            act = node("Relu", [up], p + "act")
            down = node("MatMul", [act, weight(p + "fc2.w", (shape.mlp, h))], p + "fc2.mm")
            down = node("Add", [down, weight(p + "fc2.b", (h,), "zeros")], p + "fc2")
            x = node("Add", [x, down], p + "mlp.residual")
        weight_bytes = stream.tell()
    graph = helper.make_graph(
        nodes,
        "vit_like",
        [helper.make_tensor_value_info("pixels_embedded", TensorProto.FLOAT, [1, shape.seq, h])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, shape.seq, h])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return GeneratedModel(path, data_file, shape, weight_bytes)


def _stream_tensor(
    stream, rng: np.random.Generator, name: str, dims: tuple[int, ...], kind: str
) -> TensorProto:
    """Append a float32 tensor's bytes to `stream` in chunks; return its external reference."""
    offset = stream.tell()
    remaining = int(np.prod(dims))
    while remaining:
        n = min(remaining, _CHUNK_ELEMENTS)
        if kind == "normal":
            chunk = rng.standard_normal(n, dtype=np.float32)
            chunk *= 0.02
        else:
            chunk = np.full(n, 1.0 if kind == "ones" else 0.0, np.float32)
        stream.write(memoryview(chunk.astype("<f4", copy=False)))
        remaining -= n
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", DATA_NAME),
        ("offset", offset),
        ("length", stream.tell() - offset),
    ):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor


# A child's ru_maxrss also counts the memory of the process that forked it (Linux records the
# pre-exec address space's high-water mark), so commands are started from this bare interpreter
# (about 9 MB) rather than from the benchmark itself; it reports wall time and the peak RSS.
_LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(sys.argv[1], "w") as result:
    result.write(f"{os.waitstatus_to_exitcode(status)} {wall} {usage.ru_maxrss * 1024}")
"""


def measure(
    commands: Sequence[Command], *, warm: Sequence[Path], repeat: int = 1
) -> list[Measurement]:
    """Wall time and peak RSS (ru_maxrss from wait4) of each command, run as a child.

    The commands take turns, `repeat` rounds, so a slow spell of the machine (page-cache
    write-back on a shared VM) hits them alike; every other round runs them in reverse order, so
    that each follows the other as often (what runs right after a 2 GB copy measured slower, in
    either order).  Before each run, untimed: the command's
    `before()` (clearing the previous output), the `warm` files read once into the page cache,
    and os.sync() so earlier runs' dirty pages are not written back on this run's time.
    """
    walls: dict[str, list[float]] = {c.name: [] for c in commands}
    peaks = dict.fromkeys(walls, 0)
    outputs = dict.fromkeys(walls, "")
    for round_ in range(repeat):
        for command in commands if round_ % 2 == 0 else commands[::-1]:
            if command.before is not None:
                command.before()
            for path in warm:
                _read_through(path)
            os.sync()
            wall, rss, outputs[command.name] = _run_once(command)
            walls[command.name].append(wall)
            peaks[command.name] = max(peaks[command.name], rss)
    return [
        Measurement(c.name, tuple(walls[c.name]), peaks[c.name], outputs[c.name]) for c in commands
    ]


def _run_once(command: Command) -> tuple[float, int, str]:
    with tempfile.TemporaryDirectory() as scratch:
        result, log = Path(scratch) / "result", Path(scratch) / "log"
        with open(log, "wb") as stream:
            subprocess.run(
                [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(result), *command.argv],
                stdout=stream,
                stderr=subprocess.STDOUT,
                check=True,
            )
        code, wall, rss = result.read_text().split()
        output = log.read_text(errors="replace")
    if int(code) != 0:
        raise RuntimeError(
            f"{command.name} failed (exit {code}): {' '.join(command.argv)}\n{output}"
        )
    return float(wall), int(rss), output


def _read_through(path: Path) -> None:
    buffer = bytearray(_READ_CHUNK)
    with open(path, "rb", buffering=0) as stream:
        while stream.readinto(buffer):
            pass


def _clear(folder: Path) -> Callable[[], None]:
    def clear() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    return clear


def _unlink(*paths: Path) -> Callable[[], None]:
    def unlink() -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    return unlink


_API_FIX = (
    "import sys; from graphfix.model_io import load_model, save_model; "
    "from graphfix.attention.rewrite import fix_attention; "
    "loaded = load_model(sys.argv[1], load_weights=False); result = fix_attention(loaded.model); "
    "print(result.report.summary()); "
    "print(save_model(result.model, sys.argv[2], source=loaded.path).describe())"
)
_API_IMPORTS = "import graphfix.model_io, graphfix.attention.rewrite"
_ROUND_TRIP = (
    "import sys, onnx; m = onnx.load(sys.argv[1]); "
    "onnx.save(m, sys.argv[2], save_as_external_data=True, location='model.onnx.data')"
)


def fix_argv(model: Path, out: Path, *, driver: str) -> tuple[str, ...]:
    """`graphfix fix MODEL -o OUT`, or the same load → fix → save calls without the CLI."""
    if driver == "api":
        return (sys.executable, "-c", _API_FIX, str(model), str(out))
    return (*_cli(), "fix", str(model), "-o", str(out))


def startup_argv(*, driver: str) -> tuple[str, ...]:
    """What every fix pays before touching the model: interpreter start and imports."""
    if driver == "api":
        return (sys.executable, "-c", _API_IMPORTS)
    return (*_cli(), "fix", "--help")


def _cli() -> tuple[str, ...]:
    script = Path(sys.executable).with_name("graphfix")
    return (str(script),) if script.exists() else (sys.executable, "-m", "graphfix")


def run_benchmark(
    model: GeneratedModel, work: Path, *, repeat: int, driver: str = "cli"
) -> dict[str, Measurement]:
    """Measure both baselines, both fixes and the fixes' start-up floor, taking turns."""
    same_out = model.path.parent / "fixed.onnx"
    other_dir, copy_dir, trip_dir = work / "other", work / "copy", work / "roundtrip"
    cp = ("cp", str(model.data_file), str(copy_dir / DATA_NAME))
    trip = (sys.executable, "-c", _ROUND_TRIP, str(model.path), str(trip_dir / "model.onnx"))
    commands = {
        "copy": Command("plain copy (cp)", cp, _clear(copy_dir)),
        "trip": Command("onnx load+save", trip, _clear(trip_dir)),
        "same": Command(
            "fix, same folder", fix_argv(model.path, same_out, driver=driver), _unlink(same_out)
        ),
        "other": Command(
            "fix, other folder",
            fix_argv(model.path, other_dir / "fixed.onnx", driver=driver),
            _clear(other_dir),
        ),
        "startup": Command("start-up floor", startup_argv(driver=driver)),
    }
    measured = measure(list(commands.values()), warm=[model.path, model.data_file], repeat=repeat)
    return dict(zip(commands, measured, strict=True))


def judge(measured: dict[str, Measurement], weight_bytes: int) -> list[Row]:
    """The table: baselines, each fix against its baseline (best of the runs), peak RSS.

    The start-up floor (interpreter and imports, no model) is every fix's fixed cost; each fix
    also shows its ratio without it, for information (no target).
    """
    trip, copy, floor = measured["trip"], measured["copy"], measured["startup"]
    rows = [Row(copy, copy.name), Row(trip, trip.name)]
    for key, base, limit in (("same", trip, 0.05), ("other", copy, 1.5)):
        m = measured[key]
        best, median = m.best_s / base.best_s, m.median_s / base.median_s
        rows.append(
            Row(m, m.name, f"{best:.3f}x ({median:.3f}x) {base.name}", f"< {limit}x", best < limit)
        )
        share = m.peak_rss_bytes / weight_bytes
        rows.append(Row(None, f"  peak RSS {share:.2%} of the weights", "", "< 5%", share < 0.05))
        work = m.best_s - floor.best_s
        rows.append(
            Row(
                None,
                f"  less start-up floor: {work:.2f} s",
                f"{work / base.best_s:.3f}x {base.name}",
            )
        )
    rows.append(Row(floor, floor.name, f"{floor.best_s / trip.best_s:.3f}x {trip.name}"))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    lines = [
        f"{'run':<34} {'best s':>7} {'median s':>8} {'peak RSS MB':>11}  "
        f"{'vs baseline: best (median)':<36} {'target':<7} result"
    ]
    for row in rows:
        m = row.measurement
        numbers = (
            f"{m.best_s:>7.2f} {m.median_s:>8.2f} {m.peak_rss_bytes / 1e6:>11.1f}"
            if m is not None
            else " " * 28
        )
        result = "" if row.passed is None else ("PASS" if row.passed else "FAIL")
        lines.append(f"{row.name:<34} {numbers}  {row.compared:<36} {row.target:<7} {result}")
    return "\n".join(line.rstrip() for line in lines)


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool


def report_checks(rows: Sequence[Row], checks: Sequence[Check]) -> int:
    """Print each check; the exit status: 1 if a row missed its target or a check failed."""
    for check in checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'} {check.what}")
    failed = [r for r in rows if r.passed is False] + [c for c in checks if not c.ok]
    return 1 if failed else 0


def verify_outputs(
    model: GeneratedModel, work: Path, *, before: os.stat_result, digest: str | None
) -> list[Check]:
    """The outputs load, hold the plugin nodes and place the weights as promised."""
    src = model.path.parent
    same, other = src / "fixed.onnx", work / "other" / "fixed.onnx"
    checks: list[Check] = []
    for label, path in (("same folder", same), ("other folder", other)):
        fixed = onnx.load(str(path), load_external_data=False)
        plugins = sum(n.op_type == "GraphfixSoftmax" for n in fixed.graph.node)
        checks.append(
            Check(
                f"{label}: {plugins} GraphfixSoftmax == {model.shape.blocks} blocks",
                plugins == model.shape.blocks,
            )
        )
        refs = {
            e.value for t in fixed.graph.initializer for e in t.external_data if e.key == "location"
        }
        checks.append(Check(f"{label}: references {sorted(refs)}", refs == {DATA_NAME}))
    listing = sorted(p.name for p in src.iterdir())
    checks.append(
        Check(
            f"same folder: no new data file ({', '.join(listing)})",
            listing == sorted(["model.onnx", DATA_NAME, "fixed.onnx"]),
        )
    )
    after = model.data_file.stat()
    checks.append(
        Check(
            "input data file untouched (inode, size, mtime)",
            (after.st_ino, after.st_size, after.st_mtime_ns)
            == (before.st_ino, before.st_size, before.st_mtime_ns),
        )
    )
    if digest is not None:
        checks.append(
            Check("input data file bytes unchanged (sha256)", _sha256(model.data_file) == digest)
        )
    copied = work / "other" / DATA_NAME
    checks.append(
        Check(
            "other folder: data file is a byte-identical copy, not a link",
            copied.stat().st_ino != after.st_ino
            and filecmp.cmp(copied, model.data_file, shallow=False),
        )
    )
    return checks


def check_outputs_match(model: GeneratedModel) -> Check:
    """onnxruntime reads both models' weights from disk; the fixed one (plugins lowered) agrees."""
    import onnxruntime as ort

    import graphfix
    from graphfix.model_io import load_model, save_model

    fixed = model.path.parent / "fixed.onnx"
    lowered = model.path.parent / "fixed.lowered.onnx"
    save_model(
        graphfix.with_reference_ops(load_model(fixed, load_weights=False).model),
        lowered,
        source=fixed,
        overwrite=True,
    )
    x = np.random.default_rng(1).standard_normal((1, model.shape.seq, model.shape.hidden))
    feeds = {"pixels_embedded": x.astype(np.float32)}
    results = []
    for path in (model.path, lowered):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        results.append(session.run(None, feeds)[0])
        del session
    lowered.unlink()
    err = float(np.max(np.abs(results[0] - results[1])))
    return Check(f"onnxruntime: original vs fixed max |diff| {err:.2e} (<= 1e-4)", err <= 1e-4)


def saved_line(output: str) -> str:
    """The `saved ...` line of graphfix fix's output (where the weights went)."""
    return next((line for line in output.splitlines() if line.startswith("saved ")), "(none)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_READ_CHUNK)
    with open(path, "rb", buffering=0) as stream:
        while n := stream.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = ModelShape()
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="work folder (default: a new folder under the repo's .cache/)",
    )
    parser.add_argument("--blocks", type=int, default=defaults.blocks)
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--mlp", type=int, default=defaults.mlp)
    parser.add_argument("--repeat", type=int, default=5, help="rounds of runs per command")
    parser.add_argument("--no-run", action="store_true", help="skip the onnxruntime comparison")
    parser.add_argument("--no-hash", action="store_true", help="skip hashing the input data file")
    parser.add_argument(
        "--driver",
        choices=("cli", "api"),
        default="cli",
        help="run `graphfix fix` (cli) or the same load/fix/save API calls in a child (api)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args(argv)
    shape = ModelShape(args.blocks, args.hidden, args.heads, args.mlp)
    cache = Path(__file__).resolve().parent.parent / ".cache"
    if args.dir is None:
        cache.mkdir(exist_ok=True)
    work = args.dir or Path(tempfile.mkdtemp(prefix="large_model_", dir=cache))
    try:
        print(
            f"generating {shape.blocks} blocks, {shape.weight_bytes / 1e9:.2f} GB of weights "
            f"in {work}"
        )
        start = time.perf_counter()
        model = generate_model(work / "src", shape)
        print(
            f"  generated in {time.perf_counter() - start:.1f} s: {model.path}, {model.data_file}"
        )
        before = model.data_file.stat()
        digest = None if args.no_hash else _sha256(model.data_file)
        print(
            f"measuring: {args.repeat} rounds, the commands taking turns; every run starts with "
            "its inputs in the page cache and dirty pages flushed (untimed); targets are judged "
            "on the best run of each, the median is shown too"
        )
        measured = run_benchmark(model, work, repeat=args.repeat, driver=args.driver)
        rows = judge(measured, model.weight_bytes)
        print(format_table(rows))
        print(f"weights: {model.weight_bytes / 1e6:.1f} MB; what `graphfix fix` printed:")
        for key in ("same", "other"):
            print(f"  {measured[key].name}: {saved_line(measured[key].output)}")
        checks = verify_outputs(model, work, before=before, digest=digest)
        if not args.no_run:
            checks.append(check_outputs_match(model))
        return report_checks(rows, checks)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
