"""The wgmma family on CPU: space/wgmma.py against the compiler, for sm_90a.

- every default and a sample of valid configs compile, with no spills and no static shared memory (all of it is
  dynamic, as space.layout says);
- configs that break one rule alone fail with a static_assert naming exactly that rule;
- the family exists only on sm_90; the default is a valid config for every problem;
- the generated wgmma wrappers are up to date; the tensor-map geometry validates strides.
"""
from __future__ import annotations

import functools
import importlib.util
import random
import re
from pathlib import Path

import pytest

import space
import space.wgmma  # noqa: F401  (registers the family)
from space import Config, Problem

ARCH = space.get_arch("sm_90")
FAMILY = space.get_family("wgmma")
PROBLEMS = tuple(Problem(d, dt, c) for d in (64, 128, 256) for dt in ("fp16", "bf16") for c in (False, True))
SAMPLE_PROBLEMS = (Problem(128, "fp16", False), Problem(64, "bf16", True), Problem(256, "fp16", True))
RANDOM_VALID_PER_PROBLEM = 4
SEED = 20261130
SCAN_LIMIT = 20000
# the rules a config can break alone somewhere in SAMPLE_PROBLEMS (test_rules_that_can_fire_are_sampled checks them)
ALONE_RULES = {"pingpong_needs_two_consumers", "pingpong_needs_overlap", "rescale_before_needs_overlap",
               "setmaxnreg_needs_two_consumers", "setmaxnreg_one_block", "smem_optin_limit",
               "accumulators_fit_registers", "split_pack_need_grid", "kv_splits_store_direct",
               "tail_split_needs_equal_rounds"}
STATIC_ASSERT_RULE = re.compile(r'static assertion failed with "(\w+):')
KERNELS = Path(__file__).resolve().parent.parent / "kernels"


