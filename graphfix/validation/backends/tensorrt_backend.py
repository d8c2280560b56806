"""TensorRT through polygraphy's backend API: build or reuse an engine, run it, read its layers.

TensorRT is imported only when a runner is made, so this module imports anywhere.  Engines are
cached under `~/.cache/graphfix/engines/<sha256>.engine`, keyed by the ONNX bytes (external data
included), the build options, the TensorRT version and the plugin libraries' bytes.

Fusion proof reads `IEngineInspector.get_engine_information(JSON)`: each layer's `Metadata`
lists the ONNX nodes it was built from (`[ONNX Layer: name]`, joined by \\x1f).  A layer counts as
fused attention when its type is Myelin or names an MHA kernel, its name is a Myelin
`{ForeignNode[first...last]}`, or its tactic names `_gemm_mha_`/`fmha`/`mha`; a plugin layer has a
type containing "Plugin".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from graphfix.errors import PluginBuildError
from graphfix.model_io import LoadedModel, external_data_files
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.validation.backends import BackendError
from graphfix.validation.inputs import ValidationUsageError, cast_feeds, input_specs


class Precision(str, Enum):
    """A TensorRT build precision (the JSON and the CLI spell the values)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


PRECISIONS = tuple(p.value for p in Precision)


class FusionStatus(str, Enum):
    """What TensorRT made of one attention block."""

    PLUGIN = "plugin"  # ran the graphfix plugin
    FUSED = "fused"  # inside Myelin or an MHA kernel
    UNFUSED = "unfused"  # its own non-attention layer
    NOT_FOUND = "not found"  # no layer names it


_NAME_MARKERS = ("foreignnode", "myelin", "_gemm_mha_", "fmha")
_TYPE_OR_TACTIC_MARKERS = ("myelin", "mha")
_NAME_SPLIT = re.compile(r" \+ |, |\.\.\.|PWN\(|\{ForeignNode\[|\]\}|[()]")
_METADATA_NODE = re.compile(r"\[ONNX Layer: ([^\]|]+?)\s*(?:\|[^\]]*)?\]")


@dataclass(frozen=True)
class TensorRTStatus:
    """Whether `import tensorrt` works here, and its version or why not."""

    version: str | None
    reason: str | None

    @property
    def available(self) -> bool:
        return self.version is not None


def tensorrt_status() -> TensorRTStatus:
    try:
        import tensorrt as trt
    except (ImportError, OSError) as exc:
        return TensorRTStatus(version=None, reason=f"import tensorrt failed: {exc}")
    return TensorRTStatus(version=str(trt.__version__), reason=None)


def require_tensorrt() -> TensorRTStatus:
    """The TensorRT status, or BackendError saying why it cannot be used and what to do."""
    status = tensorrt_status()
    if not status.available:
        raise BackendError(
            f"the TensorRT backend needs TensorRT ({status.reason}); install TensorRT 10 or 11 "
            "with its Python package, or validate with --backend onnxruntime (backend='onnxruntime')"
        )
    return status


@dataclass(frozen=True)
class EngineOptions:
    """Builder settings derived from the requested precision and the TensorRT version."""

    precision: str
    fp16: bool
    bf16: bool
    strongly_typed: bool

    def describe(self) -> str:
        if self.strongly_typed:
            return "strongly typed (precision as written in the ONNX)"
        return {
            "fp32": "float32",
            "fp16": "fp16 allowed (--fp16)",
            "bf16": "bf16 allowed (--bf16)",
        }[self.precision]


