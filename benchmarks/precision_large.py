"""`graphfix precision` on a model over 2 GB with external data, against a plain copy of its weights.

Generates the SigLIP-so400m-sized model of benchmarks/large_model.py (2.2 GB of float32 weights
in one external data file), then measures wall time and peak RSS, each as a child process, taking
turns (benchmarks/large_model.py's `measure`: warm page cache, os.sync before each run):

    precision    graphfix precision MODEL -o OTHER/model16.onnx     target ≤ 2× the plain copy
    plain copy   cp of the data file                                  the baseline

and peak RSS of the conversion < 10 % of the weights.  graphfix's bytecode is compiled first
(untimed), as an installed package has it.  Then checks the output: its data file
holds the weights in float16 (half the bytes), the input's files are unchanged, and onnxruntime
gives the float32 model's outputs within float16 tolerance.

    python benchmarks/precision_large.py                  # ~6 GB of disk under .cache/, removed
    python benchmarks/precision_large.py --blocks 3 --hidden 64 --heads 4 --mlp 128   # toy size
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from large_model import (
    DATA_NAME,
    Command,
    ModelShape,
    _clear,
    _cli,
    generate_model,
    measure,
)

RSS_SHARE = 0.10
TIME_FACTOR = 2.0


def run_large(
    shape: ModelShape | None = None, *, folder: Path | None = None, repeat: int = 2
) -> bool:
    """Generate, measure, check and print; True when both targets are met."""
    shape = shape or ModelShape()
    root = Path(tempfile.mkdtemp(prefix="precision-large-", dir=folder))
    try:
        model = generate_model(root / "in", shape)
        out_dir, copy_dir = root / "out", root / "copy"
        out_dir.mkdir()
        copy_dir.mkdir()
        out = out_dir / "model16.onnx"
        commands = [
            Command("plain copy (cp)", ("cp", str(model.data_file), str(copy_dir / DATA_NAME)), _clear(copy_dir)),
            Command(
                "graphfix precision",
                (*_cli(), "precision", str(model.path), "-o", str(out)),
                _clear(out_dir),
            ),
        ]  # fmt: skip
        _compile_bytecode()
        copy, convert = measure(commands, warm=[model.path, model.data_file], repeat=repeat)
        weights = model.weight_bytes
        ratio = convert.best_s / copy.best_s
        rss_share = convert.peak_rss_bytes / weights
        print(
            f"{weights / 1e9:.2f} GB of float32 weights in one external data file; best of {repeat}"
        )
        print(
            f"  plain copy (cp)      {copy.best_s:7.2f} s  peak RSS {copy.peak_rss_bytes / 1e6:8.1f} MB"
        )
        print(
            f"  graphfix precision   {convert.best_s:7.2f} s  peak RSS {convert.peak_rss_bytes / 1e6:8.1f} MB"
            f"  = {ratio:.2f}× the copy (target ≤ {TIME_FACTOR}×), RSS {100 * rss_share:.1f}% of the "
            f"weights (target < {100 * RSS_SHARE:.0f}%)"
        )
        _check(model, out)
        return ratio <= TIME_FACTOR and rss_share < RSS_SHARE
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _compile_bytecode() -> None:
    """Compile graphfix's modules to bytecode first, untimed, as `pip install` does: under
    PYTHONDONTWRITEBYTECODE (set on the development VM) an editable checkout would otherwise
    compile its ~100 modules from source at every start, about 0.15 s of each run."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("graphfix")
    if spec is not None and spec.origin is not None:
        compileall.compile_dir(Path(spec.origin).parent, quiet=1)


def _check(model, out: Path) -> None:
    import onnx
    import onnxruntime as ort

    converted = onnx.load(str(out), load_external_data=False)
    data = out.parent / f"{out.name}.data"
    size = data.stat().st_size
    assert abs(size - model.weight_bytes / 2) < 1024, (size, model.weight_bytes)
    assert {t.data_type for t in converted.graph.initializer if t.dims} <= {
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.INT64,
    }
    print(f"  output: {out.name} + {data.name} ({size / 1e9:.2f} GB float16)")
    if model.weight_bytes > 4 << 30:
        return
    options = ort.SessionOptions()
    options.log_severity_level = 3
    feed = {"pixels_embedded": np.random.default_rng(0).standard_normal((1, model.shape.seq, model.shape.hidden)).astype(np.float32)}  # fmt: skip
    ref = ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]
    got = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]
    error = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    print(f"  onnxruntime: max |float16 - float32| / max |float32| = {error:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = ModelShape()
    for name in ("blocks", "hidden", "heads", "mlp"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--dir", type=Path, default=None, help="where to put the files")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    shape = ModelShape(blocks=args.blocks, hidden=args.hidden, heads=args.heads, mlp=args.mlp)
    return 0 if run_large(shape, folder=args.dir, repeat=args.repeat) else 1


if __name__ == "__main__":
    sys.exit(main())
