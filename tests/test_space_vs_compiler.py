"""space/'s verdict on a config must be the compiler's: valid ⇒ compiles, invalid ⇒ fails with a static_assert
whose message starts with exactly the rules space/ names. Also ptxas' static smem = space.layout's.

The sample (sm_90, three problems) is picked deterministically:
  - per rule and problem, the first config (in a seeded shuffle of the cross product) that breaks that rule
    alone, and its first one-axis neighbour that is valid: both sides of the rule's boundary;
  - a few seeded random valid configs per problem.
Builds go through the session cache with check_rules=False, so the compiler judges every config itself.
The family's fast valid_configs (space/split_kv.py's expansion by kv_splits) is compared with the brute force, and so
is space.judged_configs (what `autotune space` lists) for both families.
"""
from __future__ import annotations

import functools
import random
import re

import pytest

import space
from autotune.build.builder import Builder

ARCH = space.get_arch("sm_90")
FAMILY = space.get_family("mma_sync")
PROBLEMS = (space.Problem(128, "fp16", False), space.Problem(64, "bf16", True), space.Problem(256, "fp16", False))
RANDOM_VALID_PER_PROBLEM = 6
SEED = 20261129
STATIC_ASSERT_RULE = re.compile(r'static assertion failed with "(\w+):')
# a slice of the cross product for the brute-force comparisons: every value of the decode axis, a few of the rest
SLICE = {"br": (64, 128), "bc": (64,), "smem_mode": ("dynamic", "hybrid"), "min_blocks": (1, 2),
         "loader_warps": (0, 1)}


@functools.lru_cache(maxsize=None)
def sample() -> tuple[dict, list]:
    """(invalid picks {rule: [(config, problem, violated rules)]}, valid [(config, problem)])."""
    invalid: dict[str, list] = {rule.name: [] for rule in FAMILY.rules}
    valid: list = []
    rng = random.Random(SEED)
    # Two split counts stand for all (kv_splits_range is the only rule that reads it, and the domain keeps it in
    # range), each on every other point of the other axes' product: the sample scans the 187k configs it did
    # before the axis, not 6× that.
    configs = [c if i % 2 == 0 else c.replace(kv_splits=4)
               for i, c in enumerate(space.enumerate_configs(FAMILY.name, {"kv_splits": (1,)}))]
    for problem in PROBLEMS:
        rng.shuffle(configs)
        broken = {c: tuple(v.rule for v in space.violations(c, problem, ARCH)) for c in configs}
        for rule in invalid:
            alone = next((c for c in configs if broken[c] == (rule,)), None)
            if alone is None:
                continue
            invalid[rule].append((alone, problem, broken[alone]))
            neighbour = next((n for n in _neighbours(alone)
                              if not (broken[n] if n in broken else space.violations(n, problem, ARCH))), None)
            if neighbour is not None:
                valid.append((neighbour, problem))
        valid += [(c, problem) for c in [c for c in configs if not broken[c]][:RANDOM_VALID_PER_PROBLEM]]
    return invalid, list(dict.fromkeys(valid))


def _neighbours(config: space.Config):
    for axis in FAMILY.axes:
        for value in axis.values:
            if value != getattr(config, axis.name):
                yield config.replace(**{axis.name: value})


@pytest.fixture(scope="module")
def verdicts(build_cache_dir):
    invalid, valid = sample()
    items = valid + [(c, p) for picks in invalid.values() for c, p, _ in picks]
    results = Builder(ARCH, cache_dir=build_cache_dir, check_rules=False).build(items)
    return {(r.config, r.problem): r for r in results}


def test_the_sample_is_large_and_has_both_verdicts():
    invalid, valid = sample()
    n_invalid = sum(len(picks) for picks in invalid.values())
    assert n_invalid + len(valid) >= 30
    assert n_invalid >= 10 and len(valid) >= 20
    assert any(c.smem_mode == "static" for c, _ in valid)
    assert {c.kv_splits > 1 for c, _ in valid} == {True, False}