def engine_options(precision: str | None, *, tensorrt_version: str) -> EngineOptions:
    """fp16/bf16 builder flags on TensorRT 10; strongly typed networks on TensorRT 11+."""
    if precision is not None and precision not in PRECISIONS:
        raise ValidationUsageError(
            f"precision {precision!r} is not one of {', '.join(PRECISIONS)}; leave it unset for "
            "the model's own precision"
        )
    major = int(tensorrt_version.split(".")[0])
    if major >= 11:
        if precision in ("fp16", "bf16"):
            raise ValidationUsageError(
                f"TensorRT {tensorrt_version} builds strongly typed networks and has no "
                f"{precision} builder flag: the precision must be in the ONNX itself (convert it, "
                "with Casts where float32 must stay) and validated without --precision"
            )
        return EngineOptions(precision or "fp32", fp16=False, bf16=False, strongly_typed=True)
    chosen = precision or "fp32"
    return EngineOptions(chosen, fp16=chosen == "fp16", bf16=chosen == "bf16", strongly_typed=False)


def default_engine_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "graphfix" / "engines"


def default_plugin_libraries() -> tuple[Path, ...]:
    """graphfix's built plugin library that registers itself on load (what LoadPlugins takes)."""
    try:
        from graphfix.plugins.build import find_plugin_libraries
    except ImportError as exc:
        raise PluginBuildError(
            f"graphfix.plugins.build is not available ({exc}); pass the plugin library explicitly "
            "(plugins=[path] or --plugins PATH)"
        ) from exc
    return (find_plugin_libraries().static,)


# --- engine layers and fusion proof (pure: no TensorRT needed) -----------------------------------


@dataclass(frozen=True)
class EngineLayer:
    """One layer of a built engine and the ONNX nodes it was made from."""

    name: str
    layer_type: str
    tactic: str
    onnx_nodes: tuple[str, ...]

    @property
    def is_plugin(self) -> bool:
        return "plugin" in self.layer_type.lower()

    @property
    def is_fused_attention(self) -> bool:
        name = self.name.lower()
        typed = f"{self.layer_type} {self.tactic}".lower()
        return any(m in name for m in _NAME_MARKERS) or any(
            m in typed for m in _TYPE_OR_TACTIC_MARKERS
        )


