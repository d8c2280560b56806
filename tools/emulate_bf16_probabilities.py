"""CPU emulation: how rounding the probabilities to bfloat16 (or float16) moves attention's max error.

The tiled online softmax of GraphfixAttention's kernels (64-key tiles, running max, float32
scores and sums) in float64 with the roundings of its bfloat16 paths: P rounded once, normalised
by the exact sum ("U", as cuDNN and FlashAttention round) or by the rounded one ("R"), and P split
into hi + lo ("split", what the kernels do), and P rounded once to float16 with V in float16
(exact for bfloat16 values of |v| <= 65504; "half", bfloat16's float16 P·V, normalised by the
exact sum as the kernels' float16 path is); each output rounded to bfloat16 and compared with the
float64 reference. "outround" is the reference itself rounded to bfloat16: no result can beat it.
notes/attention_plugin.md ("Missing / next") has what it showed.

    python tools/emulate_bf16_probabilities.py bert 8 3     # shape, heads, seeds
"""

from __future__ import annotations

import math
import sys

import torch

CASES = {
    "sdxl_self": (4096, 4096, 64),
    "sdxl_cross": (4096, 77, 64),
    "siglip": (729, 729, 72),
    "llama": (4096, 4096, 128),
    "bert": (512, 512, 64),
    "bertpad": (512, 512, 64),
    "gemma": (2048, 2048, 256),
    "flux": (4608, 4608, 128),
}


def bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float64)


def f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.float64)


def run(s_len, t, d, *, causal=False, pad=False, heads=2, seed=0, tile=64) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed)
    worst: dict[str, float] = {}
    for _ in range(heads):
        q, k, v = (bf(torch.randn(n, d, generator=g)) for n in (s_len, t, t))
        scale = 1 / math.sqrt(d)
        keep = torch.ones(s_len, t, dtype=torch.bool)
        if pad:
            keep[:, t * 3 // 4 :] = False
        if causal:
            keep &= ~torch.ones(s_len, t, dtype=torch.bool).triu(1)
        s = f32(f32(q @ k.T) * scale).masked_fill(~keep, -math.inf)
        ref = torch.softmax((q @ k.T * scale).masked_fill(~keep, -math.inf), -1) @ v
        m = torch.full((s_len, 1), -math.inf, dtype=torch.float64)
        out = {n: torch.zeros(s_len, d, dtype=torch.float64) for n in ("U", "R", "split", "half")}
        total = {n: torch.zeros(s_len, 1, dtype=torch.float64) for n in out}
        for j in range(0, t, tile):
            st = s[:, j : j + tile]
            new = torch.maximum(m, st.max(-1, keepdim=True).values)
            alpha = torch.exp(m - new).nan_to_num(0.0)
            p = f32(torch.exp(st - new).nan_to_num(0.0))
            hi = bf(p)
            lo = bf(p - hi)
            for n in out:
                out[n] = f32(out[n] * alpha)
                total[n] = f32(total[n] * alpha)
            out["U"] += hi @ v[j : j + tile]
            total["U"] += p.sum(-1, keepdim=True)
            out["R"] += hi @ v[j : j + tile]
            total["R"] += hi.sum(-1, keepdim=True)
            out["split"] += (hi + lo) @ v[j : j + tile]
            total["split"] += p.sum(-1, keepdim=True)
            out["half"] += f16(p) @ f16(v[j : j + tile])
            total["half"] += p.sum(-1, keepdim=True)
            m = new
        for n in out:
            err = (bf(f32(out[n] / total[n])) - ref).abs().max().item()
            worst[n] = max(worst.get(n, 0.0), err)
        worst["outround"] = max(worst.get("outround", 0.0), (bf(ref) - ref).abs().max().item())
    return worst


def main(argv: list[str]) -> int:
    name, heads = argv[0], int(argv[1])
    seeds = int(argv[2]) if len(argv) > 2 else 1
    s_len, t, d = CASES[name]
    for seed in range(seeds):
        got = run(
            s_len,
            t,
            d,
            causal=name in ("llama", "gemma"),
            pad=name == "bertpad",
            heads=heads,
            seed=seed,
        )
        print(name, seed, {k: f"{v:.3e}" for k, v in got.items()}, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
