"""graphfix.validation.fusion_proof on real engine-inspector JSON published by NVIDIA.

The one real file (tests/data/engine_inspector/README.md says where it comes from) is a TREx
example: a CNN with a Softmax TensorRT ran as its own layer, no Myelin and no attention. NVIDIA
publishes no inspector JSON of an engine with Myelin kernels or an MHA kernel that we could find,
so the kernel-kind rules are checked on kernel names alone (their sources are given below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphfix.validation.fusion_proof import (
    BlockStatus,
    EngineLayer,
    FusionProof,
    LayerKind,
    classify_blocks,
    parse_engine_layers,
)

DATA = Path(__file__).parent / "data" / "engine_inspector"
RESNET = DATA / "trex_tf_resnet50_rtx3090_fp16.graph.json"


@pytest.fixture(scope="module")
def resnet_layers() -> tuple[EngineLayer, ...]:
    return parse_engine_layers(RESNET.read_text())


def test_real_engine_parses_every_layer(resnet_layers):
    raw = json.loads(RESNET.read_text())["Layers"]
    assert [layer.name for layer in resnet_layers] == [entry["Name"] for entry in raw]
    assert not any(layer.nodes_from_metadata for layer in resnet_layers)  # TensorRT 8: none


def test_real_softmax_that_ran_as_its_own_layer_is_unfused(resnet_layers):
    (block,) = classify_blocks(resnet_layers, ["resnet50/predictions/Softmax"])
    assert block.status == BlockStatus.UNFUSED
    assert block.layer == "resnet50/predictions/Softmax"
    assert "CudaSoftMax" in block.evidence


def test_real_implicit_gemm_convolutions_are_not_attention(resnet_layers):
    gemm_tactics = [layer for layer in resnet_layers if "gemm" in layer.tactic]
    assert len(gemm_tactics) == 36
    assert {layer.kind for layer in resnet_layers} == {LayerKind.LAYER}


def test_real_node_inside_a_fused_layer_name_is_found(resnet_layers):
    relu, missing = classify_blocks(resnet_layers, ["resnet50/conv1_relu/Relu", "/no/Softmax"])
    assert (relu.status, relu.layer) == (
        BlockStatus.UNFUSED,
        "Conv__435 + resnet50/conv1_relu/Relu",
    )
    assert missing.status == BlockStatus.NOT_FOUND


@pytest.mark.parametrize(
    ("name", "layer_type"),
    [
        # Myelin's MHA kernel as a profiled layer name (a TensorRT 10 ViT profile quoted publicly)
        ("_gemm_mha_v2_myl3_6", "kgen"),
        # the example of a layer classified "unfused" before this module
        ("fused_mha_v2_kernel", "kgen"),
        # a kernel of TensorRT's own fMHA (plugin/bertQKVToContextPlugin in NVIDIA/TensorRT)
        ("fmha_v2_int8_512_64_ldgsts_sm90_kernel", "gemm"),
    ],
)
def test_mha_kernel_names_are_attention_kernels(name, layer_type):
    assert EngineLayer(name, layer_type, "", (), False).kind == LayerKind.ATTENTION_KERNEL


@pytest.mark.parametrize(
    ("name", "layer_type", "kind"),
    [
        ("__myl_TranReshMove_myl3_4", "kgen", LayerKind.MYELIN_KERNEL),
        ("resnet50/predictions/Softmax", "CudaSoftMax", LayerKind.LAYER),
        ("sync_0", "signal", LayerKind.SYNC),
        ("{ForeignNode[/MatMul.../Add_3]}", "Myelin", LayerKind.MYELIN_REGION),
        ("/blocks.0/attn/Softmax", "PluginV3", LayerKind.PLUGIN),
    ],
)
def test_other_layer_kinds(name, layer_type, kind):
    assert EngineLayer(name, layer_type, "", (), False).kind == kind


def test_block_status_prefers_plugin_then_attention_kernel_over_other_kernels():
    node = "/attn/Softmax"
    kgen = EngineLayer("__myl_MaxSubExp_myl0_1", "kgen", "", (node,), True)
    mha = EngineLayer("_gemm_mha_v2_myl0_2", "kgen", "", (node,), True)
    plugin = EngineLayer(node, "PluginV3", "", (node,), True)
    assert classify_blocks([kgen], [node])[0].status == BlockStatus.UNFUSED
    assert classify_blocks([kgen, mha], [node])[0].status == BlockStatus.FUSED
    assert classify_blocks([kgen, mha, plugin], [node])[0].status == BlockStatus.PLUGIN
    # an MHA kernel that lists its nodes and not this one says nothing about this node
    assert classify_blocks([mha], ["/other/Softmax"])[0].status == BlockStatus.NOT_FOUND


def test_proof_counts_and_summary(resnet_layers):
    blocks = classify_blocks(resnet_layers, ["resnet50/predictions/Softmax"])
    proof = FusionProof("10.14.1", blocks, blocks)
    assert proof.candidate_fused == 0 and proof.original_fused == 0
    text = "\n".join(proof.summary_lines())
    assert "resnet50/predictions/Softmax: unfused (ran as layer" in text
    assert json.loads(json.dumps(blocks[0].status)) == "unfused"


def test_published_myelin_kernels_are_told_apart_by_their_tactic():
    """TensorRT 10 DETAILED layers printed in NVIDIA/TensorRT#4397: a GEMM whose layer name is
    the ONNX module path `…/mha/output/dense/MatMul` is not an attention kernel; the MHA kernel
    is known by its tactic."""
    layers = parse_engine_layers((DATA / "issue4397_bert_myelin_layers.json").read_text())
    kinds = {layer.name: layer.kind for layer in layers}
    assert kinds == {
        "/encoder/layers_0/pos_ff/output/MatMul_myl0_7": LayerKind.MYELIN_KERNEL,
        "__myl_AddCastMeanSubMulMeanAddSqrtDivMulCastMulAdd_myl0_8": LayerKind.MYELIN_KERNEL,
        "_gemm_mha_v2_myl0_59": LayerKind.ATTENTION_KERNEL,
        "/encoder/layers_8/mha/output/dense/MatMul_myl0_60": LayerKind.MYELIN_KERNEL,
    }
    assert all(layer.nodes_from_metadata for layer in layers)
