"""Real exported models the attention matcher is tested on.

Every entry of `CORPUS` names a model factory (a small, seeded, random-weight model in eval mode
and its example inputs), the exporter and opset it is exported with, and the facts a test should
assert about the exported graph (`Expected`).  `model_path(entry)` exports it once and caches the
file under `corpus_dir()`, keyed by the model, exporter, opset, this file's source and the
versions of the libraries involved, so later runs only read the file.

    python tests/model_corpus.py                 # build everything, print name, path, seconds
    python tests/model_corpus.py --only bert     # entries whose name contains "bert"
    python tests/model_corpus.py --list          # the registry as a table, nothing built

Nothing here imports torch or a model library until a model is actually built.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import io
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cache_dirs

SEED = 0

Exporter = Literal["legacy", "dynamo"]


# --------------------------------------------------------------------------------------------
# Registry types


@dataclass(frozen=True)
class Expected:
    """What the exported graph contains.

    The three kinds are disjoint: `causal_attention` counts causal self-attention blocks,
    `self_attention` the non-causal ones.  `other_softmax` counts Softmax nodes that are not
    attention (classifier heads, routers...) and must be left alone.  `attention_ops` counts ONNX
    `Attention` nodes (opset 23), which are not Softmax chains at all.
    """

    self_attention: int = 0
    cross_attention: int = 0
    causal_attention: int = 0
    dtype: str = "float32"  # at the attention Softmax's input, as AttentionMatch.dtype
    cast_island: bool = False  # Cast→Softmax→Cast: a float16 model computing it in float32
    other_softmax: int = 0
    attention_ops: int = 0

    @property
    def blocks(self) -> int:
        return self.self_attention + self.cross_attention + self.causal_attention

    @property
    def softmax_nodes(self) -> int:
        return self.blocks + self.other_softmax


@dataclass(frozen=True)
class Exportable:
    """A model ready for `torch.onnx.export`: module in eval mode, example inputs, input names."""

    module: Any  # torch.nn.Module; typed loosely so that this file imports without torch
    args: tuple[Any, ...]
    input_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]] | None = None


@dataclass(frozen=True)
class CorpusEntry:
    """One exported model of the corpus."""

    model: str  # the model factory's name without its leading underscore
    factory: Callable[[], Exportable]
    exporter: Exporter
    opset: int
    expected: Expected
    library: str | None = None  # the distribution the model comes from; None: torch only
    export_error: str | None = None  # this exporter cannot export the model: what it says
    notes: str = ""

    @property
    def name(self) -> str:
        return f"{self.model}-{self.exporter}{self.opset}"

    @property
    def slow(self) -> bool:
        """True for models from transformers/timm/diffusers/open_clip (pytest marker `slow`)."""
        return self.library is not None


# --------------------------------------------------------------------------------------------
# Environment: cache directory, the torchvision work-around, exporting


def corpus_dir() -> Path:
    """Where exported models are cached, outside the source tree: $GRAPHFIX_CORPUS_DIR, else
    ~/.cache/graphfix-tests/corpus/ (tests/cache_dirs.py)."""
    return cache_dirs.corpus()


def define_torchvision_ops() -> None:
    """Let a CUDA-built torchvision import next to a CPU-only torch.

    torchvision's Python side registers fake kernels for `torchvision::nms` and `qnms`, whose
    schemas come from its C++ library; when that library cannot load, the import fails with
    "operator torchvision::nms does not exist".  transformers, timm, open_clip and diffusers all
    import torchvision, so this runs before any of them.  Defining the two schemas is enough.
    """
    import torch

    schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):  # defined by torchvision's C++ or a prior call
            torch.library.define(f"torchvision::{op}", schema)


def import_transformers(reason: str) -> tuple[Any, Any]:
    """torch and transformers for a test that exports a model itself (it skips without them)."""
    import pytest

    torch = pytest.importorskip("torch", reason=reason)
    define_torchvision_ops()
    return torch, pytest.importorskip("transformers", reason=reason)


def _versions(entry: CorpusEntry) -> str:
    names = ["torch", "onnx", "onnxscript"]
    if entry.library:
        names.append(entry.library)
    return ",".join(f"{name}={importlib.metadata.version(name)}" for name in names)


def missing_exporters(entry: CorpusEntry) -> list[str]:
    """The distributions exporting `entry` needs (torch, onnxscript, its library) that are absent."""
    missing = []
    for name in ("torch", "onnxscript", entry.library):
        if name is None:
            continue
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def cache_key(entry: CorpusEntry) -> str:
    """A digest of everything the exported file depends on, this file's source included."""
    text = "\n".join([entry.name, _versions(entry), Path(__file__).read_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_path(entry: CorpusEntry, *, cache_dir: Path | None = None) -> Path:
    """The exported model of `entry`, exported now unless a cached file exists.

    Raises whatever the exporter raises; entries with `export_error` are expected to raise.
    """
    missing = missing_exporters(entry)
    if missing:  # the cache key names their versions, so not even a cached file can be found
        import pytest

        pytest.skip(
            f"exporting {entry.name} needs {' and '.join(missing)} (not installed): "
            "pip install torch==2.13.0 -e '.[models]'"
        )
    directory = corpus_dir() if cache_dir is None else cache_dir
    path = directory / f"{entry.name}-{cache_key(entry)}.onnx"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    exportable = entry.factory()
    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        _export(exportable, partial, exporter=entry.exporter, opset=entry.opset)
        partial.replace(path)  # atomic: a concurrent run sees the whole file or none
    finally:
        partial.unlink(missing_ok=True)
    return path


def _export(exportable: Exportable, path: Path, *, exporter: Exporter, opset: int) -> None:
    import torch

    chatter = io.StringIO()  # the dynamo exporter prints its progress on stdout
    with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            exportable.module,
            exportable.args,
            str(path),
            input_names=list(exportable.input_names),
            opset_version=opset,
            dynamo=exporter == "dynamo",
            dynamic_axes=exportable.dynamic_axes,
            external_data=False,
        )


def _seeded() -> Any:
    import torch

    torch.manual_seed(SEED)
    return torch


# --------------------------------------------------------------------------------------------
# Hand-written attention modules (torch only)

BATCH, SEQ, KV_SEQ, HEADS, HEAD_DIM = 2, 8, 12, 2, 16
EMBED = HEADS * HEAD_DIM


def _attention_module(
    *,
    core: str,
    cross: bool = False,
    mask: Literal["none", "bool", "additive"] = "none",
    causal: Literal["none", "sdpa", "buffer", "triu"] = "none",
    dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    softmax_in_float32: bool = False,
) -> Exportable:
    """A multi-head attention layer: Q and fused KV projections, heads, `core`, out projection.

    `core` picks how softmax(Q·Kᵀ·scale + mask)·V is written: "sdpa" calls
    F.scaled_dot_product_attention; the others are eager, named by where the scale sits
    ("div", "mul": on Q·Kᵀ; "div_q", "mul_q": on Q), "k_layout" (Kᵀ computed directly in
    [B,H,D,S] layout by a MatMul, no transpose of K), "einsum" (Einsum for both products).
    Both exporters fuse `k.transpose(1, 2).transpose(-2, -1)` into one Transpose(perm=[0,2,3,1]).
    """
    torch = _seeded()
    nn = torch.nn
    functional = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(EMBED, EMBED)
            self.kv = nn.Linear(EMBED, 2 * EMBED)
            self.k_by_head = nn.Parameter(torch.randn(HEADS, HEAD_DIM, EMBED) / EMBED)
            self.out = nn.Linear(EMBED, EMBED)
            tril = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool))
            self.register_buffer("causal_keep", tril.view(1, 1, SEQ, SEQ), persistent=False)

        def heads(self, x: Any) -> Any:
            return x.view(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

        def forward(self, x: Any, *extra: Any) -> Any:
            memory = extra[0] if cross else x
            bias = extra[-1] if mask != "none" else None
            q = self.heads(self.q(x))
            k_flat, v_flat = self.kv(memory).chunk(2, dim=-1)
            v = self.heads(v_flat)
            scale = 1.0 / math.sqrt(HEAD_DIM)
            if core == "sdpa":
                y = functional.scaled_dot_product_attention(
                    q, self.heads(k_flat), v, attn_mask=bias, is_causal=causal == "sdpa"
                )
            else:
                y = self.eager(q, k_flat, v, bias, scale, memory)
            y = y.transpose(1, 2).reshape(x.shape[0], x.shape[1], EMBED)
            return self.out(y)

        def eager(self, q: Any, k_flat: Any, v: Any, bias: Any, scale: float, memory: Any) -> Any:
            k = self.heads(k_flat)
            if core == "mul_q":
                q = q * scale
            elif core == "div_q":
                q = q / math.sqrt(HEAD_DIM)
            if core == "einsum":
                scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
            elif core == "k_layout":
                k_t = torch.matmul(self.k_by_head, memory.transpose(1, 2).unsqueeze(1))
                scores = torch.matmul(q, k_t) * scale
            else:
                scores = torch.matmul(q, k.transpose(-2, -1))
            if core == "div":
                scores = scores / math.sqrt(HEAD_DIM)
            elif core == "mul":
                scores = scores * scale
            if causal == "buffer":
                scores = scores.masked_fill(~self.causal_keep, float("-inf"))
            elif causal == "triu":
                length = scores.shape[-1]
                blocked = torch.full((length, length), float("-inf"), dtype=scores.dtype)
                scores = scores + torch.triu(blocked, diagonal=1)
            if bias is not None:
                scores = scores + bias
            if softmax_in_float32:
                probs = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
            else:
                probs = torch.softmax(scores, dim=-1)
            if core == "einsum":
                return torch.einsum("bhqk,bhkd->bhqd", probs, v)
            return torch.matmul(probs, v)

    element_type = getattr(torch, dtype)
    module = Attention().eval().to(element_type)
    x = torch.randn(BATCH, SEQ, EMBED, dtype=element_type)
    args: list[Any] = [x]
    names = ["x"]
    kv_len = SEQ
    if cross:
        kv_len = KV_SEQ
        args.append(torch.randn(BATCH, KV_SEQ, EMBED, dtype=element_type))
        names.append("memory")
    if mask == "bool":
        args.append(torch.rand(BATCH, 1, SEQ, kv_len) > 0.2)
        names.append("mask")
    elif mask == "additive":
        keep = torch.rand(BATCH, 1, 1, kv_len) > 0.2
        args.append(torch.where(keep, 0.0, -10000.0).to(element_type))
        names.append("mask")
    return Exportable(module, tuple(args), tuple(names))


def _sdpa() -> Exportable:
    return _attention_module(core="sdpa")


def _sdpa_mask() -> Exportable:
    return _attention_module(core="sdpa", mask="bool")


def _sdpa_causal() -> Exportable:
    return _attention_module(core="sdpa", causal="sdpa")


def _sdpa_causal_dynamic() -> Exportable:
    plain = _attention_module(core="sdpa", causal="sdpa")
    return Exportable(plain.module, plain.args, plain.input_names, {"x": {0: "batch", 1: "seq"}})


def _sdpa_cross() -> Exportable:
    return _attention_module(core="sdpa", cross=True)


def _eager_div() -> Exportable:
    return _attention_module(core="div")


def _eager_mul() -> Exportable:
    return _attention_module(core="mul")


def _eager_mul_q() -> Exportable:
    return _attention_module(core="mul_q")


def _eager_div_q() -> Exportable:
    return _attention_module(core="div_q")


def _eager_k_layout() -> Exportable:
    return _attention_module(core="k_layout")


def _eager_einsum() -> Exportable:
    return _attention_module(core="einsum")


def _eager_fp16_softmax_fp32() -> Exportable:
    return _attention_module(core="div", mask="additive", dtype="float16", softmax_in_float32=True)


def _eager_bf16() -> Exportable:
    return _attention_module(core="mul", mask="additive", dtype="bfloat16")


def _sdpa_fp16() -> Exportable:
    return _attention_module(core="sdpa", mask="bool", dtype="float16")


def _eager_mask_add() -> Exportable:
    return _attention_module(core="div", mask="additive")


def _eager_cross() -> Exportable:
    return _attention_module(core="mul", cross=True, mask="additive")


def _eager_causal_buffer() -> Exportable:
    return _attention_module(core="div", causal="buffer")


def _eager_causal_triu() -> Exportable:
    return _attention_module(core="div", causal="triu")


# --------------------------------------------------------------------------------------------
# Softmax that is not attention (torch only)


def _classifier_head() -> Exportable:
    torch = _seeded()
    nn = torch.nn
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10), nn.Softmax(dim=-1))
    return Exportable(module.eval(), (torch.randn(2, 16),), ("x",))


