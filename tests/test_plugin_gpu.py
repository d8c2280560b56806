"""GraphfixSoftmax's enqueue on a GPU against a float64 NumPy reference (ONNX Softmax-13).

The host harness (plugins/tests/pluginHarness.cpp) runs every case in one process, through
TensorRT's plugin interfaces: createPlugin, configurePlugin with dynamic dimensions, the
serialisation round trip, attachToContext, then onShapeChange + enqueue per shape (one plugin per
dtype/axis/rank serves several shapes). Outputs are poisoned before each run, and the bytes around
each output are checked untouched.

Bounds: float16/bfloat16 within 1 ulp of the correctly rounded result; float32 within 64 ulp and
no less accurate than torch.softmax in float32 on the same input (max and RMS relative error).

Run on a GPU machine:  python -m pytest tests/test_plugin_gpu.py -m gpu -q
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import plugin_harness_support as support
import pytest

pytestmark = pytest.mark.gpu

DTYPES = ("float32", "float16", "bfloat16")
# (mantissa bits, minimum normal exponent) of each output format
FORMATS = {"float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}


@dataclass(frozen=True)
class Case:
    name: str
    dims: tuple[int, ...]
    axis: int
    scale: float = 1.0
    mask: str = "none"  # none | random | causal | rows (some rows all -inf)
    in_offset: int = 0
    out_offset: int = 0


CASES = (
    Case("row1", (4, 1), -1),
    Case("row7", (5, 3, 7), -1),
    Case("row77", (3, 5, 77), -1),
    Case("row729", (2, 7, 729), -1),
    Case("row4096", (2, 3, 4096), -1),
    Case("row16384", (6, 16384), -1),
    Case("row65536", (3, 65536), -1),
    Case("row1024_wide", (3, 1024), -1, scale=30.0),
    Case("row4096_wide", (4, 4096), -1, scale=30.0),
    Case("masked77", (2, 8, 77), -1, mask="random"),
    Case("masked4096", (4, 4096), -1, mask="random"),
    Case("masked65536", (2, 65536), -1, mask="random"),
    Case("causal64", (2, 64, 64), -1, mask="causal"),
    Case("causal729", (1, 729, 729), -1, mask="causal"),
    Case("allinf7", (6, 7), -1, mask="rows"),
    Case("allinf729", (6, 729), -1, mask="rows"),
    Case("allinf4096", (6, 4096), -1, mask="rows"),
    Case("allinf65536", (3, 65536), -1, mask="rows"),
    Case("axis1_of3", (3, 77, 5), 1),
    Case("axis0_of4", (2, 4, 6, 8), 0),
    Case("axism2_of4", (2, 4, 6, 8), -2),
    Case("axis1_long", (2, 4096, 3), 1),
    Case("axis0_masked", (64, 33), 0, mask="random"),
    Case("axis1_allinf", (4, 9, 40), 1, mask="rows"),
    Case("rank1", (729,), 0),
    Case("rank8_last", (2, 1, 3, 1, 2, 1, 5, 7), -1),
    Case("rank8_mid", (2, 1, 3, 1, 2, 1, 5, 7), 2),
    Case("misaligned_both77", (3, 5, 77), -1, in_offset=1, out_offset=1),
    Case("misaligned_both4096", (2, 4096), -1, in_offset=3, out_offset=3),
    Case("misaligned_in4096", (3, 4096), -1, in_offset=1, out_offset=0),
    Case("misaligned_in65536", (2, 65536), -1, in_offset=0, out_offset=5),
    Case("odd_outer513", (9, 11, 513), -1),
    Case("odd_outer1000", (7, 3, 1000), -1, mask="random"),
)


def _from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _make_input(case: Case, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(case.dims).astype(np.float64) * case.scale
    axis = case.axis % len(case.dims)
    moved = np.moveaxis(x, axis, -1)
    if case.mask == "random":
        moved[rng.random(moved.shape) < 0.3] = -np.inf
    elif case.mask == "causal":
        n = moved.shape[-1]
        moved[..., np.triu(np.ones((moved.shape[-2], n), dtype=bool), k=1)] = -np.inf
    elif case.mask == "rows":
        rows = moved.reshape(-1, moved.shape[-1])
        rows[:: max(1, len(rows) // 3)] = -np.inf
        moved[...] = rows.reshape(moved.shape)
    return np.moveaxis(moved, -1, axis)


def _encode(x: np.ndarray, dtype: str) -> tuple[bytes, np.ndarray]:
    """The input's bytes in `dtype` and its exact value in float64."""
    if dtype == "float32":
        q = x.astype(np.float32)
        return q.tobytes(), q.astype(np.float64)
    if dtype == "float16":
        q = x.astype(np.float16)
        return q.tobytes(), q.astype(np.float64)
    bits = support.to_bfloat16_bits(x.astype(np.float32))
    return bits.tobytes(), _from_bfloat16_bits(bits).astype(np.float64)


def _decode_bits(raw: bytes, dtype: str, dims: tuple[int, ...]) -> np.ndarray:
    kind = np.uint32 if dtype == "float32" else np.uint16
    return np.frombuffer(raw, dtype=kind).reshape(dims)


