#!/usr/bin/env python3
"""The host time of one warm `autotune.attention` call, on any machine: the whole Python path runs for real and only
the driver underneath it is a stand-in.

    PYTHONPATH=. python3 benchmarks/launch_standin.py [--calls 20000] [--rounds 7] [--row NAME ...] [--profile NAME]

What is real: attention's flag checks, the memo lookup, the config lookup in the shipped H200 tables (cold call
only), the loader's validation and parameter block, the split-KV partials, the TMA tensor-map encoders, the
ctypes calls of cuLaunchKernel / cuLaunchKernelEx / cuTensorMapEncodeTiled / cuCtxGetCurrent with their
argument marshalling. What stands in: those four libcuda functions are a C stub compiled here with `cc` (each
returns CUDA_SUCCESS at once), cuda-python's driver is a Python double for the calls it answers (only the cold
call's context and module set-up, and the context check per launch where the loader still asks it), torch's
stream and device queries return fixed handles, and the tensors are CPU tensors (torch.empty of the outputs and
partials costs what the CPU allocator costs, not the CUDA caching allocator). So the figures are this host's
Python and ctypes cost per call, not a GPU host's: compare them with each other (before/after a change), not with
the H200 rows of docs/benchmarks.md.

Rows (the configs are the shipped H200 table's for these shapes):
  b1-decode    q (1, 32, 1, 128) on k/v (1, 8, 4096, 128) bf16: 16 key splits, so a combine launch follows;
  b32-decode   q (32, 32, 1, 128) on k/v (32, 8, 4096, 128) bf16: no split;
  b4-prefill   q, k, v (4, 16, 4096, 128) fp16, causal.
Each figure is the median over --rounds of the mean µs per call over --calls calls.
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import space  # noqa: E402

STUB_SOURCE = r"""
#include <stdint.h>
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void *stream, void **params, void **extra) { return 0; }
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) { return 0; }
int cuTensorMapEncodeTiled(void *tmap, int dtype, unsigned rank, void *address, const uint64_t *dims,
                           const uint64_t *strides, const uint32_t *box, const uint32_t *elem, int interleave,
                           int swizzle, int l2, int oob) { return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x1000; return 0; }
"""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
CONTEXT = 0x1000  # what the stub's cuCtxGetCurrent answers, and the double's primary context
ROWS = {
    "b1-decode": ((1, 32, 1, 128), (1, 8, 4096, 128), torch.bfloat16, False),
    "b32-decode": ((32, 32, 1, 128), (32, 8, 4096, 128), torch.bfloat16, False),
    "b4-prefill": ((4, 16, 4096, 128), (4, 16, 4096, 128), torch.float16, True),
}


def stub_libcuda() -> ctypes.CDLL:
    """The four libcuda entry points of the hot path, as a real shared object (so ctypes marshals as it would)."""
    d = Path(tempfile.mkdtemp(prefix="libcuda-stub-"))
    (d / "stub.c").write_text(STUB_SOURCE)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(d / "libcuda_stub.so"), str(d / "stub.c")], check=True)
    return ctypes.CDLL(str(d / "libcuda_stub.so"))


class _Handle:
    def __init__(self, value: int):
        self.value = value

    def __int__(self):
        return self.value


class DriverDouble:
    """cuda-python's driver module for the calls the loader makes through it; enums come from the real module."""

    def __init__(self):
        from cuda.bindings import driver as real

        self._real = real
        self.current = _Handle(CONTEXT)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _ok(self, *values):
        return (self._real.CUresult.CUDA_SUCCESS, *values)

    def cuInit(self, flags):  # noqa: N802 (the driver's names)
        return self._ok()

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return self._ok(ordinal)

    def cuDevicePrimaryCtxRetain(self, dev):  # noqa: N802
        return self._ok(_Handle(CONTEXT))

    def cuCtxGetCurrent(self):  # noqa: N802
        return self._ok(self.current)

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        self.current = ctx
        return self._ok()

    def cuModuleLoadData(self, image):  # noqa: N802
        return self._ok(_Handle(0x2000))

    def cuModuleGetFunction(self, module, name):  # noqa: N802
        return self._ok(_Handle(0x3000 + len(name)))

    def cuFuncSetAttribute(self, function, attr, value):  # noqa: N802
        return self._ok()

    def cuDeviceGetAttribute(self, attr, dev):  # noqa: N802
        return self._ok(132)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, threads, smem):  # noqa: N802
        return self._ok(1)


