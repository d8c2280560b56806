"""GraphfixAttention speed and accuracy on a GPU, against its baselines measured in the same run.

For each shape and dtype (inputs ~N(0, 1), scale 1/sqrt(D)):
  - plugin:   the plugin's enqueue, through the host harness (TensorRT's plugin interfaces);
  - cudnn:    torch SDPA with SDPBackend.CUDNN_ATTENTION;
  - flash:    torch SDPA with SDPBackend.FLASH_ATTENTION (no arbitrary masks: n/a there);
  - unfused:  the chain in torch, matmul → softmax → matmul, in the I/O dtype;
the median time over CUDA-event-timed runs, and the max abs error of each against a float64
reference computed on the GPU. Target per row: plugin within 1.2x of cudnn's time, error no worse
than cudnn's (ties within 1e-6), never slower than unfused.

    python benchmarks/attention_bench.py [--iterations 30] [--json out.json]
    python benchmarks/attention_bench.py --backend portable --only BERT,cross --dtypes float16,float32

`--backend` sets GRAPHFIX_ATTENTION_BACKEND for the plugin (auto: cuDNN where it can, portable:
the plugin's own kernel); the path column says which one ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphfix.plugins.build import (  # noqa: E402
    ATTENTION_HARNESS_NAME,
    build_plugin_harness,
    build_plugins,
    cudnn_runtime_environment,
)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool = False
    padding_mask: bool = False  # bool key-padding mask [B, 1, 1, T]: the last quarter blocked


SHAPES = (
    Shape("SDXL self", 2, 10, 4096, 4096, 64),
    Shape("SDXL cross", 2, 10, 4096, 77, 64),
    Shape("SigLIP-384 b32", 32, 16, 729, 729, 72),
    Shape("Llama prefill causal", 1, 32, 4096, 4096, 128, causal=True),
    Shape("BERT", 8, 12, 512, 512, 64),
    Shape("BERT padding mask", 8, 12, 512, 512, 64, padding_mask=True),
)
DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class Row:
    shape: str
    dims: str
    dtype: str
    plugin_ms: float
    cudnn_ms: float
    flash_ms: float
    unfused_ms: float
    plugin_err: float
    cudnn_err: float
    flash_err: float
    unfused_err: float
    plugin_path: str

    @property
    def vs_cudnn(self) -> float:
        return self.plugin_ms / self.cudnn_ms if self.cudnn_ms > 0 else math.nan

    def verdict(self) -> str:
        misses = []
        if not self.vs_cudnn <= 1.2:
            misses.append(">1.2x cudnn")
        if not self.plugin_err <= self.cudnn_err + 1e-6:
            misses.append("err > cudnn")
        if not self.plugin_ms <= self.unfused_ms:
            misses.append("slower than unfused")
        return "ok" if not misses else ", ".join(misses)


def _median_ms(torch, launch, iterations: int) -> float:
    for _ in range(3):
        launch()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iterations):
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def _inputs(torch, shape: Shape, dtype: str):
    generator = torch.Generator(device="cuda").manual_seed(0)
    dims_q = (shape.batch, shape.heads, shape.seq_q, shape.head_dim)
    dims_k = (shape.batch, shape.heads, shape.seq_k, shape.head_dim)
    q, k, v = (
        torch.randn(d, device="cuda", generator=generator).to(getattr(torch, dtype))
        for d in (dims_q, dims_k, dims_k)
    )
    keep = None
    if shape.padding_mask:
        keep = torch.ones((shape.batch, 1, 1, shape.seq_k), dtype=torch.bool, device="cuda")
        keep[..., shape.seq_k * 3 // 4 :] = False
    return q, k, v, keep


def _reference(torch, q, k, v, keep, shape: Shape):
    """float64 attention, one batch entry at a time."""
    out = torch.empty(q.shape, dtype=torch.float64, device="cuda")
    scale = 1.0 / math.sqrt(shape.head_dim)
    for b in range(q.shape[0]):
        s = (q[b].double() @ k[b].double().transpose(-1, -2)) * scale
        if keep is not None:
            s = s.masked_fill(~keep[b], -math.inf)
        if shape.causal:
            blocked = torch.ones(s.shape[-2:], dtype=torch.bool, device="cuda").triu(1)
            s = s.masked_fill(blocked, -math.inf)
        out[b] = torch.softmax(s, dim=-1) @ v[b].double()
        del s
    return out


def _unfused(torch, q, k, v, keep, shape: Shape):
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(shape.head_dim))
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    if shape.causal:
        blocked = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(blocked, -math.inf)
    return torch.softmax(s, dim=-1) @ v


def _torch_rows(torch, shape: Shape, dtype: str, iterations: int, reference):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v, keep = _inputs(torch, shape, dtype)
    results = {}
    for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
    ):

        def launch(backend=backend):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, attn_mask=keep, is_causal=shape.causal)

        try:
            with torch.no_grad():
                err = (launch().double() - reference).abs().max().item()
                results[name] = (_median_ms(torch, launch, iterations), err)
        except RuntimeError as error:
            print(f"  {name} n/a for {shape.name} {dtype}: {str(error).splitlines()[0][:120]}")
            results[name] = (math.nan, math.nan)
    with torch.no_grad():
        err = (_unfused(torch, q, k, v, keep, shape).double() - reference).abs().max().item()
        results["unfused"] = (
            _median_ms(torch, lambda: _unfused(torch, q, k, v, keep, shape), iterations),
            err,
        )
    return results


def _write(torch, tensor, path: Path) -> str:
    raw = tensor.contiguous().cpu()
    if raw.dtype == torch.bfloat16:
        raw = raw.view(torch.int16)
    path.write_bytes(raw.numpy().tobytes())
    return ",".join(map(str, tensor.shape))


def main(argv: list[str] | None = None) -> int:
    import torch  # only on the GPU machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--cuda-archs", default=os.environ.get("GRAPHFIX_CUDA_ARCHS", "90"))
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--backend", choices=("auto", "cudnn", "portable"), default="auto")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated")
    parser.add_argument(
        "--only", default="", help="comma-separated: run the shapes whose name contains one"
    )
    args = parser.parse_args(argv)
    environment = cudnn_runtime_environment() | {"GRAPHFIX_ATTENTION_BACKEND": args.backend}

    build_dir = args.build_dir or REPO / ".cache" / f"plugin-build-{args.cuda_archs}"
    library = build_plugins(build_dir=build_dir, cuda_archs=args.cuda_archs).libraries.dynamic
    harness = build_plugin_harness(build_dir=build_dir, target=ATTENTION_HARNESS_NAME)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for shape in [s for s in SHAPES if any(o in s.name for o in args.only.split(","))]:
            for dtype in args.dtypes.split(","):
                q, k, v, keep = _inputs(torch, shape, dtype)
                reference = _reference(torch, q, k, v, keep, shape)
                stem = Path(work) / "case"
                tensors = [
                    f"{dtype}:{_write(torch, x, stem.with_suffix('.' + n))}:{stem.with_suffix('.' + n)}"
                    for n, x in (("q", q), ("k", k), ("v", v))
                ]
                if keep is not None:
                    tensors.append(f"bool:{_write(torch, keep, stem.with_suffix('.m'))}:{stem}.m")
                fields = [
                    f"scale:kFLOAT32:1:{1.0 / math.sqrt(shape.head_dim)!r}",
                    f"causal:kINT32:1:{int(shape.causal)}",
                ]
                manifest = Path(work) / "manifest.txt"
                manifest.write_text(
                    f"{';'.join(fields)}|{';'.join(tensors)}|{stem}.out|{args.iterations}\n"
                )
                done = subprocess.run(
                    [str(harness), "run", "--library", str(library), "--loading", "dynamic"]
                    + ["--manifest", str(manifest)],
                    capture_output=True,
                    text=True,
                    check=False,
                    env=environment,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"harness failed: {done.stdout}{done.stderr}")
                result = json.loads(done.stdout)["cases"][0]
                if result["status"] != 0:
                    raise RuntimeError(f"plugin failed: {result}")
                raw = Path(f"{stem}.out").read_bytes()
                kind = torch.int16 if dtype == "bfloat16" else getattr(torch, dtype)
                out = torch.frombuffer(bytearray(raw), dtype=kind)
                if dtype == "bfloat16":
                    out = out.view(torch.bfloat16)
                out = out.reshape(q.shape).cuda().double()
                plugin_err = (out - reference).abs().max().item()
                notes = [m["text"] for m in result["messages"] if "onShapeChange" in m["text"]]
                path = "cudnn" if notes and notes[-1].endswith("cuDNN SDPA") else "portable"
                del q, k, v, keep, out
                torch_results = _torch_rows(torch, shape, dtype, args.iterations, reference)
                del reference
                torch.cuda.empty_cache()
                dims = f"{shape.batch}x{shape.heads}x{shape.seq_q}x{shape.seq_k}x{shape.head_dim}"
                rows.append(
                    Row(
                        shape=shape.name,
                        dims=dims,
                        dtype=dtype,
                        plugin_ms=result["median_ms"],
                        cudnn_ms=torch_results["cudnn"][0],
                        flash_ms=torch_results["flash"][0],
                        unfused_ms=torch_results["unfused"][0],
                        plugin_err=plugin_err,
                        cudnn_err=torch_results["cudnn"][1],
                        flash_err=torch_results["flash"][1],
                        unfused_err=torch_results["unfused"][1],
                        plugin_path=path,
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


def _table(rows: list[Row]) -> str:
    header = (
        f"{'shape':<21} {'B x H x S x T x D':<19} {'dtype':<8} {'path':<8} {'plugin':>7} "
        f"{'cudnn':>7} {'flash':>7} {'unfused':>7} {'/cudnn':>6}   {'err plugin':>10} "
        f"{'cudnn':>8} {'flash':>8} {'unfused':>8}  target"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.shape:<21} {r.dims:<19} {r.dtype:<8} {r.plugin_path:<8} {r.plugin_ms:>7.3f} "
            f"{r.cudnn_ms:>7.3f} {r.flash_ms:>7.3f} {r.unfused_ms:>7.3f} {r.vs_cudnn:>6.2f}   "
            f"{r.plugin_err:>10.5f} {r.cudnn_err:>8.5f} {r.flash_err:>8.5f} "
            f"{r.unfused_err:>8.5f}  {r.verdict()}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
