"""The Q/DQ placement rules TensorRT documents, one small check per rule, each with its source.

Sources (quoted or paraphrased where marked):
[EQ]   TensorRT Developer Guide, "Explicit Quantization" (quantized-types-explicit-quantization.html,
       docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/), sections "Quantized
       Weights", "Q/DQ Layer-Placement Recommendations", "Q/DQ Propagation", "Q/DQ Interaction
       with Plugins"/fusion figures.  Quoted: "When using pre-quantized weights, an
       IDequantizeLayer is required between the weights and the linear operator that uses them."
       Figure captions quoted from the same guide: Fig. 6 "The precision of xf1 is floating-point,
       so the output of the fused convolution is limited to floating-point, and the trailing
       Q-layer cannot be fused with the convolution."; Fig. 8 "An element-wise addition operator is
       fused with the input DQ operators and the output Q operator."; Fig. 9 "The extra pair of
       Q/DQ operators ... forces the separation of the convolution operator from the element-wise
       addition operator."; Fig. 10 "scales of Q1 and Q2 are compared for equality, and if equal,
       they are allowed to propagate backward."  Placement recommendations (paraphrased):
       quantize all inputs of weighted operations (Convolution, Transposed Convolution, GEMM);
       do not quantize their outputs by default; quantize the residual input in skip connections.
[API]  TensorRT C++ API, IDequantizeLayer/IQuantizeLayer::setAxis: per-channel scales lie along
       one axis; for weights it is the output-channel axis (K): 0 for Convolution weights
       [K, C, R, S], 1 for Deconvolution weights [C, K, R, S].  ONNX DequantizeLinear: `axis`
       selects the per-axis scale dimension.
[TREx] TensorRT Engine Explorer lint (NVIDIA/TensorRT tools/experimental/trt-engine-explorer/
       trex/lint.py, removed in TensorRT 11.1): ConvLinter.alignment_lint — "the input and
       outputs channels of a Tensor Core accelerated convolution should be aligned to 8
       (FP32/FP16) or 16 (INT8)"; QDQLinter — "Unfused Quantize/Dequantize nodes are wasteful
       and should be avoided"; ReformatLinter — conversions between float32/16 and INT8 "are a
       red flag".  Its published INT8 engines use 32-wide vectorised Int8 layouts (NC/32HW32).
[MO]   ModelOpt ONNX PTQ (modelopt.onnx.quantization.quantize): FP8 mode quantizes "['Conv',
       'Gemm', 'MatMul', 'Residual-Add']"; `disable_mha_qdq` turns off Q/DQ on the attention
       BMMs (MHA); `passes=['concat_elimination']` gives a Concat's inputs one scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from graphfix.qdq.report import Finding, Severity
from graphfix.qdq.view import COMPUTE_OPS, Operand, QdqView, block_of


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str
    source: str
    fixable: str  # what `qdq fix` does about it ("" when it cannot)


RULES: tuple[Rule, ...] = (
    Rule("input-not-quantized", Severity.FLOAT,
         "a Conv/ConvTranspose/MatMul/Gemm activation input has no Q/DQ: the node runs in float",
         "[EQ] quantize all inputs of weighted operations", ""),
    Rule("weight-not-quantized", Severity.FLOAT,
         "the weights reach the node without a DequantizeLinear: the node runs in float",
         "[EQ] Quantized Weights: an IDequantizeLayer is required between weights and operator", ""),
    Rule("weight-per-tensor", Severity.ACCURACY,
         "weights quantized with one scale per tensor instead of per output channel",
         "[EQ]/[API] per-channel weight scales on the output-channel axis; [MO] default", ""),
    Rule("weight-axis", Severity.FLOAT,
         "per-channel weight scales on an axis other than the output-channel axis",
         "[API] setAxis: K axis — 0 for Conv, 1 for ConvTranspose, N for MatMul/Gemm weights", ""),
    Rule("residual-qdq-on-conv-branch", Severity.SLOW,
         "a Q/DQ pair sits between a Conv/GEMM and the residual Add it should fuse with",
         "[EQ] Fig. 9: the extra Q/DQ pair separates the convolution from the addition",
         "bypass the pair for the Add (exact: the Add then reads the float output)"),
    Rule("residual-skip-not-quantized", Severity.SLOW,
         "the skip input of a residual Add after a quantized Conv/GEMM has no Q/DQ",
         "[EQ] quantize the residual input in skip connections; Fig. 6", ""),
    Rule("channels-not-aligned", Severity.SLOW,
         "channel counts of a quantized node are not multiples of 16 (INT8 tensor cores)",
         "[TREx] alignment_lint (16 for INT8; engines use 32-wide Int8 layouts)", ""),
    Rule("concat-scale-mismatch", Severity.SLOW,
         "Q/DQ pairs with different scales feed one Concat: TensorRT must requantize",
         "[EQ] Fig. 10 Q/DQ propagation needs equal scales; [MO] concat_elimination",
         "requantize every input with the scale of the Q that reads the Concat (exact or better)"),
    Rule("qdq-reformat", Severity.SLOW,
         "a Q/DQ pair feeds only float ops (norm, Resize, Softmax, output...): it only adds "
         "reformat layers",
         "[TREx] QDQLinter/ReformatLinter: unfused Q/DQ and float↔INT8 reformats",
         "remove the pair (exact: the consumers read the float tensor)"),
    Rule("myelin-split", Severity.SLOW,
         "a Q/DQ pair inside an attention score chain or a normalization splits what Myelin fuses",
         "[EQ] explicit Q/DQ fix precision conversions exactly where written; [MO] disable_mha_qdq",
         "remove the pair (exact: the fused region reads the float tensor)"),
    Rule("duplicate-quantizer", Severity.SLOW,
         "several Q (or DQ) nodes with identical parameters read one tensor",
         "[TREx] QDQLinter: unfused Quantize/Dequantize layers are wasteful",
         "merge them into one (exact)"),
    Rule("attention-placement", Severity.FLOAT,
         "quantized attention needs Q/DQ before both inputs of the first MatMul, after the "
         "Softmax and on V (and on the second MatMul's output for the out-projection)",
         "[MO] MHA Q/DQ placement (disable_mha_qdq); [EQ] quantize all GEMM inputs", ""),
)  # fmt: skip

RULES_BY_ID = {rule.id: rule for rule in RULES}

# Ops whose inputs and output TensorRT fuses with DQs and a Q into one quantized layer ([EQ] Fig. 1, 8).
QUANTIZABLE_OPS = frozenset({"Add", "Sub", "Mul", "AveragePool", "GlobalAveragePool", "Concat"})
NORM_OPS = frozenset(
    {"InstanceNormalization", "LayerNormalization", "GroupNormalization", "BatchNormalization"}
)
_NORM_STATISTICS = frozenset({"ReduceMean", "Pow", "Sqrt", "Reciprocal", "InstanceNormalization"})
ALIGNMENT = 16


@dataclass(frozen=True)
class ComputeOperands:
    activations: tuple[Operand, ...]
    weight: Operand | None
    weight_axis: int | None  # the output-channel axis the weight's per-channel scales must use


@dataclass(frozen=True)
class AttentionSite:
    """An attention chain as the lint needs it (node names as the view labels them)."""

    qk: str
    pv: str
    softmax: str
    chain: frozenset[str]  # QK MatMul .. Softmax (the score path)


class LintContext:
    """Everything the checks share: the view, compute operands, attention sites."""

    def __init__(self, view: QdqView, attention: tuple[AttentionSite, ...]) -> None:
        self.view = view
        self.attention = attention
        self.compute = [n for n in view.nodes if n.op_type in COMPUTE_OPS]
        self.operands = {view.label(n): compute_operands(view, n) for n in self.compute}
        self.attention_nodes = {s.qk: s for s in attention} | {s.pv: s for s in attention}
        self.quantized = {
            view.label(n)
            for n in self.compute
            if not _blocking(view, n, self.operands[view.label(n)])
        }

    def finding(
        self, rule_id: str, node: str, detail: str, *, fixable: bool | None = None
    ) -> Finding:
        rule = RULES_BY_ID[rule_id]
        return Finding(
            node=node,
            rule=rule_id,
            severity=rule.severity,
            detail=detail,
            fixable=bool(rule.fixable) if fixable is None else fixable,
            block=block_of(node),
        )


def compute_operands(view: QdqView, node: onnx.NodeProto) -> ComputeOperands:
    """The activation and weight operands of a compute node and the weight's channel axis."""
    inputs = list(node.input[:2])
    if node.op_type in ("Conv", "ConvTranspose"):
        axis = 0 if node.op_type == "Conv" else 1
        return ComputeOperands((view.operand(inputs[0]),), view.operand(inputs[1]), axis)
    first, second = view.operand(inputs[0]), view.operand(inputs[1])
    if node.op_type == "Gemm":
        if second.constant:
            return ComputeOperands((first,), second, 0 if view.attribute(node, "transB", 0) else 1)
        return ComputeOperands((first, second), None, None)
    if second.constant:  # MatMul x·W: W is [.., K, N], output channels on its last axis
        rank = len(view.shape(inputs[1]) or ()) or 2
        return ComputeOperands((first,), second, rank - 1)
    if first.constant:
        return ComputeOperands((second,), first, None)
    return ComputeOperands((first, second), None, None)


