"""fuse_norms on every real export of the corpora: norms expected, found, fused, and the error.

For each model of tests/model_corpus.py and tests/norm_corpus.py that holds a norm:
  - expected: norm-module calls while the torch model runs (norm_corpus.expected_norms), by kind;
  - found:    fused + kept + already one op, as fuse_norms reports them;
  - fused:    chains fused at the model's own opset (None: raised to 17 for LayerNorm only);
  - fused@23: chains fused when asked for opset 23 (RMSNormalization, GroupNormalization-21);
  - max |Δ|:  the largest output difference of the opset-23 model from the original under
              onnxruntime's CPU provider (seeded inputs, graph optimisations off);
  - time:     fuse_norms at the model's opset, best of 3, next to onnx-graphsurgeon's
              import_onnx + export_onnx of the same model (the cost of merely viewing it there).

    python benchmarks/norm_fusion.py [--only bert llama]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import model_corpus  # noqa: E402
import norm_corpus  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import graphfix  # noqa: E402
from graphfix.precision.norm_types import NormKind  # noqa: E402

SHORT = {NormKind.LAYER_NORM: "LN", NormKind.RMS_NORM: "RMS", NormKind.GROUP_NORM: "GN"}


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def _run(model: onnx.ModelProto, feed: dict) -> list:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def _by_kind(counts: dict[NormKind, int]) -> str:
    return " ".join(f"{SHORT[k]}{n}" for k, n in counts.items() if n) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=(), help="substrings of entry names")
    args = parser.parse_args(argv)
    import onnx_graphsurgeon as gs

    model_corpus.define_torchvision_ops()
    header = f"{'model':32} {'nodes':>5}  {'expected':10} {'found':10} {'fused':10} {'fused@23':10} {'max |Δ|':>9}  {'fuse_norms':>10}  {'gs view':>8}"
    print(header)
    totals = {"expected": 0, "found": 0, "fused": 0, "fused23": 0}
    for entry in (*model_corpus.CORPUS, *norm_corpus.NORM_CORPUS):
        if entry.export_error or (args.only and not any(o in entry.name for o in args.only)):
            continue
        model = onnx.load(str(model_corpus.model_path(entry)))
        expected = norm_corpus.expected_norms(f"_{entry.model}")
        if not any(expected.values()):
            continue
        plain = graphfix.fuse_norms(model)
        raised = graphfix.fuse_norms(model, opset=23)
        found = {k: plain.report.found(k) for k in NormKind}
        fused = {k: sum(f.kind is k for f in plain.report.fused) for k in NormKind}
        fused23 = {k: sum(f.kind is k for f in raised.report.fused) for k in NormKind}
        feed = model_corpus.random_feed(model, np.random.default_rng(0))
        error = max(
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            for a, b in zip(_run(model, feed), _run(raised.model, feed), strict=True)
        )
        fuse_s = _best(lambda model=model: graphfix.fuse_norms(model))
        gs_s = _best(lambda model=model: gs.export_onnx(gs.import_onnx(model)))
        print(
            f"{entry.name:32} {len(model.graph.node):5}  {_by_kind(expected):10} {_by_kind(found):10} "
            f"{_by_kind(fused):10} {_by_kind(fused23):10} {error:9.2e}  {fuse_s * 1e3:8.1f}ms  {gs_s * 1e3:6.1f}ms",
            flush=True,
        )
        totals["expected"] += sum(expected.values())
        totals["found"] += sum(found.values())
        totals["fused"] += sum(fused.values())
        totals["fused23"] += sum(fused23.values())
    print(
        f"total: {totals['expected']} norms expected, {totals['found']} found, "
        f"{totals['fused']} fused at the models' opsets, {totals['fused23']} at opset 23"
    )
    return 0 if totals["expected"] == totals["found"] else 1


if __name__ == "__main__":
    sys.exit(main())
