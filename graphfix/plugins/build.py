"""Build, locate and load the TensorRT plugin library that GraphfixSoftmax nodes run on.

The C++ sources ship inside the package (`graphfix/plugins/_plugin_src`, a link to the repository's
`plugins/` folder, copied as package data by a non-editable install). One CMake build makes two
libraries from them (DESIGN.md, "Loading the plugin library"):

- `libgraphfix_plugins.so` registers its creator when it is loaded: `trtexec --staticPlugins`,
  polygraphy `--plugins`, onnxruntime's `trt_extra_plugin_lib_paths`;
- `libgraphfix_plugins_dynamic.so` exports `getCreators`/`setLoggerFinder`: `trtexec
  --dynamicPlugins`, `IPluginRegistry::loadLibrary`, `trt.get_plugin_registry().load_library`.

Load one or the other into a process, never both: TensorRT refuses a creator registered twice.

GraphfixAttention's cuDNN path is compiled when cuDNN's `cudnn.h` is found ($CUDNN_ROOT,
$GRAPHFIX_CUDNN_INCLUDE_DIR, the system folders, an installed `nvidia-cudnn-cu12/cu13` wheel); the
cuDNN frontend headers then come from $GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR or the 2 MB
`nvidia-cudnn-frontend` wheel (fetched into the cache). cuDNN itself is loaded at run time, never
linked; without `cudnn.h` (CI) the libraries have the portable attention kernel only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from graphfix.errors import PluginBuildError, UsageError
from graphfix.plugins.spec import PLUGIN_SPECS, PluginSpec

STATIC_LIBRARY_NAME = "libgraphfix_plugins.so"
DYNAMIC_LIBRARY_NAME = "libgraphfix_plugins_dynamic.so"
HARNESS_NAME = "graphfix_plugin_harness"
ATTENTION_HARNESS_NAME = "graphfix_attention_harness"

# The Apache-2.0 TensorRT 10.14 headers, fetched only when no TensorRT headers are installed.
KERNEL_LENS_REQUIREMENT = "kernel-lens==2.0.1"
_KERNEL_LENS_HEADER_PREFIX = "kernel_lens/include/tensorrt/"
_KERNEL_LENS_TENSORRT_MAJOR = 10  # kernel-lens 2.0.1 holds TensorRT 10.14's headers
_HEADER = "NvInferRuntime.h"
_VERSION_HEADER = "NvInferVersion.h"
_BUILD_LOG = "graphfix-plugin-build.log"
BUILD_MANIFEST = "graphfix-build.json"
_DEFAULT_CUDA_ROOT = "/usr/local/cuda"
# The cuDNN frontend (header-only C++, MIT), fetched only where cudnn.h is found.
CUDNN_FRONTEND_REQUIREMENT = "nvidia-cudnn-frontend==1.16.0"
_CUDNN_HEADER = "cudnn.h"
_CUDNN_FRONTEND_HEADER = "cudnn_frontend.h"


@dataclass(frozen=True)
class PluginLibraries:
    """The two builds of the plugin library; load one of them into a process, not both."""

    static: Path
    dynamic: Path

    def loading_flags(self) -> tuple[tuple[str, Path], ...]:
        """(how a tool loads plugins, the library to give it), for every supported way."""
        return (
            ("trtexec --staticPlugins", self.static),
            ("polygraphy --plugins", self.static),
            ("onnxruntime TensorRT EP trt_extra_plugin_lib_paths", self.static),
            ("trtexec --dynamicPlugins", self.dynamic),
            ("IPluginRegistry::loadLibrary / trt.get_plugin_registry().load_library", self.dynamic),
        )


@dataclass(frozen=True)
class TensorRTHeaders:
    """Where the TensorRT headers were found and how."""

    include_dir: Path
    origin: str


@dataclass(frozen=True)
class CudnnHeaders:
    """Where cuDNN's and its frontend's headers were found, for GraphfixAttention's cuDNN path."""

    include_dir: Path
    frontend_include_dir: Path


@dataclass(frozen=True)
class PluginBuild:
    """A finished build: the libraries and what they were built from."""

    libraries: PluginLibraries
    build_dir: Path
    cuda_archs: str
    headers: TensorRTHeaders
    nvcc: Path
    nvinfer_library: Path | None
    cudnn: CudnnHeaders | None = None
    cuda_archs_origin: str = ""
    notes: tuple[str, ...] = ()  # what the build left out and why


@dataclass(frozen=True)
class LoadedPlugins:
    """The outcome of `load_plugins_into_tensorrt`."""

    library: Path | None
    already_registered: bool


