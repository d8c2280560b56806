"""GraphfixAttention in the plugin libraries, on the host: no GPU, no TensorRT, no cuDNN needed.

The libraries are built as in test_plugin_host_harness.py (same build folder, CUDA architecture
$GRAPHFIX_TEST_CUDA_ARCHS, default 75). The attention harness (plugins/tests/attentionHarness.cpp)
loads a library the way TensorRT does and drives GraphfixAttention through TensorRT's plugin
interfaces; these tests check what it reports against graphfix/plugins/spec.py's ATTENTION.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import plugin_harness_support as support
import pytest
from plugin_harness_support import Tools

from graphfix.plugins.build import ATTENTION_HARNESS_NAME
from graphfix.plugins.spec import ATTENTION, SOFTMAX

pytestmark = pytest.mark.compile  # builds the plugin libraries and a harness with nvcc

FLOAT_TYPES = ("kFLOAT", "kHALF", "kBF16")
LOADINGS = ("static", "dynamic")
# Q, K, V and a key-padding mask of a small grouped-query attention.
GQA = "float16:2,4,16,64;float16:2,2,16,64;float16:2,2,16,32;bool:2,1,1,16"
SCALE = "scale:kFLOAT32:1:0.125"


@pytest.fixture(scope="session")
def tools() -> Tools:
    return support.host_tools(ATTENTION_HARNESS_NAME)


@dataclass(frozen=True)
class HarnessRun:
    report: dict
    stderr: str

    def errors(self, loading: str) -> list[str]:
        """What the plugin reported as errors: through the logger, or on stderr without one."""
        if loading == "static":
            return [line for line in self.stderr.splitlines() if line.startswith("[E]")]
        return [m["text"] for m in self.report["messages"] if m["severity"] <= 1]


def run_harness(
    tools: Tools, command: str, loading: str, *args: str, backend: str | None = None
) -> HarnessRun:
    env = dict(os.environ)
    env.pop("GRAPHFIX_ATTENTION_BACKEND", None)
    if backend is not None:
        env["GRAPHFIX_ATTENTION_BACKEND"] = backend
    done = support.run_harness_process(tools, command, loading, *args, timeout=120, env=env)
    assert done.returncode == 0, f"harness exited {done.returncode}: {done.stdout}{done.stderr}"
    return HarnessRun(json.loads(done.stdout), done.stderr)


def probe(
    tools: Tools,
    *fields: str,
    inputs: str = GQA,
    loading: str = "dynamic",
    backend: str | None = None,
) -> HarnessRun:
    args = [arg for field in fields for arg in ("--field", field)]
    return run_harness(tools, "probe", loading, *args, "--inputs", inputs, backend=backend)


# ---- identity, registration, capabilities -------------------------------------------------------


def _spec_fields() -> list[dict]:
    return [
        {"name": name, "type": kind, "length": 1, "values": None} for name, kind in ATTENTION.fields
    ]


@pytest.mark.parametrize("loading", LOADINGS)
def test_library_offers_both_creators_and_attention_matches_spec(
    tools: Tools, loading: str
) -> None:
    report = run_harness(tools, "describe", loading).report
    creators = {c["name"]: c for c in report["creators"]}
    assert set(creators) == {SOFTMAX.op_type, ATTENTION.op_type}
    attention = creators[ATTENTION.op_type]
    assert attention["interface"] == {"kind": "PLUGIN CREATOR_V3ONE", "major": 1, "minor": 0}
    assert (attention["version"], attention["namespace"]) == (
        ATTENTION.version,
        ATTENTION.namespace,
    )
    assert attention["fields"] == _spec_fields()
    plugin = report["plugin"]
    assert (plugin["name"], plugin["version"], plugin["namespace"]) == (
        ATTENTION.op_type,
        ATTENTION.version,
        ATTENTION.namespace,
    )
    assert plugin["capabilities"] == {
        "core": {"kind": "PLUGIN_V3ONE_CORE", "major": 1, "minor": 0},
        "build": {"kind": "PLUGIN_V3ONE_BUILD", "major": 1, "minor": 0},
        "runtime": {"kind": "PLUGIN_V3ONE_RUNTIME", "major": 1, "minor": 0},
    }
    assert plugin["nb_outputs"] == 1


# ---- build-time behaviour ------------------------------------------------------------------------


def test_output_type_is_q_type_for_float_types_only(tools: Tools) -> None:
    types = probe(tools, SCALE).report["output_types"]
    for name, result in types.items():
        if name in FLOAT_TYPES:
            assert result == {"status": 0, "type": name}
        else:
            assert result["status"] != 0, name


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (GQA, [2, 4, 16, 32]),
        ("float32:2,8,77,64;float32:2,8,300,64;float32:2,8,300,64", [2, 8, 77, 64]),
        ("bfloat16:6,33,72;bfloat16:6,40,72;bfloat16:6,40,16;float32:40", [6, 33, 16]),
        ("float16:1,32,1,128;float16:1,8,4096,128;float16:1,8,4096,128", [1, 32, 1, 128]),
    ],
)
def test_output_shape_is_q_shape_with_v_head_dim(tools: Tools, inputs: str, expected) -> None:
    report = probe(tools, SCALE, inputs=inputs).report
    assert report["output_shapes"] == {"status": 0, "dims": expected, "builder_calls": 0}
    assert report["configure"] == 0
    assert report["on_shape_change"] == 0
    assert [
        m
        for m in report["messages"]
        if m["severity"] <= 1 and "getOutputDataTypes" not in m["text"]
    ] == []


def test_k_transposed_reads_t_from_the_last_dimension(tools: Tools) -> None:
    inputs = "float16:2,4,16,64;float16:2,4,64,48;float16:2,4,48,64"
    report = probe(tools, SCALE, "k_transposed:kINT32:1:1", inputs=inputs).report
    assert (report["configure"], report["on_shape_change"]) == (0, 0)
    note = [m["text"] for m in report["messages"] if "onShapeChange" in m["text"]]
    assert "T=48" in note[-1] and "D=64" in note[-1]


def test_supported_formats(tools: Tools) -> None:
    formats = probe(tools, SCALE).report["formats"]
    linear = lambda *types: [[t, "kLINEAR"] for t in types]  # noqa: E731
    assert sorted(formats["0"]) == sorted(linear(*FLOAT_TYPES))
    assert formats["1"] == linear("kHALF")
    assert formats["2"] == linear("kHALF")
    assert sorted(formats["3"]) == sorted(linear("kFLOAT", "kHALF", "kBOOL"))
    assert formats["4"] == linear("kHALF")


@pytest.mark.parametrize("loading", LOADINGS)
def test_fields_survive_serialisation(tools: Tools, loading: str) -> None:
    given = [
        "scale:kFLOAT32:1:0.08838834764831845",
        "k_transposed:kINT32:1:1",
        "causal:kINT32:1:1",
        "softcap:kFLOAT32:1:30",
        "mask_fill:kFLOAT32:1:-10000",
        "nan_to_zero:kINT32:1:1",
    ]
    inputs = "float32:2,4,16,64;float32:2,4,64,16;float32:2,4,16,64"
    report = probe(tools, *given, inputs=inputs, loading=loading).report
    serialised = report["serialized_fields"]
    assert [(f["name"], f["type"], f["length"]) for f in serialised] == [
        (name, kind, 1) for name, kind in ATTENTION.fields
    ]
    values = [f["values"][0] for f in serialised]
    assert values[1:] == [1, 1, 30, -10000, 1]
    assert math.isclose(values[0], 0.08838834764831845, rel_tol=1e-7)
    for copy in ("deserialized_fields", "cloned_fields", "attached_fields"):
        assert report[copy] == serialised


def test_defaults_besides_scale(tools: Tools) -> None:
    report = probe(tools, SCALE).report
    values = {f["name"]: f["values"][0] for f in report["serialized_fields"]}
    assert values == {
        "scale": 0.125,
        "k_transposed": 0,
        "causal": 0,
        "softcap": 0,
        "mask_fill": "-inf",
        "nan_to_zero": 0,
    }


# ---- the cuDNN path's workspace and backend choice -----------------------------------------------


def test_workspace_only_where_the_cudnn_path_may_run(tools: Tools) -> None:
    float32 = "float32:2,4,16,64;float32:2,2,16,64;float32:2,2,16,32;bool:2,1,1,16"
    assert probe(tools, SCALE, inputs=float32).report["workspace_size"] == 0
    assert probe(tools, SCALE, backend="portable").report["workspace_size"] == 0
    assert probe(tools, SCALE, "softcap:kFLOAT32:1:20").report["workspace_size"] == 0
    finite = probe(tools, SCALE, "mask_fill:kFLOAT32:1:-10000").report
    assert finite["workspace_size"] == 0
    assert probe(tools, SCALE).report["workspace_size"] >= 8 << 20


def test_k_transposed_takes_scratch_for_k_rows_on_every_path(tools: Tools) -> None:
    # K given as [B, Hkv, D, T]: the flash kernels read it transposed into the workspace.
    inputs = "float16:2,4,16,64;float16:2,2,64,16;float16:2,2,16,32;bool:2,1,1,16"
    transposed = "k_transposed:kINT32:1:1"
    keys = 2 * 2 * 16 * 64 * 2
    portable = probe(tools, SCALE, transposed, inputs=inputs, backend="portable").report
    assert portable["workspace_size"] == keys
    float32 = inputs.replace("float16", "float32")
    assert probe(tools, SCALE, transposed, inputs=float32).report["workspace_size"] == 2 * keys
    assert (
        probe(tools, SCALE, transposed, inputs=inputs).report["workspace_size"] >= (8 << 20) + keys
    )


def test_bfloat16_without_mask_or_softcap_takes_scratch_for_float16_values(tools: Tools) -> None:
    # the Hopper kernel's float16 P·V (kHOPPER_VARIANT_HALF_VALUES): V as float16 (2 x 2 x 16 x
    # 32 x 2 = 4096 bytes, a multiple of 256) and the conversion's 1024 int32 slots (4096 bytes)
    # for a |v| above 65504
    inputs = "bfloat16:2,4,16,64;bfloat16:2,2,16,64;bfloat16:2,2,16,32"
    assert probe(tools, SCALE, inputs=inputs, backend="portable").report["workspace_size"] == 8192
    masked = inputs + ";bool:2,1,1,16"
    assert probe(tools, SCALE, inputs=masked, backend="portable").report["workspace_size"] == 0
    # one slot per block of 128 query rows where that is more than 1024 (V converted inside the
    # kernel: kHOPPER_VARIANT_CONVERT_IN_KERNEL): 16 x 16 x 8 = 2048 slots, after V's 32 MiB
    wide = "bfloat16:16,16,1024,64;bfloat16:16,16,1024,64;bfloat16:16,16,1024,64"
    assert probe(tools, SCALE, inputs=wide, backend="portable").report["workspace_size"] == (
        16 * 16 * 1024 * 64 * 2 + 2048 * 4
    )
    softcap = "softcap:kFLOAT32:1:20"
    assert (
        probe(tools, SCALE, softcap, inputs=inputs, backend="portable").report["workspace_size"]
        == 0
    )


def _own_kernel(report: dict) -> str:
    notes = [m["text"] for m in report["messages"] if "onShapeChange" in m["text"]]
    return notes[-1].split("; ", 1)[1]


@pytest.mark.parametrize(
    ("dtype", "d", "dv", "expected"),
    [
        (
            "float16",
            64,
            64,
            "flash kernel mma.sync m16n8k16 float16, head dim padded to 64, 64x64 "
            "tiles, 27648 bytes of shared memory",
        ),
        (
            "bfloat16",
            72,
            72,
            "flash kernel mma.sync m16n8k16 bfloat16, head dim padded to 80, 64x64 "
            "tiles, 33792 bytes of shared memory",
        ),
        ("float16", 64, 128, "flash kernel mma.sync m16n8k16 float16, head dim padded to 128"),
        (
            "float32",
            64,
            64,
            "flash kernel mma.sync m16n8k8 3xTF32, head dim padded to 64, 64x64 "
            "tiles, 58368 bytes of shared memory",
        ),
        ("float32", 128, 128, "3xTF32, head dim padded to 128, 64x64 tiles, 107520 bytes"),
        ("float32", 20, 24, "3xTF32, head dim padded to 32"),
        ("float16", 20, 24, "fallback kernel, no flash kernel: head dimensions not multiples of 8"),
        # above 128: padded to 160/192/256 while the tiles fit (planned as for sm_80 here, 163 KB;
        # V kept at 64 where the fallback kernel runs, so that it fits the 48 KB assumed without a GPU)
        ("float16", 136, 136, "m16n8k16 float16, head dim padded to 160, 64x64 tiles, 64512 bytes"),
        (
            "float16",
            256,
            256,
            "m16n8k16 float16, head dim padded to 256, 64x64 tiles, 101376 bytes",
        ),
        (
            "float32",
            256,
            64,
            "fallback kernel, no flash kernel: the flash kernel's tiles need more shared memory",
        ),
        ("float16", 264, 64, "fallback kernel, no flash kernel: head dimensions above 256"),
    ],
)
def test_own_kernel_choice_and_tiling(
    tools: Tools, dtype: str, d: int, dv: int, expected: str
) -> None:
    inputs = f"{dtype}:2,4,16,{d};{dtype}:2,2,16,{d};{dtype}:2,2,16,{dv}"
    report = probe(tools, SCALE, "softcap:kFLOAT32:1:30", inputs=inputs).report
    assert report["on_shape_change"] == 0
    assert expected in _own_kernel(report)


def _cudnn_reason(report: dict) -> str | None:
    notes = [m["text"] for m in report["messages"] if "onShapeChange" in m["text"]]
    return None if notes[-1].endswith("cuDNN SDPA") else notes[-1]


def test_without_cudnn_auto_warns_once_and_runs_the_own_kernels(tools: Tools) -> None:
    report = probe(tools, SCALE).report
    reason = _cudnn_reason(report)
    if reason is None:
        pytest.skip("cuDNN can be loaded here")
    warnings = [m["text"] for m in report["messages"] if m["severity"] == 2]
    assert len(warnings) == 1
    assert "the cuDNN path is unavailable" in warnings[0]
    assert ": own kernels (" in reason


@pytest.mark.parametrize("loading", LOADINGS)
def test_required_cudnn_that_is_missing_fails_plugin_creation(tools: Tools, loading: str) -> None:
    if _cudnn_reason(probe(tools, SCALE).report) is None:
        pytest.skip("cuDNN can be loaded here")
    run = probe(tools, SCALE, loading=loading, backend="cudnn")
    assert run.report["created"] is False
    assert any(
        "createPlugin" in e and "GRAPHFIX_ATTENTION_BACKEND=cudnn, but" in e
        for e in run.errors(loading)
    ), run.errors(loading)


def test_unknown_backend_is_an_error(tools: Tools) -> None:
    run = probe(tools, SCALE, backend="fastest")
    assert run.report["created"] is False
    assert any("allowed: auto (default), cudnn, portable" in e for e in run.errors("dynamic"))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ((SCALE,), None),
        ((SCALE, "softcap:kFLOAT32:1:50"), "softcap"),
        ((SCALE, "mask_fill:kFLOAT32:1:-10000"), "a bool mask with a finite mask_fill"),
    ],
)
def test_portable_backend_reason_is_reported(tools: Tools, fields, reason: str | None) -> None:
    auto = _cudnn_reason(probe(tools, *fields).report)
    if reason is not None:
        assert reason in auto
    forced = _cudnn_reason(probe(tools, *fields, backend="portable").report)
    assert "GRAPHFIX_ATTENTION_BACKEND=portable" in forced


# ---- bad fields and shapes give errors, not crashes ---------------------------------------------


@pytest.mark.parametrize("loading", LOADINGS)
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((), "the field 'scale' is missing"),
        (("scale:kINT32:1:1",), "expected kFLOAT32"),
        (("scale:kFLOAT64:1:0.1",), "expected kFLOAT32"),
        ((SCALE, "causal:kFLOAT32:1:1"), "expected kINT32"),
        (("scale:kFLOAT32:2:0.1,0.2",), "exactly one value"),
        (("scale:kFLOAT32:1:null",), "no data"),
        (("scale:kFLOAT32:1:inf",), "it must be finite"),
        ((SCALE, "causal:kINT32:1:2"), "causal is 2"),
        ((SCALE, "k_transposed:kINT32:1:-1"), "k_transposed is -1"),
        ((SCALE, "nan_to_zero:kINT32:1:7"), "nan_to_zero is 7"),
        ((SCALE, "softcap:kFLOAT32:1:-1"), "softcap is -1"),
        ((SCALE, "mask_fill:kFLOAT32:1:nan"), "mask_fill is nan"),
        ((SCALE, "mask_fill:kFLOAT32:1:inf"), "mask_fill is inf"),
        ((SCALE, "axis:kINT32:1:-1"), "unknown field 'axis'"),
    ],
)
def test_bad_field_is_an_error(tools: Tools, loading: str, fields, message: str) -> None:
    run = probe(tools, *fields, loading=loading)
    assert run.report["created"] is False
    assert any(message in e and "createPlugin" in e for e in run.errors(loading)), run.errors(
        loading
    )


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ("float16:2,6,16,64;float16:2,4,16,64;float16:2,4,16,64", "Hq must be a multiple of Hkv"),
        ("float16:2,4,16,64;float16:2,4,16,32;float16:2,4,16,64", "K's head dimension"),
        ("float16:2,4,16,64;float16:2,4,16,64;float16:2,4,17,64", "V's sequence dimension"),
        ("float16:2,4,16,64;float16:3,4,16,64;float16:3,4,16,64", "K's batch dimension"),
        ("float16:2,4,16,64;float16:2,4,16,64;float16:2,4,16,64;bool:3,1,1,16", "mask dimension 0"),
        (
            "float16:2,4,16,64;float16:2,4,16,64;float16:2,4,16,64;bool:2,4,16,15",
            "mask dimension 3",
        ),
        ("float16:2,16,64;float16:2,16,64;float16:2,16,64;bool:2,1,16,16", "the mask has rank 4"),
        ("float16:1,2,4,16,64;float16:1,2,4,16,64;float16:1,2,4,16,64", "Q has rank 5"),
        ("float16:2,4,16,64;float32:2,4,16,64;float16:2,4,16,64", "Q, K and V must share one type"),
        (
            "float16:2,4,16,64;float16:2,4,16,64;float16:2,4,16,64;int32:2,1,1,16",
            "the mask has type",
        ),
    ],
)
def test_bad_shapes_and_types_are_errors(tools: Tools, inputs: str, message: str) -> None:
    report = probe(tools, SCALE, inputs=inputs).report
    assert report["created"] is True
    assert report["configure"] == -1
    assert report["on_shape_change"] == -1
    errors = [m["text"] for m in report["messages"] if m["severity"] <= 1]
    assert any(message in e and "configurePlugin" in e for e in errors), errors
