"""Exports for norm fusion that the attention corpus (model_corpus.py) does not hold.

At the corpus's opsets (legacy 17, dynamo 18) torch writes LayerNorm as LayerNormalization;
the legacy exporter below opset 17 writes it as ReduceMean/Sub/Pow/Sqrt/Div, which is what
fuse_norms must fuse.  So the real models come again at legacy opset 14, next to small torch
modules for variants no corpus model has (no scale or bias, float16, hand-written norms with
float32 casts, a channels-first LayerNorm that must not fuse, GroupNorm without affine,
torch's own RMSNorm).  Exported once and cached with the corpus (model_corpus.model_path).

    python tests/norm_corpus.py        # build everything, print name, path, seconds
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from typing import Any

import model_corpus as mc
from model_corpus import CorpusEntry, Expected, Exportable

from graphfix.precision.norm_types import NormKind

LEGACY_DECOMPOSED = 14  # the highest opset where the legacy exporter decomposes LayerNorm
HIDDEN = 32


def _layer_norms(dtype: str) -> Exportable:
    """nn.LayerNorm with scale and bias, without either, without bias; over 1 and 2 axes."""
    torch = mc._seeded()
    nn = torch.nn

    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.affine = nn.LayerNorm(HIDDEN)
            self.plain = nn.LayerNorm(HIDDEN, elementwise_affine=False)
            self.no_bias = nn.LayerNorm(HIDDEN, bias=False)
            self.two_axes = nn.LayerNorm((4, HIDDEN))
            for norm in (self.affine, self.no_bias, self.two_axes):
                nn.init.normal_(norm.weight, 1.0, 0.2)
                if norm.bias is not None:
                    nn.init.normal_(norm.bias, 0.0, 0.2)

        def forward(self, x: Any) -> Any:
            y = self.affine(self.proj(x))
            y = self.plain(y * 3.0) + self.no_bias(y)
            return self.two_axes(y)

    element_type = getattr(torch, dtype)
    module = Norms().eval().to(element_type)
    return Exportable(module, (torch.randn(2, 4, HIDDEN, dtype=element_type),), ("x",))


def _layer_norms_fp32() -> Exportable:
    return _layer_norms("float32")


def _layer_norms_fp16() -> Exportable:
    return _layer_norms("float16")


def _manual_norms(dtype: str) -> Exportable:
    """Norms written by hand as libraries do: an HF-style LayerNorm in float32 (casts around
    it), a Gemma-style RMSNorm (`1 + weight`, scaled in float32) and a ConvNeXt-style
    channels-first LayerNorm over axis 1, which LayerNormalization cannot express."""
    torch = mc._seeded()
    nn = torch.nn

    class HandLayerNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(HIDDEN) * 0.2 + 1.0)
            self.bias = nn.Parameter(torch.randn(HIDDEN) * 0.2)

        def forward(self, x: Any) -> Any:
            h = x.to(torch.float32)
            mean = h.mean(-1, keepdim=True)
            var = (h - mean).pow(2).mean(-1, keepdim=True)
            h = (h - mean) / torch.sqrt(var + 1e-6)
            return self.weight * h.to(x.dtype) + self.bias

    class GemmaStyleRMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(HIDDEN) * 0.2)

        def forward(self, x: Any) -> Any:
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (h * (1.0 + self.weight.float())).type_as(x)

    class ChannelsFirstLayerNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(HIDDEN) * 0.2 + 1.0)
            self.bias = nn.Parameter(torch.randn(HIDDEN) * 0.2)

        def forward(self, x: Any) -> Any:
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + 1e-6)
            return self.weight[:, None] * x + self.bias[:, None]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.hand = HandLayerNorm()
            self.gemma = GemmaStyleRMSNorm()
            self.channels_first = ChannelsFirstLayerNorm()

        def forward(self, x: Any) -> Any:
            y = self.gemma(self.hand(self.proj(x)))
            return self.channels_first(y.transpose(1, 2))

    element_type = getattr(torch, dtype)
    module = Block().eval().to(element_type)
    return Exportable(module, (torch.randn(2, 6, HIDDEN, dtype=element_type),), ("x",))


def _manual_norms_fp32() -> Exportable:
    return _manual_norms("float32")


def _manual_norms_fp16() -> Exportable:
    return _manual_norms("float16")


def _group_norms(dtype: str = "float32") -> Exportable:
    """nn.GroupNorm with and without affine, on 4-D and 3-D tensors."""
    torch = mc._seeded()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.affine = nn.GroupNorm(4, 16)
            self.plain = nn.GroupNorm(2, 16, affine=False)
            self.sequence = nn.GroupNorm(8, 16, eps=1e-6)
            nn.init.normal_(self.affine.weight, 1.0, 0.2)
            nn.init.normal_(self.affine.bias, 0.0, 0.2)

        def forward(self, x: Any) -> Any:
            y = self.plain(torch.nn.functional.silu(self.affine(self.conv(x))))
            return self.sequence(y.flatten(2))

    element_type = getattr(torch, dtype)
    module = Net().eval().to(element_type)
    return Exportable(module, (torch.randn(2, 3, 8, 8, dtype=element_type),), ("image",))


def _group_norms_fp16() -> Exportable:
    return _group_norms("float16")


def _rms_norms() -> Exportable:
    """torch's nn.RMSNorm, with and without a weight."""
    torch = mc._seeded()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.weighted = nn.RMSNorm(HIDDEN, eps=1e-6)
            self.plain = nn.RMSNorm(HIDDEN, elementwise_affine=False)
            nn.init.normal_(self.weighted.weight, 1.0, 0.2)

        def forward(self, x: Any) -> Any:
            return self.plain(self.weighted(self.proj(x)) * 2.0)

    return Exportable(Net().eval(), (torch.randn(2, 4, HIDDEN),), ("x",))