def _conv_channel_softmax() -> Exportable:
    torch = _seeded()
    nn = torch.nn
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softmax(dim=1))
    return Exportable(module.eval(), (torch.randn(1, 3, 16, 16),), ("image",))


def _moe_router() -> Exportable:
    torch = _seeded()
    nn = torch.nn

    class Router(nn.Module):
        """Top-2 of 4 experts; the routing weights scale the experts' outputs."""

        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(16, 4, bias=False)
            self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

        def forward(self, x: Any) -> Any:
            weights = torch.softmax(self.gate(x), dim=-1)
            top_weights, top_index = torch.topk(weights, 2, dim=-1)
            outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)
            index = top_index.unsqueeze(-1).expand(*top_index.shape, outputs.shape[-1])
            chosen = torch.gather(outputs, -2, index)
            return (chosen * top_weights.unsqueeze(-1)).sum(dim=-2)

    return Exportable(Router().eval(), (torch.randn(2, 8, 16),), ("x",))


def _softmax_const_matmul() -> Exportable:
    torch = _seeded()
    nn = torch.nn

    class Mixture(nn.Module):
        """softmax(x·W1) · W2: a soft lookup into a learned table, a MatMul with a weight."""

        def __init__(self) -> None:
            super().__init__()
            self.keys = nn.Parameter(torch.randn(16, 32))
            self.table = nn.Parameter(torch.randn(32, 16))

        def forward(self, x: Any) -> Any:
            return torch.matmul(torch.softmax(torch.matmul(x, self.keys), dim=-1), self.table)

    return Exportable(Mixture().eval(), (torch.randn(2, 8, 16),), ("x",))


