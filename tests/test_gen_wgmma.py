"""tools/gen_wgmma.py reproduces the committed wgmma header, and every plugin file its text names
exists (the header is generated: an edit by hand, or a rename of a file it cites, drifts)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "plugins"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_wgmma", REPO / "tools" / "gen_wgmma.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_wgmma_header_is_what_the_generator_writes() -> None:
    generator = _generator()
    assert generator.OUTPUT.read_text() == generator.render()


def test_the_generator_and_its_header_name_only_plugin_files_that_exist() -> None:
    generator = _generator()
    texts = (Path(generator.__file__).read_text(), generator.render())
    named = {
        name for text in texts for name in re.findall(r"graphfix\w+\.(?:cuh|cu|h|cpp)\b", text)
    }
    present = {path.name for path in PLUGINS.rglob("*") if path.is_file()}
    assert named, "the generator names the files it serves"
    assert named <= present, sorted(named - present)