def parse_engine_layers(info_json: str) -> tuple[EngineLayer, ...]:
    """Layers from `get_engine_information(LayerInformationFormat.JSON)` (any verbosity)."""
    data = json.loads(info_json)
    entries = data.get("Layers", []) if isinstance(data, dict) else data
    layers = []
    for entry in entries:
        if isinstance(entry, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY
            layers.append(EngineLayer(entry, "", "", _nodes_in_name(entry)))
            continue
        name = str(entry.get("Name", ""))
        metadata = str(entry.get("Metadata", ""))
        nodes = tuple(n.strip() for n in _METADATA_NODE.findall(metadata))
        layers.append(
            EngineLayer(
                name=name,
                layer_type=str(entry.get("LayerType", "")),
                tactic=str(entry.get("TacticName") or entry.get("TacticValue") or ""),
                onnx_nodes=tuple(dict.fromkeys((*nodes, *_nodes_in_name(name)))),
            )
        )
    return tuple(layers)


def _nodes_in_name(name: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in _NAME_SPLIT.split(name) if p.strip())


@dataclass(frozen=True)
class BlockFusion:
    """What TensorRT made of one attention block, found by its Softmax/plugin node name.

    status: see FusionStatus.
    """

    node: str
    status: FusionStatus
    layer: str | None
    evidence: str


def classify_blocks(layers: Sequence[EngineLayer], nodes: Sequence[str]) -> tuple[BlockFusion, ...]:
    """Per ONNX node name in `nodes`: the layer that carries it and whether that is a fusion."""
    myelin = [layer for layer in layers if layer.is_fused_attention]
    results = []
    for node in nodes:
        covering = [layer for layer in layers if node and node in layer.onnx_nodes]
        plugin = next((layer for layer in covering if layer.is_plugin), None)
        fused = next((layer for layer in covering if layer.is_fused_attention), None)
        if plugin is not None:
            results.append(
                BlockFusion(
                    node, FusionStatus.PLUGIN, plugin.name, f"plugin layer ({plugin.layer_type})"
                )
            )
        elif fused is not None:
            results.append(BlockFusion(node, FusionStatus.FUSED, fused.name, _describe(fused)))
        elif covering:
            layer = covering[0]
            results.append(
                BlockFusion(
                    node, FusionStatus.UNFUSED, layer.name, f"own layer ({layer.layer_type or '?'})"
                )
            )
        elif myelin:
            evidence = (
                f"no layer of its own; the engine has {len(myelin)} fused region(s) "
                f"(e.g. '{myelin[0].name}') that hide the nodes inside them"
            )
            results.append(BlockFusion(node, FusionStatus.FUSED, None, evidence))
        else:
            results.append(
                BlockFusion(node, FusionStatus.NOT_FOUND, None, "no engine layer names this node")
            )
    return tuple(results)


def _describe(layer: EngineLayer) -> str:
    parts = [layer.layer_type or "layer"]
    if layer.tactic:
        parts.append(f"tactic {layer.tactic}")
    return ", ".join(parts)


@dataclass(frozen=True)
class FusionProof:
    """Per rewritten block, what TensorRT ran; and how many attention blocks it fused originally."""

    tensorrt_version: str
    candidate: tuple[BlockFusion, ...]
    original: tuple[BlockFusion, ...] | None
    original_problem: str | None = None

    @property
    def candidate_fused(self) -> int:
        return sum(b.status is FusionStatus.FUSED for b in self.candidate)

    @property
    def original_fused(self) -> int | None:
        return (
            None
            if self.original is None
            else sum(b.status is FusionStatus.FUSED for b in self.original)
        )

    def summary_lines(self) -> list[str]:
        ran = sum(b.status is FusionStatus.PLUGIN for b in self.candidate)
        lines = [
            f"fusion proof (TensorRT {self.tensorrt_version} engine layers):",
            f"  fixed model: {ran} of {len(self.candidate)} rewritten block(s) ran the plugin, "
            f"{self.candidate_fused} still fused",
        ]
        lines += [f"    {b.node}: {b.status} ({b.evidence})" for b in self.candidate]
        if self.original is None:
            lines.append(f"  original model: not inspected ({self.original_problem})")
        else:
            lines.append(
                f"  original model: TensorRT fused {self.original_fused} of {len(self.original)} "
                "attention block(s)"
            )
            lines += [f"    {b.node}: {b.status} ({b.evidence})" for b in self.original]
        return lines


# --- building and running -----------------------------------------------------------------------


class TensorRTRunner:
    """An engine for `model` (built through polygraphy, or loaded from the cache) and its runner."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        label: str,
        shapes: Mapping[str, tuple[int, ...]],
        precision: str | None = None,
        plugin_libraries: Sequence[str | os.PathLike[str]] = (),
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        status = require_tensorrt()
        import tensorrt as trt

        self._trt = trt
        self.tensorrt_version = status.version
        self.label = label
        self.options = engine_options(precision, tensorrt_version=status.version)
        self.specs = input_specs(model.model)
        self.plugin_libraries = tuple(Path(p) for p in plugin_libraries)
        for library in self.plugin_libraries:
            if not library.is_file():
                raise PluginBuildError(
                    f"plugin library not found: {library}; build it (graphfix plugins build) or "
                    "pass the path of the built library"
                )
        cache = Path(cache_dir) if cache_dir is not None else default_engine_cache()
        self.has_plugin_nodes = any(n.domain == PLUGIN_DOMAIN for n in model.model.graph.node)
        with _onnx_file(model) as onnx_path:
            key = _cache_key(onnx_path, self.options, shapes, status.version, self.plugin_libraries)
            self.engine_path = cache / f"{key}.engine"
            self.engine, self.from_cache = self._engine(onnx_path, shapes)
        self.description = (
            f"TensorRT {status.version} engine ({self.options.describe()}) of {label}"
            + (
                f", plugins {', '.join(str(p) for p in self.plugin_libraries)}"
                if self.plugin_libraries
                else ""
            )
            + f"; engine {'reused from' if self.from_cache else 'cached at'} {self.engine_path}"
        )

    def _engine(self, onnx_path: Path, shapes: Mapping[str, tuple[int, ...]]):
        from polygraphy.backend.trt import (
            CreateConfig,
            EngineFromNetwork,
            EngineFromPath,
            NetworkFromOnnxPath,
            Profile,
            SaveEngine,
            load_plugins,
        )
        from polygraphy.exception import PolygraphyException

        try:
            if self.plugin_libraries:
                load_plugins(plugins=[str(p) for p in self.plugin_libraries])
            if self.engine_path.is_file():
                try:
                    return EngineFromPath(str(self.engine_path))(), True
                except PolygraphyException:
                    self.engine_path.unlink()  # built elsewhere or corrupt: rebuild below
            dynamic = [
                s
                for s in self.specs
                if s.shape is None or not all(isinstance(d, int) for d in s.shape)
            ]
            profiles = None
            if dynamic:
                profile = Profile()
                for spec in dynamic:
                    shape = tuple(shapes[spec.name])
                    profile.add(spec.name, min=shape, opt=shape, max=shape)
                profiles = [profile]
            network = NetworkFromOnnxPath(
                str(onnx_path), strongly_typed=self.options.strongly_typed or None
            )
            config = CreateConfig(
                fp16=self.options.fp16 or None, bf16=self.options.bf16 or None, profiles=profiles
            )
            engine = EngineFromNetwork(network, config=config)()
            self.engine_path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.engine_path.with_suffix(f".{os.getpid()}.partial")
            SaveEngine(engine, path=str(partial))()
            os.replace(partial, self.engine_path)
            return engine, False
        except (PolygraphyException, RuntimeError, TypeError) as exc:
            hint = (
                "; if it names GraphfixSoftmax, the plugin library did not register its creator: "
                "check --plugins and rebuild the library for this TensorRT"
                if self.has_plugin_nodes
                else ""
            )
            raise BackendError(
                f"TensorRT could not build an engine of {self.label}: {exc}{hint}"
            ) from exc

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polygraphy.backend.trt import TrtRunner
        from polygraphy.exception import PolygraphyException

        try:
            with TrtRunner(self.engine) as runner:
                outputs = runner.infer(feed_dict=cast_feeds(feeds, self.specs))
        except (PolygraphyException, RuntimeError) as exc:
            raise BackendError(f"TensorRT failed to run {self.label}: {exc}") from exc
        return {name: np.array(value) for name, value in outputs.items()}

    def layers(self) -> tuple[EngineLayer, ...]:
        inspector = self.engine.create_engine_inspector()
        info = inspector.get_engine_information(self._trt.LayerInformationFormat.JSON)
        return parse_engine_layers(info)


@contextmanager
def _onnx_file(model: LoadedModel) -> Iterator[Path]:
    """The model as a file on disk: its own path, or a temporary copy for an in-memory model."""
    if model.path is not None:
        yield model.path
        return
    import onnx

    with tempfile.TemporaryDirectory(prefix="graphfix-trt-") as folder:
        path = Path(folder) / "model.onnx"
        large = model.model.ByteSize() >= 2**31 - 1
        onnx.save(model.model, path, save_as_external_data=large, location="model.onnx.data")
        yield path


def _cache_key(
    onnx_path: Path,
    options: EngineOptions,
    shapes: Mapping[str, tuple[int, ...]],
    version: str,
    plugins: Sequence[Path],
) -> str:
    import onnx

    digest = hashlib.sha256()
    files = [onnx_path]
    proto = onnx.load(str(onnx_path), load_external_data=False)
    files += [onnx_path.parent / loc for loc in external_data_files(proto)]
    for path in files:
        digest.update(_file_sha256(path).encode())
    settings = {
        "options": [options.precision, options.fp16, options.bf16, options.strongly_typed],
        "shapes": {k: list(v) for k, v in sorted(shapes.items())},
        "tensorrt": version,
        "plugins": [_file_sha256(p) for p in plugins],
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
