"""Real exports of the attention forms issue 21 names, for `fused_plugin` and the labels.

GPT-Neo (a finfo.min Where mask with a padding bias), DeBERTa v2, MPT, BLOOM and Falcon
(baddbmm-style: a Reshape between Q·Kᵀ and the Softmax and between the Softmax and P·V), Swin
v2 (a logit scale computed at run time, the CPB MLP's bias; transformers': the window view's
shape computed at run time), GPT-OSS-style sinks after a softcap, PVT v2 and SegFormer
(spatial-reduction attention: keys from a strided conv of the same tokens), NesT (5-D
windows), CaiT (talking heads), Q and K in float32 with V in float16, a model returning its
attention probabilities, and scores also read by `Shape`.  Entries are
`model_corpus.CorpusEntry`s cached in the corpus folder under a key of this file's source, so
editing this file re-exports only these.

    python tests/fusion_corpus.py               # build everything, print name and path
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
def _attention_projections(torch: Any) -> Any:
    """A module with q/k/v/out projections and a `heads` split to [B, H, S, D]."""
    nn = torch.nn

    class Projections(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(EMBED, EMBED)
            self.k = nn.Linear(EMBED, EMBED)
            self.v = nn.Linear(EMBED, EMBED)
            self.out = nn.Linear(EMBED, EMBED)

        def heads(self, x: Any) -> Any:
            return x.view(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

        def merge(self, y: Any) -> Any:
            return self.out(y.transpose(1, 2).reshape(y.shape[0], -1, EMBED))

    return Projections


def _softcap_sink() -> Exportable:
    """GPT-OSS-style sinks after a Gemma-style softcap: the sink logit joins the capped scores
    (the original does not cap it), a causal mask is added, the sink column is sliced off."""
    torch = model_corpus._seeded()

    class Attention(_attention_projections(torch)):
        def __init__(self) -> None:
            super().__init__()
            self.sinks = torch.nn.Parameter(torch.randn(HEADS))
            blocked = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)
            self.register_buffer("causal", blocked, persistent=False)

        def forward(self, x: Any) -> Any:
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
            scores = 30.0 * torch.tanh(scores / 30.0) + self.causal
            sinks = self.sinks.reshape(1, -1, 1, 1).expand(x.shape[0], -1, SEQ, -1)
            probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
            return self.merge(torch.matmul(probs, v))

    return Exportable(Attention().eval(), (torch.randn(BATCH, SEQ, EMBED),), ("x",))


def _mixed_type_v() -> Exportable:
    """Q and K in float32, V from a float16 projection: the probabilities are cast to float16
    for P·V."""
    torch = model_corpus._seeded()

    class Attention(_attention_projections(torch)):
        def __init__(self) -> None:
            super().__init__()
            self.v = self.v.half()

        def forward(self, x: Any) -> Any:
            q, k = self.heads(self.q(x)), self.heads(self.k(x))
            v = self.heads(self.v(x.half()))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
            probs = torch.softmax(scores, dim=-1).half()
            return self.merge(torch.matmul(probs, v).float())

    return Exportable(Attention().eval(), (torch.randn(BATCH, SEQ, EMBED),), ("x",))


def _returns_probabilities() -> Exportable:
    """Eager attention that also returns its probabilities (output_attentions)."""
    torch = model_corpus._seeded()

    class Attention(_attention_projections(torch)):
        def forward(self, x: Any) -> Any:
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            probs = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HEAD_DIM), -1)
            return self.merge(torch.matmul(probs, v)), probs

    return Exportable(Attention().eval(), (torch.randn(BATCH, SEQ, EMBED),), ("x",))


def _scores_shape() -> Exportable:
    """GPT-2 (transformers 4) style: the causal buffer is sliced by the scores' own shape, so
    `Shape` reads the scores (dynamic sequence length)."""
    torch = model_corpus._seeded()
    limit = 16

    class Attention(_attention_projections(torch)):
        def __init__(self) -> None:
            super().__init__()
            keep = torch.tril(torch.ones(limit, limit, dtype=torch.bool)).view(1, 1, limit, limit)
            self.register_buffer("keep", keep, persistent=False)

        def forward(self, x: Any) -> Any:
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
            query_length, key_length = scores.size(-2), scores.size(-1)
            keep = self.keep[:, :, key_length - query_length : key_length, :key_length]
            scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
            return self.merge(torch.matmul(torch.softmax(scores, dim=-1), v))

    return Exportable(
        Attention().eval(),
        (torch.randn(BATCH, SEQ, EMBED),),
        ("x",),
        dynamic_axes={"x": {0: "batch", 1: "sequence"}},
    )


# --- library models -------------------------------------------------------------------------------
def _gpt_neo() -> Exportable:
    """GPT-Neo: `where(causal, s, finfo.min) + padding bias` (legacy: a constant causal mask);
    the padding bias is finfo.min on every causal key of a left-padded row."""
    transformers = model_corpus._transformers()
    config = transformers.GPTNeoConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
    )
    return model_corpus._hf_text_model(config, "eager")


def _deberta_v2() -> Exportable:
    """DeBERTa v2: scores [B·H, S, T] plus the disentangled relative attention (computed from Q,
    K and the position embeddings, its rows unknown to shape inference), viewed [B, H, S, T]
    for the mask and back."""
    transformers = model_corpus._transformers()
    config = transformers.DebertaV2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
    )
    return model_corpus._hf_text_model(config, "eager")


def _mpt_fp16() -> Exportable:
    """MPT in float16: ALiBi (a constant bias) added to the float32 scores, then
    `masked_fill(mask, -65504)`."""
    transformers = model_corpus._transformers()
    config = transformers.MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2)
    plain = model_corpus._hf_text_model(config, "eager")
    return Exportable(plain.module.half(), plain.args, plain.input_names)


def _bloom() -> Exportable:
    """BLOOM: ALiBi through baddbmm on [B·H, S, T] scores, viewed as [B, H, S, T] for the mask
    and back to [B·H, S, T] for P·V."""
    transformers = model_corpus._transformers()
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2)
    return model_corpus._hf_text_model(config, "eager")


def _bloom_fp16() -> Exportable:
    """BLOOM in float16: the views around the float32 softmax (`softmax(dtype=float32)`)."""
    plain = _bloom()
    return Exportable(plain.module.half(), plain.args, plain.input_names)


def _falcon() -> Exportable:
    """Falcon with ALiBi (eager): the scores and probabilities viewed as [B, H, S, T], the ALiBi
    bias added before the scale.  transformers rounds the ALiBi slopes·positions through
    bfloat16, which onnxruntime's CPU Mul cannot run: the export uses the same bias in float32."""
    transformers = model_corpus._transformers()
    torch = model_corpus._seeded()
    from transformers.models.falcon import modeling_falcon

    def float32_alibi(attention_mask: Any, num_heads: int, dtype: Any) -> Any:
        batch, length = attention_mask.shape
        slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1) / num_heads)  # heads: a power of 2
        positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
        return (slopes[:, None] * positions).reshape(batch * num_heads, 1, length).to(dtype)

    modeling_falcon.build_alibi_tensor = float32_alibi
    config = transformers.FalconConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=False,
        bias=True,
    )
    return model_corpus._hf_text_model(config, "eager")


