"""TensorRT through polygraphy's backend API: build or reuse an engine, run it, read its layers.

TensorRT and polygraphy are imported only when a runner is made, so this module imports anywhere.
With TensorRT 11, polygraphy must be at least 0.53.4 (`pip install 'graphfix[tensorrt]'`):
0.49.21 and older read the `IBuilderConfig.int8_calibrator` that TensorRT 11 removed on every build,
and up to 0.50.3 the engine file reader subclasses `trt.IStreamReader`, which TensorRT 11 renamed,
so every engine-cache hit fails.  TensorRT 10 works with the polygraphy its NGC images ship (0.49.x).

`locate --backend tensorrt` shares this module's requirement check (`require_tensorrt`), log
routing (`polygraphy_logs_on_stderr`), error wrapping (`polygraphy_errors`) and optimization
profiles (`optimization_profiles`) with `validate`.

Engines are cached under `~/.cache/graphfix/engines/<sha256>.engine`, keyed by the ONNX bytes
(external data included), the build options, the TensorRT version, the GPU (name and compute
capability) and the plugin libraries' bytes.  Engines are built with ProfilingVerbosity.DETAILED
so that `graphfix.validation.fusion_proof` can read which ONNX nodes each layer ran.

polygraphy prints its messages (and TensorRT's, which its TensorRT logger forwards) on stdout;
while a runner works they go to stderr, warnings and errors only, so `--json` output stays one
document.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graphfix.errors import PluginBuildError
from graphfix.float_types import FloatType, spellings
from graphfix.model_io import (
    LoadedModel,
    external_data_files,
    save_model,
    system_temporary_prefix,
)
from graphfix.plugins.spec import PLUGIN_DOMAIN
from graphfix.progress import step
from graphfix.validation.backends import BackendError
from graphfix.validation.backends.gpu import GpuIdentity, current_gpu
from graphfix.validation.fusion_proof import EngineLayer, parse_engine_layers
from graphfix.validation.inputs import InputSpec, ValidationUsageError, cast_feeds, input_specs

PRECISIONS = spellings(FloatType)  # validate --precision: fp32/float32, fp16/float16, …
POLYGRAPHY_MINIMUM = "0.53.4"
POLYGRAPHY_INSTALL = f"pip install 'graphfix[tensorrt]' (polygraphy>={POLYGRAPHY_MINIMUM})"


@dataclass(frozen=True)
class TensorRTStatus:
    """Whether TensorRT and a polygraphy that works with it are importable, or why not."""

    version: str | None  # TensorRT's, when `import tensorrt` works
    polygraphy: str | None
    reason: str | None  # None: both usable

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def major(self) -> int | None:
        return None if self.version is None else int(self.version.split(".")[0])


def tensorrt_status() -> TensorRTStatus:
    try:
        import tensorrt as trt
    except (ImportError, OSError) as exc:
        return TensorRTStatus(None, None, f"import tensorrt failed: {exc}")
    version = str(trt.__version__)
    try:
        polygraphy: str | None = importlib.metadata.version("polygraphy")
    except importlib.metadata.PackageNotFoundError:
        polygraphy = None
    return TensorRTStatus(version, polygraphy, polygraphy_problem(polygraphy, version))


def polygraphy_problem(polygraphy: str | None, tensorrt_version: str) -> str | None:
    """Why polygraphy `polygraphy` (None: not installed) cannot drive TensorRT, or None."""
    if polygraphy is None:
        return (
            f"TensorRT {tensorrt_version} is installed but polygraphy is not: {POLYGRAPHY_INSTALL}"
        )
    if _release(tensorrt_version)[0] >= 11 and _release(polygraphy) < _release(POLYGRAPHY_MINIMUM):
        return (
            f"TensorRT {tensorrt_version} is installed with polygraphy {polygraphy}, which fails "
            f"on TensorRT 11: {POLYGRAPHY_INSTALL}"
        )
    return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def require_tensorrt(status: TensorRTStatus | None = None) -> TensorRTStatus:
    """`status` (None: probed now), or BackendError saying why TensorRT cannot be used and what
    to do."""
    status = status if status is not None else tensorrt_status()
    if status.available:
        return status
    if status.version is None:
        need = "TensorRT"
        fix = f"install TensorRT 10 or 11 with its Python package, then {POLYGRAPHY_INSTALL}"
    else:
        need = f"polygraphy >= {POLYGRAPHY_MINIMUM}"
        fix = POLYGRAPHY_INSTALL
    raise BackendError(
        f"the TensorRT backend needs {need} ({status.reason}); {fix}, or validate with "
        "--backend onnxruntime (backend='onnxruntime')"
    )


@contextmanager
def polygraphy_logs_on_stderr() -> Iterator[None]:
    """polygraphy's logger prints below CRITICAL on `sys.stdout` (Logger.log) and TensorRT's log
    reaches it through polygraphy's TensorRT logger: for the duration, warnings and errors only
    (or what the user's stricter severity lets through), uncoloured, on stderr.  File descriptor 1
    points at stderr too, for whatever native code writes to the process's stdout."""
    from polygraphy.logger import G_LOGGER

    severity = max(G_LOGGER.module_severity.get(), G_LOGGER.WARNING)
    colors = G_LOGGER.colors
    G_LOGGER.colors = False
    try:
        with (
            G_LOGGER.verbosity(severity),
            contextlib.redirect_stdout(sys.stderr),
            _native_stdout_on_stderr(),
        ):
            yield
    finally:
        G_LOGGER.colors = colors


@contextmanager
def _native_stdout_on_stderr() -> Iterator[None]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


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


def engine_options(precision: FloatType | str | None, *, tensorrt_version: str) -> EngineOptions:
    """fp16/bf16 builder flags on TensorRT 10; strongly typed networks on TensorRT 11+."""
    chosen = (
        FloatType.FLOAT32
        if precision is None
        else FloatType.parse(precision, error=ValidationUsageError)
    )
    major = int(tensorrt_version.split(".")[0])
    if major >= 11:
        if chosen is not FloatType.FLOAT32:
            raise ValidationUsageError(
                f"TensorRT {tensorrt_version} builds strongly typed networks and has no "
                f"{chosen.short} builder flag: the precision must be in the ONNX itself (convert "
                "it, with Casts where float32 must stay) and validated without --precision"
            )
        return EngineOptions(chosen.short, fp16=False, bf16=False, strongly_typed=True)
    return EngineOptions(
        chosen.short,
        fp16=chosen is FloatType.FLOAT16,
        bf16=chosen is FloatType.BFLOAT16,
        strongly_typed=False,
    )


def default_engine_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "graphfix" / "engines"


def default_plugin_libraries(*, tensorrt_major: int | None = None) -> tuple[Path, ...]:
    """graphfix's built plugin library that registers itself on load (what LoadPlugins takes),
    from the build folder of TensorRT major version `tensorrt_major` (None: the installed one)."""
    from graphfix.plugins.build import default_build_dir, find_plugin_libraries

    build = default_build_dir(tensorrt_major=tensorrt_major)
    return (find_plugin_libraries(build_dir=build).static,)


def plugin_load_problem(library: Path, error: OSError, *, tensorrt_version: str) -> str:
    """One line for the OSError that loading `library` into this process raised, with the fix."""
    detail = " ".join(str(error).split())
    rebuild = "rebuild it with `graphfix plugins build` where this TensorRT is installed"
    if "undefined symbol: getPluginRegistry" in detail:
        return (
            f"cannot load plugin library {library}: it was built without libnvinfer, so nothing "
            f"provides getPluginRegistry ({detail}); {rebuild} (TENSORRT_ROOT, or the tensorrt "
            "wheel's tensorrt_libs, lets it link libnvinfer)"
        )
    linked = re.search(r"libnvinfer\.so\.(\d+)", detail)
    major = tensorrt_version.split(".")[0]
    if linked and linked.group(1) != major:
        return (
            f"cannot load plugin library {library}: it was built for TensorRT {linked.group(1)} "
            f"but this is TensorRT {tensorrt_version} ({detail}); {rebuild} (each TensorRT major "
            "version gets its own build folder)"
        )
    return f"cannot load plugin library {library} into TensorRT {tensorrt_version}: {detail}; {rebuild}"


@contextmanager
def polygraphy_errors(
    doing: str, *, status: TensorRTStatus, plugin_nodes: bool | None = None
) -> Iterator[None]:
    """What polygraphy and TensorRT raise while `doing` (e.g. "build an engine of model.onnx") as
    one-line BackendErrors.  An AttributeError is blamed on a polygraphy/TensorRT mismatch only
    when polygraphy's code raised it or a TensorRT object lacks the attribute; any other one (a
    bug in graphfix) propagates unchanged."""
    from polygraphy.exception import PolygraphyException

    try:
        yield
    except AttributeError as exc:
        problem = version_mismatch(exc, status)
        if problem is None:
            raise
        raise BackendError(problem) from exc
    except (PolygraphyException, RuntimeError, TypeError) as exc:
        hint = (
            "; if it names a graphfix plugin, the plugin library did not register its "
            "creator: check --plugins and rebuild the library for this TensorRT"
            if plugin_nodes
            else ""
        )
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise BackendError(f"TensorRT could not {doing}: {message}{hint}") from exc


def version_mismatch(error: AttributeError, status: TensorRTStatus) -> str | None:
    """One line when `error` comes from polygraphy calling what this TensorRT lacks (raised in
    polygraphy's code, or on a TensorRT object), else None."""
    import polygraphy

    detail = " ".join(str(error).split())
    owner = type(getattr(error, "obj", None)).__module__
    if _raised_under(error, Path(polygraphy.__file__).parent):
        return (
            f"polygraphy {status.polygraphy} does not work with TensorRT {status.version} "
            f"({detail}); {POLYGRAPHY_INSTALL}"
        )
    if owner.split(".")[0] == "tensorrt":
        return (
            f"TensorRT {status.version} lacks what graphfix calls ({detail}); graphfix supports "
            "TensorRT 10 and 11: install one of them"
        )
    return None


def _raised_under(error: BaseException, folder: Path) -> bool:
    """Whether the innermost Python frame of `error`'s traceback runs a file under `folder`."""
    frame = error.__traceback__
    if frame is None:
        return False
    while frame.tb_next is not None:
        frame = frame.tb_next
    return Path(frame.tb_frame.f_code.co_filename).resolve().is_relative_to(folder.resolve())


# --- building and running -----------------------------------------------------------------------


class TensorRTRunner:
    """An engine for `model` (built through polygraphy, or loaded from the cache) and its runner."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        label: str,
        shapes: Mapping[str, tuple[int, ...]],
        options: EngineOptions,
        plugin_libraries: Sequence[str | os.PathLike[str]] = (),
        cache_dir: str | os.PathLike[str] | None = None,
        status: TensorRTStatus | None = None,
    ) -> None:
        self.status = status if status is not None else require_tensorrt()
        import tensorrt as trt

        self._trt = trt
        self.tensorrt_version = str(self.status.version)
        self.label = label
        self.lowered_nodes = 0  # the plugins themselves run
        self.low_precision: str | None = None  # TensorRT stores each tensor in its own type
        self.options = options
        self.specs = input_specs(model.model)
        refuse_bfloat16_io(model.model, label)
        self.plugin_libraries = tuple(Path(p) for p in plugin_libraries)
        for library in self.plugin_libraries:
            if not library.is_file():
                raise PluginBuildError(
                    f"plugin library not found: {library}; build it (graphfix plugins build) or "
                    "pass the path of the built library"
                )
        cache = Path(cache_dir) if cache_dir is not None else default_engine_cache()
        self.has_plugin_nodes = any(n.domain == PLUGIN_DOMAIN for n in model.model.graph.node)
        with polygraphy_logs_on_stderr(), self._polygraphy_errors("build an engine of"):
            from polygraphy.backend.trt import util as trt_util

            self.gpu = current_gpu()
            # First TensorRT object of the process: the plugin registry logs through its logger.
            self._runtime = trt.Runtime(trt_util.get_trt_logger())
            self._load_plugins()
            with _onnx_file(model) as onnx_path:
                key = _cache_key(
                    onnx_path,
                    self.options,
                    shapes,
                    self.tensorrt_version,
                    self.plugin_libraries,
                    self.gpu,
                )
                self.engine_path = cache / f"{key}.engine"
                self.engine, self.from_cache = self._engine(onnx_path, shapes)
        self.description = (
            f"TensorRT {self.tensorrt_version} engine ({self.options.describe()}) of {label} "
            f"on {self.gpu.describe()}"
            + (
                f", plugins {', '.join(str(p) for p in self.plugin_libraries)}"
                if self.plugin_libraries
                else ""
            )
            + f"; engine {'reused from' if self.from_cache else 'cached at'} {self.engine_path}"
        )

    def _polygraphy_errors(self, doing: str):
        return polygraphy_errors(
            f"{doing} {self.label}", status=self.status, plugin_nodes=self.has_plugin_nodes
        )

    def _load_plugins(self) -> None:
        """Load the libraries and check that the registry finds every graphfix creator.

        graphfix's getCreators library goes through `IPluginRegistry.load_library`; any other
        library is dlopened (polygraphy's LoadPlugins) and registers itself.
        """
        if not self.plugin_libraries:
            return
        from polygraphy.backend.trt import load_plugins

        from graphfix.plugins.build import (
            DYNAMIC_LIBRARY_NAME,
            check_library_tensorrt,
            require_creators,
        )

        registry = self._trt.get_plugin_registry()
        for library in self.plugin_libraries:
            check_library_tensorrt(library, tensorrt_version=self.tensorrt_version)
            if library.name == DYNAMIC_LIBRARY_NAME:
                if registry.load_library(str(library)) is None:
                    raise BackendError(
                        f"TensorRT {self.tensorrt_version} refused plugin library {library} "
                        "(IPluginRegistry.load_library; its messages are above): its creators "
                        "are already registered, or it was built for another TensorRT; load one "
                        "graphfix library per process and rebuild it with `graphfix plugins build`"
                    )
                continue
            try:
                load_plugins(plugins=[str(library)])
            except OSError as exc:
                raise BackendError(
                    plugin_load_problem(library, exc, tensorrt_version=self.tensorrt_version)
                ) from exc
        if self.has_plugin_nodes:
            require_creators(
                registry,
                loaded=", ".join(str(p) for p in self.plugin_libraries),
                tensorrt_version=self.tensorrt_version,
            )

    def _engine(self, onnx_path: Path, shapes: Mapping[str, tuple[int, ...]]):
        from polygraphy.backend.trt import (
            CreateConfig,
            EngineFromNetwork,
            EngineFromPath,
            NetworkFromOnnxPath,
            SaveEngine,
        )
        from polygraphy.exception import PolygraphyException

        if self.engine_path.is_file():
            try:
                return EngineFromPath(str(self.engine_path), runtime=self._runtime)(), True
            except PolygraphyException:
                self.engine_path.unlink()  # built elsewhere or corrupt: rebuild below
        network = NetworkFromOnnxPath(
            str(onnx_path), strongly_typed=self.options.strongly_typed or None
        )
        config = CreateConfig(
            fp16=self.options.fp16 or None,
            bf16=self.options.bf16 or None,
            profiles=optimization_profiles(self.specs, shapes),
            profiling_verbosity=self._trt.ProfilingVerbosity.DETAILED,
        )
        step(f"building a TensorRT engine of {self.label} (minutes for a large model)")
        engine = EngineFromNetwork(network, config=config)()
        self.engine_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.engine_path.with_suffix(f".{os.getpid()}.partial")
        SaveEngine(engine, path=str(partial))()
        os.replace(partial, self.engine_path)
        return engine, False

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polygraphy.backend.trt import TrtRunner

        with polygraphy_logs_on_stderr(), self._polygraphy_errors("run"):
            with TrtRunner(self.engine) as runner:
                outputs = runner.infer(feed_dict=cast_feeds(feeds, self.specs))
        return {name: np.array(value) for name, value in outputs.items()}

    def layers(self) -> tuple[EngineLayer, ...]:
        with polygraphy_logs_on_stderr(), self._polygraphy_errors("inspect the engine of"):
            inspector = self.engine.create_engine_inspector()
            info = inspector.get_engine_information(self._trt.LayerInformationFormat.JSON)
        return parse_engine_layers(info)


def optimization_profiles(specs: Sequence[InputSpec], shapes: Mapping[str, Sequence[int]]):
    """One polygraphy Profile fixing every input with a symbolic or unknown dim to its feed's
    shape (min = opt = max), or None when every input is static (TensorRT needs no profile)."""
    from polygraphy.backend.trt import Profile

    dynamic = [s for s in specs if s.shape is None or not all(isinstance(d, int) for d in s.shape)]
    if not dynamic:
        return None
    profile = Profile()
    for spec in dynamic:
        shape = tuple(int(d) for d in shapes[spec.name])
        profile.add(spec.name, min=shape, opt=shape, max=shape)
    return [profile]


def refuse_bfloat16_io(model: onnx.ModelProto, label: str) -> None:
    """polygraphy feeds and returns NumPy arrays, which have no bfloat16: a model whose inputs or
    outputs are bfloat16 is refused with the fix instead of failing inside polygraphy."""
    graph = model.graph
    edges = [
        v.name
        for v in (*graph.input, *graph.output)
        if v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    ]
    if edges:
        raise BackendError(
            f"{label} has bfloat16 inputs or outputs ({', '.join(edges)}), which polygraphy cannot "
            "feed or return (NumPy has no bfloat16); keep the model's inputs and outputs float32 "
            "with Casts at the edges (graphfix precision does so by default)"
        )


@contextmanager
def _onnx_file(model: LoadedModel) -> Iterator[Path]:
    """The model as a file on disk: its own path, or a temporary copy for an in-memory model."""
    if model.path is not None:
        yield model.path
        return
    with tempfile.TemporaryDirectory(prefix=system_temporary_prefix("trt")) as folder:
        path = Path(folder) / "model.onnx"
        save_model(model.model, path)  # over 2 GB: model.onnx.data, the caller's proto untouched
        yield path


def _cache_key(
    onnx_path: Path,
    options: EngineOptions,
    shapes: Mapping[str, tuple[int, ...]],
    version: str,
    plugins: Sequence[Path],
    gpu: GpuIdentity,
) -> str:
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
        "gpu": [gpu.name, list(gpu.compute_capability)],
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