def _weight_axis_ok(view: QdqView, operand: Operand, expected: int | None) -> bool | None:
    """Whether per-channel weight scales lie on `expected` (None: cannot tell)."""
    q = operand.quantizer
    if q is None or not q.per_channel or expected is None:
        return None
    rank = len(view.shape(operand.tensor) or ()) or None
    axis = q.axis
    if operand.path:  # DQ → Transpose → node: follow the permutation; other paths: unknown
        transpose = view.producer(operand.tensor)
        if operand.path != ("Transpose",) or transpose is None:
            return None
        perm = view.attribute(transpose, "perm")
        if perm is None:
            return None
        rank = len(perm)
        axis = list(perm).index(axis % rank)
    if rank is None:
        return None
    return axis % rank == expected % rank


def _blocking(view: QdqView, node: onnx.NodeProto, ops: ComputeOperands) -> bool:
    if any(a.dq is None for a in ops.activations):
        return True
    if ops.weight is not None:
        if ops.weight.dq is None:
            return True
        if _weight_axis_ok(view, ops.weight, ops.weight_axis) is False:
            return True
    return False


# --- checks -----------------------------------------------------------------------------------


def check_operands(ctx: LintContext) -> Iterator[Finding]:
    """input-not-quantized, weight-not-quantized, weight-per-tensor, weight-axis."""
    view = ctx.view
    for node in ctx.compute:
        name = view.label(node)
        ops = ctx.operands[name]
        if name not in ctx.attention_nodes:
            for operand in ops.activations:
                if operand.dq is None:
                    yield ctx.finding(
                        "input-not-quantized",
                        name,
                        f"{node.op_type} input '{operand.tensor}' has no DequantizeLinear "
                        f"(through {', '.join(operand.path) or 'no'} data-movement ops); "
                        f"{_producer_text(view, operand.tensor)}; the node runs in float — "
                        "re-run the quantizer with this node included",
                    )
        weight = ops.weight
        if weight is None:
            continue
        if weight.dq is None:
            yield ctx.finding(
                "weight-not-quantized",
                name,
                f"weights '{weight.tensor}' are float with no DequantizeLinear; the node runs "
                "in float — quantize its weights (per channel)",
            )
            continue
        q = weight.quantizer
        if q is not None and q.scale is not None and not q.per_channel:
            yield ctx.finding(
                "weight-per-tensor",
                name,
                f"weights quantized per tensor ({q.describe()}); per-channel scales on axis "
                f"{ops.weight_axis} keep small output channels accurate — re-quantize with "
                "per-channel weights (ORT per_channel=True; ModelOpt default)",
            )
        if _weight_axis_ok(view, weight, ops.weight_axis) is False:
            yield ctx.finding(
                "weight-axis",
                name,
                f"weight scales are per channel on axis {q.axis} but {node.op_type} needs its "
                f"output-channel axis {ops.weight_axis}; TensorRT cannot fold them into the "
                "kernel — re-quantize on the right axis",
            )