def _attention_then_classifier() -> Exportable:
    """An attention layer, mean pooling and a classifier head that ends in a Softmax."""
    attention = _attention_module(core="div", mask="additive")
    torch = _seeded()
    nn = torch.nn

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = attention.module
            self.head = nn.Linear(EMBED, 10)

        def forward(self, x: Any, mask: Any) -> Any:
            pooled = self.attention(x, mask).mean(dim=1)
            return torch.softmax(self.head(pooled), dim=-1)

    return Exportable(Classifier().eval(), attention.args, attention.input_names)


# --------------------------------------------------------------------------------------------
# transformers


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    define_torchvision_ops()
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _first_output(model: Any, keys: tuple[str, ...]) -> Any:
    """`model` taking the tensors named `keys` positionally and returning its first output."""
    import torch

    class FirstOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            inputs = dict(zip(keys, tensors, strict=True))
            return self.model(**inputs, use_cache=False, return_dict=False)[0]

    return FirstOutput().eval()


def _text_inputs(torch: Any, vocab: int, *, batch: int = 2, length: int = SEQ) -> tuple[Any, Any]:
    ids = torch.randint(0, vocab, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[-1, -2:] = 0  # right padding on the last row, so the padding mask is not all ones
    return ids, mask


def _hf_text_model(config: Any, attn: str, *, with_mask: bool = True) -> Exportable:
    transformers = _transformers()
    torch = _seeded()
    model = transformers.AutoModel.from_config(config, attn_implementation=attn).eval()
    ids, mask = _text_inputs(torch, config.vocab_size)
    if with_mask:
        keys = ("input_ids", "attention_mask")
        return Exportable(_first_output(model, keys), (ids, mask), keys)
    return Exportable(_first_output(model, ("input_ids",)), (ids,), ("input_ids",))


def _bert_config() -> Any:
    return _transformers().BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )


def _bert_eager() -> Exportable:
    return _hf_text_model(_bert_config(), "eager")


def _bert_sdpa() -> Exportable:
    return _hf_text_model(_bert_config(), "sdpa")


def _gpt2_config() -> Any:
    return _transformers().GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)


def _gpt2_eager() -> Exportable:
    return _hf_text_model(_gpt2_config(), "eager")


def _gpt2_sdpa() -> Exportable:
    return _hf_text_model(_gpt2_config(), "sdpa")


def _llama_config() -> Any:
    return _transformers().LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def _llama_eager() -> Exportable:
    return _hf_text_model(_llama_config(), "eager")


def _llama_sdpa() -> Exportable:
    return _hf_text_model(_llama_config(), "sdpa")


def _llama_eager_no_mask() -> Exportable:
    """No attention_mask: transformers then looks for packed sequences with torch.diff."""
    return _hf_text_model(_llama_config(), "eager", with_mask=False)


def _llama_eager_fp16() -> Exportable:
    plain = _hf_text_model(_llama_config(), "eager")
    return Exportable(plain.module.half(), plain.args, plain.input_names)


def _gemma2_eager() -> Exportable:
    """Gemma 2: tanh soft-capping of the scores; layer 0 has a 4-token sliding window."""
    config = _transformers().Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=4,
        attn_logit_softcapping=50.0,
    )
    return _hf_text_model(config, "eager")