def _entry(
    factory: Any, exporter: str, opset: int, expected: Expected, library: str | None = None
) -> CorpusEntry:
    return CorpusEntry(factory.__name__.lstrip("_"), factory, exporter, opset, expected, library)  # type: ignore[arg-type]


NONE = Expected()
NORM_CORPUS: tuple[CorpusEntry, ...] = (
    _entry(_layer_norms_fp32, "legacy", LEGACY_DECOMPOSED, NONE),
    _entry(_layer_norms_fp32, "legacy", 17, NONE),
    _entry(_layer_norms_fp16, "legacy", LEGACY_DECOMPOSED, NONE),
    _entry(_manual_norms_fp32, "legacy", 17, NONE),
    _entry(_manual_norms_fp32, "dynamo", 18, NONE),
    _entry(_manual_norms_fp16, "legacy", 17, NONE),
    _entry(_manual_norms_fp16, "dynamo", 18, NONE),
    _entry(_group_norms, "legacy", 17, NONE),
    _entry(_group_norms, "dynamo", 18, NONE),
    _entry(_group_norms_fp16, "legacy", 17, NONE),
    _entry(_group_norms_fp16, "dynamo", 18, NONE),
    _entry(_rms_norms, "dynamo", 18, NONE),
    _entry(mc._bert_eager, "legacy", LEGACY_DECOMPOSED, Expected(self_attention=2), "transformers"),
    _entry(
        mc._gpt2_eager, "legacy", LEGACY_DECOMPOSED, Expected(causal_attention=2), "transformers"
    ),
    _entry(
        mc._clip_text_eager,
        "legacy",
        LEGACY_DECOMPOSED,
        Expected(causal_attention=2),
        "transformers",
    ),
    _entry(
        mc._whisper_eager,
        "legacy",
        LEGACY_DECOMPOSED,
        Expected(self_attention=1, causal_attention=1, cross_attention=1),
        "transformers",
    ),
    _entry(
        mc._timm_vit_tiny_eager, "legacy", LEGACY_DECOMPOSED, Expected(self_attention=2), "timm"
    ),
    _entry(
        mc._open_clip_text,
        "legacy",
        LEGACY_DECOMPOSED,
        Expected(causal_attention=2),
        "open_clip_torch",
    ),
    _entry(
        mc._unet_eager,
        "legacy",
        LEGACY_DECOMPOSED,
        Expected(self_attention=4, cross_attention=4),
        "diffusers",
    ),
)


# transformers' T5LayerNorm scales by the root mean square and subtracts no mean (its docstring).
RMS_STYLE_LAYER_NORMS = {"T5LayerNorm"}
# Norm modules whose output the exported graph does not use (the exporter drops them), by model.
UNUSED_NORMS = {
    # post_layernorm makes the pooled output; the corpus exports only last_hidden_state
    "clip_vision_eager": {NormKind.LAYER_NORM: 1},
}


def _kind(module: Any) -> NormKind | None:
    import torch

    name = type(module).__name__
    if isinstance(module, torch.nn.GroupNorm) or "GroupNorm" in name:
        return NormKind.GROUP_NORM
    if isinstance(module, torch.nn.RMSNorm) or "RMSNorm" in name or name in RMS_STYLE_LAYER_NORMS:
        return NormKind.RMS_NORM
    if isinstance(module, torch.nn.LayerNorm) or "LayerNorm" in name:
        return NormKind.LAYER_NORM
    return None


@functools.cache
def expected_norms(factory_name: str) -> dict[NormKind, int]:
    """Calls of norm modules (innermost ones only) while the model `factory_name` builds runs
    its example inputs, by kind: a tower the export does not run (open_clip's other tower) is
    not counted, a norm module applied twice is counted twice."""
    import torch

    factory = getattr(mc, factory_name, None) or globals()[factory_name]
    exportable = factory()
    counts: Counter = Counter()
    hooks = []
    for sub in exportable.module.modules():
        kind = _kind(sub)
        if kind is not None and not any(
            _kind(inner) for inner in sub.modules() if inner is not sub
        ):
            hooks.append(sub.register_forward_hook(lambda *_, kind=kind: counts.update([kind])))
    try:
        with torch.no_grad():
            exportable.module(*exportable.args)
    finally:
        for hook in hooks:
            hook.remove()
    unused = UNUSED_NORMS.get(factory_name.lstrip("_"), {})
    return {kind: counts[kind] - unused.get(kind, 0) for kind in NormKind}


def main() -> int:
    failures = 0
    for entry in NORM_CORPUS:
        began = time.perf_counter()
        try:
            path = mc.model_path(entry)
        except Exception as exc:
            failures += 1
            print(f"{entry.name:36} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        print(f"{entry.name:36} {time.perf_counter() - began:6.2f}s  {path}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