def test_valid_configs_compile(verdicts):
    _, valid = sample()
    failed = [f"{p.key} {c.key}: {verdicts[(c, p)].error}" for c, p in valid if not verdicts[(c, p)].ok]
    assert not failed, "space/ says valid, the compiler disagrees:\n" + "\n".join(failed)


@pytest.mark.parametrize("rule", [r.name for r in FAMILY.rules])
def test_invalid_configs_fail_with_exactly_the_rules_space_names(rule, verdicts):
    picks = sample()[0][rule]
    if not picks:
        pytest.skip(f"no config of the space breaks {rule!r} alone for {[p.key for p in PROBLEMS]}")
    for config, problem, rules in picks:
        result = verdicts[(config, problem)]
        assert not result.ok, f"space/ says {rules}, but {problem.key} {config.key} compiled"
        compiler_rules = set(STATIC_ASSERT_RULE.findall(result.error))
        assert compiler_rules == set(rules), (
            f"{problem.key} {config.key}: space/ says {sorted(rules)}, "
            f"the compiler says {sorted(compiler_rules)}:\n{result.error}")


def test_ptxas_static_smem_is_the_layout_static_smem(verdicts):
    _, valid = sample()
    wrong = []
    for config, problem in valid:
        result = verdicts[(config, problem)]
        if result.ok and result.report.smem_static != space.layout(config, problem).smem_static:
            wrong.append(f"{problem.key} {config.key}: ptxas {result.report.smem_static} B, "
                         f"layout {space.layout(config, problem).smem_static} B")
    assert not wrong, "\n".join(wrong)
    assert any(verdicts[(c, p)].report.smem_static > 0 for c, p in valid if verdicts[(c, p)].ok)


@pytest.mark.parametrize("problem", PROBLEMS[:2], ids=lambda p: p.key)
def test_the_fast_valid_configs_are_the_brute_forces(problem):
    """valid_mma_sync_configs (the kv_splits expansion) against the brute force: the same configs in the same order
    on a slice of the cross product, and the same verdict on a seeded sample of all of it."""
    fast = space.mma_sync.valid_mma_sync_configs(problem, ARCH)
    chosen = set(fast)
    assert len(chosen) == len(fast)
    assert [c for c in fast if all(getattr(c, n) in values for n, values in SLICE.items())] == [
        c for c in space.enumerate_configs(FAMILY.name, SLICE) if space.is_valid(c, problem, ARCH)]
    rng = random.Random(SEED)
    for _ in range(3000):
        c = space.Config(FAMILY.name, tuple((a.name, rng.choice(a.values)) for a in FAMILY.axes))
        assert space.is_valid(c, problem, ARCH) == (c in chosen), c.key
    assert space.valid_configs(problem, ARCH, ("mma_sync",)) == fast
    assert {c.kv_splits for c in fast} == set(space.mma_sync.KV_SPLITS)


# judged_configs' slices: the decode axes whole, values of the other axes that break and keep the rules reading them
JUDGED = (("mma_sync", PROBLEMS[0], SLICE),
          ("wgmma", space.Problem(128, "fp16", False), {"consumer_wgs": (1, 2), "bc": (64, 192), "stages": (2, 5),
                                                        "o_store": ("direct", "smem"), "scheduler": ("grid", "persistent")}))


@pytest.mark.parametrize("family,problem,narrow", JUDGED, ids=[f for f, _, _ in JUDGED])
def test_judged_configs_give_the_brute_forces_verdicts(family, problem, narrow):
    """`autotune space` judges the cross product through space.judged_configs (the decode axes expanded): on a
    slice of it, every config once, in enumerate_configs' order, with exactly space.violations' list; and the same
    valid configs as valid_configs over the whole product."""
    judged = list(space.judged_configs(family, problem, ARCH, narrow))
    assert [c for c, _ in judged] == list(space.enumerate_configs(family, narrow))
    assert [broken for _, broken in judged] == [space.violations(c, problem, ARCH) for c, _ in judged]
    assert {bool(broken) for _, broken in judged} == {True, False}
    inside = [c for c in space.valid_configs(problem, ARCH, (family,))
              if all(getattr(c, n) in values for n, values in narrow.items())]
    assert [c for c, broken in judged if not broken] == inside