def plugin_source_dir() -> Path:
    """The folder holding the plugins' CMakeLists.txt, in a checkout or an installed package."""
    source = (Path(__file__).parent / "_plugin_src").resolve()
    if not (source / "CMakeLists.txt").is_file():
        raise PluginBuildError(
            f"the plugin sources are missing: no CMakeLists.txt in {source}; reinstall graphfix "
            "(`pip install graphfix`) or use a checkout that has the plugins/ folder"
        )
    return source


def cache_dir() -> Path:
    """graphfix's cache: $GRAPHFIX_CACHE_DIR, else $XDG_CACHE_HOME/graphfix, else ~/.cache/graphfix."""
    if os.environ.get("GRAPHFIX_CACHE_DIR"):
        return Path(os.environ["GRAPHFIX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "graphfix"


def default_build_dir(*, tensorrt_major: int | None = None) -> Path:
    """Where `build_plugins` builds when no folder is given: one per source folder and TensorRT
    major version, in the cache (a library linked to libnvinfer.so.10 does not load under 11).

    `tensorrt_major`: None means the installed TensorRT's, else that of the headers a build uses.
    """
    major = tensorrt_major if tensorrt_major is not None else _tensorrt_major()
    digest = hashlib.sha1(str(plugin_source_dir()).encode()).hexdigest()[:10]
    return cache_dir() / f"plugins-build-{digest}-trt{major}"


def tensorrt_header_major(include_dir: Path) -> int:
    """NV_TENSORRT_MAJOR as `include_dir`'s NvInferVersion.h defines it."""
    return tensorrt_header_version(include_dir)[0]


def tensorrt_header_version(include_dir: Path) -> tuple[int, int]:
    """(NV_TENSORRT_MAJOR, NV_TENSORRT_MINOR) as `include_dir`'s NvInferVersion.h defines them
    (TensorRT 10.x and 11.x define them through TRT_MAJOR_ENTERPRISE / TRT_MINOR_ENTERPRISE)."""
    header = Path(include_dir) / _VERSION_HEADER
    try:
        text = header.read_text(errors="replace")
    except OSError as exc:
        raise PluginBuildError(
            f"cannot read {header} ({exc}); point TENSORRT_ROOT at a complete TensorRT install"
        ) from exc
    found = []
    for part in ("MAJOR", "MINOR"):
        for macro in (f"NV_TENSORRT_{part}", f"TRT_{part}_ENTERPRISE"):
            value = re.search(rf"#define\s+{macro}\s+(\d+)", text)
            if value:
                found.append(int(value.group(1)))
                break
    if len(found) != 2:
        raise PluginBuildError(
            f"{header} defines no NV_TENSORRT_MAJOR/MINOR; point TENSORRT_ROOT at a TensorRT 10 or "
            "11 install"
        )
    return found[0], found[1]


# pip installs TensorRT as one of these distributions (a metapackage and its CUDA-specific parts).
_TENSORRT_DISTRIBUTIONS = (
    "tensorrt",
    "tensorrt-cu13",
    "tensorrt-cu12",
    "tensorrt-cu11",
    "tensorrt-cu13-libs",
    "tensorrt-cu12-libs",
    "tensorrt-cu11-libs",
    "tensorrt-libs",
)


def installed_tensorrt_version() -> str | None:
    """The installed TensorRT's version: its pip distribution's metadata (nothing imported), else
    `import tensorrt` (an NGC image or a tar/deb install's wheel); None without TensorRT."""
    for name in _TENSORRT_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import tensorrt as trt
    except (ImportError, OSError):
        return None
    return str(trt.__version__)


def _tensorrt_major() -> int:
    installed = installed_tensorrt_version()
    if installed is not None:
        return _major_minor(installed)[0]
    try:
        return tensorrt_header_major(find_tensorrt_headers(allow_download=False).include_dir)
    except PluginBuildError:  # nothing installed: a build would fetch kernel-lens's headers
        return _KERNEL_LENS_TENSORRT_MAJOR


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = (int(p) for p in re.findall(r"\d+", version)[:2])
    return major, minor


def find_nvcc() -> Path:
    """The CUDA compiler: $CUDACXX, nvcc on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin."""
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), _DEFAULT_CUDA_ROOT):
        if root:
            candidates.append(str(Path(root) / "bin" / "nvcc"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise PluginBuildError(
        "nvcc (the CUDA compiler) was not found on PATH, in $CUDACXX, $CUDA_HOME/bin or "
        "/usr/local/cuda/bin; install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH"
    )


def _find_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise PluginBuildError(
            "cmake was not found on PATH; install CMake 3.24 or newer (`pip install cmake`)"
        )
    return cmake


def _installed_package_dirs(names: tuple[str, ...]) -> list[Path]:
    """Folders of installed top-level packages, found without importing them."""
    folders = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders.extend(Path(p) for p in spec.submodule_search_locations)
    return folders


def _system_include_dirs() -> list[Path]:
    machine = platform.machine()
    return [
        Path("/usr/include"),
        Path(f"/usr/include/{machine}-linux-gnu"),  # NGC images and the deb packages
        Path("/usr/local/include"),
        Path("/usr/local/TensorRT/include"),
        Path("/usr/local/tensorrt/include"),
        Path("/opt/tensorrt/include"),
        *sorted(Path("/usr/local").glob("TensorRT-*/include")),  # the tar packages, unpacked
        *sorted(Path("/opt").glob("TensorRT-*/include")),
        Path("/usr/local/cuda/include"),
    ]


def _kernel_lens_include_dir() -> Path:
    version = KERNEL_LENS_REQUIREMENT.split("==")[1]
    return cache_dir() / "tensorrt-headers" / f"kernel-lens-{version}" / "include"


def fetch_tensorrt_headers() -> Path:
    """Extracts TensorRT's headers from the `kernel-lens` wheel into the cache; returns the folder."""
    return _fetch_wheel_headers(
        KERNEL_LENS_REQUIREMENT,
        prefix=_KERNEL_LENS_HEADER_PREFIX,
        include_dir=_kernel_lens_include_dir(),
        header=_HEADER,
        missing="TensorRT headers were not found",
        remedy="set TENSORRT_ROOT to a TensorRT install that has include/NvInferRuntime.h",
    )


def _fetch_wheel_headers(
    requirement: str,
    *,
    prefix: str,
    include_dir: Path,
    header: str,
    missing: str,
    remedy: str,
    suffixes: tuple[str, ...] | None = (".h", ".hpp"),
) -> Path:
    """`pip download` one wheel and extract its headers under `prefix` into `include_dir`
    (keeping their relative paths); the folder appears only once it is complete.
    `suffixes`: the file endings that are headers (None: every file, for libcu++'s `nv/target`)."""
    if (include_dir / header).is_file():
        return include_dir
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--dest", download, requirement]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(download).glob("*.whl"))
        if completed.returncode != 0 or not wheels:
            raise PluginBuildError(
                f"{missing}, and `{shlex.join(command[2:])}` failed "
                f"({completed.stderr.strip()[-300:]}); {remedy}"
            )
        staging = include_dir.with_name(include_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                if member.startswith(prefix) and not member.endswith("/"):
                    if suffixes is not None and not member.endswith(suffixes):
                        continue
                    target = staging / member[len(prefix) :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(member))
    if not (staging / header).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise PluginBuildError(f"{requirement} holds no {prefix}{header}; {remedy}")
    shutil.rmtree(include_dir, ignore_errors=True)
    staging.rename(include_dir)
    return include_dir


def find_tensorrt_headers(*, allow_download: bool | None = None) -> TensorRTHeaders:
    """TensorRT's headers: $TENSORRT_ROOT/include, else the first of these whose major version is
    the installed TensorRT's (any, when none is installed): the system include folders (NGC
    images, deb packages, unpacked tar packages), an installed `tensorrt` wheel, NVIDIA's published
    headers for the installed major.minor or kernel-lens's TensorRT 10.14 copy in the cache.
    Otherwise, when `allow_download` (the default), a pip-only TensorRT 11+ (whose wheels ship no
    headers) gets NVIDIA's published headers for its major.minor, anything else kernel-lens's."""
    root = os.environ.get("TENSORRT_ROOT")
    if root:
        include_dir = Path(root) / "include"
        if not (include_dir / _HEADER).is_file():
            raise PluginBuildError(
                f"TENSORRT_ROOT={root} has no include/{_HEADER}; point it at a TensorRT install "
                "(the folder holding include/ and lib/) or unset it"
            )
        return TensorRTHeaders(include_dir, "TENSORRT_ROOT")
    installed = installed_tensorrt_version()
    wanted = None if installed is None else _major_minor(installed)
    candidates = [(d, "system") for d in _system_include_dirs()]
    candidates += [
        (folder / "include", "tensorrt wheel")
        for folder in _installed_package_dirs(("tensorrt", "tensorrt_libs", "tensorrt_bindings"))
    ]
    if wanted is not None:
        candidates.append((published_headers_dir(*wanted), "NVIDIA's published headers"))
    candidates.append((_kernel_lens_include_dir(), KERNEL_LENS_REQUIREMENT))
    passed_over = []
    for include_dir, origin in candidates:
        if not (include_dir / _HEADER).is_file():
            continue
        if wanted is None or tensorrt_header_major(include_dir) == wanted[0]:
            return TensorRTHeaders(include_dir, origin)
        passed_over.append(f"{include_dir} (TensorRT {tensorrt_header_major(include_dir)})")
    if wanted is not None and wanted[0] != _KERNEL_LENS_TENSORRT_MAJOR:
        if allow_download is False:
            raise PluginBuildError(_no_published_headers(installed, passed_over, None))
        return TensorRTHeaders(
            fetch_published_headers(installed, passed_over=passed_over),
            "NVIDIA's published headers",
        )
    if allow_download is False:
        raise PluginBuildError(
            f"TensorRT headers ({_HEADER}) were not found in TENSORRT_ROOT, the system include "
            "folders or a tensorrt wheel; set TENSORRT_ROOT, or allow fetching them from "
            f"{KERNEL_LENS_REQUIREMENT}"
        )
    return TensorRTHeaders(fetch_tensorrt_headers(), KERNEL_LENS_REQUIREMENT)


# NVIDIA publishes each release's headers in the TensorRT OSS repository's include/, tagged
# v<major>.<minor> or v<major>.<minor>.<patch>; GitHub serves a tag as a tarball whose top folder is
# TensorRT-<tag without v>.  $GRAPHFIX_TENSORRT_HEADERS_URL replaces the address (a mirror, or a
# file:// URL of a tarball) with {tag} standing for the tag.
_PUBLISHED_HEADERS_URL = "https://github.com/NVIDIA/TensorRT/archive/refs/tags/{tag}.tar.gz"


def published_headers_dir(major: int, minor: int) -> Path:
    """Where NVIDIA's published headers for TensorRT major.minor go in the cache."""
    return cache_dir() / "tensorrt-headers" / f"nvidia-{major}.{minor}" / "include"


def _release_tags(version: str) -> list[str]:
    numbers = re.findall(r"\d+", version)[:3]
    tags = [f"v{'.'.join(numbers)}", f"v{'.'.join(numbers[:2])}"]
    return list(dict.fromkeys(tags))


def _headers_url(tag: str) -> str:
    return (os.environ.get("GRAPHFIX_TENSORRT_HEADERS_URL") or _PUBLISHED_HEADERS_URL).format(
        tag=tag
    )


def _no_published_headers(version: str, passed_over: list[str], reason: str | None) -> str:
    major, minor = _major_minor(version)
    folder = published_headers_dir(major, minor).parent
    url = _headers_url(_release_tags(version)[-1])
    other = f"; headers of another major version were passed over: {', '.join(passed_over)}"
    return (
        f"TensorRT {version} is installed from pip, whose wheels ship no headers, and "
        + (
            f"NVIDIA's published headers could not be downloaded ({reason})"
            if reason
            else f"no TensorRT {major} headers were found"
        )
        + f"; run `mkdir -p {folder} && curl -fL {url} | tar xz -C {folder} --strip-components=1 "
        f"--wildcards '*/include/*'` and build again, or set TENSORRT_ROOT to a TensorRT {major} "
        "install" + (other if passed_over else "")
    )


def fetch_published_headers(version: str, *, passed_over: list[str] | None = None) -> Path:
    """NVIDIA's published headers for TensorRT `version`'s major.minor (the OSS repository's
    include/ at its release tag), downloaded once into the cache; PluginBuildError with the
    command to run where the download fails (offline)."""
    major, minor = _major_minor(version)
    include_dir = published_headers_dir(major, minor)
    if (include_dir / _HEADER).is_file():
        return include_dir
    reasons = []
    for tag in _release_tags(version):
        url = _headers_url(tag)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                staging = _extract_include(response, include_dir)
        except (OSError, tarfile.TarError) as exc:  # URLError and HTTPError are OSErrors
            reasons.append(f"{url}: {' '.join(str(exc).split())}")
            continue
        found = tensorrt_header_version(staging) if (staging / _VERSION_HEADER).is_file() else None
        if found != (major, minor):
            shutil.rmtree(staging, ignore_errors=True)
            reasons.append(f"{url} holds TensorRT {found} headers, not {major}.{minor}")
            continue
        shutil.rmtree(include_dir, ignore_errors=True)
        staging.rename(include_dir)
        return include_dir
    raise PluginBuildError(_no_published_headers(version, passed_over or [], "; ".join(reasons)))


def _extract_include(stream, include_dir: Path) -> Path:
    """The headers under `<top>/include/` of the gzip tarball `stream`, into a staging folder
    next to `include_dir` (keeping their paths below include/)."""
    staging = include_dir.with_name(include_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(fileobj=stream, mode="r|gz") as archive:
        for member in archive:
            parts = Path(member.name).parts
            if len(parts) < 3 or parts[1] != "include" or not member.isfile():
                continue
            if not member.name.endswith((".h", ".hpp", ".inl")) or ".." in parts:
                continue
            target = staging.joinpath(*parts[2:])
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None  # a regular file, checked above
            target.write_bytes(source.read())
    return staging


def _cudnn_include_candidates() -> list[Path]:
    candidates = [
        Path(os.environ[name]) / suffix
        for name, suffix in (("GRAPHFIX_CUDNN_INCLUDE_DIR", ""), ("CUDNN_ROOT", "include"))
        if os.environ.get(name)
    ]
    candidates += _system_include_dirs()
    candidates += [folder / "cudnn" / "include" for folder in _installed_package_dirs(("nvidia",))]
    return candidates


def _cudnn_frontend_include_dir() -> Path:
    version = CUDNN_FRONTEND_REQUIREMENT.split("==")[1]
    return cache_dir() / "cudnn-headers" / f"frontend-{version}" / "include"


def fetch_cudnn_frontend_headers() -> Path:
    """Extracts the cuDNN frontend's headers from its wheel into the cache; returns the folder."""
    return _fetch_wheel_headers(
        CUDNN_FRONTEND_REQUIREMENT,
        prefix="include/",
        include_dir=_cudnn_frontend_include_dir(),
        header=_CUDNN_FRONTEND_HEADER,
        missing="cudnn.h was found but the cuDNN frontend headers were not",
        remedy="set GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR to a folder holding cudnn_frontend.h",
    )


def find_cudnn_headers(*, allow_download: bool | None = None) -> CudnnHeaders | None:
    """cuDNN's and its frontend's headers for GraphfixAttention's cuDNN path, or None without
    cudnn.h (the plugins then build with the portable attention kernel only). The frontend comes
    from $GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR, else (when `allow_download`, the default) its wheel."""
    include_dir = next(
        (d for d in _cudnn_include_candidates() if (d / _CUDNN_HEADER).is_file()), None
    )
    if include_dir is None:
        return None
    configured = os.environ.get("GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR")
    if configured:
        if not (Path(configured) / _CUDNN_FRONTEND_HEADER).is_file():
            raise PluginBuildError(
                f"GRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR={configured} has no {_CUDNN_FRONTEND_HEADER}; "
                "point it at the frontend's include folder or unset it"
            )
        return CudnnHeaders(include_dir, Path(configured))
    for candidate in [_cudnn_frontend_include_dir(), include_dir]:
        if (candidate / _CUDNN_FRONTEND_HEADER).is_file():
            return CudnnHeaders(include_dir, candidate)
    if allow_download is False:
        return None
    return CudnnHeaders(include_dir, fetch_cudnn_frontend_headers())


def cudnn_runtime_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (None: this process's) with what GraphfixAttention needs to load an installed cuDNN
    wheel's libcudnn.so.9 in a child process: its folder (and the CUDA runtime's, which the cuDNN
    frontend loads) on LD_LIBRARY_PATH, GRAPHFIX_CUDNN_LIBRARY naming it. Unchanged without one."""
    env = dict(os.environ if env is None else env)
    folders: list[str] = []
    for nvidia in _installed_package_dirs(("nvidia",)):
        libraries = sorted(nvidia.glob("cudnn/lib/libcudnn.so.9"))
        folders += [str(p.parent) for p in libraries]
        folders += [str(p.parent) for p in sorted(nvidia.glob("*/lib/libcudart.so.1[23]"))]
        if libraries and "GRAPHFIX_CUDNN_LIBRARY" not in env:
            env["GRAPHFIX_CUDNN_LIBRARY"] = str(libraries[0])
    if folders:
        env["LD_LIBRARY_PATH"] = ":".join([*folders, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return env


def _wheel_nvinfer_library() -> Path | None:
    """libnvinfer from an installed TensorRT wheel (`tensorrt_libs`), which CMake does not search."""
    for folder in _installed_package_dirs(("tensorrt_libs", "tensorrt")):
        for library in sorted(folder.glob("libnvinfer.so.*")):
            if re.fullmatch(r"libnvinfer\.so\.\d+", library.name):
                return library
    return None


def _check_same_major(headers: TensorRTHeaders, major: int, nvinfer: Path | None) -> None:
    """The headers and the libnvinfer the library links must be one TensorRT major version."""
    if nvinfer is None:
        return
    linked = int(nvinfer.name.rsplit(".", 1)[1])
    if linked != major:
        raise PluginBuildError(
            f"the TensorRT headers in {headers.include_dir} ({headers.origin}) are TensorRT {major} "
            f"but the installed libnvinfer is {nvinfer} (TensorRT {linked}); set TENSORRT_ROOT "
            f"to a TensorRT {linked} install that has include/{_HEADER}"
        )


@dataclass(frozen=True)
class CudaArchs:
    """The CUDA architectures to build for, and why those ("--cuda-archs", "the visible GPU", …)."""

    value: str  # CMake's list ("90", "80;90") or "default" (CMakeLists.txt's wide list)
    origin: str


# CMakeLists.txt's "default" list, as people read it.
WIDE_ARCHS = "sm_75 to sm_90, plus sm_100 and sm_120 with CUDA >= 12.8"


def choose_cuda_archs(cuda_archs: str | None = None) -> CudaArchs:
    """What to build for: `cuda_archs`, else $GRAPHFIX_CUDA_ARCHS, else CMake's $CUDAARCHS, else
    the GPUs nvidia-smi sees, else (no GPU here) every architecture in the wide list."""
    for value, origin in (
        (cuda_archs, "--cuda-archs"),
        (os.environ.get("GRAPHFIX_CUDA_ARCHS"), "$GRAPHFIX_CUDA_ARCHS"),
        (os.environ.get("CUDAARCHS"), "$CUDAARCHS"),
    ):
        if value is not None and value.strip():
            return CudaArchs(_normalized_archs(value, origin), origin)
    gpus = visible_gpu_archs()
    if gpus:
        names = ", ".join(f"{name} (sm_{arch})" for name, arch in gpus)
        archs = ";".join(dict.fromkeys(arch for _, arch in gpus))
        return CudaArchs(archs, f"the visible GPU(s): {names}, from nvidia-smi")
    return CudaArchs(
        "default",
        f"no GPU visible (nvidia-smi found none), so every architecture: {WIDE_ARCHS}; pass "
        "--cuda-archs 90 (your GPU's compute capability) for a build several times faster",
    )


def visible_gpu_archs() -> list[tuple[str, str]]:
    """(name, compute capability as "90") of each GPU nvidia-smi lists; [] without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, _, capability = line.rpartition(",")
        if re.fullmatch(r"\s*\d+\.\d+\s*", capability):
            gpus.append((name.strip(), capability.strip().replace(".", "")))
    return gpus


def _normalized_archs(value: str, origin: str) -> str:
    if value.strip() == "default":
        return "default"
    archs = [a for a in re.split(r"[;,\s]+", value.strip()) if a]
    if not all(re.fullmatch(r"\d+[af]?(-real|-virtual)?", a) for a in archs):
        raise UsageError(
            f"{origin}={value!r} is not a list of CUDA architectures; expected numbers such as "
            "'75;80;86;89;90' (or 'default')"
        )
    return ";".join(archs)


# Lines of CMake's build tools that say how far the build is: ninja "[12/40] Building CUDA …",
# make "[ 45%] Building CUDA …".
_PROGRESS = re.compile(r"^\[\s*(\d+/\d+|\d+%)\]\s")


def _run_logged(
    command: list[str], log: Path, what: str, progress: Callable[[str], None] | None = None
) -> None:
    """Run `command`, appending its output to `log`; each progress line also goes to `progress`."""
    lines: list[str] = []
    with log.open("a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as child:
            for line in child.stdout:
                out.write(line)
                lines.append(line.rstrip("\n"))
                if progress is not None and _PROGRESS.match(line):
                    progress(line.rstrip())
        out.write("\n")
    if child.returncode != 0:
        raise PluginBuildError(
            f"{what} failed (exit {child.returncode}); full log: {log}\n" + "\n".join(lines[-25:])
        )


def _make_build_dir(build: Path) -> None:
    try:
        build.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the build folder {build}: {exc.strerror or exc}; give --build-dir "
            "a folder you can write to"
        ) from exc


def build_plugins(
    *,
    build_dir: Path | str | None = None,
    cuda_archs: str | None = None,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> PluginBuild:
    """Configures and builds both plugin libraries with CMake; returns where they are.

    `cuda_archs`: e.g. "90" or "75;80;86;89;90"; None means $GRAPHFIX_CUDA_ARCHS, $CUDAARCHS, the
    GPUs nvidia-smi sees, and only where there is none every architecture people run TensorRT on
    (`choose_cuda_archs`; the result says which).  `jobs`: parallel compile jobs, None means one
    per CPU.  `progress` receives what is happening (the architectures first, then each of the
    build tool's progress lines).
    """
    if jobs is not None and (isinstance(jobs, bool) or jobs < 1):
        raise UsageError(f"--jobs (jobs) must be an integer >= 1, got {jobs!r}")
    chosen = choose_cuda_archs(cuda_archs)  # a malformed value fails before anything runs
    if build_dir is not None:  # an unusable folder fails before the toolchain is looked for
        _make_build_dir(Path(build_dir))
    archs = chosen.value
    source = plugin_source_dir()
    nvcc = find_nvcc()
    cmake = _find_cmake()
    headers = find_tensorrt_headers()
    if progress is not None:
        progress(f"building for CUDA architectures {archs}: {chosen.origin}")
    nvinfer = _wheel_nvinfer_library()
    major = tensorrt_header_major(headers.include_dir)
    _check_same_major(headers, major, nvinfer)
    build = Path(build_dir) if build_dir is not None else default_build_dir(tensorrt_major=major)
    cudnn, cudnn_note = cudnn_headers_for_build()
    notes = (cudnn_note,) if cudnn_note else ()
    if progress is not None and cudnn_note:
        progress(cudnn_note)
    _make_build_dir(build)
    log = build / _BUILD_LOG
    log.write_text("")

    configure = [
        cmake,
        "-S",
        str(source),
        "-B",
        str(build),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DGRAPHFIX_TENSORRT_INCLUDE_DIR={headers.include_dir}",
        f"-DGRAPHFIX_CUDA_ARCHITECTURES={archs}",
    ]
    if nvinfer is not None:
        configure.append(f"-DGRAPHFIX_NVINFER_LIBRARY={nvinfer}")
    if cudnn is not None:
        configure.append(f"-DGRAPHFIX_CUDNN_INCLUDE_DIR={cudnn.include_dir}")
        configure.append(f"-DGRAPHFIX_CUDNN_FRONTEND_INCLUDE_DIR={cudnn.frontend_include_dir}")
    if shutil.which("ninja") and not (build / "Makefile").exists():
        configure += ["-G", "Ninja"]
    _run_logged(configure, log, "configuring the plugins with CMake")
    _run_logged(
        [cmake, "--build", str(build), "-j", str(jobs or os.cpu_count() or 1), "--target"]
        + ["graphfix_plugins", "graphfix_plugins_dynamic"],
        log,
        "building the plugins",
        progress,
    )
    _write_manifest(build, headers, nvinfer, cudnn, notes)
    return PluginBuild(
        libraries=find_plugin_libraries(build_dir=build),
        build_dir=build,
        cuda_archs=archs,
        cuda_archs_origin=chosen.origin,
        headers=headers,
        nvcc=nvcc,
        nvinfer_library=nvinfer,
        cudnn=cudnn,
        notes=notes,
    )


def cudnn_headers_for_build() -> tuple[CudnnHeaders | None, str | None]:
    """cuDNN's headers for the build, or None and why the cuDNN path is left out when cudnn.h is
    there but its frontend cannot be had (offline: the wheel download failed)."""
    try:
        return find_cudnn_headers(), None
    except PluginBuildError as exc:
        return None, (f"GraphfixAttention's cuDNN path left out, its own kernels only: {exc}")


def _write_manifest(
    build: Path,
    headers: TensorRTHeaders,
    nvinfer: Path | None,
    cudnn: CudnnHeaders | None,
    notes: tuple[str, ...],
) -> None:
    """What the build folder's libraries were built from, beside them (graphfix-build.json)."""
    major, minor = tensorrt_header_version(headers.include_dir)
    manifest = {
        "tensorrt_headers": f"{major}.{minor}",
        "tensorrt_include_dir": str(headers.include_dir),
        "tensorrt_headers_origin": headers.origin,
        "nvinfer_library": None if nvinfer is None else str(nvinfer),
        "cudnn": cudnn is not None,
        "notes": list(notes),
    }
    (build / BUILD_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


_HEADER_MARKER = re.compile(rb"graphfix-tensorrt-headers=(\d+)\.(\d+);")


def library_tensorrt_headers(library: Path | str) -> tuple[int, int] | None:
    """The TensorRT (major, minor) whose headers built `library`, read from the file without
    loading it (plugins/common/tensorrtHeaderVersion.cpp); None for a library that does not
    record it (built by an older graphfix, or not graphfix's)."""
    try:
        data = Path(library).read_bytes()
    except OSError as exc:
        raise PluginBuildError(
            f"cannot read plugin library {library} ({exc.strerror or exc}); build it with "
            "`graphfix plugins build` or pass the path of the built library"
        ) from exc
    found = _HEADER_MARKER.search(data)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


def check_library_tensorrt(library: Path | str, *, tensorrt_version: str | None) -> None:
    """PluginBuildError unless `library` was built with headers of TensorRT `tensorrt_version`'s
    major version (None: nothing to check against).  TensorRT 11 moved vtable slots of the
    plugin registry, logger and logger finder, so the other major's library would crash."""
    if tensorrt_version is None:
        return
    built = library_tensorrt_headers(library)
    major = _major_minor(tensorrt_version)[0]
    if built is not None and built[0] != major:
        raise PluginBuildError(
            f"plugin library {library} was built with TensorRT {built[0]}.{built[1]} headers but "
            f"this is TensorRT {tensorrt_version}: loading it would crash (TensorRT 11 moved the "
            "plugin registry's and logger's virtual functions); rebuild it with `graphfix plugins "
            "build` where this TensorRT is installed"
        )


def build_plugin_harness(
    *, build_dir: Path | str | None = None, jobs: int | None = None, target: str | None = None
) -> Path:
    """Builds a host harness (tests, benchmarks) in a folder `build_plugins` configured.

    `target`: HARNESS_NAME (None, GraphfixSoftmax) or ATTENTION_HARNESS_NAME (GraphfixAttention).
    """
    target = target or HARNESS_NAME
    build = Path(build_dir) if build_dir is not None else default_build_dir()
    if not (build / "CMakeCache.txt").is_file():
        raise PluginBuildError(f"{build} is not a configured plugin build; run build_plugins first")
    log = build / _BUILD_LOG
    _run_logged(
        [_find_cmake(), "--build", str(build), "-j", str(jobs or os.cpu_count() or 1)]
        + ["--target", target],
        log,
        "building the plugin harness",
    )
    return build / target


def find_plugin_libraries(*, build_dir: Path | str | None = None) -> PluginLibraries:
    """The built libraries in `build_dir` (None: the default build folder)."""
    build = Path(build_dir) if build_dir is not None else default_build_dir()
    libraries = PluginLibraries(
        static=build / STATIC_LIBRARY_NAME, dynamic=build / DYNAMIC_LIBRARY_NAME
    )
    missing = [p.name for p in (libraries.static, libraries.dynamic) if not p.is_file()]
    if missing:
        raise PluginBuildError(
            f"the plugin library is not built: {', '.join(missing)} missing in {build}; "
            "run `graphfix plugins build`"
        )
    return libraries


def load_plugins_into_tensorrt(*, libraries: PluginLibraries | None = None) -> LoadedPlugins:
    """Registers every graphfix plugin with TensorRT's plugin registry in this process.

    Loads the getCreators library through `IPluginRegistry.load_library`; does nothing when the
    creators are already registered (for example by the self-registering library).
    """
    try:
        import tensorrt as trt
    except ImportError as error:
        raise PluginBuildError(
            f"TensorRT's Python package cannot be imported ({error}); install TensorRT "
            "(`pip install tensorrt`) on a machine with an NVIDIA GPU, or load "
            f"{DYNAMIC_LIBRARY_NAME} with trtexec --dynamicPlugins instead"
        ) from error
    registry = trt.get_plugin_registry()
    if not missing_creators(registry):
        return LoadedPlugins(library=None, already_registered=True)
    libraries = libraries if libraries is not None else find_plugin_libraries()
    check_library_tensorrt(libraries.dynamic, tensorrt_version=str(trt.__version__))
    registry.load_library(str(libraries.dynamic))
    require_creators(registry, loaded=libraries.dynamic, tensorrt_version=str(trt.__version__))
    return LoadedPlugins(library=libraries.dynamic, already_registered=False)


def missing_creators(registry) -> tuple[PluginSpec, ...]:
    """The graphfix plugins that `registry` (a `trt.IPluginRegistry`) does not find by name,
    version and namespace, the way TensorRT's ONNX parser looks a plugin node up."""
    return tuple(
        spec
        for spec in PLUGIN_SPECS
        if registry.get_creator(spec.op_type, spec.version, spec.namespace) is None
    )


def require_creators(registry, *, loaded: Path | str, tensorrt_version: str) -> None:
    """PluginBuildError unless `registry` finds every graphfix plugin after loading `loaded`."""
    missing = missing_creators(registry)
    if missing:
        names = ", ".join(
            f"{s.op_type} version {s.version} in namespace {s.namespace!r}" for s in missing
        )
        raise PluginBuildError(
            f"TensorRT {tensorrt_version} loaded {loaded} but its plugin registry finds no creator "
            f"{names}; rebuild the library for this TensorRT (`graphfix plugins build`) or pass "
            "the one built for it (--plugins)"
        )


def trtexec_command(model_path: Path | str, *, libraries: PluginLibraries | None = None) -> str:
    """The trtexec command line that builds an engine of `model_path` with the plugin library
    (PluginBuildError when the library was built for another TensorRT major than the installed)."""
    libraries = libraries if libraries is not None else find_plugin_libraries()
    check_library_tensorrt(libraries.dynamic, tensorrt_version=installed_tensorrt_version())
    return shlex.join(["trtexec", f"--onnx={model_path}", f"--dynamicPlugins={libraries.dynamic}"])
