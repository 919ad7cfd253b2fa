"""cubin → CUfunction → launch, through cuda-python's driver API, inside torch's context and on torch's stream.

torch allocates the tensors and owns the stream; we only load modules and launch. Both must live in the same
CUDA context, so everything here runs in the device's *primary* context, the one torch's runtime uses.
Every driver call is checked; a failure raises CudaError naming the call and the CUresult.

Note that a kernel that faults leaves the context unusable (every later call fails): callers that try untrusted
configs run them in a child process (autotune.measure.child_process).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import space

from . import tma
from .libcuda import (LaunchConfig, ctx_get_current_fn, driver, error_name, launch_kernel_ex_fn, launch_kernel_fn,
                      memset_d32_async_fn, programmatic_serialization)
from .params import FlashFwdParams, InputShape, make_params

MAX_GRID_YZ = 65535
MAX_GRID_X = 2**31 - 1
MAX_PERSISTENT_TILES = 2**29  # flash_fwd.cu's Cursor: (units + 2 CTAs) << 2 fits 32 bits


class CudaError(RuntimeError):
    """A driver call failed. `call` is the API name, `code` the CUresult's name (e.g. CUDA_ERROR_ILLEGAL_ADDRESS)."""

    def __init__(self, call: str, code: str, detail: str = ""):
        self.call, self.code, self.detail = call, code, detail
        super().__init__(f"{call} failed: {code}" + (f" ({detail})" if detail else ""))

    def __reduce__(self):  # picklable across the worker boundary despite the custom signature
        return CudaError, (self.call, self.code, self.detail)


def _error_name(err) -> tuple[str, str]:
    drv = driver()
    try:
        name = drv.cuGetErrorName(err)[1]
        text = drv.cuGetErrorString(err)[1]
        return name.decode(), text.decode()
    except Exception:  # an unknown code: the enum's own name is the best we have
        return str(err), ""


def cu_check(result, call: str):
    """Every binding returns (CUresult, *values): raise on error, else return the value (or tuple, or None)."""
    err, *values = result
    if err != driver().CUresult.CUDA_SUCCESS:
        name, text = _error_name(err)
        raise CudaError(call, name, text)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


# ---- context ---------------------------------------------------------------------------------------------------

_lock = threading.RLock()
_primary: dict[int, object] = {}  # device ordinal -> retained primary CUcontext (retained once, held for the process)


def ensure_context(device: int | None = None):
    """Make the device's primary context (torch's) current on this thread and return it.

    torch creates that context lazily, so after torch.cuda.init() the thread may have none current yet:
    retaining the primary context creates it if needed, and it is the very one torch's runtime will use.
    """
    import torch

    torch.cuda.init()
    if device is None:
        device = torch.cuda.current_device()
    drv = driver()
    with _lock:
        ctx = _primary.get(device)
        if ctx is None:
            cu_check(drv.cuInit(0), "cuInit")
            dev = cu_check(drv.cuDeviceGet(device), "cuDeviceGet")
            ctx = cu_check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _primary[device] = ctx
    current = cu_check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(current) != int(ctx):  # null, or another device's / a foreign context
        cu_check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


# ---- modules and launches --------------------------------------------------------------------------------------

def _address(arg) -> int:
    """Address of one by-value kernel argument: a ctypes object, or a cuda-python struct such as CUtensorMap."""
    if isinstance(arg, (ctypes.Structure, ctypes.Union, ctypes.Array, ctypes._SimpleCData)):
        return ctypes.addressof(arg)
    get_ptr = getattr(arg, "getPtr", None)
    if callable(get_ptr):
        return int(get_ptr())
    raise TypeError(f"extra_args: expected ctypes objects or cuda-python structs with getPtr(), got {type(arg).__name__}")


@functools.lru_cache(maxsize=None)
def raw_stream_fn():
    """device index -> torch's current stream on that device as a raw CUstream int. torch's own accessor of the
    raw handle where the build has it (what inductor's generated code calls: no Stream object is made), else the
    same handle through torch.cuda.current_stream."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def _stream_handle(stream, device: int) -> int:
    if stream is None:
        return raw_stream_fn()(device)
    return int(getattr(stream, "cuda_stream", stream))  # a torch.cuda.Stream or a raw handle


def _current_context() -> int:
    """The calling thread's current CUcontext as an int (0 for none), asked of libcuda directly: it is asked
    before every launch, where cuda-python's conversions cost more than the question."""
    ctx = ctypes.c_void_p()
    code = ctx_get_current_fn()(ctypes.byref(ctx))
    if code:
        raise CudaError("cuCtxGetCurrent", error_name(code))
    return ctx.value or 0


