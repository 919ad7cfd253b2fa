"""The end of a search: re-time the top configs in one evaluator session, keep the best median, store it.

Trial times come from many moments of a long run (clocks, temperature, other tenants); the winner is decided
by timing the few best back to back in one worker process, next to the SDPA baselines measured there too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from space import Arch, Config, Shape

from ..measure.child_process import EvalOutcome
from ..store.best_table import BestEntry


@dataclass(frozen=True)
class Retimed:
    number: int               # the trial that found this config
    config: Config
    outcome: EvalOutcome      # the re-timing
    trial_tflops: float       # what the trial measured

    def as_attr(self) -> dict:
        o = self.outcome
        return {"trial": self.number, "config_key": self.config.key, "status": o.status, "tflops": o.tflops,
                "time_ms": o.time_ms, "time_spread_ms": o.spread_ms, "trial_tflops": self.trial_tflops,
                "reason": o.reason}


def retime_and_baselines(top: list, builder, evaluator, shape: Shape,
                         log: Callable[[str], None] = print) -> tuple[list[Retimed], dict, list[str]]:
    """Re-time `top` (FrozenTrials, best first) and measure the SDPA baselines in the same worker session."""
    notes: list[str] = []
    configs = []
    for t in top:
        try:
            configs.append((t, Config.from_key(t.user_attrs["config_key"])))
        except (KeyError, ValueError) as e:
            notes.append(f"trial #{t.number}: cannot re-time, its config is no longer in the space ({e})")
    retimed: list[Retimed] = []
    if configs:
        log(f"re-timing the top {len(configs)} config(s) in one evaluator session...")
        builds = builder.build([(c, shape.problem) for _, c in configs])  # cache hits, unless the sources changed
        for (t, config), build in zip(configs, builds):
            if not build.ok:
                outcome = EvalOutcome("crashed", f"rebuild failed: {build.error}")
            else:
                outcome = evaluator.evaluate(build, shape)
            retimed.append(Retimed(t.number, config, outcome, float(t.value)))
            if outcome.status != "complete":
                notes.append(f"trial #{t.number} failed its re-timing ({outcome.status}: {outcome.reason}); "
                             "it is not a candidate")
    try:
        baselines = evaluator.baselines(shape)
    except Exception as e:  # the table still prints; the baselines are context, not the result
        baselines = {}
        notes.append(f"SDPA baselines could not be measured: {e}")
    return retimed, baselines, notes


def pick(retimed: list[Retimed]) -> Retimed | None:
    """The re-timed config with the best median (highest TFLOPS for the same shape)."""
    done = [r for r in retimed if r.outcome.status == "complete" and r.outcome.tflops]
    return max(done, key=lambda r: r.outcome.tflops) if done else None


def store_best(store, best: Retimed, shape: Shape, gpu_name: str, arch: Arch, study_name: str, prov: dict):

    entry = BestEntry.for_shape(
        shape, gpu_name, arch.name, best.config, best.outcome.tflops, time_ms=best.outcome.time_ms,
        spread_ms=best.outcome.spread_ms, study=study_name, trial=best.number,
        kernel_source_hash=prov.get("kernel_source_hash"), nvcc_version=prov.get("nvcc_version"),
    )
    return store.record_best(entry)


__all__ = ["Retimed", "pick", "retime_and_baselines", "store_best"]