def check_attention(ctx: LintContext) -> Iterator[Finding]:
    """attention-placement: Q/DQ before both QK inputs, after the Softmax, on V."""
    for site in ctx.attention:
        for name, roles in ((site.qk, ("Q", "Kᵀ")), (site.pv, ("softmax output", "V"))):
            ops = ctx.operands.get(name)
            if ops is None:
                continue
            missing = [
                role
                for role, operand in zip(roles, ops.activations, strict=False)
                if operand.dq is None
            ]
            if missing:
                where = "first (Q·Kᵀ)" if name == site.qk else "second (P·V)"
                yield ctx.finding(
                    "attention-placement",
                    name,
                    f"attention {where} MatMul of Softmax '{site.softmax}' lacks Q/DQ on "
                    f"{' and '.join(missing)}; TensorRT's quantized MHA needs Q/DQ on Q and K, "
                    "after the Softmax and on V, so this BMM runs in float",
                )


def _compute_branch(view: QdqView, tensor: str) -> onnx.NodeProto | None:
    """The compute node producing `tensor`, directly or through a constant bias Add."""
    node = view.producer(tensor)
    if node is not None and node.op_type == "Add":
        consts = [i for i in node.input if view.is_constant(i)]
        if len(consts) == 1:
            other = next(i for i in node.input if i not in consts)
            node = view.producer(other)
    return node if node is not None and node.op_type in COMPUTE_OPS else None


