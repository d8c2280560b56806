"""GraphfixAttention's reference lowering (`with_reference_ops`) against the node contract.

On a CPU, nothing else checks the contract numerically: every `fused_plugin` rewrite is validated
through this lowering, so a lowering that drifted from the contract would pass them all.  Here it
runs in onnxruntime and is compared with `contract_float64`, the math of graphfix/plugins/spec.py's
ATTENTION comment written independently in NumPy float64, across masks (boolean keep/blocked with
-inf or a finite fill, additive in float32 or in Q's type, broadcast), causal, softcap, grouped
and multi-query heads, an exact sink key, fully blocked rows with and without nan_to_zero, Dv ≠ D,
Kᵀ inputs and rank 3, in float32, float16 and bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphfix.plugins.reference import with_reference_ops
from graphfix.plugins.spec import ensure_plugin_opset, make_attention_node

TYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
}
# The lowering computes in float32 and rounds its output once to the I/O type: within one unit in
# the last place of that type (relative `eps`), plus float32's own error near zero.
EPS = {"float32": 2.0**-20, "float16": 2.0**-10, "bfloat16": 2.0**-7}
ATOL = {"float32": 1e-6, "float16": 1e-5, "bfloat16": 1e-4}


def contract_float64(
    q,
    k,
    v,
    mask=None,
    *,
    scale,
    k_transposed=False,
    causal=False,
    softcap=0.0,
    mask_fill=-np.inf,
    nan_to_zero=False,
) -> np.ndarray:
    """The node's output, from its contract alone (spec.py's ATTENTION comment, DESIGN.md)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    rank3 = q.ndim == 3
    if rank3:  # one head per batch entry
        q, k, v = q[:, None], k[:, None], v[:, None]
        mask = None if mask is None else np.asarray(mask)[:, None] if mask.ndim == 3 else mask
    if k_transposed:
        k = np.swapaxes(k, -1, -2)
    group = q.shape[1] // k.shape[1]
    head = np.arange(q.shape[1]) // group  # query head h reads key/value head h // group
    k, v = k[:, head], v[:, head]
    s = scale * np.einsum("bhsd,bhtd->bhst", q, k)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        if mask.dtype == np.bool_:
            s = np.where(mask, s, mask_fill)
        else:
            s = s + np.asarray(mask, np.float64)
    if causal:
        rows, cols = s.shape[-2:]
        s = np.where(np.arange(cols)[None, :] > np.arange(rows)[:, None], -np.inf, s)
    top = s.max(axis=-1, keepdims=True)
    blocked = np.isneginf(top)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(blocked, 0.0, top))
        p = e / e.sum(axis=-1, keepdims=True)
    p = np.where(blocked, 0.0 if nan_to_zero else np.nan, p)
    out = np.einsum("bhst,bhtd->bhsd", p, v)
    return out[:, 0] if rank3 else out


@dataclass(frozen=True)
class Case:
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: tuple[int, ...] | None = None
    mask_kind: str = "bool"  # "bool", "additive" (float32) or "additive_qtype"
    attrs: dict = field(default_factory=dict)
    blocked_rows: bool = False  # some rows have every key blocked


B, H, S, T, D = 2, 4, 5, 7, 8
CASES = {
    "plain": Case((B, H, S, D), (B, H, T, D), (B, H, T, D)),
    "bool_mask": Case((B, H, S, D), (B, H, T, D), (B, H, T, D), (B, 1, S, T)),
    "key_padding": Case((B, H, S, D), (B, H, T, D), (B, H, T, D), (B, 1, 1, T)),
    "finite_fill": Case(
        (B, H, S, D),
        (B, H, T, D),
        (B, H, T, D),
        (B, 1, S, T),
        attrs={"mask_fill": -1e4},
        blocked_rows=True,
    ),
    "additive": Case((B, H, S, D), (B, H, T, D), (B, H, T, D), (1, 1, S, T), "additive"),
    "additive_qtype": Case((B, H, S, D), (B, H, T, D), (B, H, T, D), (S, T), "additive_qtype"),
    "causal": Case((B, H, T, D), (B, H, T, D), (B, H, T, D), attrs={"causal": 1}),
    "causal_and_mask": Case(
        (B, H, T, D), (B, H, T, D), (B, H, T, D), (B, 1, 1, T), attrs={"causal": 1}
    ),
    "softcap": Case((B, H, S, D), (B, H, T, D), (B, H, T, D), (B, 1, S, T), attrs={"softcap": 1.5}),
    "grouped": Case((B, H, S, D), (B, 2, T, D), (B, 2, T, D), (B, 1, S, T)),
    "multi_query": Case((B, H, S, D), (B, 1, T, D), (B, 1, T, D)),
    "blocked_rows_nan": Case(
        (B, H, S, D), (B, H, T, D), (B, H, T, D), (B, 1, S, T), blocked_rows=True
    ),
    "blocked_rows_zero": Case(
        (B, H, S, D),
        (B, H, T, D),
        (B, H, T, D),
        (B, 1, S, T),
        attrs={"nan_to_zero": 1},
        blocked_rows=True,
    ),
    "dv_not_d": Case((B, H, S, D), (B, H, T, D), (B, H, T, 12), (B, 1, S, T)),
    "k_transposed": Case((B, H, S, D), (B, H, D, T), (B, H, T, D), attrs={"k_transposed": 1}),
    "rank3": Case((6, S, D), (6, T, D), (6, T, 12), (6, S, T)),
}