@functools.lru_cache(maxsize=None)
def sample() -> tuple[dict, list]:
    """(invalid picks {rule: [(config, problem, rules)]}, valid [(config, problem)]), deterministic."""
    invalid: dict[str, list] = {rule.name: [] for rule in FAMILY.rules}
    valid: list = [(FAMILY.default(p, ARCH), p) for p in PROBLEMS]
    # every scheduler on every problem's default: its extra barrier, tile order and persistent loop must compile
    # without spills everywhere, d256 (at its register budget) included
    # (where valid: the d256 default overlaps, and persistent overlapped d256 causal is over its register margin)
    valid += [(c, p) for p in PROBLEMS
              for c in (FAMILY.default(p, ARCH).replace(scheduler=s) for s in ("lpt", "persistent"))
              if space.is_valid(c, p, ARCH)]
    # o_rescale=before: FA3's d256 loop (2 × 64 rows, Bc 80, 2 stages, overlap, no ping-pong) and the d128/d64
    # winners' shapes, every problem (d256 is at its register budget), grid and persistent
    before = dict(setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1, o_rescale="before")
    for p in PROBLEMS:
        shape = {256: dict(consumer_wgs=2, bc=80, stages=2), 128: dict(consumer_wgs=2, bc=128, stages=3),
                 64: dict(consumer_wgs=3, bc=128, stages=4)}[p.head_dim]
        valid += [(c, p) for c in (Config.make("wgmma", **shape, **before, scheduler=s) for s in ("grid", "persistent"))
                  if space.is_valid(c, p, ARCH)]
    # softmax_reduce=tree (a few more live registers in the softmax): every problem's default, and the o_rescale=before
    # configs above (d256 persistent is the tightest budget)
    valid += [(c.replace(softmax_reduce="tree"), p) for c, p in list(valid)
              if space.is_valid(c.replace(softmax_reduce="tree"), p, ARCH)
              and (c == FAMILY.default(p, ARCH) or c.o_rescale == "before")]
    # exp2_fma=quarter (the polynomial's temporaries beside the MUFU results): every problem's default, the
    # o_rescale=before configs above and the tree variants (d256 persistent is the tightest budget)
    valid += [(c.replace(exp2_fma="quarter"), p) for c, p in list(valid)
              if space.is_valid(c.replace(exp2_fma="quarter"), p, ARCH)
              and (c == FAMILY.default(p, ARCH) or c.o_rescale == "before" or c.softmax_reduce == "tree")]
    # tail_split (a second copy of the tile loop for the cut tiles, and their fp32 partials): every persistent config
    # above on a problem that allows it (non-causal; the d256 overlapped loop is over its margin)
    valid += [(c.replace(tail_split=True), p) for c, p in list(valid)
              if c.scheduler == "persistent" and space.is_valid(c.replace(tail_split=True), p, ARCH)]
    # the decode axes: each problem's decode default (split-KV with packed GQA heads) and packed heads with O staged
    # in shared memory
    for p in PROBLEMS:
        decode = space.default_config_for_shape(space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=32768,
                                                            head_dim=p.head_dim, dtype=p.dtype, causal=p.causal), ARCH)
        valid += [(c, p) for c in (decode, decode.replace(kv_splits=1, o_store="smem")) if space.is_valid(c, p, ARCH)]
    rng = random.Random(SEED)
    # Two split counts stand for all (no rule looks at the count beyond 1, and the domain keeps it in range): the
    # cross product is then 40k configs, not 200k. Each problem's scan stops once every rule that can fire alone
    # has its pick, or after SCAN_LIMIT configs.
    configs = [c for c in space.enumerate_configs(FAMILY.name) if c.kv_splits in (1, 4)]
    for problem in SAMPLE_PROBLEMS:
        rng.shuffle(configs)
        found: dict[str, tuple] = {}
        fine: list = []
        for c in configs[:SCAN_LIMIT]:
            broken = tuple(v.rule for v in space.violations(c, problem, ARCH))
            if not broken:
                if len(fine) < RANDOM_VALID_PER_PROBLEM:
                    fine.append(c)
            elif len(broken) == 1 and broken[0] not in found:
                found[broken[0]] = (c, problem, broken)
            if len(fine) == RANDOM_VALID_PER_PROBLEM and ALONE_RULES <= set(found):
                break
        for rule, pick in found.items():
            invalid[rule].append(pick)
        valid += [(c, problem) for c in fine]
    # tail_split's register rule breaks alone only on a non-causal d256 problem, which the scan does not sample
    d256 = Problem(256, "fp16", False)
    over = FAMILY.default(d256, ARCH).replace(scheduler="persistent", tail_split=True)
    invalid["tail_split_fits_registers"].append((over, d256, tuple(v.rule for v in space.violations(over, d256, ARCH))))
    return invalid, list(dict.fromkeys(valid))


@pytest.fixture(scope="module")
def verdicts(build_cache_dir):
    from autotune.build.builder import Builder

    invalid, valid = sample()
    items = valid + [(c, p) for picks in invalid.values() for c, p, _ in picks]
    results = Builder(ARCH, cache_dir=build_cache_dir, check_rules=False).build(items)
    return {(r.config, r.problem): r for r in results}


def test_sample_has_both_verdicts():
    invalid, valid = sample()
    assert len(valid) >= 20
    assert sum(len(p) for p in invalid.values()) >= 8
    assert {c.pingpong for c, _ in valid} == {True, False}
    assert {c.setmaxnreg for c, _ in valid} == {True, False}
    assert {c.o_store for c, _ in valid} == {"direct", "smem"}
    assert {c.scheduler for c, _ in valid} == {"grid", "lpt", "persistent"}
    assert {c.o_rescale for c, _ in valid} == set(space.wgmma.O_RESCALES)
    assert {c.softmax_reduce for c, _ in valid} == {"chain", "tree"}
    assert {c.exp2_fma for c, _ in valid} == {"none", "quarter"}
    assert {c.pack_gqa for c, _ in valid} == {True, False}
    assert {c.kv_splits > 1 for c, _ in valid} == {True, False}
    assert {c.tail_split for c, _ in valid} == {True, False}


def test_valid_configs_compile_without_spills(verdicts):
    _, valid = sample()
    failed = [f"{p.key} {c.key}: {verdicts[(c, p)].error}" for c, p in valid if not verdicts[(c, p)].ok]
    assert not failed, "space/ says valid, the compiler disagrees:\n" + "\n".join(failed)
    spilled = [f"{p.key} {c.key}: {verdicts[(c, p)].report}" for c, p in valid if verdicts[(c, p)].spilled]
    assert not spilled, "valid configs spill:\n" + "\n".join(spilled)