def residual_adds(
    ctx: LintContext,
) -> Iterator[tuple[onnx.NodeProto, int, onnx.NodeProto, onnx.NodeProto | None]]:
    """(Add, main input index, compute node, DQ on the main branch or None) per residual Add.

    The main branch is the one TensorRT fuses into the compute node; where both inputs come from
    compute nodes, it is the one computed last (graph order), the other being the skip.
    """
    view = ctx.view
    for add in view.nodes:
        if (
            add.op_type != "Add"
            or len(add.input) != 2
            or any(view.is_constant(i) for i in add.input)
        ):
            continue
        branches = []
        for position, tensor in enumerate(add.input):
            dq = view.producer(tensor)
            via = None
            if view.is_dq(dq) and view.pair_source(dq) is not None:
                via = dq
                tensor = view.pair_source(dq).input[0]
            compute = _compute_branch(view, tensor)
            if compute is not None:
                branches.append((view.index.position(compute), position, compute, via))
        if not branches:
            continue
        _, position, compute, via = max(branches, key=lambda b: b[0])
        yield add, position, compute, via


def _before_pair(view: QdqView, tensor: str) -> str:
    """`tensor`, or the input of the Q → DQ pair that produces it."""
    dq = view.producer(tensor)
    q = view.pair_source(dq) if view.is_dq(dq) else None
    return tensor if q is None else q.input[0]


def check_residual(ctx: LintContext) -> Iterator[Finding]:
    """residual-qdq-on-conv-branch and residual-skip-not-quantized."""
    view = ctx.view
    for add, position, compute, dq in residual_adds(ctx):
        compute_name = view.label(compute)
        if compute_name not in ctx.quantized:
            continue
        if dq is not None:
            q = view.pair_source(dq)
            yield ctx.finding(
                "residual-qdq-on-conv-branch",
                view.label(add),
                f"Q/DQ pair {view.label(q)} → {view.label(dq)} sits between {compute.op_type} "
                f"'{compute_name}' and this residual Add; TensorRT cannot fuse the Add into the "
                "quantized kernel — keep the Q/DQ on the skip input only",
            )
            continue
        skip = add.input[1 - position]
        if view.operand(skip).dq is None:
            yield ctx.finding(
                "residual-skip-not-quantized",
                view.label(add),
                f"skip input '{skip}' of the residual Add after {compute.op_type} "
                f"'{compute_name}' has no Q/DQ; the fused kernel's output stays float — add a "
                "Q/DQ on the skip input (needs a calibrated scale: re-run the quantizer)",
            )


def check_alignment(ctx: LintContext) -> Iterator[Finding]:
    """channels-not-aligned, on nodes that run quantized."""
    view = ctx.view
    for node in ctx.compute:
        name = view.label(node)
        if name not in ctx.quantized:
            continue
        dims = _channel_dims(view, node)
        if dims is None:
            continue
        bad = {k: v for k, v in dims.items() if v % ALIGNMENT}
        if bad:
            text = ", ".join(f"{k}={v}" for k, v in bad.items())
            yield ctx.finding(
                "channels-not-aligned",
                name,
                f"{text} not a multiple of {ALIGNMENT}: INT8 tensor-core kernels pad or fall "
                "back to slower tactics (multiples of 32 match TensorRT's 32-wide INT8 layouts)",
            )


def _channel_dims(view: QdqView, node: onnx.NodeProto) -> dict[str, int] | None:
    if node.op_type in ("Conv", "ConvTranspose"):
        data = view.static_shape(node.input[0])
        out = view.static_shape(node.output[0])
        if data is None or out is None or len(data) < 2:
            return None
        return {"input channels": data[1], "output channels": out[1]}
    a = view.static_shape(node.input[0])
    out = view.static_shape(node.output[0])
    if a is None or out is None or not a or not out:
        return None
    k = a[0] if node.op_type == "Gemm" and view.attribute(node, "transA", 0) else a[-1]
    return {"K": k, "N": out[-1]}


