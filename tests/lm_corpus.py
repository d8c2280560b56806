"""Tiny causal language models (random weights, transformers configs) for `validate`'s defaults.

Issue 19 measured `validate` failing these families after `graphfix precision` only because its
default attention_mask was random 0/1.  Each is exported by both exporters through
`model_corpus`'s machinery, cached in the corpus dir under a folder keyed by this file's source
(so editing it re-exports these models only, not the main corpus).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import model_corpus
from model_corpus import CorpusEntry, Expected, Exportable

_SIZES = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def _causal(config_name: str, **extra: Any) -> Exportable:
    config = getattr(model_corpus._transformers(), config_name)(**{**_SIZES, **extra})
    return model_corpus._hf_text_model(config, "eager")


def _qwen2() -> Exportable:
    return _causal("Qwen2Config")


def _qwen3() -> Exportable:
    return _causal("Qwen3Config", head_dim=8)


def _phi3() -> Exportable:
    return _causal("Phi3Config", pad_token_id=0)


def _gemma3() -> Exportable:
    """Gemma 3 text: local (sliding window 4) and global layers."""
    return _causal("Gemma3TextConfig", head_dim=8, sliding_window=4)


def _mistral_sliding() -> Exportable:
    return _causal("MistralConfig", sliding_window=4)


def _opt() -> Exportable:
    config = model_corpus._transformers().OPTConfig(
        vocab_size=64,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    )
    return model_corpus._hf_text_model(config, "eager")


CAUSAL_LMS: tuple[CorpusEntry, ...] = tuple(
    entry
    for factory in (_qwen2, _qwen3, _phi3, _gemma3, _mistral_sliding, _opt)
    for entry in model_corpus._both(factory, Expected(causal_attention=2), library="transformers")
)


def model_path(entry: CorpusEntry) -> Path:
    """`entry` exported (or found cached) in a corpus subfolder keyed by this file's source."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return model_corpus.model_path(
        entry, cache_dir=model_corpus.corpus_dir() / f"lm_corpus-{digest}"
    )