def _inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {
        "q": rng.standard_normal(case.q).astype(np.float32),
        "k": rng.standard_normal(case.k).astype(np.float32),
        "v": rng.standard_normal(case.v).astype(np.float32),
    }
    if case.mask is None:
        return feeds
    keep = rng.random(case.mask) > 0.35
    keep[..., 0] = True  # every row keeps a key, unless blocked on purpose below
    if case.blocked_rows:
        keep[..., 1, :] = False
    if case.mask_kind == "bool":
        feeds["mask"] = keep
    else:  # a bias with -inf where blocked
        bias = rng.standard_normal(case.mask).astype(np.float32)
        feeds["mask"] = np.where(keep, bias, -np.inf).astype(np.float32)
    return feeds


def _model(case: Case, dtype: str, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Inputs in float32, cast to `dtype`; outputs: the node's, and the inputs it saw, in float32."""
    elem = TYPES[dtype]
    nodes, outputs, names = [], [], []
    graph_inputs = []
    for name, value in feeds.items():
        source = TensorProto.BOOL if value.dtype == np.bool_ else TensorProto.FLOAT
        graph_inputs.append(helper.make_tensor_value_info(name, source, value.shape))
        in_q_type = name != "mask" or case.mask_kind == "additive_qtype"
        if elem == TensorProto.FLOAT or not in_q_type:
            names.append(name)
            continue
        nodes.append(helper.make_node("Cast", [name], [f"{name}_t"], to=elem))
        nodes.append(
            helper.make_node("Cast", [f"{name}_t"], [f"{name}_seen"], to=TensorProto.FLOAT)
        )
        outputs.append(
            helper.make_tensor_value_info(f"{name}_seen", TensorProto.FLOAT, value.shape)
        )
        names.append(f"{name}_t")
    attrs = {
        "scale": 0.3,
        "k_transposed": 0,
        "causal": 0,
        "softcap": 0.0,
        "mask_fill": -np.inf,
        "nan_to_zero": 0,
        **case.attrs,
    }
    out_shape = [*case.q[:-1], case.v[-1]]
    nodes.append(make_attention_node(names, "y_t", name="attention", **attrs))
    nodes.append(helper.make_node("Cast", ["y_t"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "contract",
        graph_inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape), *outputs],
        value_info=[
            helper.make_tensor_value_info(n, elem, feeds[n[:-2]].shape)
            for n in names
            if n.endswith("_t")
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ensure_plugin_opset(model)
    return model


@pytest.mark.parametrize("dtype", sorted(TYPES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_lowering_computes_the_node_contract(name: str, dtype: str) -> None:
    case = CASES[name]
    feeds = _inputs(case, np.random.default_rng(sorted(CASES).index(name)))
    lowered = with_reference_ops(_model(case, dtype, feeds))
    onnx.checker.check_model(lowered, full_check=True)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    results = dict(
        zip([o.name for o in lowered.graph.output], session.run(None, feeds), strict=True)
    )
    seen = {n: results.get(f"{n}_seen", value) for n, value in feeds.items()}
    attrs = {"scale": 0.3, "mask_fill": -np.inf, **case.attrs}
    exact = contract_float64(
        seen["q"],
        seen["k"],
        seen["v"],
        seen.get("mask"),
        scale=attrs["scale"],
        k_transposed=bool(attrs.get("k_transposed")),
        causal=bool(attrs.get("causal")),
        softcap=attrs.get("softcap", 0.0),
        mask_fill=attrs["mask_fill"],
        nan_to_zero=bool(attrs.get("nan_to_zero")),
    )
    np.testing.assert_allclose(results["y"], exact, rtol=EPS[dtype], atol=ATOL[dtype])
    if case.blocked_rows and np.isneginf(attrs["mask_fill"]):  # the rows that are all -inf
        assert np.isnan(exact).any() != bool(attrs.get("nan_to_zero"))


@pytest.mark.parametrize("dtype", sorted(TYPES))
def test_a_sink_key_is_one_more_key_of_the_node(dtype: str) -> None:
    """An attention sink as the fused rewrite expresses it (one extra key whose score is the sink
    logit, a zero value row) gives the sink's softmax: softmax([scores, sink]) without the sink."""
    rng = np.random.default_rng(7)
    scale, sink = 0.25, np.float32(1.75)
    q = rng.standard_normal((B, H, S, D)).astype(np.float32)
    k = rng.standard_normal((B, H, T, D)).astype(np.float32)
    v = rng.standard_normal((B, H, T, D)).astype(np.float32)
    # One extra head-dimension column: Q's holds sink / scale (exact: a power of two), K's extra
    # key is the unit vector on it, its value row zero.
    q1 = np.concatenate([q, np.full((B, H, S, 1), sink / scale, np.float32)], axis=-1)
    k1 = np.concatenate(
        [
            np.pad(k, [(0, 0), (0, 0), (0, 0), (0, 1)]),
            np.eye(1, D + 1, D, dtype=np.float32)[None, None].repeat(B, 0).repeat(H, 1),
        ],
        axis=2,
    )
    v1 = np.concatenate([v, np.zeros((B, H, 1, D), np.float32)], axis=2)
    case = Case(q1.shape, k1.shape, v1.shape, attrs={"scale": scale})
    feeds = {"q": q1, "k": k1, "v": v1}
    lowered = with_reference_ops(_model(case, dtype, feeds))
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    results = dict(
        zip([o.name for o in lowered.graph.output], session.run(None, feeds), strict=True)
    )
    seen = {n: results.get(f"{n}_seen", value)[..., :D] for n, value in feeds.items()}
    s = scale * np.einsum("bhsd,bhtd->bhst", seen["q"].astype(np.float64), seen["k"][..., :T, :])
    s = np.concatenate([s, np.full((B, H, S, 1), float(sink))], axis=-1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True))[..., :T]
    exact = np.einsum("bhst,bhtd->bhsd", p, seen["v"][..., :T, :].astype(np.float64))
    np.testing.assert_allclose(results["y"], exact, rtol=EPS[dtype], atol=ATOL[dtype])
