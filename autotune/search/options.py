"""What a search is asked (SearchOptions) and what it answers (SearchResult, or SearchInterrupted on Ctrl-C).

Shared by the loop (loop.py), the worker processes (distributed.py), campaigns and the sampler comparison, so
none of them needs another's internals to describe a search.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from space import Arch, Config, Shape

from ..build.spill_policy import SpillPolicy
from ..measure.child_process import DEFAULT_EVALUATOR
from .coordination import DEFAULT_GRACE, DEFAULT_HEARTBEAT
from .retime import DEFAULT_CAP, DEFAULT_ROUNDS, DEFAULT_WITHIN, pick

DEFAULT_TRIALS = 60          # ≈ 15-20 minutes on one H200 with 16 build cores; TPE settles after ~40
DEFAULT_EVAL_TIMEOUT = 120.0  # seconds per evaluation (correctness check + timing), worker start excluded
ASKS_PER_TRIAL = 30           # the ask cap: 30 asks per wanted trial (d128 has ~1 valid config in 13) + 200
TOP_N = 5
WAIT_SECONDS = 0.5            # shared storages: how often a worker with nothing to do looks at the others again


@dataclass
class SearchOptions:
    shape: Shape
    trials: int = DEFAULT_TRIALS
    timeout: float | None = None           # wall seconds for the trial loop (the finale comes on top)
    sampler: str = "tpe"
    seed: int | None = 0
    storage: str | None = None
    study_name: str | None = None
    arch: str | None = None                # default: the evaluator's GPU
    families: tuple[str, ...] | None = None
    spill_policy: SpillPolicy = field(default_factory=SpillPolicy)
    jobs: int | None = None                # parallel nvcc processes (default: CPU count)
    ahead: int | None = None               # configs per batch (default: jobs, at least 2)
    eval_timeout: float = DEFAULT_EVAL_TIMEOUT
    evaluator: str = DEFAULT_EVALUATOR
    cache_dir: str | None = None
    retime_top: int = 5                    # finalists re-timed at the end, at least (retime.py)
    retime_within: float = DEFAULT_WITHIN  # ... and every trial within this fraction of the best trial's figure
    retime_cap: int = DEFAULT_CAP          # ... up to this many finalists (or retime_top, if more)
    retime_rounds: int = DEFAULT_ROUNDS    # interleaved rounds every finalist gets
    retime_max_rounds: int | None = None   # the round budget for the leader's contenders (None: retime.py's default)
    enqueue: tuple[Config, ...] = ()       # configs to try first (the heuristic default always is)
    max_asks: int | None = None
    sweep: bool = True                     # sweep every valid config when they fit in --trials (exhaustive.py)
    nvcc_flags: tuple[str, ...] = ()       # extra nvcc flags (experiments, tests); part of the build cache key
    workers: int = 1                       # worker processes on this host (distributed.py); > 1 needs a server storage
    gpus: tuple[str, ...] | None = None    # CUDA_VISIBLE_DEVICES values for the workers (default: every visible GPU)
    heartbeat: int = DEFAULT_HEARTBEAT     # shared storages: seconds between heartbeats of the trials in flight
    grace: int = DEFAULT_GRACE             # shared storages: seconds without a heartbeat before a trial is dead
    warm_start: int = 0                    # a fresh study first tries up to N best configs of tuned neighbour shapes
    replay: object = None                  # a landscape file (or Landscape): no nvcc, no GPU, see landscapes/replay.py
    replay_noise: int | None = None        # with replay: seed of the noise drawn from its sessions (replay_noise.py)

    def check(self) -> None:
        if self.trials < 1:  # 0 would run a search that can only end with nothing found
            raise ValueError(f"--trials: expected a count ≥ 1, got {self.trials}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"--timeout: expected seconds > 0, got {self.timeout}")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"--jobs: expected a count ≥ 1, got {self.jobs}")
        if self.ahead is not None and self.ahead < 1:
            raise ValueError(f"--ahead: expected a count ≥ 1, got {self.ahead}")
        if self.eval_timeout <= 0:
            raise ValueError(f"--eval-timeout: expected seconds > 0, got {self.eval_timeout}")
        if self.retime_top < 1:
            raise ValueError(f"--retime: expected a count ≥ 1, got {self.retime_top}")
        if not 0 <= self.retime_within < 1:
            raise ValueError(f"--retime-within: expected a fraction from 0 to 1 (0.03 = 3 %), got {self.retime_within}")
        if self.retime_cap < 1:
            raise ValueError(f"--retime-cap: expected a count ≥ 1, got {self.retime_cap}")
        if self.retime_rounds < 1:
            raise ValueError(f"--retime-rounds: expected a count ≥ 1, got {self.retime_rounds}")
        if self.retime_max_rounds is not None and self.retime_max_rounds < self.retime_rounds:
            raise ValueError(f"--retime-max-rounds: expected at least --retime-rounds ({self.retime_rounds}), got "
                             f"{self.retime_max_rounds}")
        if self.max_asks is not None and self.max_asks < 1:
            raise ValueError(f"max_asks: expected a count ≥ 1, got {self.max_asks}")
        if self.workers < 1:
            raise ValueError(f"--workers: expected a count ≥ 1, got {self.workers}")
        if self.heartbeat < 1 or self.grace <= self.heartbeat:
            raise ValueError(f"--heartbeat {self.heartbeat} / --grace {self.grace}: expected whole seconds with "
                             "1 ≤ heartbeat < grace (a grace of 3-6 heartbeats rides out a busy host)")
        if self.replay_noise is not None and self.replay is None:
            raise ValueError("--replay-noise: only with --replay (it draws from a recorded landscape's sessions)")
        if self.warm_start < 0:
            raise ValueError(f"--warm-start: expected a count ≥ 0, got {self.warm_start}")


@dataclass
class SearchResult:
    study_name: str
    storage: str
    gpu_name: str
    arch: Arch
    shape: Shape
    target: int
    evaluated: int                          # distinct configs built in the study, after this run
    this_run: Counter                       # statuses of trials told in this run
    counts: Counter                         # statuses of every finished trial of the study
    asks: int                               # trials stored this run (queued configs, and proposals worth building)
    stop_reason: str
    top: list = field(default_factory=list)  # FrozenTrials, best first (up to 5)
    retimed: list = field(default_factory=list)
    record: object | None = None            # best_table.RecordResult
    baselines: dict = field(default_factory=dict)
    idle_seconds: float = 0.0               # GPU idle while the compiler had its next work
    idle_other_seconds: float = 0.0         # GPU idle otherwise (asking, telling, worker start)
    first_eval_after: float | None = None   # seconds until the first evaluation started
    build_seconds: float = 0.0
    eval_seconds: float = 0.0
    ask_seconds: float = 0.0                # in asks: the sampler's proposals and storing the trials
    tell_seconds: float = 0.0               # telling outcomes (stored study and the sampler's shadow)
    loop_seconds: float = 0.0               # wall time of the trial loop (the pipeline)
    proposals: int = 0                      # the sampler's proposals this run (proposals.py), queued configs included
    proposals_invalid: int = 0              # of them, invalid configs told to the sampler only
    proposals_repeated: int = 0             # of them, configs judged or in flight already, told to the sampler only
    batch_sizes: list[int] = field(default_factory=list)  # configs per batch handed to the builder (pipeline.py)
    in_flight_at_ask: list[int] = field(default_factory=list)  # configs asked and not yet judged, at each ask
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False               # Ctrl-C: in-flight trials failed, no re-timing, nothing stored
    workers: list[str] = field(default_factory=list)  # --workers: one line per worker process
    replay: str | None = None               # --replay: the landscape answered instead of nvcc and a GPU
    simulated: str | None = None            # --replay with paced builds/evaluations: what the pacing was

    @property
    def best(self):
        return pick(self.retimed)


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the search cleanly: the trials in flight are failed as 'interrupted', the storage is
    consistent, and `result` holds the summary so far (nothing was re-timed or stored). Still a
    KeyboardInterrupt, so a library caller that does not look for it stops as it would on any Ctrl-C."""

    def __init__(self, result: "SearchResult"):
        super().__init__(result.stop_reason)
        self.result = result


__all__ = ["ASKS_PER_TRIAL", "DEFAULT_EVAL_TIMEOUT", "DEFAULT_TRIALS", "SearchInterrupted", "SearchOptions",
           "SearchResult", "TOP_N", "WAIT_SECONDS"]
