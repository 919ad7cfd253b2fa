"""Correctness matrix of the wgmma family on a Hopper GPU, through the project's own build → load →
check path (autotune.measure.check in an autotune.measure.child_process child, so a fault or hang fails one test, not the matrix).

Configs: a fixed ladder from the plainest producer/consumer kernel to the FA3-style combinations (setmaxnreg,
intra-warpgroup overlap, ping-pong, 3 consumer warpgroups, non-power-of-two Bc, 2-4 stages, 2 CTAs per SM), plus
each problem's default; every problem runs the ladder's configs that space/ finds valid for it (≥ 10 each).
Cases: seqlen 1/17/128/1000/4096, seqlen_q < seqlen_k and >, GQA 4:1, (B,N,H,D) strides, lse.
The loader must pass autotune.launch.tma.launch_extra_args(config, q, k, v) after the parameter block.
"""
from __future__ import annotations

import dataclasses
import os
import zlib

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
import space.wgmma  # noqa: E402,F401  (registers the family)
from space import Config, Problem  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability(0) == (9, 0)
ARCH = space.get_arch("sm_90")
FAMILY = space.get_family("wgmma")
CHECK_TIMEOUT_S = 90
MIN_CONFIGS_PER_PROBLEM = 10

LADDER = tuple(Config.make("wgmma", **d) for d in (
    dict(consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=96, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem", min_blocks=1),
    dict(consumer_wgs=1, bc=64, stages=3, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=2),
    dict(consumer_wgs=1, bc=112, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="smem", min_blocks=2),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1),
    dict(consumer_wgs=2, bc=112, stages=3, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=80, stages=4, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=3, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=3, bc=80, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1),
    dict(consumer_wgs=3, bc=64, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    # the scheduler axis: persistent CTAs with O staged in the Q slot (the shipped d128 winner's shape), with
    # ping-pong turns across tiles, with 3 consumer warpgroups, without overlap at 2 CTAs per SM; and the lpt order
    dict(consumer_wgs=2, bc=128, stages=3, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         scheduler="persistent"),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         scheduler="persistent"),
    dict(consumer_wgs=3, bc=128, stages=4, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         scheduler="persistent"),
    dict(consumer_wgs=1, bc=64, stages=3, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=2,
         scheduler="persistent"),
    dict(consumer_wgs=2, bc=96, stages=3, setmaxnreg=False, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         scheduler="lpt"),
    dict(consumer_wgs=1, bc=112, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="smem", min_blocks=2,
         scheduler="lpt"),
    # o_rescale=before: O shrinks under the S GEMM, before P·V is issued; the d128 winner's shape (grid and
    # persistent), with ping-pong turns, with 3 consumer warpgroups (d64)
    dict(consumer_wgs=2, bc=128, stages=3, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         o_rescale="before"),
    dict(consumer_wgs=2, bc=128, stages=3, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         scheduler="persistent", o_rescale="before"),
    dict(consumer_wgs=2, bc=112, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         o_rescale="before"),
    dict(consumer_wgs=3, bc=128, stages=4, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         o_rescale="before"),
    # softmax_reduce=tree (four partial maxima and sums per row, masked tiles included): the d128 winner's shape
    # (persistent, O rescaled after), under ping-pong turns with O rescaled before, three warpgroups without overlap
    # (d64's), and with packed GQA heads and splits (decode's)
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         scheduler="persistent", softmax_reduce="tree"),
    dict(consumer_wgs=2, bc=112, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         o_rescale="before", softmax_reduce="tree"),
    dict(consumer_wgs=3, bc=112, stages=3, setmaxnreg=False, overlap=False, pingpong=False, o_store="smem",
         min_blocks=1, scheduler="persistent", softmax_reduce="tree"),
    dict(consumer_wgs=1, bc=128, stages=3, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=1,
         kv_splits=3, pack_gqa=True, softmax_reduce="tree"),
    # exp2_fma=quarter (every fourth exponential of an unmasked tile on the FMA pipe): the shipped d128 ping-pong row
    # (persistent, O rescaled before), the d64 three-warpgroup row without overlap, with the tree reductions on
    # the grid, and under splits with packed heads (decode's loop)
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1,
         scheduler="persistent", o_rescale="before", exp2_fma="quarter"),
    dict(consumer_wgs=3, bc=128, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem",
         min_blocks=1, scheduler="persistent", exp2_fma="quarter"),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1,
         softmax_reduce="tree", exp2_fma="quarter"),
    dict(consumer_wgs=1, bc=128, stages=3, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=1,
         kv_splits=3, pack_gqa=True, exp2_fma="quarter"),
    # o_rescale=fused (O scaled and P converted among the exponentials, the P·V wait behind the K slot's release):
    # the shipped d128 ping-pong row's shape (persistent), the same on the grid with the tree reductions, overlap
    # without ping-pong at Bc 176, d64's three warpgroups without overlap, and under splits with packed heads
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1,
         scheduler="persistent", o_rescale="fused"),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         o_rescale="fused", softmax_reduce="tree"),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1,
         scheduler="lpt", o_rescale="fused"),
    dict(consumer_wgs=3, bc=128, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem",
         min_blocks=1, scheduler="persistent", o_rescale="fused"),
    dict(consumer_wgs=1, bc=128, stages=2, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=1,
         kv_splits=3, pack_gqa=True, o_rescale="fused"),
    # the decode axes on prefill shapes too (every split count is in tests/test_decode_gpu.py): packed GQA heads with
    # splits, splits under ping-pong, packed heads across three warpgroups without overlap
    dict(consumer_wgs=1, bc=128, stages=3, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=1,
         kv_splits=3, pack_gqa=True),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
         kv_splits=2),
    dict(consumer_wgs=3, bc=64, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem", min_blocks=1,
         pack_gqa=True),
    # the deep rings decode's shipped rows use: 6 stages of 64 keys without overlap, 5 of 80 with overlap and splits
    dict(consumer_wgs=1, bc=64, stages=6, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct",
         min_blocks=1, kv_splits=16, pack_gqa=True),
    dict(consumer_wgs=1, bc=80, stages=5, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct",
         min_blocks=1, kv_splits=2),
    # tail_split (persistent, non-causal: the last round's tiles cut along the keys and merged by the tail combine;
    # the many-tiles case is cut): the shipped d128 ping-pong row's config, the d64 rows' three warpgroups without
    # overlap, overlap with O written from registers, one warpgroup at two CTAs per SM (tests/test_tail_split_gpu.py
    # adds Relaunch, a CUDA graph and the combine switched off)
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1,
         scheduler="persistent", o_rescale="before", tail_split=True),
    dict(consumer_wgs=3, bc=128, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem",
         min_blocks=1, scheduler="persistent", tail_split=True),
    dict(consumer_wgs=2, bc=128, stages=3, setmaxnreg=True, overlap=True, pingpong=False, o_store="direct",
         min_blocks=1, scheduler="persistent", tail_split=True),
    dict(consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct",
         min_blocks=2, scheduler="persistent", tail_split=True),
))
PROBLEMS = tuple(Problem(d, dtype, causal) for d in (64, 128) for dtype in space.DTYPES for causal in (False, True))


