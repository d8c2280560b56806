"""More real exports for the matcher: the chains `tests/model_corpus.py` does not cover.

Masks combined by nn.MultiheadAttention, Swin's shifted windows (a Reshape inside the chain),
Einsum layouts other than bhid,bhjd->bhij, GPT-OSS's attention sinks, and attention quantized
by onnxruntime's `quantize_static` (QuantizeLinear → DequantizeLinear pairs).  Entries are
`model_corpus.CorpusEntry`s, cached in the same folder under a key of this file's source (so
editing this file does not invalidate the main corpus, nor the other way round).

    python tests/matcher_corpus.py               # build everything, print name and path
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import os
import sys
from pathlib import Path
from typing import Any

import model_corpus
from model_corpus import CorpusEntry, Expected, Exportable

BATCH, SEQ, HEADS, HEAD_DIM = 2, 8, 2, 16
EMBED = HEADS * HEAD_DIM


# --- hand-written modules (torch only) -----------------------------------------------------------
def _mha_masks() -> Exportable:
    """nn.MultiheadAttention with a boolean key_padding_mask and a boolean causal attn_mask."""
    torch = model_corpus._seeded()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
            blocked = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
            self.register_buffer("blocked", blocked, persistent=False)

        def forward(self, x: Any, padding: Any) -> Any:
            out, _ = self.attn(
                x, x, x, key_padding_mask=padding, attn_mask=self.blocked, need_weights=False
            )
            return out

    padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    padding[1, -3:] = True  # the second sequence is 3 tokens shorter
    x = torch.randn(BATCH, SEQ, EMBED)
    return Exportable(Block().eval(), (x, padding), ("x", "padding"))


def _masked(fill: str, second: str) -> Exportable:
    """A causal `masked_fill(~tril, fill)` followed by a second mask: "additive" (a float padding
    mask input added) or "bool" (a second masked_fill with a boolean padding input)."""
    torch = model_corpus._seeded()
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(EMBED, 3 * EMBED)
            self.out = nn.Linear(EMBED, EMBED)
            keep = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ)
            self.register_buffer("keep", keep, persistent=False)

        def forward(self, x: Any, padding: Any) -> Any:
            q, k, v = (
                t.view(x.shape[0], SEQ, HEADS, HEAD_DIM).transpose(1, 2)
                for t in self.qkv(x).chunk(3, dim=-1)
            )
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
            value = float("-inf") if fill == "-inf" else torch.finfo(scores.dtype).min
            if second == "bool_then_causal_bias":  # padding by Where, causal by Add
                causal = torch.where(self.keep, 0.0, -10000.0)
                return self.finish(x, scores.masked_fill(padding, value) + causal, v)
            scores = scores.masked_fill(~self.keep, value)
            if second == "additive":
                scores = scores + padding
            else:
                scores = scores.masked_fill(padding, value)
            return self.finish(x, scores, v)

        def finish(self, x: Any, scores: Any, v: Any) -> Any:
            y = torch.matmul(torch.softmax(scores, dim=-1), v)
            return self.out(y.transpose(1, 2).reshape(x.shape[0], SEQ, EMBED))

    blocked = torch.zeros(BATCH, 1, 1, SEQ, dtype=torch.bool)
    blocked[1, ..., -3:] = True
    padding = blocked if second != "additive" else torch.where(blocked, -10000.0, 0.0)
    x = torch.randn(BATCH, SEQ, EMBED)
    return Exportable(Attention().eval(), (x, padding), ("x", "padding"))


def _causal_fill_and_padding() -> Exportable:
    return _masked("-inf", "additive")


def _causal_fill_and_bool_padding() -> Exportable:
    return _masked("-inf", "bool")


def _causal_min_fill_and_padding() -> Exportable:
    return _masked("min", "additive")


def _padding_min_fill_and_causal_bias() -> Exportable:
    return _masked("min", "bool_then_causal_bias")


def _einsum_module(qk: str, pv: str, *, multi_query: bool, bshd: bool = False) -> Exportable:
    """Eager attention written with Einsum in the given equations (Q, K, V and the output laid
    out [B, S, H, D] when `bshd`, else [B, H, S, D]; one shared K/V head when `multi_query`)."""
    torch = model_corpus._seeded()
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(EMBED, EMBED)
            kv_width = HEAD_DIM if multi_query else EMBED
            self.k = nn.Linear(EMBED, kv_width)
            self.v = nn.Linear(EMBED, kv_width)
            self.out = nn.Linear(EMBED, EMBED)

        def split(self, x: Any, heads: int | None) -> Any:
            if heads is None:
                return x  # [B, S, D]: one head shared by all query heads
            x = x.view(x.shape[0], x.shape[1], heads, HEAD_DIM)  # b s h d
            return x if bshd else x.transpose(1, 2)

        def forward(self, x: Any) -> Any:
            q = self.split(self.q(x), HEADS)
            kv_heads = None if multi_query else HEADS
            k = self.split(self.k(x), kv_heads)
            v = self.split(self.v(x), kv_heads)
            scores = torch.einsum(qk, q, k) / math.sqrt(HEAD_DIM)
            probs = torch.softmax(scores, dim=-1)
            y = torch.einsum(pv, probs, v)
            if not bshd:
                y = y.transpose(1, 2)
            return self.out(y.reshape(x.shape[0], x.shape[1], EMBED))

    return Exportable(Attention().eval(), (torch.randn(BATCH, SEQ, EMBED),), ("x",))


def _einsum_bshd() -> Exportable:
    return _einsum_module("bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd", multi_query=False, bshd=True)


def _einsum_letters() -> Exportable:
    return _einsum_module("znid,znjd->znij", "znij,znjd->znid", multi_query=False)


def _einsum_multi_query() -> Exportable:
    return _einsum_module("bhid,bjd->bhij", "bhij,bjd->bhid", multi_query=True)


# --- library models -------------------------------------------------------------------------------
def _swin() -> Exportable:
    """A two-block Swin stage on an 8x8 token grid with 4x4 windows: block 1 is shifted, so its
    scores are viewed as (B, windows, H, N, N), the window mask added, and viewed back."""
    timm = model_corpus._timm()
    torch = model_corpus._seeded()
    model = timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        img_size=32,
        patch_size=4,
        window_size=4,
        embed_dim=16,
        depths=(2,),
        num_heads=(2,),
        num_classes=10,
    ).eval()
    return Exportable(model, (torch.randn(1, 3, 32, 32),), ("image",))


def _gpt_oss_eager() -> Exportable:
    """GPT-OSS: a learned per-head sink logit concatenated to the scores, sliced off after."""
    transformers = model_corpus._transformers()
    config = transformers.GptOssConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        head_dim=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"],
    )
    torch = model_corpus._seeded()
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()

    class DenseMLP(torch.nn.Module):
        """Stands in for the mixture of experts, whose routing loop does not export."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)

        def forward(self, x: Any) -> tuple[Any, None]:
            return self.proj(x), None

    for layer in model.layers:
        layer.mlp = DenseMLP()
    ids, mask = model_corpus._text_inputs(torch, config.vocab_size)
    keys = ("input_ids", "attention_mask")
    return Exportable(model_corpus._first_output(model, keys), (ids, mask), keys)