def _image_model(model: Any) -> Exportable:
    torch = model_corpus._seeded()
    return Exportable(model.eval(), (torch.randn(1, 3, 32, 32),), ("image",))


def _hf_image_model(config: Any, model_class: str) -> Exportable:
    """A transformers vision model (eager attention) returning its last hidden state."""
    transformers = model_corpus._transformers()
    torch = model_corpus._seeded()
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values, return_dict=False)[0]

    return _image_model(LastHidden())


def _swin_v2() -> Exportable:
    """timm Swin v2: cosine attention with a learned logit scale (clamped and exponentiated at
    run time) and a relative-position bias from the continuous position MLP (CPB)."""
    timm = model_corpus._timm()
    model_corpus._seeded()
    model = timm.create_model(
        "swinv2_tiny_window8_256",
        pretrained=False,
        img_size=32,
        patch_size=4,
        window_size=4,
        embed_dim=16,
        depths=(2,),
        num_heads=(2,),
        num_classes=10,
    )
    return _image_model(model)


def _hf_swin(config_class: str, model_class: str) -> Exportable:
    """A one-stage transformers Swin on an 8x8 token grid with 4x4 windows (block 1 shifted)."""
    transformers = model_corpus._transformers()
    config = getattr(transformers, config_class)(
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[2],
        num_heads=[2],
        window_size=4,
    )
    return _hf_image_model(config, model_class)


def _swin_v2_hf() -> Exportable:
    """transformers Swin v2: the window view's shape and the window mask are computed at run
    time (legacy), the mask added twice, the logit scale clamped and exponentiated."""
    return _hf_swin("Swinv2Config", "Swinv2Model")


