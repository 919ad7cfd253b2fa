"""space/'s verdict on a config must be the compiler's: valid ⇒ compiles, invalid ⇒ fails with a static_assert
whose message starts with exactly the rules space/ names. Also ptxas' static smem = space.layout's.

The sample (sm_90, three problems) is picked deterministically:
  - per rule and problem, the first config (in a seeded shuffle of the cross product) that breaks that rule
    alone, and its first one-axis neighbour that is valid: both sides of the rule's boundary;
  - a few seeded random valid configs per problem.
Builds go through the session cache with check_rules=False, so the compiler judges every config itself.
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


@functools.lru_cache(maxsize=None)
def sample() -> tuple[dict, list]:
    """(invalid picks {rule: [(config, problem, violated rules)]}, valid [(config, problem)])."""
    invalid: dict[str, list] = {rule.name: [] for rule in FAMILY.rules}
    valid: list = []
    rng = random.Random(SEED)
    configs = list(space.enumerate_configs(FAMILY.name))
    for problem in PROBLEMS:
        rng.shuffle(configs)
        broken = {c: tuple(v.rule for v in space.violations(c, problem, ARCH)) for c in configs}
        for rule in invalid:
            alone = next((c for c in configs if broken[c] == (rule,)), None)
            if alone is None:
                continue
            invalid[rule].append((alone, problem, broken[alone]))
            neighbour = next((n for n in _neighbours(alone) if not broken[n]), None)
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
