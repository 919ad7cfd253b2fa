"""Keep the GPU busy: asking, building and evaluating overlap.

Three stages run at once:

    ask      (caller's thread: Optuna)       fills the next batch, one ask at a time
    build    (one background thread)         compiles a whole batch in parallel (the Builder's ninja)
    evaluate (the worker's child process)    one config at a time, started and polled without blocking

While the GPU evaluates batch n, batch n+1 compiles and batch n+2 is being asked. Nothing more is asked while a
whole batch is built and waiting for the GPU, so however fast the builds are (cached ones take milliseconds), a
process holds at most about four batches in flight: it never takes a study's whole budget for itself while other
workers on the study sit idle. The caller's thread never blocks while there is something useful to do: between
asks it checks whether the evaluation or the build finished. It blocks only when there is nothing left to ask: on
the evaluation if one runs, else on the build.

Only the build runs in a thread; Optuna (ask/tell) and the evaluator are used from the caller's thread only,
so the sampler and the storage are never touched concurrently.

Accounting: every moment with no evaluation in flight is GPU idle time; it is charged to "waiting for builds"
when a build was running and nothing built was waiting, otherwise to "other" (asking, telling, start-up).
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

POLL_SECONDS = 0.002  # how long a non-blocking check of the evaluation may wait


class BuildAhead:
    """One batch at a time, built in a background thread."""

    def __init__(self, build: Callable[[list], list]):
        self._build = build
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autotune-build-ahead")
        self._future: Future | None = None
        self.build_seconds = 0.0  # wall time of the builds themselves
        self.batches = 0

    @property
    def pending(self) -> bool:
        return self._future is not None

    def done(self) -> bool:
        return self._future is not None and self._future.done()

    def submit(self, items: Sequence) -> None:
        if self._future is not None:
            raise RuntimeError("BuildAhead.submit: the previous batch was not collected")
        items = list(items)

        def run() -> tuple[list, float]:
            t0 = time.monotonic()
            out = self._build(items) if items else []
            if len(out) != len(items):
                raise RuntimeError(f"build returned {len(out)} results for {len(items)} items")
            return out, time.monotonic() - t0

        self._future = self._pool.submit(run)

    def collect(self) -> list:
        """The submitted batch's results, in order (blocks until built); re-raises what the build raised."""
        if self._future is None:
            raise RuntimeError("BuildAhead.collect: nothing was submitted")
        future, self._future = self._future, None
        results, seconds = future.result()
        self.build_seconds += seconds
        self.batches += 1
        return results

    def close(self) -> None:
        """Wait for a build still running (its results land in the cache for next time); stop the thread."""
        self._future = None
        self._pool.shutdown(wait=True)


class Stages(Protocol):
    """What the pipeline drives; loop.TrialLoop implements it over Optuna, the Builder and the Evaluator."""

    def can_ask(self) -> bool: ...                 # budget, ask cap and time allow another ask
    def ask(self) -> Any | None: ...              # one new item to build, or None (decided without building)
    def build(self, items: list) -> list: ...     # runs in the build thread
    def judge_built(self, item, built) -> bool: ...  # True: decided from the build alone (already told)
    def start_eval(self, item, built) -> None: ...
    def poll_eval(self, block_for: float | None) -> Any | None: ...  # the result, or None while running
    def finish_eval(self, item, built, result) -> None: ...
    def should_stop(self) -> bool: ...             # stop evaluating (e.g. --timeout); leftovers are returned
    # Optional: nothing left here, but other processes on the same study may still hand work back (a shared
    # storage). True: it waited a little, look again; False (or absent): the run is over.
    def wait_for_others(self) -> bool: ...


class Pipeline:
    def __init__(self, stages: Stages, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size: expected a count ≥ 1, got {batch_size}")
        self.stages = stages
        self.batch_size = batch_size
        self.batch_sizes: list[int] = []       # configs in each batch handed to the builder
        self.in_flight_at_ask: list[int] = []  # configs asked and not yet judged, at each ask (the sampler's lag)
        self.idle_for_builds = 0.0   # GPU idle while the compiler had the next work
        self.idle_other = 0.0        # GPU idle for any other reason (asking, telling, start-up)
        self.first_eval_after = None  # seconds from start to the first evaluation
        self.build_seconds = 0.0
        self.evaluations = 0
        self.seconds = 0.0           # wall time of run()

    def run(self) -> list:
        """Drive the stages until nothing is left to ask, build or evaluate; returns items never judged
        (when should_stop() cut the run short) for the caller to abandon."""
        st = self.stages
        builds = BuildAhead(st.build)
        asking: list = []           # asked, not yet handed to the builder
        building: list = []         # in the builder
        ready: deque = deque()      # (item, built) waiting for the GPU
        evaluating = None           # (item, built) on the GPU
        stopping = False
        started = last = time.monotonic()
        idle_cause = None           # why the GPU was idle during the previous step (None: it was busy)

        def collect() -> None:
            ready.extend(zip(building, builds.collect()))
            building.clear()

        def finish(result) -> None:
            nonlocal evaluating
            st.finish_eval(*evaluating, result)
            evaluating = None

        try:
            while True:
                now = time.monotonic()
                if idle_cause == "builds":
                    self.idle_for_builds += now - last
                elif idle_cause == "other":
                    self.idle_other += now - last
                last = now

                if building and builds.done():
                    collect()
                if evaluating is not None:
                    result = st.poll_eval(0 if stopping else POLL_SECONDS)
                    if result is not None:
                        finish(result)
                if not stopping and st.should_stop():
                    stopping = True
                if stopping:
                    if evaluating is None:
                        break
                    finish(st.poll_eval(None))  # let the running evaluation finish (bounded by its timeout)
                    break

                # Ask only while the GPU has less than a batch built and waiting: with fast (cached) builds an
                # unbounded lookahead would take the whole budget in flight at once, leaving nothing for other
                # workers on the study and nothing for the sampler to learn from until it is all timed.
                more_asks = len(ready) < self.batch_size and st.can_ask()
                gpu_starving = evaluating is None and not ready
                if not building and asking and (len(asking) >= self.batch_size or not more_asks or gpu_starving):
                    builds.submit(asking)
                    self.batch_sizes.append(len(asking))
                    building, asking = asking, []
                while evaluating is None and ready:
                    item, built = ready.popleft()
                    if not st.judge_built(item, built):
                        st.start_eval(item, built)
                        evaluating = (item, built)
                        self.evaluations += 1
                        if self.first_eval_after is None:
                            self.first_eval_after = time.monotonic() - started

                if evaluating is None:
                    idle_cause = "builds" if building and not ready else "other"
                else:
                    idle_cause = None

                if more_asks and len(asking) < self.batch_size:
                    self.in_flight_at_ask.append(len(asking) + len(building) + len(ready) + (evaluating is not None))
                    item = st.ask()
                    if item is not None:
                        asking.append(item)
                    continue
                if evaluating is not None:
                    result = st.poll_eval(None if not building else 0.05)
                    if result is not None:
                        finish(result)
                    continue
                if building:
                    collect()  # nothing else to do: wait for the compiler
                    continue
                if not asking and not ready:
                    wait = getattr(st, "wait_for_others", None)
                    if wait is not None and wait():
                        continue
                    break  # nothing asked, built, or running, and nothing more to ask
        finally:
            builds.close()
            self.build_seconds = builds.build_seconds
            self.seconds = time.monotonic() - started
        leftovers = asking + building + [item for item, _ in ready]
        return leftovers


__all__ = ["BuildAhead", "Pipeline", "Stages"]