def concat_sites(ctx: LintContext) -> Iterator[tuple[onnx.NodeProto, list[onnx.NodeProto], bool]]:
    """(Concat, its input DQs, whether their scales differ) for Concats fed by several DQs."""
    view = ctx.view
    for concat in view.nodes:
        if concat.op_type != "Concat":
            continue
        dqs = [view.producer(i) for i in concat.input if i]
        dqs = [d for d in dqs if view.is_dq(d)]
        if len(dqs) < 2:
            continue
        quantizers = [view.quantizer(d) for d in dqs]
        differ = any(not quantizers[0].same_params(q) for q in quantizers[1:])
        yield concat, dqs, differ


def concat_target(view: QdqView, concat: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Q every consumer of the Concat shares parameters with, when all consumers are Qs."""
    consumers = view.consumers(concat.output[0])
    if not consumers or concat.output[0] in view.index.graph_outputs:
        return None
    if not all(view.is_q(c) for c in consumers):
        return None
    first = view.quantizer(consumers[0])
    if first.per_channel or not all(first.same_params(view.quantizer(c)) for c in consumers[1:]):
        return None
    return consumers[0]


def check_concat(ctx: LintContext) -> Iterator[Finding]:
    """concat-scale-mismatch."""
    view = ctx.view
    for concat, dqs, differ in concat_sites(ctx):
        if not differ:
            continue
        scales = ", ".join(view.quantizer(d).describe() for d in dqs)
        target = concat_target(view, concat)
        activations = all(view.pair_source(d) is not None for d in dqs)
        fixable = target is not None and activations
        why = (
            f"`qdq fix` requantizes them with the scale of {view.label(target)}"
            if fixable
            else "not fixable here: the Concat's output is not read by one Q only — "
            "re-quantize with one scale for all inputs (ModelOpt concat_elimination)"
        )
        yield ctx.finding(
            "concat-scale-mismatch",
            view.label(concat),
            f"inputs quantized with different scales ({scales}); TensorRT requantizes them "
            f"before concatenating; {why}",
            fixable=fixable,
        )


def check_duplicates(ctx: LintContext) -> Iterator[Finding]:
    """duplicate-quantizer."""
    view = ctx.view
    groups: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for node in view.nodes:
        if view.is_q(node) or view.is_dq(node):
            groups.setdefault((node.op_type, node.input[0]), []).append(node)
    for (op, tensor), nodes in groups.items():
        for i, node in enumerate(nodes):
            twin = next(
                (k for k in nodes[:i] if view.quantizer(k).same_params(view.quantizer(node))), None
            )
            if twin is not None:
                yield ctx.finding(
                    "duplicate-quantizer",
                    view.label(node),
                    f"{op} on '{tensor}' duplicates {view.label(twin)} (same parameters): one "
                    "more kernel for the same values",
                )


def activation_pairs(view: QdqView) -> Iterator[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(Q, DQ) for every DQ fed by a Q of a non-constant tensor."""
    for node in view.nodes:
        if view.is_dq(node):
            q = view.pair_source(node)
            if q is not None and not view.is_constant(q.input[0]):
                yield q, node


def myelin_split_reason(ctx: LintContext, q: onnx.NodeProto) -> str | None:
    """Why a Q at this place splits an attention or normalization fusion (None: it does not)."""
    view = ctx.view
    source = q.input[0]
    producer = view.producer(source)
    if producer is None:
        return None
    name = view.label(producer)
    for site in ctx.attention:
        if name in site.chain and name != site.softmax:
            return f"on the attention scores between '{site.qk}' and Softmax '{site.softmax}'"
    if producer.op_type in ("ReduceMean", "InstanceNormalization") or (
        producer.op_type in _NORM_STATISTICS and _reaches(view, producer, "ReduceMean", 3)
    ):
        return f"inside a normalization (after {producer.op_type} '{name}')"
    if producer.op_type == "Reshape":
        before = view.producer(producer.input[0])
        if before is not None and before.op_type in NORM_OPS:
            return f"between {before.op_type} '{view.label(before)}' and its affine scale/shift"
    if producer.op_type == "Sub" and any(
        (p := view.producer(i)) is not None and p.op_type == "ReduceMean" for i in producer.input
    ):
        return f"inside a normalization (centring Sub '{name}')"
    if producer.op_type == "Div" and len(producer.input) == 2:
        p = view.producer(producer.input[1])
        if p is not None and p.op_type in ("Sqrt", "Add") and _reaches(view, p, "ReduceMean", 3):
            return f"inside a normalization (Div '{name}' by the standard deviation)"
    return None


def _reaches(view: QdqView, node: onnx.NodeProto, op_type: str, depth: int) -> bool:
    if node.op_type == op_type:
        return True
    if depth == 0:
        return False
    return any(
        (p := view.producer(i)) is not None and _reaches(view, p, op_type, depth - 1)
        for i in node.input
        if i
    )


def check_myelin_split(ctx: LintContext) -> Iterator[Finding]:
    """myelin-split."""
    view = ctx.view
    for q, dq in activation_pairs(view):
        reason = myelin_split_reason(ctx, q)
        if reason:
            yield ctx.finding(
                "myelin-split",
                view.label(q),
                f"Q/DQ pair {view.label(q)} → {view.label(dq)} sits {reason}; it splits the "
                "region Myelin fuses into separate kernels with INT8 reformats in between",
            )


def pair_use(ctx: LintContext, dq: onnx.NodeProto) -> tuple[bool, tuple[str, ...]]:
    """Whether a DQ's output reaches a consumer that runs quantized, and the float ops it reaches.

    Quantized consumers: a compute node; a Q (requantization); a quantizable op whose output is
    quantized ([EQ] Fig. 8); the skip input of a residual Add.
    """
    view = ctx.view
    float_ops: list[str] = []
    pending = [dq.output[0]]
    seen: set[str] = set()
    while pending:
        tensor = pending.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in view.index.graph_outputs:
            float_ops.append("graph output")
        for consumer in view.consumers(tensor):
            op = consumer.op_type
            if op in COMPUTE_OPS or view.is_q(consumer):
                return True, ()
            if view.commutes(consumer) or op == "Concat":
                pending.extend(o for o in consumer.output if o)
                continue
            if (
                op in QUANTIZABLE_OPS
                and all(view.is_q(c) for c in view.consumers(consumer.output[0]))
                and view.consumers(consumer.output[0])
            ):
                return True, ()
            if op == "Add" and any(
                _compute_branch(view, _before_pair(view, other)) is not None
                for other in consumer.input
                if other != tensor
            ):
                return True, ()  # the skip input of a residual Add (its conv branch may be Q/DQ'd)
            float_ops.append(op)
    return False, tuple(dict.fromkeys(float_ops))


def quantizes_compute_output(ctx: LintContext, q: onnx.NodeProto) -> bool:
    """The Q reads the output of a quantized Conv/GEMM (after its bias): TensorRT fuses it into
    the kernel, which then writes INT8/FP8 ([EQ] Fig. 3; [TREx] mixed_precision_lint: a
    quantized convolution with float outputs is ill-advised for memory-bound convolutions)."""
    compute = _compute_branch(ctx.view, q.input[0])
    return compute is not None and ctx.view.label(compute) in ctx.quantized


def check_reformat(ctx: LintContext, *, skip: set[str]) -> Iterator[Finding]:
    """qdq-reformat, for pairs not already reported by another rule (`skip`: Q names)."""
    view = ctx.view
    for q, dq in activation_pairs(view):
        if view.label(q) in skip or quantizes_compute_output(ctx, q):
            continue
        used, float_ops = pair_use(ctx, dq)
        if not used:
            output = dq.output[0] in view.index.graph_outputs
            yield ctx.finding(
                "qdq-reformat",
                view.label(q),
                f"Q/DQ pair {view.label(q)} → {view.label(dq)} feeds only float ops "
                f"({', '.join(float_ops) or 'nothing'}); TensorRT runs it as Quantize + "
                "Dequantize reformat layers with nothing quantized in between"
                + (
                    "; not fixed here: its output is a graph output (re-export without it)"
                    if output
                    else ""
                ),
                fixable=not output,
            )


def _producer_text(view: QdqView, tensor: str) -> str:
    node = view.producer(tensor)
    if node is None:
        return "it is a graph input" if tensor in view.index.graph_inputs else "no producer"
    return f"it comes from {node.op_type} '{view.label(node)}'"