def _bits_to_float64(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return bits.view(np.float32).astype(np.float64)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    return _from_bfloat16_bits(bits).astype(np.float64)


def reference_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """ONNX Softmax-13 in float64: exp(x - max) / sum; an all -inf row gives NaN."""
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def _round_to_format(r: np.ndarray, dtype: str) -> np.ndarray:
    """Correctly rounded (nearest even) value of r >= 0 in `dtype`, computed in float64."""
    mantissa, min_exp = FORMATS[dtype]
    _, e = np.frexp(r)
    spacing = np.ldexp(1.0, np.maximum(e - 1, min_exp) - mantissa)
    return np.round(r / spacing) * spacing


def _format_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return values.astype(np.float32).view(np.uint32).astype(np.int64)
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint16).astype(np.int64)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.int64)


def ulp_distance(out_bits: np.ndarray, reference: np.ndarray, dtype: str) -> np.ndarray:
    """Units in the last place between the outputs and the correctly rounded reference."""
    expected = _format_bits(_round_to_format(reference, dtype), dtype)
    return np.abs(out_bits.astype(np.int64) - expected)


@dataclass(frozen=True)
class Outcome:
    case: Case
    dtype: str
    status: int
    guards_intact: bool
    cuda: str
    x: np.ndarray  # the input as the plugin saw it, in float64
    out_bits: np.ndarray


@pytest.fixture(scope="session")
def gpu_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Outcome]:
    tools = support.gpu_tools()

    work = tmp_path_factory.mktemp("gpu-cases")
    rng = np.random.default_rng(20251129)
    lines, pending = [], []
    for case in CASES:
        x = _make_input(case, rng)
        for dtype in DTYPES:
            raw, exact = _encode(x, dtype)
            stem = work / f"{case.name}-{dtype}"
            stem.with_suffix(".in").write_bytes(raw)
            dims = " ".join(str(d) for d in case.dims)
            lines.append(
                f"{dtype} {case.axis} {case.in_offset} {case.out_offset} "
                f"{stem.with_suffix('.in')} {stem.with_suffix('.out')} {dims}"
            )
            pending.append((case, dtype, exact, stem.with_suffix(".out")))
    manifest = work / "manifest.txt"
    manifest.write_text("\n".join(lines) + "\n")
    done = support.run_harness_process(tools, "run", "dynamic", "--manifest", str(manifest))
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    assert results["errors"] == []
    outcomes = {}
    for (case, dtype, exact, out_path), result in zip(pending, results["cases"], strict=True):
        outcomes[(case.name, dtype)] = Outcome(
            case=case,
            dtype=dtype,
            status=result["status"],
            guards_intact=result["guards_intact"],
            cuda=result["cuda"],
            x=exact,
            out_bits=_decode_bits(out_path.read_bytes(), dtype, case.dims),
        )
    return outcomes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_enqueue_matches_float64_reference(gpu_outcomes, case: Case, dtype: str) -> None:
    outcome = gpu_outcomes[(case.name, dtype)]
    assert outcome.status == 0
    assert outcome.cuda == "no error"
    assert outcome.guards_intact, "the plugin wrote outside its output"
    reference = reference_softmax(outcome.x, case.axis)
    out = _bits_to_float64(outcome.out_bits, dtype)
    nan_rows = np.isnan(reference)
    np.testing.assert_array_equal(np.isnan(out), nan_rows)
    if case.mask == "rows":
        assert nan_rows.any()
    valid = ~nan_rows
    ulps = ulp_distance(outcome.out_bits[valid], reference[valid], dtype)
    limit = 64 if dtype == "float32" else 1
    worst = int(ulps.max()) if ulps.size else 0
    assert worst <= limit, f"{worst} ulp (limit {limit})"
    if dtype == "float32":
        normal = valid & (reference >= np.finfo(np.float32).tiny)
        relative = np.abs(out[normal] - reference[normal]) / reference[normal]
        assert relative.max(initial=0.0) <= 2.0**-17


def _torch_softmax_float32(x: np.ndarray, axis: int) -> np.ndarray:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch cannot see the GPU")
    with torch.no_grad():
        t = torch.from_numpy(x.astype(np.float32)).cuda()
        return torch.softmax(t, dim=axis).cpu().numpy().astype(np.float64)


@pytest.mark.parametrize(
    "name", [c.name for c in CASES if c.mask in ("none", "random") and c.scale == 1.0]
)
def test_float32_no_less_accurate_than_torch(gpu_outcomes, name: str) -> None:
    outcome = gpu_outcomes[(name, "float32")]
    reference = reference_softmax(outcome.x, outcome.case.axis)
    ours = _bits_to_float64(outcome.out_bits, "float32")
    theirs = _torch_softmax_float32(outcome.x, outcome.case.axis)
    positive = reference > 0
    ours_rel = np.abs(ours[positive] - reference[positive]) / reference[positive]
    theirs_rel = np.abs(theirs[positive] - reference[positive]) / reference[positive]
    assert ours_rel.max() <= theirs_rel.max(), (ours_rel.max(), theirs_rel.max())
    assert np.sqrt(np.mean(ours_rel**2)) <= np.sqrt(np.mean(theirs_rel**2))
