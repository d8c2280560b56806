"""Real exports that contain ONNX `Attention` nodes: torch's dynamo exporter at opset 23.

torch's dynamo exporter writes `F.scaled_dot_product_attention` as one `Attention` node from
opset 23 on (3-D or 4-D inputs, grouped heads, `is_causal`, boolean or float masks, as the model
asks).  The models are model_corpus's factories; entries are cached in the same folder under a
key of this file's and model_corpus's sources (editing this file does not invalidate the main
corpus).

    python tests/native_corpus.py               # build everything, print name and path
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from pathlib import Path

import model_corpus
from model_corpus import CorpusEntry, Expected

OPSET = 23


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
    _entry(model_corpus._bert_sdpa, 2, "transformers"),
    _entry(model_corpus._llama_sdpa, 2, "transformers"),  # grouped heads: 4 query, 2 key/value
    _entry(model_corpus._timm_vit_tiny, 2, "timm"),
)


def _key(entry_name: str) -> str:
    names = ["torch", "onnx", "onnxscript", "transformers", "timm"]
    versions = ",".join(f"{n}={importlib.metadata.version(n)}" for n in names)
    sources = Path(__file__).read_text() + Path(model_corpus.__file__).read_text()
    return hashlib.sha256("\n".join([entry_name, versions, sources]).encode()).hexdigest()[:12]


def model_path(entry: CorpusEntry, *, cache_dir: Path | None = None) -> Path:
    """The export of `entry`, cached like model_corpus.model_path but keyed by this file."""
    directory = model_corpus.corpus_dir() if cache_dir is None else cache_dir
    path = directory / f"{entry.name}-n{_key(entry.name)}.onnx"
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


if __name__ == "__main__":
    model_corpus.define_torchvision_ops()
    for entry in ENTRIES:
        print(entry.name, model_path(entry), file=sys.stdout)
