"""Real exports that contain ONNX `Attention` nodes: torch's dynamo exporter at opset 23.

torch's dynamo exporter writes `F.scaled_dot_product_attention` as one `Attention` node from
opset 23 on (3-D or 4-D inputs, grouped heads, `is_causal`, boolean or float masks, as the model
asks).  The models are model_corpus's factories; entries are cached in the same folder, under
matcher_corpus's key (editing this file invalidates neither corpus).

    python tests/native_corpus.py               # build everything, print name and path
"""

from __future__ import annotations

import sys
from pathlib import Path

import matcher_corpus
import model_corpus
from model_corpus import CorpusEntry, Expected, Exportable

OPSET = 23


def _sdpa_gqa(*, causal: bool) -> Exportable:
    """F.scaled_dot_product_attention with 4 query heads over 2 key/value heads (enable_gqa):
    one Attention node with grouped heads, a boolean mask or is_causal."""
    torch = model_corpus._seeded()

    class Block(torch.nn.Module):
        def forward(self, q, k, v, keep=None):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, is_causal=causal, enable_gqa=True
            )

    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    keep = torch.rand(2, 1, 6, 6) > 0.2
    keep[..., 0] = True
    args, names = (
        ((q, k, v), ("q", "k", "v")) if causal else ((q, k, v, keep), ("q", "k", "v", "keep"))
    )
    return Exportable(Block().eval(), args, names)


def _sdpa_gqa_mask() -> Exportable:
    return _sdpa_gqa(causal=False)


def _sdpa_gqa_causal() -> Exportable:
    return _sdpa_gqa(causal=True)


def _entry(factory, attention_ops: int, library: str | None = None) -> CorpusEntry:
    model = factory.__name__.lstrip("_")
    return CorpusEntry(
        model, factory, "dynamo", OPSET, Expected(attention_ops=attention_ops), library
    )


ENTRIES: tuple[CorpusEntry, ...] = (
    _entry(model_corpus._sdpa, 1),
    _entry(model_corpus._sdpa_causal, 1),
    _entry(model_corpus._sdpa_cross, 1),
    _entry(model_corpus._sdpa_fp16, 1),
    _entry(_sdpa_gqa_mask, 1),
    _entry(_sdpa_gqa_causal, 1),
    _entry(model_corpus._bert_sdpa, 2, "transformers"),
    _entry(model_corpus._llama_sdpa, 2, "transformers"),  # grouped heads: 4 query, 2 key/value
    _entry(model_corpus._timm_vit_tiny, 2, "timm"),
)


def model_path(entry: CorpusEntry, *, cache_dir: Path | None = None) -> Path:
    """The export of `entry`, cached as matcher_corpus caches its own (the entry names differ)."""
    return matcher_corpus.model_path(entry, cache_dir=cache_dir)


if __name__ == "__main__":
    model_corpus.define_torchvision_ops()
    for entry in ENTRIES:
        print(entry.name, model_path(entry), file=sys.stdout)
