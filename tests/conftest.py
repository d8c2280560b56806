"""Fixtures shared by the test modules.

`corpus_dir`: where tests/model_corpus.py caches exported models ($GRAPHFIX_CORPUS_DIR, else
<repo>/.cache/corpus/).  `torchvision_ops`: lets torchvision (imported by transformers, timm,
open_clip and diffusers) load next to a CPU-only torch; request it before importing any of them.
"""

from __future__ import annotations

from pathlib import Path

import model_corpus
import pytest


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return model_corpus.corpus_dir()


@pytest.fixture(scope="session")
def torchvision_ops() -> None:
    model_corpus.define_torchvision_ops()