def _clip_text_eager() -> Exportable:
    transformers = _transformers()
    config = transformers.CLIPTextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
    )
    return _hf_text_model(config, "eager", with_mask=False)


def _clip_vision_eager() -> Exportable:
    transformers = _transformers()
    torch = _seeded()
    config = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    model = transformers.CLIPVisionModel._from_config(config, attn_implementation="eager").eval()
    keys = ("pixel_values",)
    return Exportable(_first_output(model, keys), (torch.randn(1, 3, 32, 32),), keys)


def _t5_eager() -> Exportable:
    transformers = _transformers()
    torch = _seeded()
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
    )
    model = transformers.T5Model._from_config(config, attn_implementation="eager").eval()
    ids, mask = _text_inputs(torch, config.vocab_size)
    decoder_ids = torch.randint(0, config.vocab_size, (2, 6))
    keys = ("input_ids", "attention_mask", "decoder_input_ids")
    return Exportable(_first_output(model, keys), (ids, mask, decoder_ids), keys)


def _whisper_eager() -> Exportable:
    transformers = _transformers()
    torch = _seeded()
    config = transformers.WhisperConfig(
        vocab_size=64,
        num_mel_bins=8,
        encoder_layers=1,
        decoder_layers=1,
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=16,
        pad_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = transformers.WhisperModel._from_config(config, attn_implementation="eager").eval()
    features = torch.randn(1, 8, 32)
    decoder_ids, decoder_mask = _text_inputs(torch, config.vocab_size, batch=1, length=6)
    keys = ("input_features", "decoder_input_ids", "decoder_attention_mask")
    return Exportable(_first_output(model, keys), (features, decoder_ids, decoder_mask), keys)


# --------------------------------------------------------------------------------------------
# timm, open_clip, diffusers


def _timm() -> Any:
    define_torchvision_ops()
    import timm

    return timm


def _timm_vit(name: str, *, fused: bool) -> Exportable:
    timm = _timm()
    torch = _seeded()
    model = timm.create_model(
        name,
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=4,
        num_classes=10,
    ).eval()
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused
    return Exportable(model, (torch.randn(1, 3, 32, 32),), ("image",))


def _timm_vit_tiny() -> Exportable:
    return _timm_vit("vit_tiny_patch16_224", fused=True)


def _timm_vit_tiny_eager() -> Exportable:
    return _timm_vit("vit_tiny_patch16_224", fused=False)


def _timm_siglip() -> Exportable:
    return _timm_vit("vit_base_patch16_siglip_224", fused=True)


def _timm_siglip_eager() -> Exportable:
    return _timm_vit("vit_base_patch16_siglip_224", fused=False)


def _open_clip_model() -> Any:
    define_torchvision_ops()
    import open_clip

    _seeded()
    vision = {"layers": 2, "width": 32, "head_width": 8, "image_size": 32, "patch_size": 8}
    text = {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 4, "layers": 2}
    return open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text).eval()


