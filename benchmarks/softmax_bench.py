"""GraphfixSoftmax speed on a GPU, with its baselines measured in the same run.

For each shape and dtype: the plugin's enqueue (through the host harness, TensorRT's plugin
interfaces), torch.softmax on the same tensor, and a device-to-device copy of the same bytes
(torch's copy_ and the harness's cudaMemcpyAsync). Times are medians over CUDA-event-timed runs
that cycle through enough buffers (512 MiB) to keep each run's data out of L2. GB/s counts bytes
read plus bytes written.

    python benchmarks/softmax_bench.py [--iterations 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphfix.plugins.build import build_plugin_harness, build_plugins  # noqa: E402

SHAPES = (
    (2, 10, 4096, 4096),
    (2, 10, 4096, 77),
    (2, 20, 1024, 1024),
    (32, 16, 729, 729),
    (1, 32, 4096, 4096),
    (8, 12, 512, 512),
)
DTYPES = ("float16", "bfloat16", "float32")
ROTATION_BYTES = 512 << 20


@dataclass(frozen=True)
class Row:
    shape: tuple[int, ...]
    dtype: str
    plugin_ms: float
    torch_ms: float
    copy_ms: float
    memcpy_ms: float
    bytes_moved: int

    @property
    def plugin_gbps(self) -> float:
        return self.bytes_moved / self.plugin_ms / 1e6

    @property
    def vs_torch(self) -> float:
        return self.torch_ms / self.plugin_ms

    @property
    def of_copy(self) -> float:
        return self.copy_ms / self.plugin_ms

    def verdict(self) -> str:
        misses = []
        if self.shape[-1] >= 512 and self.of_copy < 0.85:
            misses.append("<85% copy")
        if self.dtype != "float32" and self.shape[-1] == 4096 and self.vs_torch < 2.5:
            misses.append("<2.5x torch")
        if self.vs_torch < 1.0:
            misses.append("slower than torch")
        return "ok" if not misses else ", ".join(misses)


def _median_ms(torch, launch, sets: int, iterations: int) -> float:
    for i in range(3):
        launch(i % sets)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iterations):
        start.record()
        launch(i % sets)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def _torch_times(shape: tuple[int, ...], dtype: str, iterations: int) -> tuple[float, float]:
    import torch

    torch_dtype = getattr(torch, dtype)
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.tensor([], dtype=torch_dtype).element_size()
    sets = max(1, ROTATION_BYTES // (2 * nbytes))
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        (torch.rand(shape, device="cuda", generator=generator) * 16 - 8).to(torch_dtype)
        for _ in range(sets)
    ]
    outputs = [torch.empty_like(x) for x in inputs]
    with torch.no_grad():
        softmax_ms = _median_ms(torch, lambda s: torch.softmax(inputs[s], dim=-1), sets, iterations)
        copy_ms = _median_ms(torch, lambda s: outputs[s].copy_(inputs[s]), sets, iterations)
    return softmax_ms, copy_ms


def _release_torch_memory() -> None:
    import torch

    torch.cuda.empty_cache()


def _plugin_times(
    harness: Path, library: Path, shape: tuple[int, ...], dtype: str, iterations: int
) -> dict:
    done = subprocess.run(
        [str(harness), "bench", "--library", str(library), "--loading", "dynamic"]
        + ["--dtype", dtype, "--dims", ",".join(map(str, shape)), "--axis", "-1"]
        + ["--iterations", str(iterations)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"harness bench failed: {done.stdout}{done.stderr}")
    return json.loads(done.stdout)


def _table(rows: list[Row]) -> str:
    header = (
        f"{'shape':<20} {'dtype':<9} {'plugin ms':>9} {'GB/s':>7} {'torch ms':>9} "
        f"{'x torch':>7} {'copy ms':>8} {'of copy':>7} {'memcpy ms':>9}  target"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{'x'.join(map(str, r.shape)):<20} {r.dtype:<9} {r.plugin_ms:>9.4f} "
            f"{r.plugin_gbps:>7.0f} {r.torch_ms:>9.4f} {r.vs_torch:>7.2f} {r.copy_ms:>8.4f} "
            f"{r.of_copy:>7.0%} {r.memcpy_ms:>9.4f}  {r.verdict()}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--cuda-archs", default=os.environ.get("GRAPHFIX_CUDA_ARCHS", "90"))
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    build_dir = args.build_dir or REPO / ".cache" / f"plugin-build-{args.cuda_archs}"
    library = build_plugins(build_dir=build_dir, cuda_archs=args.cuda_archs).libraries.dynamic
    harness = build_plugin_harness(build_dir=build_dir)

    rows = []
    for shape in SHAPES:
        for dtype in DTYPES:
            plugin = _plugin_times(harness, library, shape, dtype, args.iterations)
            torch_ms, copy_ms = _torch_times(shape, dtype, args.iterations)
            _release_torch_memory()
            rows.append(
                Row(
                    shape=shape,
                    dtype=dtype,
                    plugin_ms=plugin["softmax_ms"],
                    torch_ms=torch_ms,
                    copy_ms=copy_ms,
                    memcpy_ms=plugin["copy_ms"],
                    bytes_moved=plugin["bytes_moved"],
                )
            )
            print(_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(_table(rows))
    if args.json is not None:
        args.json.write_text(
            json.dumps([asdict(r) | {"verdict": r.verdict()} for r in rows], indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