class _FakeBuild:
    ok = True

    def __init__(self, config, problem):
        self.config, self.problem = config, problem

    def cubin_bytes(self) -> bytes:
        return b"\x7fELF" + self.config.key.encode()


class _Stream:
    cuda_stream = 0xBEEF


def install_standins() -> None:
    """Point the launch layer at the stub libcuda and the driver double, and torch's CUDA queries at fixed
    answers; the runtime looks configs up as on an H200 and 'builds' them without nvcc."""
    from autotune.launch import libcuda, loader, tma
    from autotune.runtime import attention_op as op
    from autotune.runtime import lookup

    lib = stub_libcuda()
    # Keep freed blocks in the heap (no mmap/munmap per large block), as CUDA's caching allocator keeps its blocks:
    # otherwise the prefill row's 64 MB output alone costs ~15 µs of page-table work per call on the CPU.
    libc = ctypes.CDLL(None)
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)
    drv = DriverDouble()
    libcuda._lib = lambda: lib
    for module in (libcuda, loader, tma):
        module.driver = lambda: drv
    for name in ("init", "_lazy_init"):
        setattr(torch.cuda, name, lambda: None)
    torch.cuda.current_device = lambda: 0
    torch.cuda.current_stream = lambda device=None: _Stream()
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    if hasattr(loader, "raw_stream_fn"):  # the loader's own raw-stream read, where it has one
        loader.raw_stream_fn = lambda: (lambda device: _Stream.cuda_stream)
    lookup.device_info = lambda device: ("NVIDIA H200", space.get_arch("sm_90"))
    lookup.build = lambda config, problem, arch, trusted_hash=None: _FakeBuild(config, problem)
    # CPU tensors: the cold call's one-time validation skips only its "a CUDA tensor" check
    check = op.check_inputs
    op.check_inputs = lambda q, k, v, require_cuda=True: check(q, k, v, require_cuda=False)
    from autotune.launch import params

    make = params.make_params
    loader.make_params = lambda *a, **kw: make(*a, **{**kw, "require_cuda": False})
    # tma refuses CPU tensors by their is_cuda: where the encoders are picked once per prepared launch
    # (tma.map_encoder, the cold call only), the stand-in tensors say they are CUDA tensors; where every call
    # encodes through tma.encode, it runs without that one check (a wrapper per call would be timed too)
    if hasattr(tma, "map_encoder"):
        pick = tma.map_encoder
        tma.map_encoder = lambda tensor, *a, **kw: pick(_CudaLooking(tensor), *a, **kw)
    else:
        tma.encode = _encode_without_device_check


def _encode_without_device_check(tensor, box_rows, name="tensor", l2_promotion="256B"):
    from autotune.launch import tma

    encoder = tma._encoder(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.element_size(),
                           box_rows, name, l2_promotion)
    return encoder(tensor.data_ptr())


class _CudaLooking:
    """A CPU tensor that answers is_cuda=True (only for tma.encode's device check)."""

    is_cuda = True

    def __init__(self, t):
        self._t = t

    def __getattr__(self, name):
        return getattr(self._t, name)


def row_inputs(name: str):
    q_shape, kv_shape, dtype, causal = ROWS[name]
    q = torch.empty(q_shape, dtype=dtype)
    k, v = torch.empty(kv_shape, dtype=dtype), torch.empty(kv_shape, dtype=dtype)
    return q, k, v, causal


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--row", action="append", choices=sorted(ROWS), default=[])
    p.add_argument("--profile", choices=sorted(ROWS), help="cProfile one row's warm calls instead of timing")
    args = p.parse_args(argv)
    install_standins()
    import autotune
    from autotune.runtime import attention_op as op

    if args.profile:
        q, k, v, causal = row_inputs(args.profile)
        autotune.attention(q, k, v, causal=causal)
        prof = cProfile.Profile()
        prof.runcall(lambda: [autotune.attention(q, k, v, causal=causal) for _ in range(args.calls)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    for name in args.row or list(ROWS):
        q, k, v, causal = row_inputs(name)

        def call():
            autotune.attention(q, k, v, causal=causal)

        call()  # cold: lookup, validation, the prepared launch
        selection = list(op._launchers.values())[-1].plan.selection
        rounds = [per_call_us(call, args.calls) for _ in range(args.rounds)]
        print(f"{name}: {statistics.median(rounds):.2f} µs/call (rounds {min(rounds):.2f}-{max(rounds):.2f}; "
              f"{args.rounds} × {args.calls} calls; torch {torch.__version__}; {selection.source} "
              f"kv_splits={selection.config.kv_splits})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
