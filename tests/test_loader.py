"""The loader's driver-API plumbing, against a fake cuda-python driver (the real launch is covered by the GPU tests).

The fake records every call the way the real bindings take it; the launch itself goes straight to libcuda
(autotune/launch/libcuda.py), so the fake stands in for that ctypes function too, and reads the kernelParams void**
array back out of memory: the test sees exactly the bytes the driver would copy to the GPU.
"""
from __future__ import annotations

import ctypes
import enum
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from autotune.launch import loader  # noqa: E402
from autotune.launch.params import FlashFwdParams, InputShape  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_FOUND = 500


class Handle:
    def __init__(self, value: int):
        self.value = value

    def __int__(self):
        return self.value


class FunctionHandle(Handle):
    def __init__(self, value: int, name: str):
        super().__init__(value)
        self.name = name


class FakeDriver:
    CUresult = CUresult

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        CU_FUNC_ATTRIBUTE_NUM_REGS = 4

    def __init__(self):
        self.calls = []
        self.capability = (9, 0)  # torch.cuda.get_device_capability, as the fixture patches it
        self.current = Handle(0)
        self.fail = set()
        self.launches = []

    def _ok(self, name, *values):
        self.calls.append(name)
        if name in self.fail:
            return (CUresult.CUDA_ERROR_NOT_FOUND,) + (None,) * len(values)
        return (CUresult.CUDA_SUCCESS, *values)

    def cuInit(self, flags):
        return self._ok("cuInit")

    def cuDeviceGet(self, ordinal):
        return self._ok("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._ok("cuDevicePrimaryCtxRetain", Handle(0x1000 + dev))

    def cuCtxGetCurrent(self):
        return self._ok("cuCtxGetCurrent", self.current)

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return self._ok("cuCtxSetCurrent")

    def cuModuleLoadData(self, image):
        assert isinstance(image, int) and ctypes.string_at(image, 4) == b"\x7fELF"
        return self._ok("cuModuleLoadData", Handle(0x2000))

    def cuModuleGetFunction(self, module, name):
        assert isinstance(name, bytes)
        return self._ok("cuModuleGetFunction", FunctionHandle(0x3000, name.decode()))

    def cuFuncSetAttribute(self, function, attr, value):
        self.calls.append(("cuFuncSetAttribute", attr, value))
        return (CUresult.CUDA_SUCCESS,)

    def CUstream(self, handle):
        return Handle(handle)

    def ctx_get_current(self, pointer):
        """libcuda's cuCtxGetCurrent as autotune.launch.libcuda binds it: writes through a ctypes byref."""
        self.calls.append("cuCtxGetCurrent")
        pointer._obj.value = int(self.current) or None
        return 0

    def launch_kernel_ex(self, config, f, params, extra):
        """libcuda's cuLaunchKernelEx: the geometry and stream come in the CUlaunchConfig."""
        c = config._obj
        self.launch_kernel(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                           c.sharedMemBytes, c.hStream or 0, params, extra)
        self.launches[-1]["programmatic"] = c.numAttrs == 1
        return 0

    def launch_kernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        """libcuda's cuLaunchKernel as autotune.launch.libcuda binds it: raw handle ints and a ctypes void* array."""
        pointers = params
        struct = FlashFwdParams.from_buffer_copy(ctypes.string_at(pointers[0], ctypes.sizeof(FlashFwdParams)))
        self.launches.append(dict(f=f, grid=(gx, gy, gz), block=(bx, by, bz), smem=smem, stream=int(stream),
                                  params=struct, extra=pointers[1] if len(pointers) > 1 else None,
                                  current=int(self.current)))
        self.calls.append("cuLaunchKernel")
        return int(CUresult.CUDA_ERROR_NOT_FOUND) if "cuLaunchKernel" in self.fail else 0

    def cuGetErrorName(self, err):
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, b"named symbol not found"


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(loader, "driver", lambda: drv)
    monkeypatch.setattr(loader, "launch_kernel_fn", lambda: drv.launch_kernel)
    monkeypatch.setattr(loader, "launch_kernel_ex_fn", lambda: drv.launch_kernel_ex)
    monkeypatch.setattr(loader, "ctx_get_current_fn", lambda: drv.ctx_get_current)
    monkeypatch.setattr(loader, "error_name", lambda code: CUresult(code).name)
    monkeypatch.setattr(loader, "_primary", {})
    monkeypatch.setattr(loader, "_kernels", {})
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: drv.capability)
    return drv


