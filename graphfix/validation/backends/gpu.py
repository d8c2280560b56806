"""The GPU a TensorRT engine is built for: its name and compute capability (an engine cache key).

Read through the CUDA driver API (libcuda.so.1, present wherever an NVIDIA driver is) for the
device the CUDA runtime uses in this process (`cudaGetDevice`, through polygraphy's CUDA wrapper),
so no CUDA Python package is needed.  The driver and runtime number devices alike (both honour
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

from graphfix.validation.backends import BackendError

# cuda.h: CUdevice_attribute
_COMPUTE_CAPABILITY_MAJOR = 75
_COMPUTE_CAPABILITY_MINOR = 76
_NAME_LENGTH = 256


@dataclass(frozen=True)
class GpuIdentity:
    """A GPU as an engine depends on it: the product name and the compute capability."""

    name: str
    compute_capability: tuple[int, int]

    def describe(self) -> str:
        major, minor = self.compute_capability
        return f"{self.name} (compute capability {major}.{minor})"


def current_gpu() -> GpuIdentity:
    """The GPU the CUDA runtime of this process builds and runs on (BackendError without one)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise BackendError(
            f"the NVIDIA driver library cannot be loaded ({exc}); TensorRT needs an NVIDIA GPU "
            "with its driver, or validate with --backend onnxruntime"
        ) from exc
    _check(driver.cuInit(0), "cuInit")
    device = ctypes.c_int()
    _check(driver.cuDeviceGet(ctypes.byref(device), _runtime_device()), "cuDeviceGet")
    name = ctypes.create_string_buffer(_NAME_LENGTH)
    _check(driver.cuDeviceGetName(name, _NAME_LENGTH, device), "cuDeviceGetName")
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(
        driver.cuDeviceGetAttribute(ctypes.byref(major), _COMPUTE_CAPABILITY_MAJOR, device),
        "cuDeviceGetAttribute",
    )
    _check(
        driver.cuDeviceGetAttribute(ctypes.byref(minor), _COMPUTE_CAPABILITY_MINOR, device),
        "cuDeviceGetAttribute",
    )
    return GpuIdentity(name.value.decode(errors="replace"), (major.value, minor.value))


def _runtime_device() -> int:
    from polygraphy import cuda

    try:
        wrapper = cuda.wrapper()
    except OSError as exc:  # polygraphy found no libcudart and the loader has none either
        raise BackendError(cuda_runtime_problem(exc)) from exc
    device = ctypes.c_int()
    wrapper.check(wrapper.handle.cudaGetDevice(ctypes.byref(device)))
    return device.value


def cuda_runtime_problem(error: OSError) -> str:
    """One line for polygraphy failing to load the CUDA runtime, naming the folder to add.

    pip's CUDA 13 wheels (TensorRT 11's default) put libcudart.so.13 in site-packages'
    nvidia/cu13/lib, which neither the loader nor polygraphy (nvidia/cuda_runtime/lib) searches.
    """
    detail = " ".join(str(error).split())
    folders = [str(lib.parent) for lib in installed_cuda_runtimes()]
    if folders:
        add = ":".join(dict.fromkeys(folders))
        return (
            f"polygraphy cannot load the CUDA runtime ({detail}); it is installed in {add}: "
            f'`export LD_LIBRARY_PATH={add}:"$LD_LIBRARY_PATH"` and run again'
        )
    return (
        f"polygraphy cannot load the CUDA runtime ({detail}); install it (`pip install "
        "nvidia-cuda-runtime` for CUDA 13, or the CUDA toolkit) and add the folder holding "
        "libcudart.so to LD_LIBRARY_PATH"
    )


def installed_cuda_runtimes() -> list[Path]:
    """libcudart.so.N files of installed NVIDIA wheels (nvidia/cu13/lib, nvidia/cuda_runtime/lib)."""
    found: list[Path] = []
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if nvidia.is_dir():
            found += sorted(nvidia.glob("*/lib/libcudart.so.*"))
    return list(dict.fromkeys(found))


def _check(status: int, call: str) -> None:
    if status != 0:
        raise BackendError(
            f"the CUDA driver failed {call} (CUresult {status}); check that `nvidia-smi` lists a "
            "GPU, or validate with --backend onnxruntime"
        )
