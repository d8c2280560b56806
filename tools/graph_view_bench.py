"""Time graphfix's graph view (GraphIndex over the protobuf) against onnx-graphsurgeon's.

    python tools/graph_view_bench.py model.onnx

Prints, best of 3 runs each: plain producer/consumer maps over the protobuf (the baseline),
GraphIndex with and without its shape inference, `gs.import_onnx` and `gs.export_onnx`.
Weights are not loaded (`load_external_data=False`), as graphfix reads models.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import onnx
import onnx_graphsurgeon as gs

from graphfix.graph.index import GraphIndex


def best_of(run: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(path: str) -> None:
    model = onnx.load(path, load_external_data=False)

    def raw_maps() -> None:
        producer, consumers = {}, {}
        for node in model.graph.node:
            for out in node.output:
                producer[out] = node
            for inp in node.input:
                consumers.setdefault(inp, []).append(node)

    graph = gs.import_onnx(model)
    print(f"{path}: {len(model.graph.node)} nodes")
    print(f"  producer/consumer maps (baseline)  {best_of(raw_maps):.3f} s")
    print(f"  GraphIndex, maps only              {best_of(lambda: GraphIndex(model)):.3f} s")
    print(
        f"  GraphIndex + shape inference       {best_of(lambda: GraphIndex(model).value_info):.3f} s"
    )
    print(f"  gs.import_onnx                     {best_of(lambda: gs.import_onnx(model)):.3f} s")
    print(f"  gs.export_onnx                     {best_of(lambda: gs.export_onnx(graph)):.3f} s")


if __name__ == "__main__":
    main(sys.argv[1])