def _swin_hf() -> Exportable:
    """transformers Swin v1: the shifted block views the scores per window for its mask."""
    return _hf_swin("SwinConfig", "SwinModel")


def _pvt_v2() -> Exportable:
    """PVT v2: the keys and values come from a strided conv of the same tokens (sr_ratio 2)."""
    timm = model_corpus._timm()
    model_corpus._seeded()
    model = timm.create_model(
        "pvt_v2_b0",
        pretrained=False,
        embed_dims=(16, 32),
        depths=(1, 1),
        num_heads=(1, 2),
        sr_ratios=(2, 1),
        mlp_ratios=(2, 2),
        num_classes=10,
    )
    return _image_model(model)


def _segformer() -> Exportable:
    """SegFormer (MiT): efficient self-attention with a strided-conv sequence reduction."""
    transformers = model_corpus._transformers()
    config = transformers.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
    )
    return _hf_image_model(config, "SegformerModel")


def _nest() -> Exportable:
    """NesT: attention inside 4 local blocks of 16 tokens, Q, K, V as [B, blocks, H, N, D]."""
    model_corpus._timm()
    model_corpus._seeded()
    from timm.models.nest import Nest

    model = Nest(
        img_size=32,
        patch_size=4,
        num_levels=2,
        embed_dims=(16, 32),
        num_heads=(1, 2),
        depths=(1, 1),
        num_classes=10,
    )
    return _image_model(model)


def _cait() -> Exportable:
    """CaiT: talking-heads self-attention (head-mixing projections before and after the
    Softmax) and class attention (the class token's query over [class, patches])."""
    model_corpus._timm()
    model_corpus._seeded()
    from timm.models.cait import Cait

    model = Cait(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        depth_token_only=1,
        num_classes=10,
    )
    return _image_model(model)


ENTRIES: tuple[CorpusEntry, ...] = (
    *model_corpus._both(_softcap_sink, Expected(causal_attention=1)),
    *model_corpus._both(_mixed_type_v, Expected(self_attention=1)),
    *model_corpus._both(_returns_probabilities, Expected(self_attention=1)),
    model_corpus._both(_scores_shape, Expected(causal_attention=1))[0],
    *model_corpus._both(_gpt_neo, Expected(causal_attention=2), library="transformers"),
    *model_corpus._both(_deberta_v2, Expected(self_attention=2), library="transformers"),
    *model_corpus._both(_mpt_fp16, Expected(causal_attention=2), library="transformers"),
    *model_corpus._both(_bloom, Expected(causal_attention=2), library="transformers"),
    *model_corpus._both(
        _bloom_fp16, Expected(causal_attention=2, dtype="float16"), library="transformers"
    ),
    *model_corpus._both(_falcon, Expected(causal_attention=2), library="transformers"),
    *model_corpus._both(_swin_v2, Expected(self_attention=2), library="timm"),
    *model_corpus._both(_swin_v2_hf, Expected(self_attention=2), library="transformers"),
    *model_corpus._both(_swin_hf, Expected(self_attention=2), library="transformers"),
    *model_corpus._both(_pvt_v2, Expected(self_attention=2), library="timm"),
    *model_corpus._both(_segformer, Expected(self_attention=2), library="transformers"),
    *model_corpus._both(
        _nest,
        Expected(self_attention=2),
        library="timm",
        dynamo_error="onnxscript's scaled_dot_product_attention takes only 4-D Q, K, V",
    ),
    *model_corpus._both(_cait, Expected(self_attention=2, cross_attention=1), library="timm"),
)


def _key(entry_name: str) -> str:
    names = ["torch", "onnx", "onnxscript", "onnxruntime", "transformers", "timm"]
    versions = ",".join(f"{n}={importlib.metadata.version(n)}" for n in names)
    text = "\n".join([entry_name, versions, Path(__file__).read_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_path(entry: CorpusEntry, *, cache_dir: Path | None = None) -> Path:
    """The export of `entry`, cached like model_corpus.model_path but keyed by this file."""
    directory = model_corpus.corpus_dir() if cache_dir is None else cache_dir
    path = directory / f"{entry.name}-f{_key(entry.name)}.onnx"
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


def main(names: list[str]) -> int:
    for entry in ENTRIES:
        if entry.export_error is None and (not names or entry.model in names):
            print(entry.name, model_path(entry), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main(sys.argv[1:]))
