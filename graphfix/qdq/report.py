"""What the Q/DQ lint finds and what the fixer changed: frozen records, no graph objects inside."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Severity(str, Enum):
    """How a finding costs speed or accuracy in TensorRT."""

    FLOAT = "float"  # the conv/matmul runs in float: lost from the INT8/FP8 coverage
    SLOW = "slow"  # it runs quantized, but a fusion breaks or reformat layers are added
    ACCURACY = "accuracy"  # it runs quantized, with avoidable quantization error


@dataclass(frozen=True)
class Finding:
    """One rule violation at one node."""

    node: str  # the node the rule is about (compute node, Add, Concat, or the Q/DQ pair's Q)
    rule: str  # a rule id of graphfix.qdq.rules.RULES
    severity: Severity
    detail: str
    fixable: bool  # `fix_qdq` can repair it exactly (or within quantization tolerance)
    block: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "severity": self.severity.value}


@dataclass(frozen=True)
class NodeCoverage:
    """One Conv/ConvTranspose/MatMul/Gemm: its FLOPs and whether it will run quantized."""

    node: str
    op_type: str
    block: str
    flops: int | None  # None when shapes are unknown
    quantized: bool
    precision: str  # "int8", "fp8", "float", ... (the DQ's input type where quantized)
    blocking_rules: tuple[str, ...]  # rules with severity FLOAT that keep it in float


@dataclass(frozen=True)
class BlockCoverage:
    block: str
    flops_quantized: int
    flops_total: int
    nodes: int
    nodes_quantized: int

    @property
    def fraction(self) -> float:
        return self.flops_quantized / self.flops_total if self.flops_total else 0.0


@dataclass(frozen=True)
class Coverage:
    """Share of conv/matmul FLOPs that can run in INT8/FP8, overall and per block."""

    flops_quantized: int
    flops_total: int
    nodes: int
    nodes_quantized: int
    nodes_unknown_flops: int
    blocks: tuple[BlockCoverage, ...]

    @property
    def fraction(self) -> float:
        return self.flops_quantized / self.flops_total if self.flops_total else 0.0

    def to_dict(self) -> dict:
        return {
            "flops_quantized": self.flops_quantized,
            "flops_total": self.flops_total,
            "fraction": round(self.fraction, 6),
            "nodes": self.nodes,
            "nodes_quantized": self.nodes_quantized,
            "nodes_unknown_flops": self.nodes_unknown_flops,
            "blocks": [{**asdict(b), "fraction": round(b.fraction, 6)} for b in self.blocks],
        }


@dataclass(frozen=True)
class QdqReport:
    """Everything `inspect_qdq` found in a model."""

    findings: tuple[Finding, ...]
    nodes: tuple[NodeCoverage, ...]
    coverage: Coverage
    quantizers: int  # QuantizeLinear + DequantizeLinear nodes in the graph
    attention_blocks: int

    def count(self, rule: str) -> int:
        return sum(1 for f in self.findings if f.rule == rule)

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for finding in self.findings:
            counts[finding.rule] = counts.get(finding.rule, 0) + 1
        return counts

    def to_dict(self) -> dict:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "coverage": self.coverage.to_dict(),
            "nodes": [asdict(n) for n in self.nodes],
            "quantizers": self.quantizers,
            "attention_blocks": self.attention_blocks,
            "rule_counts": self.rule_counts(),
        }


@dataclass(frozen=True)
class QdqChange:
    """One edit `fix_qdq` made."""

    rule: str  # the finding's rule it repairs
    action: str  # "bypass", "remove", "merge", "requantize"
    node: str  # the Q (or DQ) node acted on
    detail: str


@dataclass(frozen=True)
class ErrorCheck:
    """Error of the input and of the fixed model against the float model (onnxruntime, same inputs)."""

    reference: str
    before_max_abs: float
    after_max_abs: float
    before_mean_abs: float
    after_mean_abs: float

    @property
    def passed(self) -> bool:
        """The fix made neither the largest nor the mean error worse."""
        return (
            self.after_max_abs <= self.before_max_abs
            and self.after_mean_abs <= self.before_mean_abs
        )


@dataclass(frozen=True)
class QdqFixReport:
    changes: tuple[QdqChange, ...]
    before: QdqReport
    after: QdqReport
    error: ErrorCheck | None = None
    notes: tuple[str, ...] = field(default=())
    refused: tuple[QdqChange, ...] = field(default=())  # fixable, left by the error guard

    @property
    def unfixed(self) -> tuple[Finding, ...]:
        """What is still there after the fix, and why (each finding's detail says)."""
        return self.after.findings

    def to_dict(self) -> dict:
        error = None
        if self.error is not None:
            error = {**asdict(self.error), "passed": self.error.passed}
        return {
            "changes": [asdict(c) for c in self.changes],
            "before": {
                "coverage": self.before.coverage.to_dict(),
                "rule_counts": self.before.rule_counts(),
            },
            "after": {
                "coverage": self.after.coverage.to_dict(),
                "rule_counts": self.after.rule_counts(),
            },
            "unfixed": [f.to_dict() for f in self.unfixed],
            "error": error,
            "refused": [asdict(c) for c in self.refused],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class QdqFixResult:
    model: object  # onnx.ModelProto (typed loosely: this module imports nothing heavy)
    report: QdqFixReport