def _zero_counter(address: int, stream: int) -> None:
    """Zero the int32 tile counter at `address` on `stream`, ahead of the launch that reads it (stream order)."""
    code = memset_d32_async_fn()(address, 0, 1, stream)
    if code:
        raise CudaError("cuMemsetD32Async(tile_counter)", error_name(code))


def _programmatic_config(grid, block, smem_dynamic: int) -> LaunchConfig:
    """cuLaunchKernelEx's config for a launch with programmatic stream serialization; hStream is set per launch.
    The attribute it points at is a process-wide constant (libcuda.programmatic_serialization)."""
    return LaunchConfig(*grid, *block, smem_dynamic, None, ctypes.pointer(programmatic_serialization()), 1)


def _enqueue(entry: str, handle: int, grid, block, smem_dynamic: int, stream: int, pointers,
             config: LaunchConfig | None = None) -> None:
    """One launch through libcuda: cuLaunchKernelEx with `config` (its hStream set to `stream`) when given, else
    cuLaunchKernel. CudaError names the entry and the geometry."""
    if config is not None:
        config.hStream = stream
        code = launch_kernel_ex_fn()(ctypes.byref(config), handle, pointers, None)
    else:
        gx, gy, gz = grid
        bx, by, bz = block
        code = launch_kernel_fn()(handle, gx, gy, gz, bx, by, bz, smem_dynamic, stream, pointers, None)
    if code:
        raise CudaError(f"cuLaunchKernel{'Ex' if config is not None else ''}({entry}, grid={tuple(grid)}, "
                        f"block={tuple(block)}, smem={smem_dynamic})", error_name(code))


