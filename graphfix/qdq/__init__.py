"""Q/DQ placement lint and fixer for TensorRT explicit quantization (INT8/FP8)."""

from graphfix.qdq.lint import inspect_qdq
from graphfix.qdq.report import (
    BlockCoverage,
    Coverage,
    ErrorCheck,
    Finding,
    NodeCoverage,
    QdqChange,
    QdqFixReport,
    QdqFixResult,
    QdqReport,
    Severity,
)
from graphfix.qdq.rules import RULES, Rule

__all__ = [
    "RULES",
    "BlockCoverage",
    "Coverage",
    "ErrorCheck",
    "Finding",
    "NodeCoverage",
    "QdqChange",
    "QdqFixReport",
    "QdqFixResult",
    "QdqReport",
    "Rule",
    "Severity",
    "inspect_qdq",
]
