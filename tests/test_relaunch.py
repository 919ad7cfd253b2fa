"""A warm autotune.attention call on CPU: the loader's Relaunch (one prepared launch per memo key of
autotune.runtime.attention_op) against the fake driver of test_loader, which copies the parameter block and the
kernelParams entries out of memory at each launch, as the driver does.

What is proven: every call's data pointers reach the launch (a skipped patch fails), tensor maps are re-pointed
when their tensor moves and only then, a split-KV call gets fresh partials and launches its combine on the same
stream (read once per call), the memo builds a new prepared launch for other shapes, strides or dtypes and reuses
it otherwise, and validation still raises by name on the warm path.
"""
from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from autotune.launch import loader  # noqa: E402
from autotune.launch import params as launch_params  # noqa: E402
from autotune.launch.params import FlashFwdParams  # noqa: E402
from autotune.runtime import attention_op as op  # noqa: E402
from autotune.runtime import lookup as runtime  # noqa: E402
from test_loader import CUBIN, fake  # noqa: E402, F401  (fake is a fixture)


@pytest.fixture(autouse=True)
def fresh_caches():
    op.clear_caches()
    yield
    op.clear_caches()


@pytest.fixture
def streams(monkeypatch):
    """torch's current stream as the loader reads it: one handle, and a count of the reads."""
    reads = []

    def raw(device):
        reads.append(device)
        return 0xBEEF

    monkeypatch.setattr(loader, "raw_stream_fn", lambda: raw)
    return reads


def qkv(b=2, h=8, hkv=None, n=64, nk=None, d=64, dtype=torch.float16):
    hkv, nk = hkv or h, nk or n
    return (torch.zeros(b, h, n, d, dtype=dtype), torch.zeros(b, hkv, nk, d, dtype=dtype),
            torch.zeros(b, hkv, nk, d, dtype=dtype))


class MapBuffer(ctypes.Structure):
    """Stands in for a CUtensorMap: its bytes say which tensor and address it maps."""

    _fields_ = [("address", ctypes.c_uint64), ("name", ctypes.c_char * 8)]


class Encoders:
    """tma.launch_map_encoders' stand-in: one encoder per tensor, each call recorded."""

    def __init__(self):
        self.encoded = []

    def __call__(self, q, k, v):
        def encoder(name):
            def encode(address):
                self.encoded.append((name, address))
                return MapBuffer(address, name.encode())
            return encode
        return encoder("q"), encoder("k"), encoder("v")


def launched_maps(launch) -> list[tuple[str, int]]:
    """The tensor maps a recorded launch pointed at, read back from its kernelParams (after the block)."""
    pointers = ctypes.cast(launch["pointers"], ctypes.POINTER(ctypes.c_void_p))
    return [(m.name.decode(), m.address) for m in
            (MapBuffer.from_address(pointers[i]) for i in range(1, launch["count"]))]


class Runner:
    """KernelRunner's stand-in for the memo: prepare() validates and fills the block like the real one (on CPU
    tensors), launching a kernel loaded through the fake driver; split > 1 adds a combine and its partials."""

    def __init__(self, split: int = 1, encoders: Encoders | None = None, programmatic: bool = True):
        self.split, self.encoders, self.programmatic = split, encoders, programmatic
        self.prepared = 0

    def prepare(self, q, k, v, o, lse=None, scale=None, causal_align="upper_left", seqused_k=None):
        self.prepared += 1
        params = launch_params.make_params(q, k, v, o, lse, scale, require_cuda=False, causal_align=causal_align,
                                           seqused_k=seqused_k)
        kernel = loader.load_kernel(CUBIN, "flash_fwd_wgmma")
        encoders = self.encoders(q, k, v) if self.encoders else ()
        extra = tuple(e(t.data_ptr()) for e, t in zip(encoders, (q, k, v)))
        combine, partials = None, None
        if self.split > 1:
            combine = loader.Combine(loader.load_kernel(CUBIN, loader.COMBINE_ENTRY), (5, 1, 1), (128, 1, 1),
                                     self.programmatic)
            shape = launch_params.InputShape(params.batch, params.heads, params.kv_heads, params.seqlen_q,
                                             params.seqlen_k, q.shape[3], "fp16")
            partials = tuple(t.numel() for t in loader.split_partials(self.split, shape, "cpu"))
        return loader.Launch(kernel, params, (1, 8, 2 * self.split), (128, 1, 1), 4096, (q, k, v, o, lse), extra,
                             combine, encoders, partials, q.device)


