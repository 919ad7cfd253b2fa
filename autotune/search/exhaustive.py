"""The cheapest search for a small space: when every valid config fits in the trial budget, try them all.

A sampler earns its keep on a large space; on a small one it spends its budget rediscovering configs it already
tried (repeats and invalid asks), and may still miss the optimum. So before the trial loop the search counts the
valid configs of the searched families (space/ rules, no compiling) and, when there are no more of them than
`--trials`, sweeps them all (wgmma at head_dim 256: 3656 valid configs with --trials 3656 or more; d128 35616 and
d64 77872 are sampled at the default budget; a replay counts the configs of its landscape's axis values):

* the trial budget becomes the number of valid configs (there is nothing else to try);
* the first configs are queued as for any search (warm-start neighbours, each family's default, --enqueue),
  then every other valid config, nearest to its family's default first (the fewest axes changed), so a sweep
  cut short by --timeout or Ctrl-C has covered the region the heuristic already trusts;
* the study's sampler becomes a random one, idle in practice: every trial of the sweep has its values fixed,
  and a model-based sampler would only add work to every ask.

Queued configs go through Optuna's own queue (`Study.enqueue_trial`), the mechanism the search already uses for
its first configs, so the ask path is unchanged. Counting stops as soon as the budget is exceeded, so a large
space costs a fraction of a second to rule out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import space
from space import Arch, Config, Problem


@dataclass(frozen=True)
class SweepDecision:
    """Whether to sweep, and what to say about it."""

    sweep: bool
    configs: tuple[Config, ...]   # every valid config when sweeping (in no particular order), else ()
    budget: int
    message: str


def valid_up_to(problem: Problem, arch: Arch, families: Sequence[str], limit: int,
                domains: Mapping[str, Mapping[str, tuple]] | None = None) -> list[Config] | None:
    """Every valid config of `families` for the problem and arch, or None as soon as there are more than `limit`.
    `domains` ({family: {axis: values}}, the search space's): count only configs whose values lie in them, as a
    replay searches only the axis values its landscape recorded."""
    found: list[Config] = []
    for family in families:
        for config in space.enumerate_configs(family, (domains or {}).get(family)):
            if space.is_valid(config, problem, arch):
                found.append(config)
                if len(found) > limit:
                    return None
    return found


def decide(problem: Problem, arch: Arch, families: Sequence[str], budget: int,
           domains: Mapping[str, Mapping[str, tuple]] | None = None) -> SweepDecision:
    """Sweep when the valid configs of `families` (within `domains`, see valid_up_to) are no more than `budget`
    (the trial budget)."""
    names = "+".join(families)
    configs = valid_up_to(problem, arch, families, budget, domains)
    if configs is None:
        return SweepDecision(False, (), budget, f"sampling: {names} has more valid configs than the budget of "
                                                f"{budget} trials")
    if not configs:
        return SweepDecision(False, (), budget, f"sampling: {names} has no valid config for {problem.key}")
    return SweepDecision(True, tuple(configs), budget, f"sweeping all {len(configs)} valid configs of {names}: "
                                                      f"no more than the budget of {budget} trials")


def distance_to_default(config: Config, problem: Problem, arch: Arch) -> int | None:
    """How many axes of `config` differ from its family's heuristic default (None: the family has none here)."""
    try:
        default = space.default_config(problem, arch, config.family).as_dict()
    except (KeyError, ValueError):
        return None
    return sum(1 for axis, value in config.values if default.get(axis) != value)


def sweep_order(configs: Iterable[Config], problem: Problem, arch: Arch) -> list[Config]:
    """Nearest to the family's default first; ties by config key (a fixed order: resumes see the same queue)."""
    def key(c: Config):
        distance = distance_to_default(c, problem, arch)
        return (len(c.values) + 1 if distance is None else distance, c.key)

    return sorted(configs, key=key)


def queue_sweep(study, search_space, configs: Sequence[Config], skip: Iterable[str]) -> int:
    """Queue `configs` (in order) on the study, leaving out the config keys in `skip` (already judged) and those
    already waiting in the study's queue; returns how many were queued."""
    from optuna.trial import TrialState

    waiting = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        config = search_space.config_of(t.system_attrs.get("fixed_params") or {})
        if config is not None:
            waiting.add(config.key)
    skip = set(skip) | waiting
    queued = 0
    for config in configs:
        if config.key in skip:
            continue
        skip.add(config.key)
        study.enqueue_trial(search_space.params(config))  # duplicates were left out above: no per-trial lookup
        queued += 1
    return queued


__all__ = ["SweepDecision", "decide", "distance_to_default", "queue_sweep", "sweep_order", "valid_up_to"]