from gpu_cases import CASES, Case, assert_matches_reference  # noqa: E402  (shared by both families' matrices)


def plan_for(problem: Problem) -> list[Config]:
    configs = [FAMILY.default(problem, ARCH)] + [c for c in LADDER if space.is_valid(c, problem, ARCH)]
    return list(dict.fromkeys(configs))


# head_dim 256: its default config per dtype and causal flag, under every scheduler valid for it (persistent
# overlapped d256 causal is over its register margin), on every case.
D256 = tuple((p, c) for p in (Problem(256, dt, causal) for dt in space.DTYPES for causal in (False, True))
             for c in (FAMILY.default(p, ARCH).replace(scheduler=s) for s in ("grid", "lpt", "persistent"))
             if space.is_valid(c, p, ARCH))
# d256's earlier winner (no overlap) and FA3's d256 loop (128 × 80, overlap without ping-pong, O rescaled before P·V)
D256 += tuple((p, Config.make("wgmma", consumer_wgs=2, bc=80, stages=2, setmaxnreg=True, overlap=ov, pingpong=pp,
                              o_store="smem", min_blocks=1, o_rescale=r))
              for p in (Problem(256, dt, c) for dt in space.DTYPES for c in (False, True))
              for ov, pp, r in ((False, False, "after"), (True, False, "before"), (True, False, "fused"),
                                (False, False, "fused")))
# tail_split at d256: the loop without overlap (the overlapped one is over its register margin with the tail's copy)
D256 += tuple((p, Config.make("wgmma", consumer_wgs=2, bc=80, stages=2, setmaxnreg=True, overlap=False, pingpong=False,
                              o_store="smem", min_blocks=1, scheduler="persistent", tail_split=True))
              for p in (Problem(256, dt, False) for dt in space.DTYPES))
PLAN = tuple((p, c) for p in PROBLEMS for c in plan_for(p)) + D256
# tail_split's configs also run a shape whose persistent last round is cut (space.wgmma.tail_plan: 40 of 132 tiles
# left over with 128-row tiles, 80 of 264 with 64-row ones, 96 of 132 with 192-row ones; none of CASES is cut)
TAIL_CASE = Case("q1000-k3500-gqa-cut-tail-bnhd", space.Shape(batch=1, heads=38, kv_heads=19, seqlen_q=1000,
                                                             seqlen_k=3500), "bnhd", lse=True)