@pytest.fixture
def runner(fake, streams, monkeypatch):
    """The memo's resolve returns a Plan of one Runner (set .split / .encoders before the first call), and CPU
    tensors pass attention's own cold-call check; launches land in fake.launches, each with its pointer array."""
    made = Runner()
    resolved = []

    def resolve(device, shape, url, seqused_k=False):
        resolved.append(shape)
        return runtime.Plan(None, made, None)

    check = op.check_inputs
    monkeypatch.setattr(op, "check_inputs", lambda q, k, v, require_cuda=True: check(q, k, v, require_cuda=False))
    monkeypatch.setattr(runtime, "resolve", resolve)
    record = fake.launch_kernel

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, pointers, extra):
        code = record(f, gx, gy, gz, bx, by, bz, smem, stream, pointers, extra)
        fake.launches[-1].update(pointers=ctypes.addressof(pointers), count=len(pointers))
        return code

    fake.launch_kernel = launch_kernel
    made.resolved = resolved
    return made


def test_every_call_patches_its_own_pointers_and_keeps_the_rest(runner, fake):
    first = qkv(h=8, hkv=2)
    out1, lse1 = op.forward(*first, True, 0.25, True)
    q, k, v = qkv(h=8, hkv=2)  # new tensors, same layout
    out2, lse2 = op.forward(q, k, v, True, 0.25, True)
    assert runner.prepared == 1 and len(runner.resolved) == 1 and runner.resolved[0].kv_heads == 2
    one, two = fake.launches
    p1, p2 = one["params"], two["params"]
    assert (p1.q, p1.k, p1.v, p1.o, p1.lse) == (first[0].data_ptr(), first[1].data_ptr(), first[2].data_ptr(),
                                                out1.data_ptr(), lse1.data_ptr())
    assert (p2.q, p2.k, p2.v, p2.o, p2.lse) == (q.data_ptr(), k.data_ptr(), v.data_ptr(), out2.data_ptr(),
                                                lse2.data_ptr())
    assert p1.q != p2.q and p1.o != p2.o
    for name, _ in FlashFwdParams._fields_:
        if name not in ("q", "k", "v", "o", "lse"):
            assert getattr(p1, name) == getattr(p2, name), name
    assert p2.scale_log2 == pytest.approx(0.25 * 1.4426950408889634)
    assert one["grid"] == two["grid"] == (1, 8, 2) and one["smem"] == 4096 and two["stream"] == 0xBEEF
    assert out2.shape == q.shape and lse2.shape == q.shape[:3] and lse2.dtype == torch.float32


def test_a_launch_captures_the_pointers_of_its_call_not_of_a_later_one(runner, fake):
    """What a CUDA graph records is the block as it is at the launch: a later call's patch must not reach back."""
    a, b = qkv(), qkv()
    out_a, _ = op.forward(*a, False, None, False)
    op.forward(*b, False, None, False)
    assert fake.launches[0]["params"].q == a[0].data_ptr() and fake.launches[0]["params"].o == out_a.data_ptr()
    assert fake.launches[1]["params"].q == b[0].data_ptr()