class _Stream:  # torch.cuda.Stream as the loader sees it
    cuda_stream = 0xBEEF


CUBIN = b"\x7fELF" + bytes(60)


def test_load_makes_the_primary_context_current_and_caches_the_module(fake):
    k = loader.load_kernel(CUBIN, "flash_fwd_mma_sync", max_dynamic_smem=100_000)
    assert int(fake.current) == 0x1000  # the retained primary context of device 0
    assert fake.calls[:5] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent",
                              "cuCtxSetCurrent"]
    assert ("cuFuncSetAttribute", 8, 100_000) in fake.calls and k.max_dynamic_smem == 100_000
    assert k.function.name == "flash_fwd_mma_sync"
    assert loader.load_kernel(CUBIN, "flash_fwd_mma_sync") is k  # same bytes: same module, no second load
    assert fake.calls.count("cuModuleLoadData") == 1
    loader.load_kernel(CUBIN + b"\0", "flash_fwd_mma_sync")
    assert fake.calls.count("cuModuleLoadData") == 2


def test_launch_passes_a_pointer_array_to_the_struct_and_extras(fake):
    k = loader.load_kernel(CUBIN, "flash_fwd_mma_sync")
    params = FlashFwdParams(batch=3, heads=5, kv_heads=1, seqlen_q=77, seqlen_k=99, scale_log2=0.25, q_row_stride=640)
    extra = ctypes.c_int(42)
    fake.current = Handle(0)  # e.g. another thread: launch must make the context current again
    k.launch(params, (2, 5, 3), (128, 1, 1), smem_dynamic=70_000, extra_args=(extra,))
    (launch,) = fake.launches
    assert launch["grid"] == (2, 5, 3) and launch["block"] == (128, 1, 1) and launch["smem"] == 70_000
    assert launch["stream"] == 0xBEEF and launch["current"] == 0x1000
    assert bytes(launch["params"]) == bytes(params)
    assert ctypes.c_int.from_address(launch["extra"]).value == 42
    assert ("cuFuncSetAttribute", 8, 70_000) in fake.calls  # raised to what this launch needs


def test_every_failure_names_the_call_and_the_error(fake):
    fake.fail.add("cuModuleGetFunction")
    with pytest.raises(loader.CudaError, match=r"cuModuleGetFunction\('nope'\) failed: CUDA_ERROR_NOT_FOUND "
                                                r"\(named symbol not found\)") as info:
        loader.load_kernel(CUBIN, "nope")
    assert info.value.code == "CUDA_ERROR_NOT_FOUND"
    again = pickle.loads(pickle.dumps(info.value))  # crosses the worker boundary intact
    assert (again.call, again.code, str(again)) == (info.value.call, info.value.code, str(info.value))


def test_extra_args_must_be_addressable(fake):
    k = loader.load_kernel(CUBIN, "flash_fwd_mma_sync")
    with pytest.raises(TypeError, match="extra_args"):
        k.launch(FlashFwdParams(), (1, 1, 1), (32, 1, 1), extra_args=(3,))


def test_runner_grid_follows_the_layout():
    problem = space.Problem(128, "fp16", False)
    config = space.Config.make("mma_sync", br=64, bc=64, warps_m=4, warps_n=1, p_path="regs",
                               smem_mode="dynamic", kv_buffering="separate", loader_warps=0, min_blocks=1,
                               q_in_regs=False)
    runner = loader.KernelRunner.__new__(loader.KernelRunner)
    runner.layout = space.layout(config, problem)
    shape = InputShape(batch=3, heads=7, kv_heads=7, seqlen_q=129, seqlen_k=5, head_dim=128, dtype="fp16")
    assert runner.grid(shape) == (3, 7, 3)  # ceil(129 / 64) row blocks, heads, batch
    with pytest.raises(ValueError, match="heads exceed"):
        runner.grid(InputShape(1, 70_000, 1, 1, 1, 128, "fp16"))


