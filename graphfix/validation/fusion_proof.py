"""What TensorRT made of each attention block, read from an engine's layer information.

Input: `IEngineInspector.get_engine_information(LayerInformationFormat.JSON)` of an engine built
with `ProfilingVerbosity.DETAILED`: `{"Layers": [{"Name", "LayerType", "TacticName", "Metadata",
...}, ...]}` (with LAYER_NAMES_ONLY, a list of names).  Each layer's `Metadata` lists the ONNX
nodes it was built from as `[ONNX Layer: name]` entries joined by \\x1f (TensorRT 10); older
engines have no `Metadata`, and the node names are read from the layer name (`A + B`, `PWN(A, B)`,
`{ForeignNode[first...last]}`).

Layer kinds, by what TensorRT publishes:
- a plugin layer: LayerType containing "Plugin";
- an attention kernel: an MHA/FMHA kernel in the tactic (else the name) or type, as a token
  (`_gemm_mha_v2…`, `fused_mha_v2…`, `fmha…`, `…_mha`), the tokens TensorRT's own perf-analysis
  tooling uses (.agents/skills/trt-perf-analysis in NVIDIA/TensorRT);
- a Myelin region: LayerType "Myelin" or a `{ForeignNode[…]}` name (TensorRT < 9, or no detail);
- a Myelin kernel: since TensorRT 9, DETAILED information lists Myelin's kernels one by one with
  LayerType `kgen` (generated) or `gemm`, and `signal`/`wait` for stream synchronisation;
- any other layer.
No TensorRT is imported here: this module is pure, tested on real published inspector JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class LayerKind(str, Enum):
    PLUGIN = "plugin"
    ATTENTION_KERNEL = "attention kernel"
    MYELIN_REGION = "Myelin region"
    MYELIN_KERNEL = "Myelin kernel"
    SYNC = "synchronisation"
    LAYER = "layer"


class BlockStatus(str, Enum):
    """What TensorRT ran for one attention block (its Softmax or graphfix plugin node)."""

    PLUGIN = "plugin"  # graphfix's plugin
    FUSED = "fused"  # inside an MHA kernel or a Myelin region
    UNFUSED = "unfused"  # its own layer or kernel, not an attention kernel
    NOT_FOUND = "not found"  # no layer names it


# "mha"/"fmha" as a token (TensorRT's tooling: (^|[^a-z0-9])mha([^a-z0-9]|$)); "_" separates tokens.
_ATTENTION_TOKEN = re.compile(r"(?<![a-z0-9])f?mha(?![a-z0-9])|fused_?multi_?head_?attention")
_MYELIN_KERNEL_TYPES = frozenset({"kgen", "gemm"})
_SYNC_TYPES = frozenset({"signal", "wait", "signal_and_wait", "signal_wait"})
_NAME_SPLIT = re.compile(r" \+ |, |\.\.\.|PWN\(|\{ForeignNode\[|\]\}|[()]")
_METADATA_NODE = re.compile(r"\[ONNX Layer: ([^\]|]+?)\s*(?:\|[^\]]*)?\]")


@dataclass(frozen=True)
class EngineLayer:
    """One layer of a built engine and the ONNX nodes it was made from."""

    name: str
    layer_type: str
    tactic: str
    onnx_nodes: tuple[str, ...]
    nodes_from_metadata: bool  # False: guessed from the layer name (no Metadata)

    @property
    def kind(self) -> LayerKind:
        layer_type = self.layer_type.lower()
        if "plugin" in layer_type:
            return LayerKind.PLUGIN
        # The kernel is named by its tactic where there is one: a layer name can be an ONNX
        # module path ("/encoder/layers_8/mha/output/dense/MatMul_myl0_60" is a plain GEMM).
        kernel = self.tactic or self.name
        if _ATTENTION_TOKEN.search(f"{kernel} {self.layer_type}".lower()):
            return LayerKind.ATTENTION_KERNEL
        if layer_type in _SYNC_TYPES:
            return LayerKind.SYNC
        if layer_type == "myelin" or self.name.startswith("{ForeignNode["):
            return LayerKind.MYELIN_REGION
        if layer_type in _MYELIN_KERNEL_TYPES or self.name.startswith("__myl_"):
            return LayerKind.MYELIN_KERNEL
        return LayerKind.LAYER

    def describe(self) -> str:
        parts = [f"{self.kind.value} '{self.name}'"]
        if self.layer_type:
            parts.append(f"type {self.layer_type}")
        if self.tactic:
            parts.append(f"tactic {self.tactic}")
        return ", ".join(parts)


def parse_engine_layers(info_json: str) -> tuple[EngineLayer, ...]:
    """Layers from `get_engine_information(LayerInformationFormat.JSON)` (any verbosity)."""
    data = json.loads(info_json)
    entries = data.get("Layers", []) if isinstance(data, dict) else data
    layers = []
    for entry in entries:
        if isinstance(entry, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY
            layers.append(EngineLayer(entry, "", "", _nodes_in_name(entry), False))
            continue
        layers.append(engine_layer(entry))
    return tuple(layers)


def engine_layer(entry: dict) -> EngineLayer:
    """One DETAILED `Layers` entry: its name, type, tactic and the ONNX nodes it computes."""
    name = str(entry.get("Name", ""))
    from_metadata = tuple(n.strip() for n in _METADATA_NODE.findall(str(entry.get("Metadata", ""))))
    layer_type = str(entry.get("LayerType", ""))
    # A reformat layer's name quotes the layer it feeds ("Reformatting CopyNode for Input
    # Tensor 0 to A + B"), whose nodes it does not compute.
    guessed = () if layer_type == "Reformat" else _nodes_in_name(name)
    nodes = from_metadata or guessed
    return EngineLayer(
        name=name,
        layer_type=layer_type,
        tactic=str(entry.get("TacticName") or ""),
        onnx_nodes=tuple(dict.fromkeys(nodes)),
        nodes_from_metadata=bool(from_metadata),
    )


def _nodes_in_name(name: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in _NAME_SPLIT.split(name) if p.strip())


@dataclass(frozen=True)
class BlockFusion:
    """What TensorRT made of one attention block, found by its Softmax/plugin node name."""

    node: str
    status: BlockStatus
    layer: str | None
    evidence: str


def classify_blocks(layers: Sequence[EngineLayer], nodes: Sequence[str]) -> tuple[BlockFusion, ...]:
    """Per ONNX node name in `nodes`: the layer that carries it and whether that is a fusion."""
    # Layers that hide the nodes inside them: an uncovered node may be in one of these.
    opaque = [
        layer
        for layer in layers
        if layer.kind in (LayerKind.ATTENTION_KERNEL, LayerKind.MYELIN_REGION)
        and not layer.nodes_from_metadata
    ]
    return tuple(_classify(node, layers, opaque) for node in nodes)


def _classify(node: str, layers: Sequence[EngineLayer], opaque: list[EngineLayer]) -> BlockFusion:
    covering = [
        layer
        for layer in layers
        if node and node in layer.onnx_nodes and layer.kind != LayerKind.SYNC
    ]
    for kind, status in (
        (LayerKind.PLUGIN, BlockStatus.PLUGIN),
        (LayerKind.ATTENTION_KERNEL, BlockStatus.FUSED),
        (LayerKind.MYELIN_REGION, BlockStatus.FUSED),
    ):
        layer = next((c for c in covering if c.kind == kind), None)
        if layer is not None:
            return BlockFusion(node, status, layer.name, layer.describe())
    if covering:
        evidence = "; ".join(c.describe() for c in covering[:3])
        if len(covering) > 3:
            evidence += f"; and {len(covering) - 3} more"
        return BlockFusion(node, BlockStatus.UNFUSED, covering[0].name, f"ran as {evidence}")
    if opaque:
        evidence = (
            f"no layer names it; the engine has {len(opaque)} fused layer(s) that do not list "
            f"their nodes (e.g. {opaque[0].describe()}); build with ProfilingVerbosity.DETAILED "
            "on TensorRT 10 or newer to be sure"
        )
        return BlockFusion(node, BlockStatus.FUSED, None, evidence)
    return BlockFusion(node, BlockStatus.NOT_FOUND, None, "no engine layer names this node")


@dataclass(frozen=True)
class FusionProof:
    """Per rewritten block, what TensorRT ran; and how many attention blocks it fused originally."""

    tensorrt_version: str
    candidate: tuple[BlockFusion, ...]
    original: tuple[BlockFusion, ...] | None
    original_problem: str | None = None

    @property
    def candidate_fused(self) -> int:
        return sum(b.status == BlockStatus.FUSED for b in self.candidate)

    @property
    def original_fused(self) -> int | None:
        if self.original is None:
            return None
        return sum(b.status == BlockStatus.FUSED for b in self.original)

    def summary_lines(self) -> list[str]:
        ran = sum(b.status == BlockStatus.PLUGIN for b in self.candidate)
        lines = [
            f"fusion proof (TensorRT {self.tensorrt_version} engine layers):",
            f"  fixed model: {ran} of {len(self.candidate)} rewritten block(s) ran the plugin, "
            f"{self.candidate_fused} still fused",
        ]
        lines += [f"    {b.node}: {b.status.value} ({b.evidence})" for b in self.candidate]
        if self.original is None:
            lines.append(f"  original model: not inspected ({self.original_problem})")
        else:
            lines.append(
                f"  original model: TensorRT fused {self.original_fused} of {len(self.original)} "
                "attention block(s)"
            )
            lines += [f"    {b.node}: {b.status.value} ({b.evidence})" for b in self.original]
        return lines
