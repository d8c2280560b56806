"""The Hopper kernel's options (GRAPHFIX_ATTENTION_HOPPER_VARIANT bits) against cuDNN SDPA, one run.

For each shape and 16-bit dtype of attention_bench.py: the own path (GRAPHFIX_ATTENTION_BACKEND=
portable) once per distinct variant (bits that cannot change a shape's kernel are dropped: the
causal order only on causal shapes, the key-mask kernel only on masked ones, the warp-specialised
kernel only on unmasked ones, its 128-byte swizzle only where it runs: unmasked at
padded head dims 64 and 256 over more than one key tile, and 128, and the short-key kernel's at
padded head dim 64; bfloat16's float16 P·V only in
bfloat16 where that kernel runs; the short-key kernel only unmasked with at most 128 keys at head
dims up to 64), each timed by CUDA
events and CUDA-graph replay through the host harness, with its max abs error against float64;
torch's cuDNN SDPA timed the same two ways in the same run. Prints one table (graphs ms, own/cudnn)
and writes JSON.

    python benchmarks/attention_variants.py --variants 54,118,182,246 --only Llama,Flux [--json out.json]

With --ncu-cases "SHAPE:DTYPE:VARIANT;...", each such case is also run once under Nsight Compute
(`ncu`, --clock-control none, the Hopper kernel's first launch) and its report printed to
NCU_DIR/<case>.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from attention_bench import (  # noqa: E402
    SHAPES,
    _case_line,
    _inputs,
    _plugin,
    _reference,
    _time_both,
)

from graphfix.plugins.build import (  # noqa: E402
    ATTENTION_HARNESS_NAME,
    build_plugin_harness,
    build_plugins,
    cudnn_runtime_environment,
)

CAUSAL_ORDER, KEY_MASK, LATE_LOADS, TMA, PRODUCER, SWIZZLE = 2, 4, 8, 16, 32, 128
HALF_VALUES = 256  # bfloat16's float16 P·V on the warp-specialised kernel
SHORT_KEYS = 512  # the persistent short-key kernel (keys in <= 2 tiles, head dims <= 64)
# with HALF_VALUES at padded head dim 64: V converted inside the kernel, not by a pass before it
CONVERT_IN_KERNEL = 1024
NCU_SECTIONS = (
    "SpeedOfLight",
    "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "SchedulerStats",
    "WarpStateStats",
)


def _find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu"):
        hits = sorted(Path("/").glob(pattern.lstrip("/")))
        if hits:
            return str(hits[-1])
    return None


def main(argv: list[str] | None = None) -> int:
    import torch  # only on the GPU machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="0,6,14")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--cuda-archs", default=os.environ.get("GRAPHFIX_CUDA_ARCHS", "90"))
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--only", default="")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--ncu-cases", default="")
    parser.add_argument("--ncu-dir", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    environment = cudnn_runtime_environment()
    build_dir = args.build_dir or REPO / ".cache" / f"plugin-build-{args.cuda_archs}"
    library = build_plugins(build_dir=build_dir, cuda_archs=args.cuda_archs).libraries.dynamic
    harness = build_plugin_harness(build_dir=build_dir, target=ATTENTION_HARNESS_NAME)
    variants = [int(v) for v in args.variants.split(",")]
    ncu_cases = {tuple(c.split(":")) for c in args.ncu_cases.split(";") if c}
    ncu = _find_ncu() if ncu_cases else None
    if ncu_cases and ncu is None:
        print("ncu not found: no profiles")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for shape in [s for s in SHAPES if any(o in s.name for o in args.only.split(","))]:
            # the warp-specialised kernel's own bit where the plan gives it the shape (padded
            # head dims 64 and 256 over more than one of its key tiles, 128)
            producer_runs = not shape.padding_mask and (
                (shape.head_dim <= 64 and shape.seq_k > 128)
                or 96 < shape.head_dim <= 128
                or (192 < shape.head_dim <= 256 and shape.seq_k > 64)
            )
            short_runs = not shape.padding_mask and shape.seq_k <= 128 and shape.head_dim <= 64
            relevant = (
                LATE_LOADS
                | TMA
                | (CAUSAL_ORDER if shape.causal else 0)
                | (KEY_MASK if shape.padding_mask else 0)
                | (0 if shape.padding_mask else PRODUCER)
                # (the short-key kernel's tiles are swizzled at padded head dim 64)
                | (SWIZZLE if producer_runs or (short_runs and shape.head_dim > 32) else 0)
                | (SHORT_KEYS if short_runs else 0)
            )
            for dtype in args.dtypes.split(","):
                half_values = HALF_VALUES if dtype == "bfloat16" and producer_runs else 0
                if half_values and shape.head_dim <= 64:
                    half_values |= CONVERT_IN_KERNEL
                mine = sorted({v & (relevant | half_values) for v in variants})
                q, k, v, keep = _inputs(torch, shape, dtype)
                reference = _reference(torch, q, k, v, keep, shape)
                stem = Path(work) / "case"
                head = _case_line(torch, stem, shape, dtype, (q, k, v, keep))
                manifest = Path(work) / "manifest.txt"
                manifest.write_text(head + f"{args.iterations}\n")
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                    cudnn = _time_both(
                        torch,
                        partial(sdpa, q, k, v, attn_mask=keep, is_causal=shape.causal),
                        args.iterations,
                        reference,
                    )
                for variant in mine:
                    env = environment | {
                        "GRAPHFIX_ATTENTION_BACKEND": "portable",
                        "GRAPHFIX_ATTENTION_HOPPER_VARIANT": str(variant),
                    }
                    own, path = _plugin(
                        torch,
                        harness,
                        library,
                        manifest,
                        Path(f"{stem}.out"),
                        env,
                        q,
                        dtype,
                        reference,
                    )
                    row = {
                        "shape": shape.name,
                        "dtype": dtype,
                        "variant": variant,
                        "path": path,
                        "own_graphs_ms": own.graphs_ms,
                        "own_events_ms": own.events_ms,
                        "own_err": own.err,
                        "cudnn_graphs_ms": cudnn.graphs_ms,
                        "cudnn_events_ms": cudnn.events_ms,
                        "cudnn_err": cudnn.err,
                    }
                    rows.append(row)
                    print(_line(row), flush=True)
                    if ncu is not None and (shape.name, dtype, str(variant)) in ncu_cases:
                        _profile(
                            ncu,
                            harness,
                            library,
                            head,
                            work,
                            env,
                            args.ncu_dir,
                            shape.name,
                            dtype,
                            variant,
                        )
                del q, k, v, keep, reference
                torch.cuda.empty_cache()
    print()
    print(_header())
    for row in rows:
        print(_line(row))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _profile(ncu, harness, library, head, work, env, out_dir: Path, name, dtype, variant) -> None:
    manifest = Path(work) / "ncu_manifest.txt"
    manifest.write_text(head + "1\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"ncu_{name.split()[0]}_{dtype}_v{variant}.txt"
    command = [
        ncu,
        "--clock-control",
        "none",
        "--kernel-name",
        "regex:hopper",
        "--launch-count",
        "1",
    ]
    for section in NCU_SECTIONS:
        command += ["--section", section]
    command += [str(harness), "run", "--library", str(library), "--loading", "dynamic"]
    command += ["--manifest", str(manifest)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, check=False, timeout=240
    )
    target.write_text(done.stdout + done.stderr)
    print(f"  ncu {name} {dtype} v{variant}: rc {done.returncode}, {target}", flush=True)


def _header() -> str:
    return (
        f"{'shape':<21} {'dtype':<8} {'var':>3} {'path':<7} {'own gr':>7} {'cudnn gr':>8} {'ratio':>6}"
        f" {'own ev':>7} {'cudnn ev':>8} {'own err':>9} {'cudnn err':>9}"
    )


def _line(r: dict) -> str:
    return (
        f"{r['shape']:<21} {r['dtype']:<8} {r['variant']:>3} {r['path']:<7} {r['own_graphs_ms']:>7.4f}"
        f" {r['cudnn_graphs_ms']:>8.4f} {r['own_graphs_ms'] / r['cudnn_graphs_ms']:>6.2f}"
        f" {r['own_events_ms']:>7.4f} {r['cudnn_events_ms']:>8.4f} {r['own_err']:>9.2e} {r['cudnn_err']:>9.2e}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
