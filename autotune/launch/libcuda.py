"""The driver calls on the hot path of a warm `autotune.attention` call, bound straight to libcuda with ctypes.

Everything else (contexts, modules, attributes, occupancy) goes through cuda-python, whose module `driver()`
here finds for both of its layouts. These are called on
every launch, and cuda-python's argument conversion made them the bulk of the per-call overhead: on the H200,
a bare cuLaunchKernel through cuda-python cost 18 µs of host time and the three tensor-map encodings of the
wgmma family more than that again (benchmarks/runtime_overhead.py, 2026-11-29). A ctypes call with prebuilt
argument arrays costs a few microseconds. Enum values come from cuda-python, so nothing is hard-coded.
"""
from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=None)
def driver():
    """cuda-python's driver module: `cuda.bindings.driver` (cuda-python >= 12.6), else the older `cuda.cuda`."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        from cuda import cuda as drv
    return drv


@functools.lru_cache(maxsize=None)
def _lib():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:  # no driver: only reached on a machine that launches kernels
        raise RuntimeError(f"libcuda.so.1 could not be loaded ({e}); a CUDA driver is needed to launch kernels") from None


@functools.lru_cache(maxsize=None)
def launch_kernel_fn():
    """CUresult cuLaunchKernel(CUfunction, gx, gy, gz, bx, by, bz, sharedMemBytes, CUstream, void** params, void** extra)."""
    fn = _lib().cuLaunchKernel
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


@functools.lru_cache(maxsize=None)
def encode_tiled_fn():
    """CUresult cuTensorMapEncodeTiled(CUtensorMap*, dataType, rank, void* globalAddress, const cuuint64_t* globalDim,
    const cuuint64_t* globalStrides, const cuuint32_t* boxDim, const cuuint32_t* elementStrides, interleave, swizzle,
    l2Promotion, oobFill)."""
    fn = _lib().cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


@functools.lru_cache(maxsize=None)
def ctx_get_current_fn():
    """CUresult cuCtxGetCurrent(CUcontext* pctx): the context check before every launch, at a ctypes call's cost."""
    fn = _lib().cuCtxGetCurrent
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    return fn


@functools.lru_cache(maxsize=None)
def memset_d32_async_fn():
    """CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream): the tile counter's
    zeroing before each launch of a kernel that takes its tiles from one (space.Layout.tile_counter)."""
    fn = _lib().cuMemsetD32Async
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    return fn


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id (a 4-byte enum) padded to 8 bytes, then the 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h): grid, block, dynamic shared memory, stream, then the attribute list."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def launch_kernel_ex_fn():
    """CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** kernelParams, void** extra)."""
    fn = _lib().cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


@functools.lru_cache(maxsize=None)
def programmatic_serialization() -> LaunchAttribute:
    """The attribute that lets a launch start before the previous kernel on its stream has finished
    (programmatic dependent launch, sm_90+): the kernel's griddepcontrol.wait then waits for that kernel's
    completion and memory, and the launch itself overlaps the previous kernel's tail."""
    attr = LaunchAttribute()
    attr.id = int(driver().CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    return attr


def error_name(code: int) -> str:
    """CUDA_ERROR_... for a CUresult code, through cuda-python (only on the error path)."""
    drv = driver()
    try:
        return drv.cuGetErrorName(drv.CUresult(code))[1].decode()
    except Exception:
        return f"CUresult {code}"