class Kernel:
    """One loaded entry function. Create through load_kernel (which caches); launch with launch()."""

    def __init__(self, module, function, ctx, device: int, entry: str):
        self.module, self.function, self.ctx = module, function, ctx
        self.device, self.entry = device, entry
        self.max_dynamic_smem = 0  # what CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is set to
        self._handle = int(function)  # the raw CUfunction, for the ctypes launch
        self._ctx_handle = int(ctx)   # the raw CUcontext, for the check before each launch
        self._resident: dict[tuple[int, int], int] = {}  # (threads, smem_dynamic) -> SMs × CTAs per SM

    def _make_current(self) -> None:
        if _current_context() != self._ctx_handle:
            cu_check(driver().cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        """Opt in to more than 48 KB of dynamic shared memory (the launch fails without it)."""
        drv = driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        cu_check(drv.cuFuncSetAttribute(self.function, attr, int(nbytes)),
              f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) for {self.entry}")
        self.max_dynamic_smem = int(nbytes)

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of the device this kernel is loaded on."""
        import torch

        return torch.cuda.get_device_capability(self.device)

    def attribute(self, name: str) -> int:
        """cuFuncGetAttribute by short name: 'NUM_REGS', 'SHARED_SIZE_BYTES', 'MAX_THREADS_PER_BLOCK', ..."""
        drv = driver()
        attr = getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(cu_check(drv.cuFuncGetAttribute(attr, self.function), f"cuFuncGetAttribute({name})"))

    def blocks_per_sm(self, threads: int, smem_dynamic: int) -> int:
        """Resident CTAs per SM for this launch geometry (the driver's occupancy calculator)."""
        drv = driver()
        self._make_current()
        return int(cu_check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, threads, smem_dynamic),
                         "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def resident_ctas(self, threads: int, smem_dynamic: int) -> int:
        """CTAs of this kernel the whole device holds at once: SMs × blocks_per_sm (a persistent grid's size).
        Asked of the driver once per geometry, then remembered (the launch path stays free of driver queries)."""
        key = (threads, smem_dynamic)
        found = self._resident.get(key)
        if found is None:
            drv = driver()
            if smem_dynamic > self.max_dynamic_smem:
                self.set_max_dynamic_smem(smem_dynamic)  # the occupancy query counts with the opt-in limit
            dev = cu_check(drv.cuDeviceGet(self.device), "cuDeviceGet")
            attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            sms = int(cu_check(drv.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"))
            found = self._resident[key] = sms * max(1, self.blocks_per_sm(threads, smem_dynamic))
        return found

    def launch(self, params: FlashFwdParams, grid: Sequence[int], block: Sequence[int], smem_dynamic: int = 0,
               stream=None, extra_args: Sequence = (), programmatic: bool = False) -> None:
        """cuLaunchKernel with kernelParams = [&params, &extra_args[0], ...]; `stream` defaults to torch's current.
        programmatic: launch with programmatic stream serialization (cuLaunchKernelEx; sm_90+): the kernel may
        start before the previous one on the stream has finished, and must itself wait for it (griddepcontrol.wait,
        as flash_fwd_combine does).

        Asynchronous: a fault inside the kernel surfaces at the next synchronizing call, not here.
        """
        self._make_current()
        if smem_dynamic > self.max_dynamic_smem:
            self.set_max_dynamic_smem(smem_dynamic)
        args = (params, *extra_args)
        # kernelParams is a void** whose entries point at each argument's bytes; the driver copies them at launch,
        # so `pointers` and `args` only need to outlive this call.
        pointers = (ctypes.c_void_p * len(args))(*[_address(a) for a in args])
        # libcuda directly (autotune/launch/libcuda.py says why): this is the per-call hot path.
        config = _programmatic_config(grid, block, smem_dynamic) if programmatic else None
        _enqueue(self.entry, self._handle, grid, block, smem_dynamic, _stream_handle(stream, self.device), pointers,
                 config)


_kernels: dict[tuple[str, str, int], Kernel] = {}  # (cubin sha256, entry, device) -> Kernel, for the process


def load_kernel(cubin: bytes, entry: str, max_dynamic_smem: int = 0, device: int | None = None) -> Kernel:
    """Load a cubin into the device's primary context (once per process) and return its entry function."""
    import torch

    if device is None:
        torch.cuda.init()
        device = torch.cuda.current_device()
    key = (hashlib.sha256(cubin).hexdigest(), entry, device)
    drv = driver()
    with _lock:
        kernel = _kernels.get(key)
        if kernel is None:
            ctx = ensure_context(device)
            # An int address is accepted by every cuda-python version; the driver parses the image during the call.
            image = ctypes.create_string_buffer(cubin, len(cubin))
            module = cu_check(drv.cuModuleLoadData(ctypes.addressof(image)), f"cuModuleLoadData ({len(cubin)} bytes)")
            function = cu_check(drv.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry!r})")
            kernel = _kernels[key] = Kernel(module, function, ctx, device, entry)
    if max_dynamic_smem > kernel.max_dynamic_smem:
        kernel.set_max_dynamic_smem(max_dynamic_smem)
    return kernel


# ---- running a build -------------------------------------------------------------------------------------------

def cubin_bytes(build) -> bytes:
    """The cubin of a BuildResult (or of anything with .cubin_bytes() or .cubin_path)."""
    if hasattr(build, "cubin_bytes"):
        return build.cubin_bytes()
    return Path(build.cubin_path).read_bytes()


def _family(name: str) -> space.Family:
    """space.get_family, importing space/<name>.py first if needed: a Config unpickled in a worker process
    does not import the module that registers its family."""
    if name not in space.FAMILIES:
        try:
            importlib.import_module(f"space.{name}")
        except ModuleNotFoundError:
            pass  # get_family's error lists the known families
    return space.get_family(name)


# split-KV's merge kernel, in every cubin of both families (kernels/common/split_combine.cuh)
COMBINE_ENTRY = "flash_fwd_combine"
# the merge of a tail-split build's cut tiles, in every cubin of the wgmma family (kernels/sm90/flash_fwd.cu)
TAIL_COMBINE_ENTRY = "flash_fwd_tail_combine"
COMBINE_ROWS_PER_BLOCK = 4            # one warp per (batch, head, query row), 128 threads (kCombineRowsPerBlock)
# Launch split-KV's combine with programmatic dependent launch on sm_90+ (its launch overlaps the split kernel's tail;
# the kernel waits for the splits' partials itself, griddepcontrol.wait; not the tail combine: KernelRunner.combine).
# On by default since the H200 decode table measured it (docs/benchmarks.md, "Decode": B1 Nk4096 12.7 -> 11.2 µs in a
# CUDA graph); AUTOTUNE_COMBINE_PDL=0 turns it off for a process, and benchmarks/decode_table.py --combine-pdl /
# --no-combine-pdl pick either.
COMBINE_PROGRAMMATIC = os.environ.get("AUTOTUNE_COMBINE_PDL", "1") != "0"


@dataclass(frozen=True)
class Combine:
    """The second launch of a split-KV build: same parameter block, its own grid."""

    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    programmatic: bool = False  # programmatic dependent launch (COMBINE_PROGRAMMATIC, on an sm_90+ device)

    def __call__(self, params: FlashFwdParams, stream=None) -> None:
        self.kernel.launch(params, self.grid, self.block, 0, stream, programmatic=self.programmatic)


@dataclass(frozen=True, eq=False)  # holds tensors: compare by identity
class Launch:
    """Everything one launch needs, prepared ahead; calling it only enqueues the kernel on the current stream."""

    kernel: Kernel
    params: FlashFwdParams
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_dynamic: int
    keepalive: tuple         # the tensors the params (and tensor maps) point into
    extra_args: tuple = ()   # by-value arguments after the parameter block (the wgmma family's CUtensorMaps)
    combine: Combine | None = None  # split-KV builds: the merge of the partials, right after on the same stream
    # For Relaunch: the encoder of each extra argument (tma.launch_map_encoders), taking the data pointer of
    # q, k, v respectively, and a split-KV build's partials as fp32 element counts (o_partial, lse_partial).
    map_encoders: tuple = ()
    partial_elems: tuple[int, int] | None = None
    device: object = None  # the tensors' torch.device, where a Relaunch allocates partials (None: the kernel's)
    # space.Layout.tile_counter builds: the int32 the CTAs take their tiles from (params.tile_counter), zeroed on the
    # launch's stream before every launch (a Relaunch gets a fresh one per call)
    counter: object = None

    def __call__(self, stream=None) -> None:
        if self.counter is not None:
            stream = _stream_handle(stream, self.kernel.device)
            _zero_counter(self.counter.data_ptr(), stream)
        self.kernel.launch(self.params, self.grid, self.block, self.smem_dynamic, stream, self.extra_args)
        if self.combine is not None:
            self.combine(self.params, stream)


class Relaunch:
    """A Launch made ready to run again and again on other tensors of its geometry (shapes, strides, dtype,
    device: the caller keys its Relaunches by them, as autotune.runtime's memo does, and has validated them once).

    Built once: the parameter block, the kernelParams array (&params, then the tensor maps), the launch
    geometry and, for split-KV, the combine's config. Per call: the data pointers are written into the block,
    a tensor map whose tensor moved is looked up for the new address (tma.TensorMapEncoder: an encode only for
    an address it has not seen) and pointed at, a split-KV call gets fresh partials (one allocation), torch's
    current stream is read once for both launches, and the context is checked once. Every pointer is written
    on every call, so a call captured in a CUDA graph captures its own tensors. The launches copy the block
    and the maps into the driver before they return, so one block serves every call; a lock keeps two threads'
    calls from writing it at once.
    """

    def __init__(self, launch: Launch):
        import torch

        if len(launch.map_encoders) != len(launch.extra_args):
            raise ValueError(f"launch: {len(launch.extra_args)} extra arguments but {len(launch.map_encoders)} "
                             "tensor-map encoders to re-point them (tma.launch_map_encoders)")
        if len(launch.map_encoders) > 3:
            raise ValueError(f"launch: at most 3 tensor maps (of q, k, v), got {len(launch.map_encoders)}")
        self.kernel, self.grid, self.block, self.smem_dynamic = (launch.kernel, launch.grid, launch.block,
                                                                 launch.smem_dynamic)
        if self.smem_dynamic > self.kernel.max_dynamic_smem:
            self.kernel.set_max_dynamic_smem(self.smem_dynamic)
        self.params = FlashFwdParams.from_buffer_copy(launch.params)
        self.with_lse = bool(launch.params.lse)
        self.with_seqused_k = bool(launch.params.seqused_k)
        self._encoders = launch.map_encoders
        self._maps = list(launch.extra_args)  # held: an encoder's cache may drop a map the array still points at
        self._mapped = [None] * len(self._maps)  # the q, k, v addresses the maps hold (None: ask the encoder)
        self._pointers = (ctypes.c_void_p * (1 + len(self._maps)))(
            ctypes.addressof(self.params), *[_address(m) for m in self._maps])
        combine = launch.combine
        self.combine = combine
        if combine is not None:
            self._combine_pointers = (ctypes.c_void_p * 1)(ctypes.addressof(self.params))
            self._combine_config = _programmatic_config(combine.grid, combine.block, 0) if combine.programmatic \
                else None
        if (combine is None) != (launch.partial_elems is None):
            raise ValueError("launch: a split-KV or tail-split launch needs its combine and its partials' sizes "
                             "(partial_elems)")
        if launch.partial_elems is not None:
            o_elems, lse_elems = launch.partial_elems
            self._workspace_elems, self._lse_offset = o_elems + lse_elems, o_elems * 4
        self._empty, self._fp32, self._int32 = torch.empty, torch.float32, torch.int32
        self._device = launch.device if launch.device is not None else torch.device("cuda", self.kernel.device)
        self._takes_counter = launch.counter is not None
        self._lock = threading.Lock()

    def __call__(self, q: int, k: int, v: int, o: int, lse: int | None = None, seqused_k: int | None = None,
                 stream=None) -> None:
        """Launch on tensors at these data pointers (ints); lse and seqused_k exactly when the prepared launch had
        them. `stream` defaults to torch's current stream on the kernel's device."""
        if (lse is not None) != self.with_lse or (seqused_k is not None) != self.with_seqused_k:
            raise ValueError(f"relaunch: lse and seqused_k as prepared (lse {'given' if self.with_lse else 'None'}, "
                             f"seqused_k {'given' if self.with_seqused_k else 'None'}), got lse {lse!r}, "
                             f"seqused_k {seqused_k!r}")
        kernel = self.kernel
        handle = _stream_handle(stream, kernel.device)
        with self._lock:
            p = self.params
            p.q, p.k, p.v, p.o = q, k, v, o
            if lse is not None:
                p.lse = lse
            if seqused_k is not None:
                p.seqused_k = seqused_k
            if self._maps and self._mapped != [q, k, v][:len(self._maps)]:
                self._point_maps((q, k, v))
            if self.combine is not None:  # fresh partials per call: safe across streams and CUDA graphs
                workspace = self._empty(self._workspace_elems, dtype=self._fp32, device=self._device)
                p.o_partial = base = workspace.data_ptr()
                p.lse_partial = base + self._lse_offset
            kernel._make_current()
            if self._takes_counter:  # a fresh counter per call too, zeroed in stream order before the kernel reads it
                counter = self._empty(1, dtype=self._int32, device=self._device)
                p.tile_counter = counter.data_ptr()
                _zero_counter(p.tile_counter, handle)
            _enqueue(kernel.entry, kernel._handle, self.grid, self.block, self.smem_dynamic, handle, self._pointers)
            if self.combine is not None:
                combine = self.combine
                _enqueue(combine.kernel.entry, combine.kernel._handle, combine.grid, combine.block, 0, handle,
                         self._combine_pointers, self._combine_config)

    def _point_maps(self, addresses) -> None:
        for i, encoder in enumerate(self._encoders):
            address = addresses[i]
            if self._mapped[i] != address:
                tmap = encoder(address)  # ValueError naming q, k or v for a misaligned address
                self._maps[i], self._mapped[i] = tmap, address
                self._pointers[1 + i] = _address(tmap)


class KernelRunner:
    """Runs one build (config + problem + cubin) on torch tensors, with the launch geometry from space.layout
    and, after the parameter block, the family's extra arguments (tma.launch_extra_args)."""

    def __init__(self, build):
        if not getattr(build, "ok", True):
            raise ValueError(f"build: expected a successful build, got one that failed: {getattr(build, 'error', '')}")
        self.build = build
        self.config, self.problem = build.config, build.problem
        self.family = _family(self.config.family)
        self.layout = space.layout(self.config, self.problem)
        self._cubin = cubin_bytes(build)

    def kernel(self, device: int | None = None) -> Kernel:
        return load_kernel(self._cubin, self.family.entry, self.layout.smem_dynamic, device)

    def grid(self, shape: InputShape, kernel: Kernel | None = None) -> tuple[int, int, int]:
        """The contract's grid, from space.Layout.grid: (ceil(seqlen_q / rows_per_block), heads, batch) for the
        `grid` scheduler, all tiles along x for `lpt`, SMs × resident CTAs (at most) for `persistent`, which is
        why that one needs the loaded `kernel` (the driver's occupancy for its geometry)."""
        resident = None
        if self.layout.needs_residency:
            if kernel is None:
                raise ValueError(f"kernel: the {self.layout.scheduler} grid of {self.config.key} needs the loaded "
                                 "kernel (SMs × resident CTAs)")
            resident = kernel.resident_ctas(self.layout.threads, self.layout.smem_dynamic)
        gx, gy, gz = self.layout.grid(shape.batch, shape.heads, shape.seqlen_q, resident, shape.kv_heads)
        if self.layout.scheduler != "grid":
            tiles = -(-shape.seqlen_q // self.layout.rows_per_block) * shape.heads * shape.batch
            # lpt: blockIdx.x is the tile; persistent: the kernel's cursor keeps unit + 2 CTAs in 30 bits
            limit = MAX_GRID_X if self.layout.scheduler == "lpt" else MAX_PERSISTENT_TILES
            if tiles > limit:
                raise ValueError(f"q: {tiles} tiles of {self.layout.rows_per_block} query rows exceed {limit} for "
                                 f"the {self.layout.scheduler} scheduler (batch {shape.batch} × heads {shape.heads} "
                                 "× query blocks)")
            return gx, gy, gz
        if gx > MAX_GRID_X:
            raise ValueError(f"q: seqlen_q {shape.seqlen_q} needs {gx} CTAs along grid.x (max {MAX_GRID_X})")
        if gy > MAX_GRID_YZ:
            raise ValueError(f"q: {gy} heads exceed the grid's y limit {MAX_GRID_YZ}")
        if gz > MAX_GRID_YZ:
            splits = f" × {self.layout.kv_splits} key splits" if self.layout.kv_splits > 1 else ""
            raise ValueError(f"q: batch {shape.batch}{splits} exceeds the grid's z limit {MAX_GRID_YZ}")
        return gx, gy, gz

    def tail_plan(self, shape: InputShape, grid: tuple[int, int, int]):
        """How a tail-split build cuts its last round on this shape and grid (space.wgmma.tail_plan), or None:
        no tail_split, or a shape whose last round runs whole."""
        if not self.layout.tail_split:
            return None
        from space.wgmma import tail_plan

        tiles = -(-shape.seqlen_q // self.layout.rows_per_block) * shape.heads * shape.batch
        return tail_plan(tiles, grid[0], -(-shape.seqlen_k // self.config.bc))

    def combine(self, shape: InputShape, device: int | None = None,
                grid: tuple[int, int, int] | None = None) -> Combine | None:
        """The merge of a split-KV build's partials (flash_fwd_combine, same cubin), or of a tail-split build's cut
        tiles (flash_fwd_tail_combine; needs the kernel's `grid`), or None where there is nothing to merge."""
        if self.layout.kv_splits > 1:
            rows = shape.batch * shape.heads * shape.seqlen_q
            entry = COMBINE_ENTRY
        elif self.layout.tail_split:
            if grid is None:
                raise ValueError(f"grid: the tail combine of {self.config.key} needs the kernel's grid (its CTAs "
                                 "decide the cut)")
            plan = self.tail_plan(shape, grid)
            if plan is None:
                return None
            rows = plan.tail_tiles * self.layout.rows_per_block
            entry = TAIL_COMBINE_ENTRY
        else:
            return None
        blocks = -(-rows // COMBINE_ROWS_PER_BLOCK)
        if blocks > MAX_GRID_X:
            raise ValueError(f"q: {rows} query rows need {blocks} combine blocks (max {MAX_GRID_X})")
        kernel = load_kernel(self._cubin, entry, 0, device)
        # The tail combine is launched plainly: after the persistent kernel, whose CTAs hold every SM to its end,
        # PDL overlaps nothing and cost 3 us more per call on an H100 (docs/benchmarks.md, tail_split; its
        # griddepcontrol.wait then returns at once)
        programmatic = entry == COMBINE_ENTRY and COMBINE_PROGRAMMATIC and kernel.compute_capability()[0] >= 9
        return Combine(kernel, (blocks, 1, 1), (32 * COMBINE_ROWS_PER_BLOCK, 1, 1), programmatic)

    def prepare(self, q, k, v, o, lse=None, scale: float | None = None, causal_align: str = "upper_left",
                seqused_k=None) -> Launch:
        """Validate and fill the parameter block once; the returned Launch can be called many times (timing).
        A split-KV build's partial buffers are allocated here and kept alive by the Launch. seqused_k: int32
        (batch,) used key lengths, for a build of a seqused_k problem (params.make_params)."""
        params = make_params(q, k, v, o, lse, scale, problem=self.problem, causal_align=causal_align,
                             seqused_k=seqused_k)
        shape = InputShape(params.batch, params.heads, params.kv_heads, params.seqlen_q, params.seqlen_k,
                           self.problem.head_dim, self.problem.dtype)
        encoders = tma.launch_map_encoders(self.config, q, k, v)  # () for parameter-block-only families
        extra = tuple(encode(t.data_ptr()) for encode, t in zip(encoders, (q, k, v)))
        kernel = self.kernel(q.device.index)
        grid = self.grid(shape, kernel)
        plan = self.tail_plan(shape, grid)
        partials = split_partials(self.layout.kv_splits, shape, q.device) or \
            tail_partials(plan, self.layout.rows_per_block, shape.head_dim, q.device)
        if plan is not None:  # the cut the kernel and its combine follow (none: both fields stay 0)
            params.tail_full_end, params.tail_ctas = plan.full_end, plan.ctas
        if partials:
            params.o_partial, params.lse_partial = (t.data_ptr() for t in partials)
        counter = None
        if self.layout.tile_counter:
            import torch

            counter = torch.empty(1, dtype=torch.int32, device=q.device)  # Launch.__call__ zeroes it
            params.tile_counter = counter.data_ptr()
        return Launch(kernel, params, grid, (self.layout.threads, 1, 1), self.layout.smem_dynamic,
                      (q, k, v, o, lse, seqused_k, *partials), extra, self.combine(shape, q.device.index, grid),
                      encoders, tuple(t.numel() for t in partials) if partials else None, q.device, counter)

    def run(self, q, k, v, o, lse=None, scale: float | None = None, causal_align: str = "upper_left",
            seqused_k=None) -> None:
        """Write attention(q, k, v) into o (and lse), on torch's current stream."""
        self.prepare(q, k, v, o, lse, scale, causal_align, seqused_k)()

    def __call__(self, q, k, v, scale: float | None = None, return_lse: bool = False,
                 causal_align: str = "upper_left", seqused_k=None):
        """Allocate o (contiguous, like q's shape) and lse, launch, return o or (o, lse)."""
        import torch

        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
        self.run(q, k, v, o, lse, scale, causal_align, seqused_k)
        return (o, lse) if return_lse else o


def split_partials(kv_splits: int, shape: InputShape, device) -> tuple:
    """(o_partial, lse_partial) for a split-KV launch: fp32 (splits, batch, heads, seqlen_q, head_dim) and
    (splits, batch, heads, seqlen_q), contiguous (flash_params.h); () without splits. Left uninitialised: every
    row a split covers is written, and the combine never reads the O of a split whose lse is -inf."""
    if kv_splits == 1:
        return ()
    return _partials((kv_splits, shape.batch, shape.heads, shape.seqlen_q), shape.head_dim, device)


def _partials(rows: tuple, head_dim: int, device) -> tuple:
    """fp32 (rows..., head_dim) partial O and (rows...) logsumexp, in one allocation as Relaunch makes them per call
    (the logsumexp starts at a multiple of head_dim, so of 64 floats)."""
    import torch

    o_elems, lse_elems = math.prod(rows) * head_dim, math.prod(rows)
    workspace = torch.empty(o_elems + lse_elems, dtype=torch.float32, device=device)
    return workspace[:o_elems].view(rows + (head_dim,)), workspace[o_elems:].view(rows)


def tail_partials(plan, rows_per_block: int, head_dim: int, device) -> tuple:
    """(o_partial, lse_partial) for a tail-split launch whose last round is cut (plan: space.wgmma.TailPlan): fp32
    (2 × plan.ctas, rows_per_block, head_dim) and (2 × plan.ctas, rows_per_block), slot 2·cta + piece; () for
    plan None. Left uninitialised: a CTA writes every existing row of each piece it runs, and the combine reads
    only those pieces' slots (a CTA with one piece leaves its second slot unused)."""
    if plan is None:
        return ()
    return _partials((2 * plan.ctas, rows_per_block), head_dim, device)


def attention_with(build, q, k, v, scale: float | None = None, return_lse: bool = False):
    """attention(q, k, v) with one specific build; causal-ness is compiled into it (build.problem.causal)."""
    return KernelRunner(build)(q, k, v, scale=scale, return_lse=return_lse)


def as_runner(build_or_runner) -> KernelRunner:
    return build_or_runner if isinstance(build_or_runner, KernelRunner) else KernelRunner(build_or_runner)

