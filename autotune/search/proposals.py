"""Proposals: the sampler works in an in-memory shadow study, so that only configs worth building are stored.

The sampler proposes from the product of per-axis domains, where 8-13 % of the points are valid, and it proposes
known configs again (the incumbent, most of all). Asked in the stored study, every such proposal was a stored
trial with a dozen commits, and its verdict (invalid, or a copy of an earlier result) was stored too. Here:

    shadow.ask ──▶ config ──invalid──▶ told to the shadow (PRUNED, constraint), asked again
                     │    ──judged───▶ told to the shadow (a copy of the earlier result), asked again
                     │    ──in flight▶ told to the shadow with that trial, when it is told
                     ▼
                 a new valid config: the caller stores one trial with its params (storage_writes.create_trial)

The shadow is told exactly what the stored study used to be told, so the sampler learns the same things (where
configs are invalid, what the known ones scored); the stored study holds only configs that are built, plus the
queued ones (enqueued, retried) it already held. Finished trials the shadow did not see being told — a resumed
study, other processes' results on a shared storage — are copied into it (`mirror`).

The start counts built configs, not asks (sampling.BuiltStartup, fed by `built`).
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Mapping

import optuna
from optuna.trial import TrialState

import space
from space import Config, Problem

from . import verdicts as trial_mod
from .sampling import SearchSpace
from .verdicts import Outcome


# Proposals per call: a TPE proposal takes milliseconds to tens of them (it grows with the trials), and the
# pipeline notices a finished evaluation or build only between calls, so a long run of invalid and repeated
# proposals would hold the GPU idle unseen.
PER_CALL = 4


class Proposer:
    """Asks the sampler in the shadow study until it names a new valid config (or the proposal cap is met)."""

    def __init__(self, make_sampler: Callable[[Callable[[], int]], object], search_space: SearchSpace,
                 problem: Problem, max_proposals: int):
        """`make_sampler(built)`: the shadow's sampler, given the count of built configs for its start."""
        self.space, self.problem = search_space, problem
        self.max_proposals = max_proposals
        self.built_configs: set[str] = set()  # configs told with a build verdict (what the start counts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature notes of the sampler
            self.shadow = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize",
                                              sampler=make_sampler(self.built))
        self.proposals = 0   # every ask of the sampler
        self.invalid = 0     # of them, invalid configs
        self.repeated = 0    # of them, configs judged or in flight already
        self.exhausted = False
        self.mirrored: set[int] = set()  # stored trial numbers the shadow already knows

    def built(self) -> int:
        return len(self.built_configs)

    def can_propose(self) -> bool:
        return not self.exhausted and self.proposals < self.max_proposals

    # -- proposing ----------------------------------------------------------------------------------------------

    def propose(self, judged: Mapping[str, object], in_flight: Mapping[str, object], tries: int = PER_CALL):
        """(shadow trial, config) of a config neither judged (`judged`: config key → Judged) nor `in_flight`
        (config key → anything with a `shadow_followers` list); None after `tries` proposals without one (the
        caller may look at its builds and evaluation, then ask again), or once the cap is met or the space
        exhausted."""
        for _ in range(tries):
            if not self.can_propose():
                break
            s = self.shadow.ask()
            self.proposals += 1
            config = self.space.suggest(s)
            violations = space.violations(config, self.problem, self.space.arch)
            if violations:
                self.invalid += 1
                self.tell(s, trial_mod.invalid(config, self.problem, violations), config)
                continue
            earlier = judged.get(config.key)
            if earlier is not None:
                self.repeated += 1
                self.tell(s, trial_mod.reused(earlier.outcome, trial_mod.DUPLICATE_OF, earlier.number, config,
                                              self.problem), config)
                continue
            pending = in_flight.get(config.key)
            if pending is not None:  # told with that trial's result, when it comes
                self.repeated += 1
                pending.shadow_followers.append(s)
                continue
            return s, config
        return None

    def follow(self, params: Mapping) -> object:
        """The shadow's twin of a trial the stored study asked from its queue (params fixed there)."""
        self.shadow.enqueue_trial(dict(params))
        s = self.shadow.ask()
        self.space.suggest(s)
        return s

    # -- telling ------------------------------------------------------------------------------------------------

    def tell(self, s, outcome: Outcome, config: Config) -> None:
        if outcome.status != "invalid" and trial_mod.DUPLICATE_OF not in outcome.attrs:
            self.built_configs.add(config.key)
        if trial_mod.tell(self.shadow, s, outcome):
            self.exhausted = True  # BruteForceSampler: every point of the product proposed

    def abandon(self, s) -> None:
        trial_mod.abandon(self.shadow, s, "cancelled: the stored trial was abandoned")

    def mirror(self, trials: Iterable) -> None:
        """Copy finished stored trials the shadow has not seen (resume; other processes on a shared storage)."""
        for t in trials:
            if t.number in self.mirrored or t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                continue
            self.mirrored.add(t.number)
            outcome = trial_mod.from_trial(t)
            if outcome is None or not t.distributions:
                continue
            if outcome.status != "invalid" and trial_mod.DUPLICATE_OF not in t.user_attrs:
                self.built_configs.add(outcome.attrs.get("config_key"))
            self.shadow.add_trial(optuna.trial.create_trial(
                state=t.state, value=t.value if t.state == TrialState.COMPLETE else None, params=t.params,
                distributions=t.distributions, user_attrs=t.user_attrs, system_attrs=t.system_attrs))

    def summary(self) -> str:
        return (f"{self.proposals} proposals in memory ({self.invalid} invalid, {self.repeated} repeated: told to "
                "the sampler only)")


__all__ = ["PER_CALL", "Proposer"]
