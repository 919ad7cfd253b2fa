"""Correctness matrix of the decode axes of the wgmma family (split-KV, packed GQA heads), of the mma_sync family's
split-KV, and of both causal alignments, on a Hopper GPU, through the project's build → load → check path
(autotune.measure.check in a child process, so a fault or hang fails one test, not the matrix).

Configs: every kv_splits value, with and without packed heads, one consumer warpgroup streaming K/V (the decode
default's shape; d256 with 64-key tiles to fit shared memory), plus each problem's decode default.
Cases: seqlen_q 1-16 against seqlen_k 1 to 128k (odd lengths, one tile, more splits than tiles), GQA ratios 1, 2, 4
and 8, causal masks aligned top-left and bottom-right (including more queries than keys: rows that see no key),
K/V slices of a longer preallocated cache, (B,N,H,D) strides, logsumexp. The output is poisoned before each run
(autotune.measure.check).

mma_sync (MMA_PLAN × MMA_CASES, a few hundred checks from under 50 builds): every split count of its domain on the
decode tile (64 × 64, 4 warps), each split count against key lengths below splits × Bc (splits with no key tile),
odd lengths and Nk = 1; the decode default of every problem; splits with the other loops of the family (P through
shared memory with a warp split of the key columns, loader warps, a shared K/V buffer, conditional rescaling,
Q in registers, two m16 tiles per warp); GQA 1-8, causal top-left and bottom-right with Nq 4. Every build is one that
compiles without spills for sm_90 (checked on CPU when the plan changed: builds of 255-register tiles such as
128 × 32 at d128 causal spill once split, which the search's spill policy prunes).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from space import Config, Problem, Shape  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability(0) == (9, 0)
ARCH = space.get_arch("sm_90")
CHECK_TIMEOUT_S = 120


from gpu_cases import Case, assert_matches_reference, build_plan, check_worker  # noqa: E402

CASES = (
    Case("q1-k1-gqa8", Shape(batch=2, heads=16, kv_heads=2, seqlen_q=1, seqlen_k=1), "bhnd", lse=True),
    Case("q1-k130-gqa4", Shape(batch=3, heads=8, kv_heads=2, seqlen_q=1, seqlen_k=130), "cache", lse=True),
    Case("q1-k4099-gqa4-cache", Shape(batch=2, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4099), "cache", lse=True,
         causal_align="lower_right"),
    Case("q1-k131072-gqa8", Shape(batch=1, heads=8, kv_heads=1, seqlen_q=1, seqlen_k=131072), "bhnd", lse=True),
    Case("q4-k1000-gqa8-cache-lr", Shape(batch=2, heads=16, kv_heads=2, seqlen_q=4, seqlen_k=1000), "cache",
         lse=True, causal_align="lower_right"),
    Case("q7-k300-gqa2-lr", Shape(batch=1, heads=4, kv_heads=2, seqlen_q=7, seqlen_k=300), "bhnd", lse=True,
         causal_align="lower_right"),
    Case("q16-k4096-mha-bnhd-lr", Shape(batch=2, heads=4, seqlen_q=16, seqlen_k=4096), "bnhd", lse=True,
         causal_align="lower_right"),
    Case("q16-k5-gqa4-lr", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=16, seqlen_k=5), "bhnd", lse=True,
         causal_align="lower_right"),
    Case("q3-k100-gqa2-ul", Shape(batch=2, heads=4, kv_heads=2, seqlen_q=3, seqlen_k=100), "bhnd", lse=True),
    Case("q100-k777-gqa4-lr", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=100, seqlen_k=777), "bnhd", lse=True,
         causal_align="lower_right"),
)

PROBLEMS = tuple(Problem(d, dt, c) for d in space.HEAD_DIMS for dt in space.DTYPES for c in (False, True))
# (kv_splits, pack_gqa): every split count once, packing on most of them (decode's case) and off on some.
SPLITS_PACK = ((1, True), (2, False), (3, True), (4, True), (6, False), (8, True), (12, True), (16, False),
               (24, True), (32, True))


def decode_config(problem: Problem, splits: int, pack: bool) -> Config:
    bc, stages = (64, 2) if problem.head_dim == 256 else (128, 3)
    return Config.make("wgmma", consumer_wgs=1, bc=bc, stages=stages, setmaxnreg=False, overlap=True, pingpong=False,
                       o_store="direct", min_blocks=1, scheduler="grid", kv_splits=splits, pack_gqa=pack)


def plan_for(problem: Problem) -> list[Config]:
    configs = [decode_config(problem, s, p) for s, p in SPLITS_PACK]
    configs += [space.default_config_for_shape(Shape(batch=b, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=n,
                                                     head_dim=problem.head_dim, dtype=problem.dtype,
                                                     causal=problem.causal), ARCH)
                for b, n in ((1, 4096), (32, 4096))]
    # two consumer warpgroups ping-ponging over a split range, and packed heads with O staged in shared memory
    configs.append(Config.make("wgmma", consumer_wgs=2, bc=64 if problem.head_dim == 256 else 128, stages=2,
                               setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1,
                               kv_splits=4, pack_gqa=True))
    configs.append(Config.make("wgmma", consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False,
                               pingpong=False, o_store="smem", min_blocks=1, pack_gqa=True))
    valid = [c for c in dict.fromkeys(configs) if space.is_valid(c, problem, ARCH)]
    return valid


PLAN = tuple((p, c) for p in PROBLEMS for c in plan_for(p))


# ---- mma_sync: split-KV ---------------------------------------------------------------------------------------

MMA_CASES = (
    Case("q1-k1-gqa4", Shape(batch=2, heads=8, kv_heads=2, seqlen_q=1, seqlen_k=1), "bhnd", lse=True),
    Case("q1-k63-mha", Shape(batch=3, heads=4, seqlen_q=1, seqlen_k=63), "bhnd", lse=True),  # 1 tile < splits
    Case("q1-k333-gqa8-cache", Shape(batch=2, heads=16, kv_heads=2, seqlen_q=1, seqlen_k=333), "cache", lse=True,
         causal_align="lower_right"),  # 6 tiles: fewer than most split counts, the last one partial
    Case("q1-k4097-gqa4-bnhd", Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4097), "bnhd", lse=True),
    Case("q4-k1000-gqa2-lr", Shape(batch=2, heads=8, kv_heads=4, seqlen_q=4, seqlen_k=1000), "cache", lse=True,
         causal_align="lower_right"),
    Case("q4-k2-gqa4-lr", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=4, seqlen_k=2), "bhnd", lse=True,
         causal_align="lower_right"),  # more queries than keys: causal rows that see no key
    Case("q16-k20000-mha-bnhd-lr", Shape(batch=1, heads=4, seqlen_q=16, seqlen_k=20000), "bnhd", lse=True,
         causal_align="lower_right"),
    Case("q100-k777-gqa4", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=100, seqlen_k=777), "bhnd", lse=True),
)
# both dtypes and both maskings at d64 and d128, and d256 (the decode tile at its shared-memory limit) once
MMA_PROBLEMS = (Problem(64, "fp16", False), Problem(64, "bf16", True), Problem(128, "bf16", False),
                Problem(128, "fp16", True), Problem(256, "bf16", True))
MMA_ARCH = space.get_arch("sm_90")  # the GPU this matrix runs on (an H200); the mma_sync family runs on it too


def mma_plan_for(problem: Problem) -> list[Config]:
    """Every split count on the decode tile; the problem's decode defaults; splits through the family's other loops
    (as far as they are valid for the problem: d256 has no room for some)."""
    tile = space.mma_sync.decode_default(Shape(batch=1, heads=8, seqlen_q=1, seqlen_k=1 << 20,
                                               head_dim=problem.head_dim, dtype=problem.dtype,
                                               causal=problem.causal), MMA_ARCH)
    configs = [tile.replace(kv_splits=s) for s in space.mma_sync.KV_SPLITS]
    configs += [space.default_config_for_shape(Shape(batch=b, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=n,
                                                     head_dim=problem.head_dim, dtype=problem.dtype,
                                                     causal=problem.causal), MMA_ARCH, "mma_sync")
                for b, n in ((1, 4096), (1, 32768))]
    configs += [tile.replace(br=64, bc=64, warps_m=2, warps_n=2, p_path="smem", kv_splits=4),
                tile.replace(loader_warps=1, kv_buffering="double", kv_splits=8),
                tile.replace(kv_buffering="shared", o_rescale="on_growth", kv_splits=2)]
    # Q in registers (not at d256) and two m16 tiles per warp, whose rows each split's epilogue writes (d64 only):
    # elsewhere their accumulators reach ptxas' 255-register cap and spill (the matrix asserts no spill)
    if problem.head_dim < 256:
        configs.append(tile.replace(q_in_regs=True, softmax_reduce="tree", kv_splits=16))
    if problem.head_dim == 64:
        configs.append(tile.replace(warps_m=2, kv_splits=32))
    return [c for c in dict.fromkeys(configs) if space.is_valid(c, problem, MMA_ARCH)]


MMA_PLAN = tuple((p, c) for p in MMA_PROBLEMS for c in mma_plan_for(p))


def _short(config: Config) -> str:
    return "-".join(str(v if not isinstance(v, bool) else int(v)) for _, v in config.values)


# ---- CPU: the design of the matrix ----------------------------------------------------------------------------

def test_plan_covers_every_split_count_and_both_packings_at_every_head_dim():
    for d in space.HEAD_DIMS:
        here = [c for p, c in PLAN if p.head_dim == d]
        assert {c.kv_splits for c in here} == set(space.wgmma.KV_SPLITS), d
        assert {c.pack_gqa for c in here} == {False, True}, d


def test_cases_cover_the_decode_corners():
    assert {c.shape.seqlen_q for c in CASES} >= {1, 4, 16}
    assert {c.shape.heads // c.shape.kv_heads for c in CASES} >= {1, 2, 4, 8}
    assert {c.causal_align for c in CASES} == {"upper_left", "lower_right"}
    assert any(c.shape.seqlen_q > c.shape.seqlen_k for c in CASES)  # rows that see no key
    assert max(c.shape.seqlen_k for c in CASES) >= 128 * 1024
    assert "cache" in {c.layout for c in CASES}


def test_mma_sync_plan_covers_every_split_count_problem_and_loop():
    assert {p.head_dim for p in MMA_PROBLEMS} == set(space.HEAD_DIMS)
    for d in (64, 128):
        here = [p for p in MMA_PROBLEMS if p.head_dim == d]
        assert {p.dtype for p in here} == set(space.DTYPES) and {p.causal for p in here} == {False, True}, d
    for problem in MMA_PROBLEMS:
        here = [c for p, c in MMA_PLAN if p == problem]
        assert all(c.family == "mma_sync" for c in here)
        assert {c.kv_splits for c in here} == set(space.mma_sync.KV_SPLITS), problem.key
        # the decode default with splits is among the builds (what an untuned decode call runs off Hopper)
        assert any(c.kv_splits > 1 and c == space.mma_sync.decode_default(
            Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=32768, head_dim=problem.head_dim,
                  dtype=problem.dtype, causal=problem.causal), MMA_ARCH) for c in here), problem.key
    split = [c for _, c in MMA_PLAN if c.kv_splits > 1]
    assert {c.p_path for c in split} == {"regs", "smem"} and {c.warps_n for c in split} >= {1, 2}
    assert {c.loader_warps for c in split} >= {0, 1} and {c.kv_buffering for c in split} == {"shared", "separate", "double"}
    assert {c.o_rescale for c in split} == {"every_tile", "on_growth"} and {c.q_in_regs for c in split} == {False, True}
    assert 150 <= len(MMA_PLAN) * len(MMA_CASES) <= 500  # a few hundred checks, not the product


def test_mma_sync_cases_cover_the_split_corners():
    splits = max(space.mma_sync.KV_SPLITS)
    bc = space.mma_sync.DECODE_BC
    nk = {c.shape.seqlen_k for c in MMA_CASES}
    assert 1 in nk and any(n % 2 for n in nk - {1})  # Nk = 1, odd lengths
    assert any(n < splits * bc for n in nk) and any(n < bc for n in nk)  # splits left without a key tile
    assert any(n > splits * bc * space.split_kv.MIN_TILES_PER_SPLIT for n in nk)  # every split has tiles
    assert {c.shape.heads // c.shape.kv_heads for c in MMA_CASES} >= {1, 2, 4, 8}
    assert any(c.shape.seqlen_q == 4 and c.causal_align == "lower_right" for c in MMA_CASES)
    assert any(c.shape.seqlen_q > c.shape.seqlen_k and c.causal_align == "lower_right" for c in MMA_CASES)
    assert {c.layout for c in MMA_CASES} == {"bhnd", "bnhd", "cache"}


# ---- GPU ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return build_plan(ARCH, PLAN, tmp_path_factory)


@pytest.fixture(scope="module")
def worker():
    yield from check_worker()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("problem,config", PLAN, ids=[f"{p.key}-{_short(c)}" for p, c in PLAN])
@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_decode_axes_match_reference(builds, worker, problem, config, case):
    assert_matches_reference(worker, builds[(problem, config)], problem, config, case, CHECK_TIMEOUT_S)


@pytest.fixture(scope="module")
def mma_builds(tmp_path_factory):
    return build_plan(MMA_ARCH, MMA_PLAN, tmp_path_factory)


@pytest.mark.parametrize("case", MMA_CASES, ids=[c.name for c in MMA_CASES])
@pytest.mark.parametrize("problem,config", MMA_PLAN, ids=[f"mma_sync-{p.key}-{_short(c)}" for p, c in MMA_PLAN])
@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_mma_sync_split_kv_matches_reference(mma_builds, worker, problem, config, case):
    assert_matches_reference(worker, mma_builds[(problem, config)], problem, config, case, CHECK_TIMEOUT_S)


def test_bench_and_the_search_summary_show_time_and_kv_read_rate_for_decode():
    from autotune.commands.bench_cmd import table

    shape = Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4096, dtype="bf16")
    rows = [{"name": "ours", "median_ms": 0.134, "tflops": shape.tflops(0.134e-3), "vs_flash": None, "vs_cudnn": None,
             "status": "ok"}]
    text = table(rows, shape.kv_bytes)
    assert "K/V TB/s" in text.splitlines()[0]
    assert f"{shape.kv_bytes / 0.134e-3 / 1e12:.2f}" in text.splitlines()[1] and "134.0" in text.splitlines()[1]
    assert "TB/s" not in table(rows)  # prefill: TFLOPS only
    assert shape.is_decode and not Shape(seqlen_q=17, seqlen_k=4096).is_decode
    assert shape.kv_bytes == 2 * 32 * 8 * 4096 * 128 * 2


@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_the_search_checks_and_times_a_lower_right_shape_with_its_own_mask(tmp_path_factory):
    # A speculative-decoding step (4 new tokens against 4096 keys): the search's evaluator must check and time the
    # lower-right mask (each token sees ~every key), not top-left (each sees at most 4 keys: far less work).
    import dataclasses

    from autotune.measure.child_process import Evaluator

    lower_right = Shape(batch=32, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, dtype="bf16", causal=True,
                        causal_align="lower_right")
    upper_left = dataclasses.replace(lower_right, causal_align="upper_left")
    config = space.default_config_for_shape(lower_right, ARCH)
    build = build_plan(ARCH, [(lower_right.problem, config)], tmp_path_factory)[(lower_right.problem, config)]
    with Evaluator(timeout=CHECK_TIMEOUT_S) as evaluator:
        lr, ul = evaluator.evaluate(build, lower_right), evaluator.evaluate(build, upper_left)
    assert lr.status == ul.status == "complete", (lr.reason, ul.reason)
    assert lr.time_ms > 2 * ul.time_ms, (lr.time_ms, ul.time_ms)
