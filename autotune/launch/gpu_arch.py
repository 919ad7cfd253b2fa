"""Which space.Arch to build for: the visible GPU's, or the one named on the command line."""
from __future__ import annotations

import space
from space import Arch

NO_GPU_MESSAGE = f"no CUDA GPU visible; pass --arch, one of {', '.join(space.ARCHES)}"


class NoGpuError(RuntimeError):
    """No CUDA device could be queried, so the arch must be given explicitly."""


def _torch_capability(device: int) -> tuple[int, int] | None:
    try:
        import torch
    except Exception:  # torch is optional
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _driver_capability(device: int) -> tuple[int, int] | None:
    """Compute capability through the CUDA driver API (cuda-python), for machines without a CUDA torch."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 layout
        except ImportError:
            return None
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        err, dev = driver.cuDeviceGet(device)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        attr = driver.CUdevice_attribute
        err, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        if err != driver.CUresult.CUDA_SUCCESS or err2 != driver.CUresult.CUDA_SUCCESS:
            return None
        return int(major), int(minor)
    except Exception:  # no driver library on this machine (it raises at first use), or no device
        return None


def detect_arch(device: int = 0) -> Arch:
    """The space.Arch of CUDA device `device`; raises NoGpuError when no GPU is visible."""
    capability = _torch_capability(device) or _driver_capability(device)
    if capability is None:
        raise NoGpuError(NO_GPU_MESSAGE)
    try:
        return space.get_arch(capability)
    except ValueError as e:
        raise NoGpuError(f"the visible GPU is sm_{capability[0]}{capability[1]}, which autotune does not "
                         f"support ({e}); pass --arch to build for another arch") from None


def resolve_arch(name: str | None, device: int = 0) -> Arch:
    """--arch's value when given (validated), else the visible GPU's arch."""
    if name:
        return space.get_arch(name)
    return detect_arch(device)