def test_other_shapes_strides_or_dtypes_prepare_a_new_launch(runner, fake):
    q, k, v = qkv()
    op.forward(q, k, v, False, None, False)
    op.forward(*qkv(), False, None, False)
    assert runner.prepared == 1
    op.forward(*qkv(n=32), False, None, False)                                        # shape
    op.forward(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, False, None, False)  # strides
    op.forward(*qkv(dtype=torch.bfloat16), False, None, False)                        # dtype
    op.forward(q, k, v, False, None, True)                                            # flags
    assert runner.prepared == 5
    assert fake.launches[-1]["params"].lse != 0 and fake.launches[0]["params"].lse is None
    op.forward(*qkv(n=32), False, None, False)
    assert runner.prepared == 5  # each of them is warm now


def test_out_is_laid_out_like_q_cold_and_warm_and_its_strides_reach_the_block(runner, fake):
    """A model's q is a transposed (B, N, H, D) tensor: out comes back the same way (as SDPA's cuDNN backend
    returns it), so the caller's transpose back to (B, N, H * D) is a view, not a copy of the whole output."""
    b, h, n, d = 2, 8, 64, 64
    bnhd = lambda: torch.zeros(b, n, h, d, dtype=torch.float16).transpose(1, 2)  # noqa: E731
    for _ in range(2):  # cold (prepares the block with these strides), then warm (a fresh out per call)
        out, _ = op.forward(bnhd(), bnhd(), bnhd(), False, None, False)
        assert out.shape == (b, h, n, d) and out.stride() == (n * h * d, d, h * d, 1)
        assert out.transpose(1, 2).is_contiguous()  # (B, N, H, D) in memory: the reshape back is free
        p = fake.launches[-1]["params"]
        assert (p.o_batch_stride, p.o_head_stride, p.o_row_stride) == (n * h * d, d, h * d)
    assert runner.prepared == 1
    q, k, v = qkv(b, h, n=n, d=d)  # a contiguous q: a contiguous out
    out, _ = op.forward(q, k, v, False, None, False)
    assert out.is_contiguous() and fake.launches[-1]["params"].o_row_stride == d
    # one query row or one head: nothing to interleave, contiguous
    assert op.output_strides(torch.zeros(b, 1, h, d).transpose(1, 2)) == (h * d, d, d, 1)
    assert op.output_strides(torch.zeros(b, n, 1, d).transpose(1, 2)) == (n * d, n * d, d, 1)


def test_validation_still_raises_by_name_on_a_warm_layout(runner, fake):
    q, k, v = qkv()
    op.forward(q, k, v, False, None, False)
    shifted = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # same layout, address off by 2 bytes
    with pytest.raises(ValueError, match=r"^q: expected a data pointer aligned to 16 bytes"):
        op.forward(shifted, k, v, False, None, False)
    with pytest.raises(ValueError, match=r"^k: expected the same dtype as q"):
        op.forward(q, k.bfloat16(), v, False, None, False)
    with pytest.raises(ValueError, match=r"^k: expected a head count that divides q's 8 heads"):
        op.forward(q, k[:, :3], v[:, :3], False, None, False)
    assert len(fake.launches) == 1


def test_tensor_maps_follow_their_tensors_and_are_encoded_only_when_one_moves(runner, fake):
    runner.encoders = encoders = Encoders()
    q, k, v = qkv()
    op.forward(q, k, v, False, None, False)
    assert launched_maps(fake.launches[0]) == [("q", q.data_ptr()), ("k", k.data_ptr()), ("v", v.data_ptr())]
    cold = len(encoders.encoded)
    op.forward(q, k, v, False, None, False)  # nothing moved: no encoder asked
    assert len(encoders.encoded) == cold
    q2 = torch.zeros_like(q)  # a decode step: a new q, the same K/V cache
    op.forward(q2, k, v, False, None, False)
    assert encoders.encoded[cold:] == [("q", q2.data_ptr())]
    assert launched_maps(fake.launches[-1]) == [("q", q2.data_ptr()), ("k", k.data_ptr()), ("v", v.data_ptr())]
    assert fake.launches[-1]["params"].q == q2.data_ptr()
    op.forward(q, k, v, False, None, False)
    assert launched_maps(fake.launches[-1])[0] == ("q", q.data_ptr())