TAIL_PLAN = tuple((p, c) for p, c in PLAN if c.tail_split)


def _short(config: Config) -> str:
    return "-".join(str(v if not isinstance(v, bool) else int(v)) for _, v in config.values)


# ---- CPU: the design of the matrix ----------------------------------------------------------------------------

def test_every_problem_gets_enough_valid_configs():
    for problem in PROBLEMS:
        configs = plan_for(problem)
        assert len(configs) >= MIN_CONFIGS_PER_PROBLEM, (problem.key, len(configs))
        assert all(space.is_valid(c, problem, ARCH) for c in configs)


def test_ladder_covers_every_axis_value():
    for axis in FAMILY.axes:
        seen = {getattr(c, axis.name) for _, c in PLAN}
        if axis.name == "bc":
            assert len(seen) >= 5, seen
        elif axis.name == "kv_splits":  # every value: tests/test_decode_gpu.py
            assert len(seen) >= 3, seen
        else:
            assert seen == set(axis.values), (axis.name, seen)


def test_persistent_plan_has_one_and_two_q_slots():
    # a persistent CTA gets a second Q slot where it fits (space.wgmma.q_buffers): both layouts must be checked, at
    # every head dim that has persistent configs in the plan
    slots = {(space.wgmma.q_buffers(c, p), p.head_dim) for p, c in PLAN if c.scheduler == "persistent"}
    assert {s for s, _ in slots} == {1, 2}, slots
    assert {(2, 64), (2, 128), (1, 128), (1, 256)} <= slots, slots


def test_the_tail_case_is_cut_for_every_tail_config():
    from space.wgmma import tail_plan

    assert len(TAIL_PLAN) >= 12
    shape = TAIL_CASE.shape
    for problem, config in TAIL_PLAN:
        rows = space.wgmma.br(config)
        tiles = -(-shape.seqlen_q // rows) * shape.heads * shape.batch
        ctas = 132 * config.min_blocks  # an H100's or H200's SMs, the CTAs each holds of these configs
        assert tail_plan(tiles, ctas, -(-shape.seqlen_k // config.bc)) is not None, (problem.key, config.key)


def test_tensor_maps_follow_the_config():
    from autotune.launch.tma import launch_extra_args

    assert launch_extra_args(space.default_config(Problem(), ARCH, "mma_sync"), None, None, None) == ()
    with pytest.raises(ValueError, match="CUDA tensor"):
        launch_extra_args(LADDER[0], torch.zeros(1, 1, 1, 64, dtype=torch.float16), None, None)


# ---- GPU ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builds(request, tmp_path_factory):
    from autotune.build.builder import Builder

    # only the configs of the tests selected (-k), so a narrow run does not wait for the whole plan's builds
    selected = {(item.callspec.params["problem"], item.callspec.params["config"]) for item in request.session.items
                if getattr(item, "callspec", None) is not None and "config" in item.callspec.params
                and "problem" in item.callspec.params}
    items = [(c, p) for p, c in PLAN if (p, c) in selected] or [(c, p) for p, c in PLAN]
    cache = os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or tmp_path_factory.mktemp("kernel-cache")
    results = Builder(ARCH, cache_dir=cache, jobs=os.cpu_count()).build(items)
    return {(r.problem, r.config): r for r in results}


@pytest.fixture(scope="module")
def worker():
    from autotune.measure.child_process import Worker

    w = Worker(warmup=("torch.cuda:init", ()))
    yield w
    w.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("problem,config", PLAN, ids=[f"{p.key}-{_short(c)}" for p, c in PLAN])
@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_wgmma_matches_reference(builds, worker, problem, config, case):
    build = builds[(problem, config)]
    assert build.ok, f"{config.key} for {problem.key} did not build: {build.error}"
    assert not build.spilled, f"{config.key} for {problem.key} spills: {build.report}"
    shape = dataclasses.replace(case.shape, head_dim=problem.head_dim, dtype=problem.dtype, causal=problem.causal)
    seed = zlib.crc32(f"{problem.key}/{config.key}/{case.name}".encode())
    result = worker.call("autotune.measure.check:check", build, shape, seed, case.layout, case.lse, timeout=CHECK_TIMEOUT_S)
    assert result.ok, f"autotune.measure.check:check {result.status}: {result.reason}"
    check = result.value
    assert check.ok, f"{config.key} on {shape.key} ({case.layout}, seed {seed}): {check.message}"
    assert check.unwritten == 0 and check.nan_count == 0 and check.out_of_bounds == 0


@pytest.mark.parametrize("problem,config", TAIL_PLAN, ids=[f"{p.key}-{_short(c)}" for p, c in TAIL_PLAN])
@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_tail_split_cut_matches_reference(builds, worker, problem, config):
    assert_matches_reference(worker, builds[(problem, config)], problem, config, TAIL_CASE, CHECK_TIMEOUT_S)
