"""The Optuna side of the design space: which parameters a trial suggests, and the samplers.

Parameters (docs/CONTRACTS.md): `family`, then one categorical per axis of the chosen family. Axes are
conditional on the family (suggested only after it is chosen), so samplers that understand tree-structured
spaces (TPE with group=True, BruteForce) see the structure. Two families that share an axis name with different
domains would clash in Optuna's distribution check, so only then the name becomes `<family>.<axis>`.

Each axis offers the values that appear in at least one valid config of this problem and arch: this never
hides a valid config, and it spares the sampler whole slices that can only fail (for head_dim 256 that removes
two thirds of the cross product). The domains are a pure function of (problem, arch, families), so a resumed
study sees the same distributions.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Mapping, Sequence

import optuna

import space
from space import Arch, Config, Problem

SAMPLERS = ("tpe", "gp", "random", "brute")
FAMILY_PARAM = "family"


class SearchSpace:
    def __init__(self, problem: Problem, arch: Arch, families: Sequence[str] | None = None,
                 within: Sequence[Config] | None = None):
        """`within`: when given, each axis offers only the values these configs use (a replay searches what its
        landscape recorded: landscapes recorded before an axis existed hold only its default value)."""
        available = tuple(f for f in arch.families if f in space.FAMILIES)
        if families:
            unknown = [f for f in families if f not in available]
            if unknown:
                raise ValueError(f"--family: {unknown} not available on {arch.name}; expected some of {list(available)}")
            available = tuple(f for f in available if f in families)
        if not available:
            raise ValueError(f"--arch: no implemented kernel family runs on {arch.name}")
        self.problem, self.arch = problem, arch
        self.domains: dict[str, dict[str, tuple]] = {}
        for family in available:
            domains = _valid_domains(family, problem, arch)
            if domains is not None and within is not None:
                domains = _restricted(domains, [c for c in within if c.family == family])
            if domains is not None:
                self.domains[family] = domains
        if not self.domains:
            raise ValueError(f"no valid config of {list(available)} exists for {problem.key} on {arch.name}")
        self.families = tuple(self.domains)
        self._names = self._param_names()

    def _param_names(self) -> dict[tuple[str, str], str]:
        seen: dict[str, set[tuple]] = {}
        for family, axes in self.domains.items():
            for axis, domain in axes.items():
                seen.setdefault(axis, set()).add(domain)
        return {(family, axis): axis if len(seen[axis]) == 1 else f"{family}.{axis}"
                for family, axes in self.domains.items() for axis in axes}

    def param_name(self, family: str, axis: str) -> str:
        return self._names[(family, axis)]

    def suggest(self, trial) -> Config:
        """Ask the trial for a family and then its axes; the resulting Config may still be invalid."""
        family = trial.suggest_categorical(FAMILY_PARAM, list(self.families))
        values = {axis: trial.suggest_categorical(self.param_name(family, axis), list(domain))
                  for axis, domain in self.domains[family].items()}
        return Config.make(family, **values)

    def params(self, config: Config) -> dict[str, Any]:
        """The trial params that make `suggest` return `config` (for study.enqueue_trial)."""
        if config.family not in self.domains:
            raise ValueError(f"config {config.key}: family {config.family!r} is not searched here "
                             f"(families: {list(self.families)})")
        out: dict[str, Any] = {FAMILY_PARAM: config.family}
        for axis, value in config.values:
            if value not in self.domains[config.family][axis]:
                raise ValueError(f"config {config.key}: {axis}={value!r} is outside the searched domain "
                                 f"{list(self.domains[config.family][axis])} (no valid config uses it)")
            out[self.param_name(config.family, axis)] = value
        return out

    def config_of(self, params: Mapping[str, Any]) -> Config | None:
        """The Config of a finished trial's params (None when they do not name one of ours)."""
        family = params.get(FAMILY_PARAM)
        if family not in self.domains:
            return None
        try:
            return Config.make(family, **{a: params[self.param_name(family, a)] for a in self.domains[family]})
        except (KeyError, ValueError):
            return None

    @property
    def size(self) -> int:
        """Points in the sampled product (valid or not)."""
        import math

        return sum(math.prod(len(d) for d in axes.values()) for axes in self.domains.values())


@functools.lru_cache(maxsize=64)
def _valid_domains(family: str, problem: Problem, arch: Arch) -> dict[str, tuple] | None:
    """Per axis, the values used by at least one valid config (None: no valid config at all). Cached: it walks
    every valid config (thousands), and the answer depends on nothing else."""
    axes = space.get_family(family).axes
    used: dict[str, set] = {a.name: set() for a in axes}
    for config in space.valid_configs(problem, arch, (family,)):  # the family's fast path where it has one
        for name, value in config.values:
            used[name].add(value)
    if not used[axes[0].name]:
        return None
    return {a.name: tuple(v for v in a.values if v in used[a.name]) for a in axes}


