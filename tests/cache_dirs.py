"""Where the tests keep what they make, outside the source tree.

`root()`: $GRAPHFIX_TEST_CACHE, else $XDG_CACHE_HOME/graphfix-tests, else ~/.cache/graphfix-tests.
Under it: `corpus/` (the exported models, unless $GRAPHFIX_CORPUS_DIR names another folder),
`plugin-build-<archs>-<checkout>/` (the plugin libraries and harnesses, one per checkout) and `nvcc/` (compiles cached by
source hash, tests/compile_cache.py).  CI may keep the folder between runs; deleting it is always
safe (everything in it is rebuilt on demand).
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    configured = os.environ.get("GRAPHFIX_TEST_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "graphfix-tests"


def corpus() -> Path:
    """The exported models' folder: $GRAPHFIX_CORPUS_DIR, else root()/corpus."""
    configured = os.environ.get("GRAPHFIX_CORPUS_DIR")
    return Path(configured) if configured else root() / "corpus"
