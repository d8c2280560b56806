"""`graphfix inspect` and `fix` on a model with embedded weights, against `onnx.load` in one run.

Generates a transformer with its float32 weights embedded in the .onnx (by default 14 blocks of
width 1152, MLP 4304, 16 heads: 853 MB, about the size of the 850 MB model a user reported at
10.8 s / 4.2 GB for inspect and 13.2 s / 5.1 GB for fix), then measures wall time and peak RSS
(each command a child process, `ru_maxrss` from `wait4`, see `large_model.py`) of

    onnx.load           python -c "onnx.load(MODEL)"          the baseline
    inspect             graphfix inspect MODEL                 target <= max(1.5x, +1 s) of it
    fix                 graphfix fix MODEL -o OUT/fixed.onnx   target <= max(1.5x, +1 s) of it
    polygraphy inspect  polygraphy inspect model MODEL        information, where installed

and the peak RSS of inspect and fix against 1.5x the file's size.  Then it checks the fixed
model: it loads, holds one GraphfixSoftmax per block, embeds its weights (no external data) and
every initializer's bytes equal the input's.

    python benchmarks/embedded_model.py                      # ~1.7 GB of disk under .cache/
    python benchmarks/embedded_model.py --blocks 4 --repeat 3 --keep --dir /tmp/bench
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import onnx

_HERE = Path(__file__).resolve().parent


def _large_model():
    """benchmarks/large_model.py: its generator and its child-process measurement."""
    spec = importlib.util.spec_from_file_location("large_model", _HERE / "large_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("large_model", module)  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


lm = _large_model()

_LOAD = "import sys, onnx; onnx.load(sys.argv[1])"
_RATIO, _SLACK_S, _RSS_RATIO = 1.5, 1.0, 1.5


def generate_embedded(folder: Path, shape) -> Path:
    """The generator's model with its external weights embedded into one .onnx file."""
    generated = lm.generate_model(folder / "external", shape)
    model = onnx.load(str(generated.path), load_external_data=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    shutil.rmtree(folder / "external")
    return path


def _polygraphy() -> tuple[str, ...] | None:
    script = Path(sys.executable).with_name("polygraphy")
    return (str(script),) if script.exists() else None


def run_benchmark(model: Path, work: Path, *, repeat: int) -> dict:
    cli = lm._cli()
    out = work / "out"
    commands = {
        "load": lm.Command("onnx.load", (sys.executable, "-c", _LOAD, str(model))),
        "inspect": lm.Command("graphfix inspect", (*cli, "inspect", str(model))),
        "fix": lm.Command(
            "graphfix fix",
            (*cli, "fix", str(model), "-o", str(out / "fixed.onnx")),
            lm._clear(out),
        ),
    }
    polygraphy = _polygraphy()
    if polygraphy is not None:
        commands["polygraphy"] = lm.Command(
            "polygraphy inspect model", (*polygraphy, "inspect", "model", str(model))
        )
    measured = lm.measure(list(commands.values()), warm=[model], repeat=repeat)
    return dict(zip(commands, measured, strict=True))


def judge(measured: dict, file_bytes: int) -> list:
    load = measured["load"]
    rows = [lm.Row(load, load.name)]
    for key in ("inspect", "fix"):
        m = measured[key]
        limit = max(_RATIO * load.best_s, load.best_s + _SLACK_S)
        ratio = m.best_s / load.best_s
        rows.append(
            lm.Row(
                m,
                m.name,
                f"{ratio:.2f}x ({m.median_s / load.median_s:.2f}x) {load.name}",
                f"<= {limit:.2f} s",
                m.best_s <= limit,
            )
        )
        share = m.peak_rss_bytes / file_bytes
        rows.append(
            lm.Row(
                None,
                f"  peak RSS {share:.2f}x the file",
                f"onnx.load: {load.peak_rss_bytes / file_bytes:.2f}x",
                f"<= {_RSS_RATIO}x",
                share <= _RSS_RATIO,
            )
        )
    if "polygraphy" in measured:
        p = measured["polygraphy"]
        rows.append(lm.Row(p, p.name, f"{p.best_s / load.best_s:.2f}x {load.name}"))
    return rows


def verify(model: Path, fixed: Path, blocks: int) -> list:
    """The fixed model loads, has one plugin node per block and the input's weights, embedded."""
    from graphfix.embedded_weights import load_referencing_embedded

    checks = []
    saved = onnx.load(str(fixed), load_external_data=False)
    plugins = sum(n.op_type == "GraphfixSoftmax" for n in saved.graph.node)
    checks.append(lm.Check(f"{plugins} GraphfixSoftmax == {blocks} blocks", plugins == blocks))
    external = [t.name for t in saved.graph.initializer if t.external_data]
    checks.append(lm.Check(f"weights embedded ({len(external)} external)", not external))
    before, after = load_referencing_embedded(model), load_referencing_embedded(fixed)
    same = len(before.graph.initializer) == len(after.graph.initializer) and all(
        _tensor_bytes(a, model) == _tensor_bytes(b, fixed)
        for a, b in zip(before.graph.initializer, after.graph.initializer, strict=True)
    )
    checks.append(
        lm.Check(f"all {len(before.graph.initializer)} initializers byte-identical", same)
    )
    return checks


def _tensor_bytes(tensor: onnx.TensorProto, path: Path) -> bytes:
    if not tensor.external_data:
        return tensor.raw_data
    info = {e.key: e.value for e in tensor.external_data}
    with open(path, "rb") as stream:
        stream.seek(int(info["offset"]))
        return stream.read(int(info["length"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: .cache/)")
    parser.add_argument("--blocks", type=int, default=14)
    parser.add_argument("--hidden", type=int, default=1152)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--mlp", type=int, default=4304)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of runs per command")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args(argv)
    shape = lm.ModelShape(args.blocks, args.hidden, args.heads, args.mlp)
    cache = _HERE.parent / ".cache"
    if args.dir is None:
        cache.mkdir(exist_ok=True)
    work = args.dir or Path(tempfile.mkdtemp(prefix="embedded_model_", dir=cache))
    try:
        start = time.perf_counter()
        model = generate_embedded(work, shape)
        size = model.stat().st_size
        print(
            f"generated {model} ({shape.blocks} blocks, {size / 1e6:.1f} MB, weights embedded) "
            f"in {time.perf_counter() - start:.1f} s"
        )
        print(
            f"measuring: {args.repeat} round(s), the commands taking turns, each a child process "
            "started warm (its input read once, dirty pages flushed, untimed)"
        )
        measured = run_benchmark(model, work, repeat=args.repeat)
        rows = judge(measured, size)
        print(lm.format_table(rows))
        checks = verify(model, work / "out" / "fixed.onnx", shape.blocks)
        return lm.report_checks(rows, checks)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