def test_all_shared_memory_is_dynamic(verdicts):
    _, valid = sample()
    wrong = [f"{p.key} {c.key}: ptxas {verdicts[(c, p)].report.smem_static} B static"
             for c, p in valid if verdicts[(c, p)].ok and verdicts[(c, p)].report.smem_static != 0]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("rule", [r.name for r in FAMILY.rules])
def test_invalid_configs_fail_with_exactly_the_rules_space_names(rule, verdicts):
    picks = sample()[0][rule]
    if not picks:
        pytest.skip(f"no config of the space breaks {rule!r} alone for {[p.key for p in SAMPLE_PROBLEMS]}")
    for config, problem, rules in picks:
        result = verdicts[(config, problem)]
        assert not result.ok, f"space/ says {rules}, but {problem.key} {config.key} compiled"
        compiler_rules = set(STATIC_ASSERT_RULE.findall(result.error))
        assert compiler_rules == set(rules), (
            f"{problem.key} {config.key}: space/ says {sorted(rules)}, the compiler says {sorted(compiler_rules)}:\n"
            f"{result.error}")


def test_rules_that_can_fire_are_sampled():
    invalid, _ = sample()
    for rule in sorted(ALONE_RULES):
        assert invalid[rule], rule


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_default_is_valid(problem):
    config = FAMILY.default(problem, ARCH)
    assert config.family == "wgmma"
    assert space.violations(config, problem, ARCH) == []


def test_family_only_on_sm90():
    config = FAMILY.default(Problem(), ARCH)
    for name, arch in space.ARCHES.items():
        verdict = [v.rule for v in space.violations(config, Problem(), arch)]
        if name == "sm_90":
            assert verdict == []
        else:
            assert verdict == ["family_arch"], name


def test_layout():
    c = Config.make("wgmma", consumer_wgs=3, bc=112, stages=3, setmaxnreg=True, overlap=True, pingpong=False,
                    o_store="smem", min_blocks=1)
    lay = space.layout(c, Problem(64, "fp16", False))
    assert (lay.threads, lay.rows_per_block, lay.smem_static) == (512, 192, 0)
    # barriers: Q full + (K full, V full, K empty, V empty) × 3 stages
    assert lay.smem_dynamic == 1024 + 192 * 64 * 2 + 2 * 3 * 112 * 64 * 2 + 8 * 13
    defines = space.defines(c, Problem(64, "fp16", False))
    assert defines["AT_CONSUMER_WGS"] == 3 and defines["AT_SETMAXNREG"] == 1 and defines["AT_PINGPONG"] == 0
    assert defines["AT_EXPECT_SMEM_DYNAMIC"] == lay.smem_dynamic
    assert defines["AT_SCHEDULER"] == 0 and lay.scheduler == "grid"
    persistent = space.layout(c.replace(scheduler="persistent"), Problem(64, "fp16", False))
    # persistent: a second Q slot (it fits), its Q-full barrier and a Q-empty barrier per slot
    assert persistent.smem_dynamic == lay.smem_dynamic + 192 * 64 * 2 + 8 * 3 and persistent.scheduler == "persistent"
    assert space.wgmma.q_buffers(c.replace(scheduler="persistent"), Problem(64, "fp16", False)) == 2
    assert space.wgmma.q_buffers(c, Problem(64, "fp16", False)) == 1  # grid: one tile per CTA, one Q


def test_second_q_slot_only_where_it_fits():
    d256 = Config.make("wgmma", consumer_wgs=2, bc=80, stages=2, setmaxnreg=True, overlap=False, pingpong=False,
                       o_store="smem", min_blocks=1, scheduler="persistent")
    p = Problem(256, "bf16", False)
    assert space.wgmma.q_buffers(d256, p) == 1  # 64 KB more would pass the 227 KB opt-in limit
    assert space.layout(d256, p).smem_dynamic == 1024 + 128 * 256 * 2 + 2 * 2 * 80 * 256 * 2 + 8 * (1 + 8 + 1)
    two_ctas = Config.make("wgmma", consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False,
                           o_store="direct", min_blocks=2, scheduler="persistent")
    assert space.wgmma.q_buffers(two_ctas, Problem(128, "fp16", False)) == 2  # 2 × (1 + 2 × 16 + 64 KB) fit one SM
    assert space.wgmma.q_buffers(two_ctas.replace(stages=3), Problem(128, "fp16", False)) == 1  # 2 × 129 KB do not


