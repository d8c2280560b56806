"""Per export: attention blocks, blocks `fused_plugin` makes one GraphfixAttention node, the
kinds the matcher labels them, and why the others fall back.

    GRAPHFIX_CORPUS_DIR=/work/corpus python tools/fusion_table.py [fusion|matcher|model|qdq ...]

Exports come from the tests' corpora (tests/fusion_corpus.py, matcher_corpus.py and its
onnxruntime-quantized copies, model_corpus.py), exported on first use and cached.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fusion_corpus
import matcher_corpus
import model_corpus

import graphfix


def _exports(entries, path_of):
    return lambda: [(e.name, path_of(e)) for e in entries if e.export_error is None]


CORPORA = {
    "fusion": _exports(fusion_corpus.ENTRIES, fusion_corpus.model_path),
    "matcher": _exports(matcher_corpus.ENTRIES, matcher_corpus.model_path),
    "model": _exports(model_corpus.CORPUS, model_corpus.model_path),
    "qdq": lambda: [
        (f"{source}/{tool}", matcher_corpus.quantized_path(source))
        for source, tool in matcher_corpus.QUANTIZED
    ],
}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in CORPORA]
    if unknown:
        print(f"unknown corpus {unknown}; choose from {sorted(CORPORA)}", file=sys.stderr)
        return 2
    total = fused_total = 0
    print(f"{'export':40} {'blocks':>6} {'fused':>5}  kinds / fallback reasons")
    for name in names or ["fusion"]:
        for export, path in CORPORA[name]():
            report = graphfix.fix_attention(path, strategy="fused_plugin").report
            fell_back = [b for b in report.blocks if b.detail.startswith("fell back")]
            fused = len(report.blocks) - len(fell_back)
            kinds = Counter(b.kind.value for b in report.blocks)
            total += len(report.blocks)
            fused_total += fused
            print(
                f"{export:40} {len(report.blocks):6} {fused:5}  "
                + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            )
            for block in fell_back:
                print(f"{'':54}[{block.index}] {block.detail}")
    share = fused_total / total if total else 0.0
    print(f"{'total':40} {total:6} {fused_total:5}  ({share:.1%} fused)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
