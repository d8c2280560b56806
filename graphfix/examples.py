"""A built-in example model, generated without network or torch: a tiny ViT classifier.

Its attention is written the way PyTorch's exporter writes `scaled_dot_product_attention`
(√scale on Q and on Kᵀ, a Where-built additive mask, `Where(IsNaN)` after the Softmax), and its
classifier head ends in a Softmax that is not attention, so `graphfix inspect` shows both.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IMAGE_SIZE = 32
PATCH = 8
CLASSES = 10


def vit_example(
    *, blocks: int = 2, width: int = 64, heads: int = 4, seed: int = 0
) -> onnx.ModelProto:
    """A ViT classifier `pixels [1,3,32,32] → probabilities [1,10]` with random weights."""
    rng = np.random.default_rng(seed)
    tokens = (IMAGE_SIZE // PATCH) ** 2
    head_dim = width // heads
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def weight(name: str, *shape: int, scale: float = 0.05) -> str:
        inits.append(
            numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
        )
        return name

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, ins: list[str], name: str, **attrs) -> str:
        out = f"{name}_output_0"
        nodes.append(helper.make_node(op, ins, [out], name=name, **attrs))
        return out

    x = node(
        "Conv",
        ["pixels", weight("patch.weight", width, 3, PATCH, PATCH)],
        "/patch_embed/Conv",
        strides=[PATCH, PATCH],
    )
    x = node(
        "Reshape",
        [x, const("tokens_shape", np.array([1, width, tokens], np.int64))],
        "/patch_embed/Reshape",
    )
    x = node("Transpose", [x], "/patch_embed/Transpose", perm=[0, 2, 1])
    x = node("Add", [x, weight("pos_embed", 1, tokens, width, scale=0.02)], "/pos_embed/Add")
    const("ln_scale", np.ones(width, np.float32))
    const("ln_bias", np.zeros(width, np.float32))
    const("heads_shape", np.array([1, tokens, 3, heads, head_dim], np.int64))
    const("merge_shape", np.array([1, tokens, width], np.int64))
    const("sqrt_scale", np.array(head_dim**-0.25, np.float32))
    const("zero", np.array(0.0, np.float32))
    const("neg_inf", np.array(-np.inf, np.float32))
    const("split", np.array([1, 1, 1], np.int64))
    const("axis0", np.array([0], np.int64))
    for b in range(blocks):
        p = f"/blocks.{b}/attn"
        h = node(
            "LayerNormalization",
            [x, "ln_scale", "ln_bias"],
            f"/blocks.{b}/norm1/LayerNormalization",
            axis=-1,
        )
        qkv = node(
            "MatMul", [h, weight(f"blocks.{b}.qkv.weight", width, 3 * width)], f"{p}/qkv/MatMul"
        )
        qkv = node("Reshape", [qkv, "heads_shape"], f"{p}/Reshape")
        qkv = node("Transpose", [qkv], f"{p}/Transpose", perm=[2, 0, 3, 1, 4])
        split = [f"{p}/Split_output_{i}" for i in range(3)]
        nodes.append(helper.make_node("Split", [qkv, "split"], split, name=f"{p}/Split", axis=0))
        q, k, v = (node("Squeeze", [t, "axis0"], f"{p}/Squeeze_{i}") for i, t in enumerate(split))
        q = node("Mul", [q, "sqrt_scale"], f"{p}/Mul")
        k_t = node("Transpose", [k], f"{p}/Transpose_1", perm=[0, 1, 3, 2])
        k_t = node("Mul", [k_t, "sqrt_scale"], f"{p}/Mul_1")
        scores = node("MatMul", [q, k_t], f"{p}/MatMul")
        keep = node("Equal", ["zero", "zero"], f"{p}/Equal")  # an all-keep padding mask
        bias = node("Where", [keep, "zero", "neg_inf"], f"{p}/Where")
        scores = node("Add", [scores, bias], f"{p}/Add")
        probs = node("Softmax", [scores], f"{p}/Softmax", axis=-1)
        nan = node("IsNaN", [probs], f"{p}/IsNaN")
        probs = node("Where", [nan, "zero", probs], f"{p}/Where_1")
        ctx = node("MatMul", [probs, v], f"{p}/MatMul_1")
        ctx = node("Transpose", [ctx], f"{p}/Transpose_2", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "merge_shape"], f"{p}/Reshape_1")
        ctx = node(
            "MatMul", [ctx, weight(f"blocks.{b}.proj.weight", width, width)], f"{p}/proj/MatMul"
        )
        x = node("Add", [x, ctx], f"/blocks.{b}/Add")
        h = node(
            "LayerNormalization",
            [x, "ln_scale", "ln_bias"],
            f"/blocks.{b}/norm2/LayerNormalization",
            axis=-1,
        )
        h = node(
            "MatMul",
            [h, weight(f"blocks.{b}.fc1.weight", width, 4 * width)],
            f"/blocks.{b}/mlp/fc1/MatMul",
        )
        h = node("Relu", [h], f"/blocks.{b}/mlp/Relu")
        h = node(
            "MatMul",
            [h, weight(f"blocks.{b}.fc2.weight", 4 * width, width)],
            f"/blocks.{b}/mlp/fc2/MatMul",
        )
        x = node("Add", [x, h], f"/blocks.{b}/Add_1")
    pooled = node("ReduceMean", [x], "/pool/ReduceMean", axes=[1], keepdims=0)
    logits = node(
        "Gemm",
        [pooled, weight("head.weight", width, CLASSES), weight("head.bias", CLASSES)],
        "/head/Gemm",
    )
    nodes.append(helper.make_node("Softmax", [logits], ["probabilities"], name="/Softmax", axis=-1))
    graph = helper.make_graph(
        nodes,
        "graphfix_vit_example",
        [
            helper.make_tensor_value_info(
                "pixels", TensorProto.FLOAT, [1, 3, IMAGE_SIZE, IMAGE_SIZE]
            )
        ],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, CLASSES])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="graphfix"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