def test_a_split_mma_sync_build_launches_its_own_cubins_combine(fake, monkeypatch):
    problem = space.Problem(128, "fp16", False)
    config = space.mma_sync.decode_default(space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=32768),
                                           space.get_arch("sm_90"))
    assert config.family == "mma_sync" and config.kv_splits > 1
    runner = loader.KernelRunner.__new__(loader.KernelRunner)
    runner.layout, runner._cubin = space.layout(config, problem), CUBIN
    shape = InputShape(batch=3, heads=8, kv_heads=2, seqlen_q=5, seqlen_k=1000, head_dim=128, dtype="fp16")
    assert runner.grid(shape) == (1, 8, 3 * config.kv_splits)  # grid.z = batch × splits
    combine = runner.combine(shape)
    assert combine.kernel.entry == loader.COMBINE_ENTRY == "flash_fwd_combine"
    assert combine.grid == (-(-3 * 8 * 5 // 4), 1, 1) and combine.block == (128, 1, 1)  # a warp per query row
    assert loader.split_partials(config.kv_splits, shape, "cpu")[0].shape == (config.kv_splits, 3, 8, 5, 128)
    # programmatic dependent launch of the combine: the product's default on sm_90+, never below (no griddepcontrol)
    monkeypatch.setattr(loader, "COMBINE_PROGRAMMATIC", True)
    assert runner.combine(shape).programmatic
    fake.capability = (8, 9)
    assert not runner.combine(shape).programmatic
    fake.capability = (9, 0)
    monkeypatch.setattr(loader, "COMBINE_PROGRAMMATIC", False)
    assert not runner.combine(shape).programmatic
    runner.layout = space.layout(config.replace(kv_splits=1), problem)
    assert runner.combine(shape) is None and runner.grid(shape) == (1, 8, 3)


def test_runner_refuses_a_failed_build():
    class Failed:
        ok, error = False, "nvcc: error"

    with pytest.raises(ValueError, match="build: expected a successful build.*nvcc: error"):
        loader.KernelRunner(Failed())


def test_a_prepared_launch_passes_its_extra_args(fake):
    k = loader.load_kernel(CUBIN, "flash_fwd_mma_sync")
    tensor_map = (ctypes.c_uint8 * 128)(*range(128))  # stands in for a CUtensorMap
    launch = loader.Launch(k, FlashFwdParams(batch=1), (1, 1, 1), (64, 1, 1), 0, (), (tensor_map,))
    launch()
    assert ctypes.string_at(fake.launches[0]["extra"], 128) == bytes(range(128))


def test_runner_finds_a_family_whose_module_was_not_imported(monkeypatch):
    family = space.get_family("mma_sync")
    monkeypatch.delitem(space.FAMILIES, "mma_sync")  # as in a worker that unpickled a Config of it
    monkeypatch.setattr(loader.importlib, "import_module",
                        lambda name: space.FAMILIES.setdefault("mma_sync", family) if name == "space.mma_sync" else None)
    assert loader._family("mma_sync") is family
    with pytest.raises(ValueError, match="family: expected one of"):
        loader._family("nope")


def test_runner_grid_per_scheduler():
    problem = space.Problem(128, "fp16", False)
    base = space.Config.from_key("wgmma:consumer_wgs=2,bc=128,stages=3,setmaxnreg=1,overlap=1,pingpong=0,"
                                 "o_store=smem,min_blocks=1")
    shape = InputShape(batch=3, heads=7, kv_heads=7, seqlen_q=129, seqlen_k=5, head_dim=128, dtype="fp16")

    class Resident:
        asked = []

        def resident_ctas(self, threads, smem):
            self.asked.append((threads, smem))
            return 8

    def runner(scheduler):
        r = loader.KernelRunner.__new__(loader.KernelRunner)
        r.config = base.replace(scheduler=scheduler)
        r.layout = space.layout(r.config, problem)
        return r

    assert runner("grid").grid(shape) == (2, 7, 3)
    assert runner("lpt").grid(shape) == (2 * 7 * 3, 1, 1)
    persistent = runner("persistent")
    with pytest.raises(ValueError, match="needs the loaded kernel"):
        persistent.grid(shape)
    assert persistent.grid(shape, Resident()) == (8, 1, 1)
    assert Resident.asked == [(384, persistent.layout.smem_dynamic)]
    with pytest.raises(ValueError, match="tiles of 128 query rows exceed"):
        persistent.grid(InputShape(60_000, 60_000, 1, 129, 1, 128, "fp16"), Resident())


@pytest.mark.parametrize("env, expected", [(None, True), ("0", False), ("1", True)])
def test_the_combine_launches_programmatically_unless_the_environment_says_0(env, expected):
    environ = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_COMBINE_PDL"}
    if env is not None:
        environ["AUTOTUNE_COMBINE_PDL"] = env
    out = subprocess.run([sys.executable, "-c", "from autotune.launch import loader; print(loader.COMBINE_PROGRAMMATIC)"],
                         env=environ, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(expected)
