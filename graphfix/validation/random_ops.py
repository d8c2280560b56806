"""Random ops drawn alike on both sides of a comparison.

A node of `RANDOM_OPS` without a `seed` attribute draws from onnxruntime's process-wide seed,
and how many numbers a session has drawn before depends on how the model is run (a float16
model materialised, a chunk of `locate`, a remedy trial): two runs of the same model can then
draw different numbers, and a comparison that depends on them fails with nothing wrong (ViT-MAE's
random patch order; a VAE encoder that samples its latent).  Every comparison graphfix runs on
onnxruntime therefore gives each such node a seed of its own, made from its name (or its first
output's), so the same node draws the same numbers in the original, in a rewrite of it and in
each chunk or trial.  Only the copies onnxruntime runs are seeded; the files are not touched.
"""

from __future__ import annotations

import zlib

import onnx
from onnx import helper

from graphfix.graph.index import all_graphs

RANDOM_OPS = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial",
     "Bernoulli"}
)  # fmt: skip
_DEFAULT_DOMAINS = ("", "ai.onnx")


def unseeded_random_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The random nodes (subgraphs included) that draw from onnxruntime's process-wide seed."""
    return [
        node
        for graph in all_graphs(model.graph)
        for node in graph.node
        if node.op_type in RANDOM_OPS
        and node.domain in _DEFAULT_DOMAINS
        and not any(a.name == "seed" for a in node.attribute)
    ]


def seed_random_ops(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` whose unseeded random nodes each have a seed from their name (None:
    there are none, use `model` as it is)."""
    if not unseeded_random_nodes(model):
        return None
    seeded = onnx.ModelProto()
    seeded.CopyFrom(model)
    for node in unseeded_random_nodes(seeded):
        node.attribute.append(helper.make_attribute("seed", node_seed(node)))
    return seeded


def node_seed(node: onnx.NodeProto) -> float:
    """A seed that depends only on the node's name (or its first output's): an integer below
    2^24, so the float attribute holds it exactly."""
    key = node.name or (node.output[0] if node.output else node.op_type)
    return float(zlib.crc32(key.encode()) % (1 << 24))


def random_note(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, *, candidate_on_onnxruntime: bool
) -> list[str]:
    """What the report says when either model draws random numbers without a seed."""
    nodes = unseeded_random_nodes(reference) or unseeded_random_nodes(candidate)
    if not nodes:
        return []
    first = nodes[0]
    which = f"{first.op_type} '{first.name or first.output[0]}'"
    more = f" and {len(nodes) - 1} more" if len(nodes) > 1 else ""
    if candidate_on_onnxruntime:
        return [
            f"the models draw random numbers without a seed ({which}{more}): onnxruntime ran each "
            "random node with a seed made from its name, the same in both models, so both drew "
            "the same numbers"
        ]
    return [
        f"the original draws random numbers without a seed ({which}{more}): the engine draws "
        "its own, so outputs that depend on them differ by design; compare with the random "
        "nodes seeded or removed"
    ]