MHA_NOTE = "torch merges key_padding_mask into attn_mask before SDPA"

ENTRIES: tuple[CorpusEntry, ...] = (
    *model_corpus._both(_causal_fill_and_padding, Expected(causal_attention=1)),
    *model_corpus._both(_causal_fill_and_bool_padding, Expected(causal_attention=1)),
    *model_corpus._both(_causal_min_fill_and_padding, Expected(causal_attention=1)),
    *model_corpus._both(_padding_min_fill_and_causal_bias, Expected(causal_attention=1)),
    *model_corpus._both(_mha_masks, Expected(causal_attention=1), notes=MHA_NOTE),
    *model_corpus._both(_einsum_bshd, Expected(self_attention=1)),
    *model_corpus._both(_einsum_letters, Expected(self_attention=1)),
    *model_corpus._both(_einsum_multi_query, Expected(self_attention=1)),
    *model_corpus._both(_swin, Expected(self_attention=2), library="timm"),
    *model_corpus._both(
        _gpt_oss_eager,
        Expected(causal_attention=2),
        library="transformers",
        legacy_error="the legacy exporter fails on transformers' packed-sequence check",
    ),
)


# --- quantized copies of corpus exports ---------------------------------------------------------------
# (name, source entry name, expected blocks): onnxruntime's quantize_static in QDQ format.
QUANTIZED: tuple[tuple[str, str], ...] = (
    ("sdpa_mask-dynamo18", "ort_qdq"),
    ("bert_eager-legacy17", "ort_qdq"),
)


def _key(entry_name: str) -> str:
    names = ["torch", "onnx", "onnxscript", "onnxruntime", "transformers", "timm"]
    versions = ",".join(f"{n}={importlib.metadata.version(n)}" for n in names)
    text = "\n".join([entry_name, versions, Path(__file__).read_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_path(entry: CorpusEntry, *, cache_dir: Path | None = None) -> Path:
    """The export of `entry`, cached like model_corpus.model_path but keyed by this file."""
    directory = model_corpus.corpus_dir() if cache_dir is None else cache_dir
    path = directory / f"{entry.name}-m{_key(entry.name)}.onnx"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        model_corpus._export(entry.factory(), partial, exporter=entry.exporter, opset=entry.opset)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def quantized_path(source: str, *, cache_dir: Path | None = None) -> Path:
    """`source` (a corpus entry name) quantized by onnxruntime's quantize_static (QDQ, int8
    activations and weights, MinMax calibration on 4 seeded random feeds)."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    directory = model_corpus.corpus_dir() if cache_dir is None else cache_dir
    path = directory / f"{source}-ort_qdq-m{_key(source + '/qdq')}.onnx"
    if path.exists():
        return path
    entry = next(e for e in model_corpus.CORPUS if e.name == source)
    original = model_corpus.model_path(entry, cache_dir=cache_dir)
    model = onnx.load(str(original))
    rng = np.random.default_rng(0)
    feeds = [model_corpus.random_feed(model, rng) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        quantize_static(
            str(original),
            str(partial),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def main() -> int:
    for entry in ENTRIES:
        if entry.export_error is None:
            print(entry.name, model_path(entry))
    for source, _ in QUANTIZED:
        print(source, "quantized", quantized_path(source))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