def test_a_map_dropped_by_its_encoder_stays_alive_while_pointed_at(fake, streams):
    """An encoder's cache may evict the map a prepared launch points at: the Relaunch holds it."""
    held = []

    def encode(address):
        tmap = MapBuffer(address, b"q")
        held.append(ctypes.addressof(tmap))
        return tmap  # the encoder itself keeps nothing

    kernel = loader.load_kernel(CUBIN, "flash_fwd_wgmma")
    relaunch = loader.Relaunch(loader.Launch(kernel, FlashFwdParams(), (1, 1, 1), (128, 1, 1), 0, (),
                                             (encode(0x1000),), None, (encode,)))
    relaunch(0x2000, 0x3000, 0x4000, 0x5000)
    import gc

    gc.collect()
    pointers = ctypes.cast(fake.launches[-1]["extra"], ctypes.POINTER(MapBuffer))
    assert pointers[0].address == 0x2000 and relaunch._maps[0].address == 0x2000


def test_a_split_call_gets_fresh_partials_and_its_combine_on_the_same_stream(runner, fake, streams, monkeypatch):
    runner.split = 4
    q, k, v = qkv(b=1, h=8, hkv=2, n=1, nk=256)
    allocations = []
    empty, empty_strided = torch.empty, torch.empty_strided

    def counting(allocate):
        def counted(*args, **kwargs):
            allocations.append(args[:1])  # the shape
            return allocate(*args, **kwargs)
        return counted

    monkeypatch.setattr(torch, "empty", counting(empty))
    monkeypatch.setattr(torch, "empty_strided", counting(empty_strided))  # out, laid out like q
    op.forward(q, k, v, False, None, True)  # cold: prepared once
    fake.launches.clear()
    allocations.clear()
    reads = len(streams)
    for _ in range(2):
        op.forward(q, k, v, False, None, True)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_strided", empty_strided)
    assert len(streams) - reads == 2  # one stream read per call, shared by its two launches
    main1, combine1, main2, combine2 = fake.launches
    assert [x.get("programmatic", False) for x in (main1, combine1)] == [False, True]  # main: cuLaunchKernel
    assert combine1["grid"] == (5, 1, 1) and combine1["stream"] == main1["stream"] == 0xBEEF
    for main, combine in ((main1, combine1), (main2, combine2)):
        assert bytes(main["params"]) == bytes(combine["params"])  # the same block, partials included
        p = main["params"]
        o_elems = 4 * 1 * 8 * 1 * 64
        assert p.o_partial and p.lse_partial == p.o_partial + 4 * o_elems
    # each call allocates o, lse and one fp32 workspace for both partials
    assert len(allocations) == 2 * 3 and allocations[2] == (4 * 8 * (64 + 1),)


def test_two_threads_calls_on_one_relaunch_each_launch_their_own_pointers(runner, fake):
    """One parameter block serves every call: the lock keeps a second thread's pointer writes out of it until the
    first call's launch has copied it. The first launch is held until the second call has either written its
    pointers (no lock) or found the lock taken (events, no sleep)."""
    import threading

    op.forward(*qkv(), False, None, False)
    relaunch = next(iter(op._launchers.values())).relaunch
    fake.launches.clear()
    first_in_launch, second_moved = threading.Event(), threading.Event()
    record = fake.launch_kernel

    def launch_kernel(*args):
        if not first_in_launch.is_set():
            first_in_launch.set()
            assert second_moved.wait(60), "the second call neither wrote its pointers nor waited on the lock"
        else:
            second_moved.set()  # no lock: the second call got as far as its own launch
        return record(*args)

    fake.launch_kernel = launch_kernel
    lock = relaunch._lock

    class Observed:  # the Relaunch's lock, saying when a call finds it taken
        def __enter__(self):
            if not lock.acquire(blocking=False):
                second_moved.set()
                lock.acquire()

        def __exit__(self, *exc):
            lock.release()

    relaunch._lock = Observed()
    first = threading.Thread(target=relaunch, args=(0x1000, 0x2000, 0x3000, 0x4000))
    second = threading.Thread(target=relaunch, args=(0x5000, 0x6000, 0x7000, 0x8000))
    first.start()
    assert first_in_launch.wait(60)
    second.start()
    first.join(60), second.join(60)
    assert sorted((x["params"].q, x["params"].o) for x in fake.launches) == [(0x1000, 0x4000), (0x5000, 0x8000)]