def _open_clip_tower(method: str, example: Any, name: str, *, no_grad: bool = False) -> Exportable:
    """One tower of a tiny open_clip CLIP.  Under `no_grad`, nn.MultiheadAttention (which
    open_clip uses) takes its fused fast path, `aten::_native_multi_head_attention`."""
    import torch

    model = _open_clip_model()

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.clip = model

        def forward(self, x: Any) -> Any:
            with torch.set_grad_enabled(not no_grad):
                return getattr(self.clip, method)(x)

    return Exportable(Tower().eval(), (example,), (name,))


def _open_clip_image() -> Exportable:
    torch = _seeded()
    return _open_clip_tower("encode_image", torch.randn(1, 3, 32, 32), "image")


def _open_clip_image_no_grad() -> Exportable:
    torch = _seeded()
    return _open_clip_tower("encode_image", torch.randn(1, 3, 32, 32), "image", no_grad=True)


def _open_clip_text() -> Exportable:
    torch = _seeded()
    return _open_clip_tower("encode_text", torch.randint(0, 64, (2, 16)), "text")


def _diffusers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    define_torchvision_ops()
    import diffusers

    diffusers.logging.set_verbosity_error()
    return diffusers


def _unet(*, eager: bool) -> Exportable:
    diffusers = _diffusers()
    torch = _seeded()
    unet = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=8,
    ).eval()
    if eager:
        from diffusers.models.attention_processor import AttnProcessor

        unet.set_attn_processor(AttnProcessor())

    class Denoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample: Any, timestep: Any, context: Any) -> Any:
            return self.unet(sample, timestep, encoder_hidden_states=context, return_dict=False)[0]

    args = (torch.randn(1, 4, 8, 8), torch.tensor(10), torch.randn(1, 77, 32))
    return Exportable(Denoiser().eval(), args, ("sample", "timestep", "context"))


def _unet_sdpa() -> Exportable:
    return _unet(eager=False)


def _unet_eager() -> Exportable:
    return _unet(eager=True)


def _vae() -> Exportable:
    diffusers = _diffusers()
    torch = _seeded()
    vae = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    ).eval()

    class Autoencoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vae = vae

        def forward(self, image: Any) -> Any:
            return self.vae(image, return_dict=False)[0]

    return Exportable(Autoencoder().eval(), (torch.randn(1, 3, 16, 16),), ("image",))


# --------------------------------------------------------------------------------------------
# The registry

LEGACY_OPSET = 17  # the legacy exporter's opset for every model but the SDPA opset sweep
LEGACY_OPSETS = (14, 17, 18)
DYNAMO_OPSET = 18
ONE_SELF = Expected(self_attention=1)


def _both(
    factory: Callable[[], Exportable],
    expected: Expected,
    *,
    dynamo_expected: Expected | None = None,
    library: str | None = None,
    legacy_error: str | None = None,
    dynamo_error: str | None = None,
    notes: str = "",
) -> tuple[CorpusEntry, ...]:
    """Entries for the legacy exporter (LEGACY_OPSET) and the dynamo exporter (DYNAMO_OPSET).

    `dynamo_expected` (None: same as `expected`) is for graphs that differ by exporter.
    """
    model = factory.__name__.lstrip("_")
    dynamo = expected if dynamo_expected is None else dynamo_expected
    return (
        CorpusEntry(model, factory, "legacy", LEGACY_OPSET, expected, library, legacy_error, notes),
        CorpusEntry(model, factory, "dynamo", DYNAMO_OPSET, dynamo, library, dynamo_error, notes),
    )


