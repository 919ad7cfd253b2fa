"""Every value of every axis of every family an arch has is usable: it appears in at least one config that
compiles for that arch. A greedy covering set (a handful of configs), not the cross product. (Each family's default
config of every problem, on every arch, is tests/test_defaults.py's.)"""
from __future__ import annotations

import functools

import pytest

import space
from autotune.build.builder import Builder

ARCHES = ("sm_90", "sm_103")
# d128 first (the common case); the others only when d128 cannot cover some value
PROBLEMS = (space.Problem(128), space.Problem(64), space.Problem(256))


def axis_values(family: space.Family) -> set[tuple[str, object]]:
    return {(axis.name, value) for axis in family.axes for value in axis.values}


@functools.lru_cache(maxsize=None)
def covering_set(arch_name: str, family_name: str) -> tuple[list, set]:
    """Greedy set cover: (config, problem) pairs valid in space/, and the (axis, value) pairs left uncovered."""
    arch, family = space.get_arch(arch_name), space.get_family(family_name)
    uncovered = axis_values(family)
    chosen = []
    for problem in PROBLEMS:
        candidates = space.valid_configs(problem, arch, (family_name,))
        while uncovered:
            best = max(candidates, key=lambda c: len(uncovered & set(c.values)), default=None)
            if best is None or not uncovered & set(best.values):
                break
            chosen.append((best, problem))
            uncovered -= set(best.values)
    return chosen, uncovered


def families_of(arch_name: str) -> list[str]:
    return [f for f in space.get_arch(arch_name).families if f in space.FAMILIES]


CASES = [(a, f) for a in ARCHES for f in families_of(a)]


@pytest.mark.parametrize("arch_name, family_name", CASES)
def test_every_axis_value_compiles(arch_name, family_name, build_cache_dir):
    chosen, uncovered = covering_set(arch_name, family_name)
    assert not uncovered, f"no valid {family_name} config on {arch_name} uses {sorted(uncovered, key=str)}"
    # a covering set, not the cross product: about as many configs as the longest axis has values
    assert len(chosen) <= max(8, max(len(a.values) for a in space.get_family(family_name).axes) + 2)

    results = Builder(arch_name, cache_dir=build_cache_dir).build(chosen)
    failed = [f"{r.problem.key} {r.config.key}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    compiled = {pair for r in results for pair in r.config.values}
    assert compiled == axis_values(space.get_family(family_name))