def test_a_split_call_without_programmatic_launch_uses_cuLaunchKernel_for_both(runner, fake):
    runner.split, runner.programmatic = 2, False
    op.forward(*qkv(b=1, n=1, nk=128), False, None, False)
    assert [x.get("programmatic", False) for x in fake.launches] == [False, False] and len(fake.launches) == 2


def test_the_context_is_made_current_once_per_call_when_another_is(runner, fake):
    op.forward(*qkv(), False, None, False)
    from test_loader import Handle

    fake.current = Handle(0)  # e.g. a new thread, with no context current
    calls = len(fake.calls)
    op.forward(*qkv(), False, None, False)
    assert fake.launches[-1]["current"] == 0x1000
    assert fake.calls[calls:] == ["cuCtxGetCurrent", "cuCtxSetCurrent", "cuLaunchKernel"]


def test_a_relaunch_takes_lse_and_seqused_k_exactly_as_prepared(fake, streams):
    kernel = loader.load_kernel(CUBIN, "flash_fwd_wgmma")
    with_lse = loader.Relaunch(loader.Launch(kernel, FlashFwdParams(lse=0x100), (1, 1, 1), (128, 1, 1), 0, ()))
    with pytest.raises(ValueError, match="relaunch: lse and seqused_k as prepared"):
        with_lse(0x1000, 0x2000, 0x3000, 0x4000)
    with pytest.raises(ValueError, match="relaunch: lse and seqused_k as prepared"):
        with_lse(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, seqused_k=0x6000)
    with_lse(0x1000, 0x2000, 0x3000, 0x4000, 0x5000)
    assert fake.launches[-1]["params"].lse == 0x5000
    with pytest.raises(ValueError, match="tensor-map encoders"):
        loader.Relaunch(loader.Launch(kernel, FlashFwdParams(), (1, 1, 1), (128, 1, 1), 0, (), (MapBuffer(),)))


def test_a_failed_launch_names_the_entry_and_the_geometry(runner, fake):
    op.forward(*qkv(), False, None, False)
    fake.fail.add("cuLaunchKernel")
    with pytest.raises(loader.CudaError, match=r"cuLaunchKernel\(flash_fwd_wgmma, grid=\(1, 8, 2\), "
                                               r"block=\(128, 1, 1\), smem=4096\) failed: CUDA_ERROR_NOT_FOUND"):
        op.forward(*qkv(), False, None, False)


def test_the_memo_keeps_no_tensor_of_the_call_that_prepared_it(runner, fake):
    """A prepared launch holds pointers, not tensors: a K/V cache that grows each step (a new memo entry per
    step) must not be kept alive by the entries, nor the outputs and partials of their first calls."""
    import gc
    import weakref

    runner.split = 2
    q, k, v = qkv(b=1, n=1, nk=128)
    out, lse = op.forward(q, k, v, False, None, True)
    refs = [weakref.ref(t) for t in (q, k, v, out, lse)]
    del q, k, v, out, lse
    gc.collect()
    assert [r() for r in refs] == [None] * 5
    op.forward(*qkv(b=1, n=1, nk=128), False, None, True)  # and the entry still runs
    assert runner.prepared == 1 and len(fake.launches) == 4
