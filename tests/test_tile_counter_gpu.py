"""The tile counter of causal persistent wgmma kernels (space.Layout.tile_counter): zeroed before every launch.

Each launch leaves the counter at its tile count (every CTA takes one index past the last tile). A launch that
found it there would run only the CTAs' first tiles and leave the rest of O unwritten, so the loader zeroes it on
the launch's stream before each launch: a prepared Launch called again, and a Relaunch (a fresh counter per call).
The last part switches the zeroing off and checks that O then comes back incomplete: the protection is what
makes the first parts pass.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
import space.wgmma  # noqa: E402,F401  (registers the family)
from space import Config, Problem, Shape  # noqa: E402

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
ARCH = space.get_arch("sm_90")
# the shipped d128 ping-pong config; B2 H8 N2048 causal: 16 query blocks × 16 heads = 256 tiles, more than the
# 132 CTAs of an H100 or H200, so CTAs take tiles from the counter after their first
CONFIG = Config.from_key("wgmma:consumer_wgs=2,bc=128,stages=2,setmaxnreg=1,overlap=1,pingpong=1,o_store=smem,"
                         "min_blocks=1,scheduler=persistent,o_rescale=before,softmax_reduce=chain,exp2_fma=none,"
                         "kv_splits=1,pack_gqa=0")
SHAPE = Shape(batch=2, heads=8, seqlen_q=2048, head_dim=128, dtype="bf16", causal=True)


def test_only_causal_persistent_builds_take_a_counter():
    assert space.layout(CONFIG, SHAPE.problem).tile_counter
    assert not space.layout(CONFIG, Problem(128, "bf16", False)).tile_counter
    assert not space.layout(CONFIG.replace(scheduler="grid"), SHAPE.problem).tile_counter


@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_the_tile_counter_is_zeroed_before_every_launch(build_cache_dir, monkeypatch):
    from autotune.build.builder import Builder
    from autotune.launch import loader
    from autotune.measure.check import _torch_sdpa, make_inputs

    [build] = Builder(ARCH, cache_dir=os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or build_cache_dir).build(
        [(CONFIG, SHAPE.problem)])
    assert build.ok and not build.spilled, build.error or build.report
    runner = loader.KernelRunner(build)
    q, k, v = make_inputs(SHAPE, "bhnd", seed=7)
    want = _torch_sdpa(q.float(), k.float(), v.float(), True, None).to(q.dtype)
    o = torch.empty_like(q)
    launch = runner.prepare(q, k, v, o)
    assert launch.counter is not None

    def run_and_compare(call) -> None:
        o.fill_(float("nan"))  # poisoned: a tile no CTA ran stays NaN
        call()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, want, atol=2e-2, rtol=2e-2)

    for _ in range(3):  # the same prepared launch, again and again: its counter is zeroed each time
        run_and_compare(launch)
    relaunch = loader.Relaunch(launch)
    for _ in range(2):
        run_and_compare(lambda: relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()))

    # captured in a CUDA graph (as servers replay attention): the zeroing is a node of the graph, so every replay
    # starts from zero
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        run_and_compare(graph.replay)

    # switched off: the Launch's counter holds the tile count from its last run, so each CTA runs its first tile only
    monkeypatch.setattr(loader, "_zero_counter", lambda address, stream: None)
    o.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    unwritten_rows = torch.isnan(o).any(dim=-1).sum().item()
    tiles = SHAPE.batch * SHAPE.heads * (SHAPE.seqlen_q // 128)
    assert unwritten_rows >= (tiles - launch.grid[0]) * 128 // 2, unwritten_rows
