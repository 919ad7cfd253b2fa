"""tail_split on the GPU: the last round's tiles cut along the keys and merged by flash_fwd_tail_combine.

A shape whose last round is part-empty and long enough to cut (space.wgmma.tail_plan for the launch's own grid),
with seqlen_q and seqlen_k not multiples of the tiles, grouped K/V heads and the logsumexp: a prepared Launch, a
Relaunch and a CUDA-graph replay of it against SDPA with O and lse poisoned. Then the combine is switched off:
the cut tiles' rows must stay poisoned, every other row right, so the combine is what completes them.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
import space.wgmma  # noqa: E402,F401  (registers the family)
from space import Config, Shape  # noqa: E402

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
ARCH = space.get_arch("sm_90")
BASE = ("wgmma:consumer_wgs=2,bc=128,stages=2,setmaxnreg=1,overlap=1,pingpong=1,o_store=smem,min_blocks=1,"
        "scheduler=persistent,o_rescale=before,softmax_reduce=chain,exp2_fma=none,tail_split=1,kv_splits=1,pack_gqa=0")
CONFIGS = (
    Config.from_key(BASE),  # the shipped d128 rows' config, O staged in shared memory
    Config.from_key(BASE).replace(pingpong=False, stages=3, o_store="direct", o_rescale="after"),
    # one warpgroup, two CTAs per SM (264 CTAs), 64-key tiles
    Config.from_key(BASE).replace(consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False,
                                  o_store="direct", min_blocks=2, o_rescale="after"),
)
# 8 query blocks of 128 rows (16 of 64) × 38 heads: 304 (608) tiles, two rounds of 132 (264) CTAs and 40 (80) tiles
# left over; 1500 keys are 12 (24) key tiles, so the 40 (80) tiles are cut into shares of 4 (8) (space.wgmma.tail_plan)
SHAPE = Shape(batch=1, heads=38, kv_heads=19, seqlen_q=1000, seqlen_k=1500, head_dim=128, dtype="bf16", causal=False)
GROUP = SHAPE.heads // SHAPE.kv_heads


@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("config", CONFIGS, ids=["pingpong-smem", "overlap-direct", "one-wg-two-ctas"])
def test_the_cut_tiles_are_merged_by_the_tail_combine(build_cache_dir, monkeypatch, config):
    from autotune.build.builder import Builder
    from autotune.launch import loader
    from autotune.measure.check import _torch_sdpa, make_inputs

    assert space.is_valid(config, SHAPE.problem, ARCH)
    [build] = Builder(ARCH, cache_dir=os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or build_cache_dir).build(
        [(config, SHAPE.problem)])
    assert build.ok and not build.spilled, build.error or build.report
    runner = loader.KernelRunner(build)
    q, k, v = make_inputs(SHAPE, "bhnd", seed=11)
    ref = _torch_sdpa(q.float(), k.float(), v.float(), False, None)
    want = ref.to(q.dtype)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float().repeat_interleave(GROUP, dim=1)) * 128 ** -0.5
    want_lse = torch.logsumexp(scores, dim=-1)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    launch = runner.prepare(q, k, v, o, lse)
    plan = runner.tail_plan(loader.InputShape(1, 38, 19, 1000, 1500, 128, "bf16"), launch.grid)
    assert plan is not None and launch.combine is not None, (launch.grid, plan)
    assert (launch.params.tail_full_end, launch.params.tail_ctas) == (plan.full_end, plan.ctas)

    def run_and_compare(call) -> None:
        o.fill_(float("nan"))  # poisoned: a row nobody wrote stays NaN
        lse.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, want_lse, atol=2e-3, rtol=2e-3)

    for _ in range(2):
        run_and_compare(launch)
    relaunch = loader.Relaunch(launch)
    for _ in range(2):  # fresh partials per call
        run_and_compare(lambda: relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())  # warm-up outside
        with torch.cuda.graph(graph, stream=stream):
            relaunch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        run_and_compare(graph.replay)

    # the combine switched off: exactly the existing rows of the cut tiles stay poisoned
    monkeypatch.setattr(loader.Combine, "__call__", lambda self, params, stream=None: None)
    o.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    order = space.wgmma.tile_order(1, 38, 19, 1000, 1500, 128, space.wgmma.br(config), False)
    cut = torch.zeros(1, 38, 1000, dtype=torch.bool, device=o.device)
    rows = space.wgmma.br(config)
    for m_block, head, batch in order[plan.full_end:]:
        cut[batch, head, m_block * rows:(m_block + 1) * rows] = True
    unwritten = torch.isnan(o).any(dim=-1)
    assert torch.equal(unwritten, cut), (unwritten.sum().item(), cut.sum().item())
    torch.testing.assert_close(o[~cut], want[~cut], atol=2e-2, rtol=2e-2)