def _all_opsets(factory: Callable[[], Exportable], expected: Expected) -> tuple[CorpusEntry, ...]:
    """Entries for the legacy exporter at every opset of LEGACY_OPSETS, and dynamo."""
    model = factory.__name__.lstrip("_")
    legacy = tuple(
        CorpusEntry(model, factory, "legacy", opset, expected) for opset in LEGACY_OPSETS
    )
    return (*legacy, CorpusEntry(model, factory, "dynamo", DYNAMO_OPSET, expected))


CORPUS: tuple[CorpusEntry, ...] = (
    *_all_opsets(_sdpa, ONE_SELF),
    *_all_opsets(_sdpa_mask, ONE_SELF),
    *_both(_sdpa_causal, Expected(causal_attention=1)),
    *_both(_sdpa_causal_dynamic, Expected(causal_attention=1)),
    *_both(_sdpa_cross, Expected(cross_attention=1)),
    CorpusEntry(
        "sdpa_mask",
        _sdpa_mask,
        "dynamo",
        23,
        Expected(attention_ops=1),
        notes="opset 23: the dynamo exporter emits one ONNX Attention node, no Softmax",
    ),
    *_both(_eager_div, ONE_SELF),
    *_both(_eager_mul, ONE_SELF),
    *_both(_eager_mul_q, ONE_SELF),
    *_both(_eager_div_q, ONE_SELF),
    *_both(_eager_k_layout, ONE_SELF),
    *_both(_eager_einsum, ONE_SELF),
    *_both(_eager_fp16_softmax_fp32, Expected(self_attention=1, cast_island=True)),
    *_both(_eager_bf16, Expected(self_attention=1, dtype="bfloat16")),
    *_both(
        _sdpa_fp16,
        Expected(self_attention=1, dtype="float32"),
        dynamo_expected=Expected(self_attention=1, dtype="float16"),
        notes="legacy: Q·Kᵀ is Cast to float32 before the bool-mask Add, and everything after "
        "(softmax, V, output projection) runs in float32",
    ),
    *_both(_eager_mask_add, ONE_SELF),
    *_both(_eager_cross, Expected(cross_attention=1)),
    *_both(_eager_causal_buffer, Expected(causal_attention=1)),
    *_both(_eager_causal_triu, Expected(causal_attention=1)),
    *_both(_classifier_head, Expected(other_softmax=1)),
    *_both(_conv_channel_softmax, Expected(other_softmax=1)),
    *_both(_moe_router, Expected(other_softmax=1)),
    *_both(_softmax_const_matmul, Expected(other_softmax=1)),
    *_both(_attention_then_classifier, Expected(self_attention=1, other_softmax=1)),
    *_both(_bert_eager, Expected(self_attention=2), library="transformers"),
    *_both(_bert_sdpa, Expected(self_attention=2), library="transformers"),
    *_both(_gpt2_eager, Expected(causal_attention=2), library="transformers"),
    *_both(_gpt2_sdpa, Expected(causal_attention=2), library="transformers"),
    *_both(_llama_eager, Expected(causal_attention=2), library="transformers"),
    *_both(_llama_sdpa, Expected(causal_attention=2), library="transformers"),
    *_both(
        _llama_eager_no_mask,
        Expected(causal_attention=2),
        library="transformers",
        legacy_error="UnsupportedOperatorError: Exporting the operator 'aten::diff' to ONNX "
        "opset version 17 is not supported",
    ),
    *_both(
        _llama_eager_fp16,
        Expected(causal_attention=2, dtype="float16"),
        library="transformers",
    ),
    *_both(_gemma2_eager, Expected(causal_attention=2), library="transformers"),
    *_both(_clip_text_eager, Expected(causal_attention=2), library="transformers"),
    *_both(_clip_vision_eager, Expected(self_attention=2), library="transformers"),
    *_both(
        _t5_eager,
        Expected(self_attention=2, causal_attention=2, cross_attention=2),
        library="transformers",
    ),
    *_both(
        _whisper_eager,
        Expected(self_attention=1, causal_attention=1, cross_attention=1),
        library="transformers",
    ),
    *_both(_timm_vit_tiny, Expected(self_attention=2), library="timm"),
    *_both(_timm_vit_tiny_eager, Expected(self_attention=2), library="timm"),
    *_both(_timm_siglip, Expected(self_attention=2, cross_attention=1), library="timm"),
    *_both(_timm_siglip_eager, Expected(self_attention=2, cross_attention=1), library="timm"),
    *_both(_open_clip_image, Expected(self_attention=2), library="open_clip_torch"),
    *_both(
        _open_clip_image_no_grad,
        Expected(self_attention=2),
        library="open_clip_torch",
        legacy_error="UnsupportedOperatorError: Exporting the operator "
        "'aten::_native_multi_head_attention' to ONNX opset version 17 is not supported",
    ),
    *_both(_open_clip_text, Expected(causal_attention=2), library="open_clip_torch"),
    *_both(_unet_sdpa, Expected(self_attention=4, cross_attention=4), library="diffusers"),
    *_both(_unet_eager, Expected(self_attention=4, cross_attention=4), library="diffusers"),
    *_both(_vae, Expected(self_attention=2), library="diffusers"),
)