def test_generated_wgmma_wrappers_are_current():
    spec = importlib.util.spec_from_file_location("gen_wgmma_ops", KERNELS / "sm90" / "gen_wgmma_ops.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (KERNELS / "sm90" / "wgmma_ops.cuh").read_text() == gen.render(), "run kernels/sm90/gen_wgmma_ops.py"


def test_tensor_map_geometry_bhnd_and_bnhd():
    from autotune.launch.tma import tensor_map_geometry

    b, h, n, d = 2, 8, 1000, 128
    dims, strides, box = tensor_map_geometry((b, h, n, d), (h * n * d, n * d, d, 1), 2, 4096, 176)
    assert dims == (d, n, h, b) and strides == (d * 2, n * d * 2, h * n * d * 2) and box == (64, 176, 1, 1)
    # (B, N, H, D) memory viewed as (B, H, N, D): rows step over all heads
    dims, strides, _ = tensor_map_geometry((b, h, n, d), (n * h * d, d, h * d, 1), 2, 4096, 64)
    assert strides == (h * d * 2, d * 2, n * h * d * 2)
    # a size-1 batch keeps whatever legal stride; an illegal one is replaced, never stepped over
    _, strides, _ = tensor_map_geometry((1, h, n, d), (7, n * d, d, 1), 2, 4096, 64)
    assert strides[2] % 16 == 0


@pytest.mark.parametrize("shape, strides, ptr, box, match", [
    ((1, 2, 16, 128), (4096, 2048, 128, 2), 0, 64, "contiguous"),
    ((1, 2, 16, 96), (3072, 1536, 96, 1), 0, 64, "multiple of 64"),
    ((1, 2, 16, 128), (4096, 2048, 128, 1), 8, 64, "16-byte aligned"),
    ((1, 2, 16, 128), (4100, 2050, 132, 1), 0, 64, "row stride"),
    ((1, 2, 16, 128), (4096, 2048, 128, 1), 0, 300, "box_rows"),
])
def test_tensor_map_geometry_rejects(shape, strides, ptr, box, match):
    from autotune.launch.tma import tensor_map_geometry

    with pytest.raises(ValueError, match=match):
        tensor_map_geometry(shape, strides, 2, ptr, box)


@pytest.mark.parametrize("problem", SAMPLE_PROBLEMS, ids=lambda p: p.key)
def test_the_fast_valid_configs_are_the_brute_forces(problem):
    fast = space.wgmma.valid_wgmma_configs(problem, ARCH)
    chosen = set(fast)
    everything = list(space.enumerate_configs(FAMILY.name))
    assert fast == [c for c in everything if c in chosen]  # the same order, no duplicate
    for c in random.Random(SEED).sample(everything, 4000) + fast[::50]:
        assert space.is_valid(c, problem, ARCH) == (c in chosen), c.key
    assert space.valid_configs(problem, ARCH, ("wgmma",)) == fast


def test_decode_calls_stream_their_cache_without_l2_promotion():
    """The K/V maps' L2 promotion: none for decode (at most DECODE_MAX_QUERIES query rows), 256B for prefill;
    every name is a promotion the driver knows (benchmarks/tma_stream_probe.py measured the difference)."""
    from autotune.launch import tma

    assert tma.kv_l2_promotion(1) == tma.kv_l2_promotion(space.DECODE_MAX_QUERIES) == "none"
    assert tma.kv_l2_promotion(space.DECODE_MAX_QUERIES + 1) == tma.kv_l2_promotion(4096) == "256B"
    drv = pytest.importorskip("cuda.bindings.driver")
    assert all(hasattr(drv.CUtensorMapL2promotion, name) for name in tma.L2_PROMOTIONS.values())