def _restricted(domains: dict[str, tuple], configs: Sequence[Config]) -> dict[str, tuple] | None:
    """The domains cut down to the values `configs` use (None: no config of this family among them)."""
    if not configs:
        return None
    used: dict[str, set] = {axis: set() for axis in domains}
    for config in configs:
        for name, value in config.values:
            used[name].add(value)
    return {axis: tuple(v for v in domain if v in used[axis]) for axis, domain in domains.items()}


def set_constraint_supported() -> bool:
    """Optuna ≥ 5 reads per-trial constraints set with Trial.set_constraint; older ones need constraints_func."""
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def constraints_from_user_attr(trial) -> Sequence[float]:
    """constraints_func for Optuna < 5: the `constraint` user attr the search writes on every finished trial."""
    return tuple(trial.user_attrs.get("constraint", (0.0,)))


STARTUP_TRIALS = 10  # TPE's and GP's random start: this many configs built (not asks: invalid ones do not count)


def make_sampler(name: str, seed: int | None, built: Callable[[], int] | None = None):
    """A fresh sampler; `seed` makes runs repeatable. Errors name --sampler.

    `built`: how many configs the search has built so far (proposals.Proposer.built). With it, TPE's and GP's
    random start lasts until STARTUP_TRIALS configs are built, however many invalid or repeated proposals it
    takes (BuiltStartup); without it, the start counts every finished trial, as Optuna does."""
    import optuna

    constraints: dict[str, Callable] = {}
    if not set_constraint_supported():
        constraints = {"constraints_func": constraints_from_user_attr}
    startup = {} if built is None else {"n_startup_trials": 0}
    with warnings.catch_warnings():
        # multivariate/group are marked experimental; they are the right tools for a conditional space
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            # constant_liar: batches are asked before earlier ones are told, so running trials count as bad
            # guesses instead of being proposed again by every ask of the batch.
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                                 **constraints, **startup)
            return sampler if built is None else BuiltStartup(sampler, built, seed)
        if name == "gp":
            try:
                sampler_cls = optuna.samplers.GPSampler
                sampler = sampler_cls(seed=seed, warn_independent_sampling=False, **constraints, **startup)
                import optuna._gp.gp  # noqa: F401  (its torch/scipy needs fail here, not at the first ask)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"--sampler gp: Optuna's GPSampler is unavailable here ({e}); it needs torch and "
                                 "scipy (`pip install torch scipy`), or pick --sampler tpe") from None
            return sampler if built is None else BuiltStartup(sampler, built, seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "brute":
            return optuna.samplers.BruteForceSampler(seed=seed)
    raise ValueError(f"--sampler: expected one of {list(SAMPLERS)}, got {name!r}")


# Whether the search's TPE/GP start counts built configs (BuiltStartup) or finished trials (Optuna's own). Measured
# on the two N4096 landscapes, 20 seeds, lag 16 (docs/search.md): counting built configs needed 31.5 and 36.5
# trials to 98 % of the optimum, Optuna's start 22.5 and 24. The invalid trials in Optuna's start are what
# teaches TPE where the valid configs are; a start of valid random configs taught it less.
START_COUNTS_BUILT = False


def shadow_sampler(name: str, seed: int | None, built: Callable[[], int]):
    """The sampler the search asks (in the shadow study, proposals.py): make_sampler's, with the start
    START_COUNTS_BUILT says."""
    return make_sampler(name, seed, built if START_COUNTS_BUILT else None)


class BuiltStartup(optuna.samplers.BaseSampler):
    """Random proposals until `built()` reaches `startup` configs, then `inner` (whose own start is 0).

    Optuna's start counts finished trials, so on a space where 1 config in 8-13 is valid TPE's 10 random
    trials were mostly invalid ones and its model began from one or two real measurements."""

    def __init__(self, inner, built: Callable[[], int], seed: int | None, startup: int = STARTUP_TRIALS):
        self.inner, self.built, self.startup = inner, built, startup
        self.random = optuna.samplers.RandomSampler(seed=seed)

    def _now(self):
        return self.random if self.built() < self.startup else self.inner

    def infer_relative_search_space(self, study, trial):
        return self._now().infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._now().sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._now().sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self.random.reseed_rng()


class NoSampler(optuna.samplers.BaseSampler):
    """The stored study's sampler: it never proposes. Proposals come from the in-memory shadow study
    (proposals.py) and reach the stored study with their params; only queued trials (enqueued configs, retries)
    are asked there, and their params are fixed. Asked for anything else, it raises rather than guess."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        raise RuntimeError(f"NoSampler: trial #{trial.number} asked for {param_name!r}; the stored study takes "
                           "its proposals from the shadow study (search/proposals.py), never from its own sampler")


__all__ = ["BuiltStartup", "FAMILY_PARAM", "NoSampler", "SAMPLERS", "START_COUNTS_BUILT", "STARTUP_TRIALS",
           "SearchSpace", "constraints_from_user_attr", "make_sampler", "set_constraint_supported", "shadow_sampler"]