def entries(*, only: Iterable[str] = ()) -> tuple[CorpusEntry, ...]:
    """The entries whose name contains one of `only` (all when `only` is empty)."""
    patterns = tuple(only)
    return tuple(e for e in CORPUS if not patterns or any(p in e.name for p in patterns))


# --------------------------------------------------------------------------------------------
# Inputs

DYNAMIC_DIM = 5  # the size fed for a named (dynamic) dimension, unlike the export's example


def random_feed(model: Any, rng: Any) -> dict[str, Any]:
    """Random values for an ONNX model's graph inputs (`rng`: a numpy Generator).

    Normal floats, 0/1 integers (token ids, attention masks, timesteps), mostly-true booleans.
    """
    import numpy as np
    import onnx

    constants = {init.name for init in model.graph.initializer}
    feed = {}
    for value in model.graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else DYNAMIC_DIM for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype == np.bool_:
            feed[value.name] = rng.random(shape) > 0.2
        elif np.issubdtype(dtype, np.integer):
            feed[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feed[value.name] = rng.standard_normal(shape).astype(dtype)
    return feed


# --------------------------------------------------------------------------------------------
# Command line


def _describe(entry: CorpusEntry) -> str:
    e = entry.expected
    kinds = f"self={e.self_attention} cross={e.cross_attention} causal={e.causal_attention}"
    extra = " cast_island" if e.cast_island else ""
    extra += f" other_softmax={e.other_softmax}" if e.other_softmax else ""
    extra += f" attention_ops={e.attention_ops}" if e.attention_ops else ""
    extra += f" (export fails: {entry.export_error})" if entry.export_error else ""
    return f"{entry.name:36} {kinds} {e.dtype}{extra}"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (export) the model corpus.")
    parser.add_argument("--only", nargs="*", default=(), help="substrings of entry names")
    parser.add_argument("--list", action="store_true", help="print the registry, build nothing")
    args = parser.parse_args(None if argv is None else list(argv))
    failures = 0
    start = time.perf_counter()
    for entry in entries(only=args.only):
        if args.list:
            print(_describe(entry))
            continue
        began = time.perf_counter()
        try:
            path = model_path(entry)
        except Exception as exc:
            status = "expected failure" if entry.export_error else "FAILED"
            failures += entry.export_error is None
            print(f"{entry.name:36} {status}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        print(f"{entry.name:36} {time.perf_counter() - began:6.2f}s  {path}", flush=True)
    if not args.list:
        print(f"total {time.perf_counter() - start:.1f}s, {failures} unexpected failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
