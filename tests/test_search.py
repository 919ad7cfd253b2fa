"""The whole trial pipeline on CPU: the build layer is real (nvcc compiles real configs of the real kernel), the
GPU step is tests/search_doubles.py running in the worker's child process.

Distinct builds are kept to six (DEFAULT, A, A_Q, B, C, E below) in the session's shared kernel cache, so the
module costs a few compiles on a cold cache and none on a warm one. Studies are pre-created with enqueued
trials, so each test decides exactly which configs the sampler proposes.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest

import space
import search_doubles
from autotune.search import verdicts as trial_mod
from autotune.build.builder import Builder, sources_digest
from autotune.search.sampling import SearchSpace, make_sampler
from autotune.search.loop import SearchOptions, run_search
from autotune.store.best_table import BestStore
from autotune.search.progress import format_result
from autotune.build.spill_policy import SpillPolicy

ARCH = space.get_arch("sm_80")
SHAPE = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=128)
PROBLEM = SHAPE.problem
A = space.Config.from_key("mma_sync:br=64,bc=32,warps_m=4,warps_n=1,p_path=regs,smem_mode=dynamic,"
                          "kv_buffering=shared,loader_warps=0,min_blocks=1,q_in_regs=0")
B = A.replace(smem_mode="static")
E = A.replace(kv_buffering="separate")
A_Q = A.replace(q_in_regs=True)  # same launch geometry as A
# __launch_bounds__(128, 4) caps registers at 128; this kernel needs ~185 without the cap: it must spill.
C = A.replace(bc=64, min_blocks=4)
INVALID = A.replace(warps_m=8)   # rows_per_warp: 64 rows cannot feed 8 warps of 16
DEFAULT = space.default_config(PROBLEM, ARCH)


def test_the_chosen_configs_are_what_the_tests_assume():
    for c in (A, B, E, A_Q, C, DEFAULT):
        assert space.is_valid(c, PROBLEM, ARCH), c.key
    assert [v.rule for v in space.violations(INVALID, PROBLEM, ARCH)] == ["rows_per_warp"]
    f = search_doubles.fake_tflops
    assert f(E) > f(A) > f(B)  # the resume and store tests rely on this order
    assert space.layout(A, PROBLEM) == space.layout(A_Q, PROBLEM)


class SpyBuilder:
    """The real Builder, recording every batch it is asked to build; `alias` makes one config's result carry
    another's cubin hash (to exercise 'identical cubins are timed once' without hunting for real twins)."""

    def __init__(self, cache_dir, alias: dict | None = None):
        self.real = Builder(ARCH, cache_dir=cache_dir, jobs=2)
        self.calls: list[list[str]] = []
        self.alias = alias or {}

    def __getattr__(self, name):  # kernels_dir, nvcc_version, jobs
        return getattr(self.real, name)

    def build(self, items, progress=None):
        self.calls.append([c.key for c, _ in items])
        results = self.real.build(items)
        by_key = {r.config.key: r for r in results}
        out = []
        for r in results:
            twin = self.alias.get(r.config.key)
            if twin is not None:
                source = by_key.get(twin) or self.real.build_one(space.Config.from_key(twin), r.problem)
                r = dataclasses.replace(r, cubin_hash=source.cubin_hash)
            out.append(r)
        return out

    @property
    def built(self) -> set[str]:
        return {k for call in self.calls for k in call}


@pytest.fixture
def spy(build_cache_dir):
    return SpyBuilder(build_cache_dir)


@pytest.fixture
def double(tmp_path, monkeypatch):
    """The double's call log and behaviour plan, through the environment the child inherits."""
    d = search_doubles.Control(tmp_path)
    for name, value in d.env().items():
        monkeypatch.setenv(name, value)
    return d


def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


def enqueue(url: str, name: str, configs) -> None:
    """Create (or load) the study and queue these configs as the next trials, in order."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=url, direction="maximize", load_if_exists=True)
    ss = SearchSpace(PROBLEM, ARCH)
    for c in configs:
        study.enqueue_trial(ss.params(c))


def search(tmp_path, spy, name="t", **kw):
    lines: list[str] = []
    opts = dict(shape=SHAPE, trials=3, storage=storage(tmp_path), study_name=name, arch="sm_80",
                evaluator="search_doubles:evaluate", sampler="random", seed=0, eval_timeout=60)
    opts.update(kw)
    result = run_search(SearchOptions(**opts), builder=spy, log=lines.append)
    return result, lines


def load(tmp_path, name="t"):
    import optuna

    return optuna.load_study(study_name=name, storage=storage(tmp_path))


def by_config(study) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in study.trials:
        out.setdefault(t.user_attrs.get("config_key"), []).append(t)
    return out


# ---- the pipeline -------------------------------------------------------------------------------------------

def test_trial_pipeline_with_real_builds(tmp_path, spy, double):
    from optuna.trial import TrialState

    enqueue(storage(tmp_path), "t", [INVALID, A, C, A, B])
    result, lines = search(tmp_path, spy, trials=3, retime_top=3)
    study = load(tmp_path)
    trials = by_config(study)

    # invalid: recorded with the rule that rejected it, never handed to the builder
    (bad,) = trials[INVALID.key]
    assert bad.state == TrialState.PRUNED and bad.user_attrs["status"] == "invalid"
    assert bad.user_attrs["reason"] == "rows_per_warp"
    assert bad.user_attrs["constraint"][0] > 0
    # what samplers read: Trial.set_constraint on Optuna ≥ 5, constraints_func's system attr before
    sampler_view = bad.constraints.values() if hasattr(bad, "constraints") else bad.system_attrs["constraints"]
    assert list(sampler_view) and all(v > 0 for v in sampler_view)
    assert INVALID.key not in spy.built
    assert spy.built == {A.key, C.key, B.key}

    # spilled under prune: pruned with the figures, never evaluated
    (spilled,) = trials[C.key]
    assert spilled.state == TrialState.PRUNED and spilled.user_attrs["status"] == "spilled"
    assert spilled.user_attrs["spill_stores"] > 0 and "spill" in spilled.user_attrs["reason"]
    assert C.key not in double.evaluated()

    # complete: the value is the evaluator's TFLOPS, and the contract's attrs are there
    first_a, repeat_a = sorted(trials[A.key], key=lambda t: t.number)
    assert first_a.state == TrialState.COMPLETE and first_a.value == search_doubles.fake_tflops(A)
    attrs = first_a.user_attrs
    for key in trial_mod.USER_ATTRS:
        if key != "reason":
            assert attrs.get(key) is not None, key
    assert attrs["spill_stores"] == 0 and attrs["status"] == "complete" and len(attrs["cubin_hash"]) == 64
    assert attrs["threads"] == space.layout(A, PROBLEM).threads and attrs["blocks_per_sm"] == 1
    assert first_a.params == SearchSpace(PROBLEM, ARCH).params(A)

    # the repeated ask reused the result instead of building or running again
    assert repeat_a.state == TrialState.COMPLETE and repeat_a.value == first_a.value
    assert repeat_a.user_attrs["duplicate_of"] == first_a.number
    assert sum(1 for call in spy.calls[:-1] for k in call if k == A.key) == 1  # the last call is the re-timing
    evaluated = double.evaluated()
    rounds = SearchOptions(shape=SHAPE).retime_rounds
    assert evaluated.count(A.key) == 1 + rounds and evaluated.count(B.key) == 1 + rounds  # a trial + the re-timing's rounds

    # counts, budget and stop
    assert result.evaluated == 3 and result.stop_reason == "reached 3 evaluated trials"
    assert dict(result.counts) == {"invalid": 1, "complete": 2, "spilled": 1, "repeated": 1}
    assert not [t for t in study.trials if not t.state.is_finished()]

    # the winner went to the store with its provenance
    with BestStore(storage(tmp_path)) as store:
        row = store.lookup(search_doubles.GPU_NAME, "sm_80", SHAPE)
    assert row.config_key == A.key and row.tflops == pytest.approx(search_doubles.fake_tflops(A))
    assert (row.study, row.trial) == ("t", first_a.number)
    # sm_80 searches the mma_sync family alone: the hash covers the files it compiles from
    assert row.kernel_source_hash == sources_digest(spy.kernels_dir, ["sm80/flash_fwd.cu"])
    assert row.nvcc_version == spy.nvcc_version
    assert row.time_ms == pytest.approx(SHAPE.flops / (row.tflops * 1e12) * 1e3)
    assert result.record.action == "inserted"

    # study attrs for the report
    ua = study.user_attrs
    assert ua["shape"] == dataclasses.asdict(SHAPE) and ua["arch"] == "sm_80"
    assert ua["gpu_name"] == search_doubles.GPU_NAME and ua["nvcc_version"] == spy.nvcc_version
    assert ua["kernel_source_hash"] == row.kernel_source_hash
    assert ua["baselines"] == {"sdpa_flash": pytest.approx(150.0), "sdpa_cudnn": pytest.approx(200.0),
                               "sdpa_efficient": pytest.approx(90.0)}
    assert [r["trial"] for r in ua["retimed"]][0] == first_a.number
    assert [(r["chosen"], len(r["rounds_tflops"])) for r in ua["retimed"]] == [(True, rounds), (False, rounds)]

    # what the user sees
    assert any(line.startswith("[1/3]") for line in lines) and any(line.startswith("[3/3]") for line in lines)
    assert any("best " in line and A.key in line for line in lines)
    text = format_result(result)
    for needle in ("pruned for register spills: 1", "GPU idle waiting for builds", "sdpa_flash", "sdpa_cudnn",
                   "stored: inserted", A.key, "re-timed in one session", f"re-timed {rounds} round(s), interleaved"):
        assert needle in text, needle


def test_spill_policy_allow_evaluates_a_spilling_build(tmp_path, spy, double):
    enqueue(storage(tmp_path), "t", [C])
    result, _ = search(tmp_path, spy, trials=1, spill_policy=SpillPolicy.parse("allow"))
    (t,) = load(tmp_path).trials
    assert t.user_attrs["status"] == "complete" and t.user_attrs["spill_stores"] > 0
    assert t.value == search_doubles.fake_tflops(C)
    assert C.key in double.evaluated() and result.best.config == C


def test_spill_policy_parsing_and_thresholds():
    from autotune.build.ptxas import BuildReport

    report = BuildReport(registers=128, spill_stores=176, spill_loads=276, stack_bytes=160, smem_static=0,
                         compile_seconds=1.0)
    clean = dataclasses.replace(report, spill_stores=0, spill_loads=0)
    assert SpillPolicy.parse("prune").prunes(report) and not SpillPolicy.parse("prune").prunes(clean)
    assert not SpillPolicy.parse("allow").prunes(report)
    assert not SpillPolicy.parse("max-bytes=452").prunes(report)          # 176 + 276 = 452 allowed
    assert "452 B" in SpillPolicy.parse("max-bytes=451").prunes(report)
    assert str(SpillPolicy.parse(" MAX-BYTES=64 ")) == "max-bytes=64"
    for bad in ("", "drop", "max-bytes=", "max-bytes=-1", "max-bytes=1k"):
        with pytest.raises(ValueError, match="--spill-policy"):
            SpillPolicy.parse(bad)


def test_crash_and_hang_are_one_failed_trial_each_and_the_study_goes_on(tmp_path, spy, double):
    from optuna.trial import TrialState

    double.plan({A: "crash", B: "hang"})
    enqueue(storage(tmp_path), "t", [A, B, E])
    result, lines = search(tmp_path, spy, trials=3, eval_timeout=4, retime_top=1)
    trials = by_config(load(tmp_path))
    (crashed,), (hung,), (ok,) = trials[A.key], trials[B.key], trials[E.key]
    assert crashed.state == TrialState.PRUNED and crashed.user_attrs["status"] == "crashed"
    assert "exit code 139" in crashed.user_attrs["reason"]
    assert hung.state == TrialState.PRUNED and hung.user_attrs["status"] == "timeout"
    assert "--eval-timeout" in hung.user_attrs["reason"]
    assert crashed.user_attrs["constraint"][0] > 0 and hung.user_attrs["constraint"][0] > 0
    assert ok.state == TrialState.COMPLETE and ok.value == search_doubles.fake_tflops(E)
    pids = {c["config_key"]: c["pid"] for c in double.calls()}
    assert len({pids[A.key], pids[B.key], pids[E.key]}) == 3  # a fresh worker after each failure
    assert result.evaluated == 3 and result.best.config == E
    assert any("crashed" in line for line in lines) and any("timeout" in line for line in lines)


def test_a_second_run_resumes_without_repeating_work(tmp_path, spy, double):
    url = storage(tmp_path)
    enqueue(url, "t", [A])
    first, _ = search(tmp_path, spy, trials=1, retime_top=1)
    assert first.evaluated == 1 and first.record.action == "inserted"
    numbers_before = {t.number for t in load(tmp_path).trials}

    enqueue(url, "t", [A, E])  # the sampler proposes A again, then something new
    spy.calls.clear()
    mark = double.mark()
    second, lines = search(tmp_path, spy, trials=2, retime_top=1)
    study = load(tmp_path)
    assert second.evaluated == 2 and second.stop_reason == "reached 2 evaluated trials"
    assert any("1 of 2 trials already evaluated" in line for line in lines)
    assert spy.built == {E.key}                                   # A was neither rebuilt...
    assert [c["config_key"] for c in double.calls()[mark:]] == [E.key] * 4  # ...nor re-run (trial + 3 re-timings)
    new = [t for t in study.trials if t.number not in numbers_before]
    assert min(t.number for t in new) > max(numbers_before)
    (again,) = [t for t in new if t.user_attrs["config_key"] == A.key]
    assert again.user_attrs["duplicate_of"] in numbers_before
    assert second.record.action == "replaced" and second.record.previous.config_key == A.key
    with BestStore(url) as store:
        assert store.lookup(search_doubles.GPU_NAME, "sm_80", SHAPE).config_key == E.key
        assert [r["config_key"] for r in store.replaced_rows()] == [A.key]  # the old best is kept aside

    third, _ = search(tmp_path, spy, trials=2, retime_top=1)   # the same command once more: nothing to do
    assert third.evaluated == 2 and third.this_run.total() == 0 and len(load(tmp_path).trials) == len(study.trials)


def test_identical_cubins_are_timed_once(tmp_path, build_cache_dir, double):
    spy = SpyBuilder(build_cache_dir, alias={A_Q.key: A.key})
    enqueue(storage(tmp_path), "t", [A, A_Q])
    result, lines = search(tmp_path, spy, trials=2, retime_top=1)
    trials = by_config(load(tmp_path))
    (first,), (twin,) = trials[A.key], trials[A_Q.key]
    assert twin.user_attrs["same_cubin_as"] == first.number and twin.value == first.value
    assert twin.user_attrs["status"] == "complete"
    assert A_Q.key not in double.evaluated()
    assert result.evaluated == 2  # it was built: it counts toward --trials
    assert any("same cubin as" in line for line in lines)


def test_invalid_asks_do_not_use_the_budget_and_the_ask_cap_ends_the_search(tmp_path, spy, double):
    invalid = [INVALID, A.replace(warps_m=8, bc=64), A.replace(br=256, min_blocks=4), A.replace(warps_n=4)]
    assert all(space.violations(c, PROBLEM, ARCH) for c in invalid)
    enqueue(storage(tmp_path), "t", invalid)
    result, _ = search(tmp_path, spy, trials=5, max_asks=4)
    assert spy.calls == [] and double.evaluated() == []   # nothing reached nvcc, nothing ran
    # queued configs count as proposals: the cap (max_asks) bounds them with the sampler's
    assert result.asks == 4 and result.evaluated == 0 and "after 4 proposals" in result.stop_reason
    assert dict(result.counts) == {"invalid": 4}
    assert result.best is None and result.record is None
    assert "nothing stored" in format_result(result)


def test_timeout_stops_starting_trials_and_leaves_none_running(tmp_path, spy, double):
    double.plan({A: "hang"})
    enqueue(storage(tmp_path), "t", [A, B, E])
    result, _ = search(tmp_path, spy, trials=3, timeout=1.0, eval_timeout=4, ahead=2)
    study = load(tmp_path)
    assert "--timeout" in result.stop_reason
    assert not [t for t in study.trials if not t.state.is_finished()]
    a = by_config(study)[A.key][0]
    assert a.user_attrs["status"] == "timeout"  # the running evaluation finished (by its own timeout)
    cancelled = [t for t in study.trials if t.state.name == "FAIL"]
    assert cancelled and all("cancelled" in t.user_attrs["reason"] for t in cancelled)
    assert result.evaluated == 1                 # cancelled trials do not count, and may be proposed again


def test_an_interrupt_fails_the_trials_in_flight(tmp_path, double):
    class Interrupting:
        jobs = 2
        kernels_dir = None
        nvcc_version = "fake"

        def build(self, items, progress=None):
            raise KeyboardInterrupt

    enqueue(storage(tmp_path), "t", [A, B])
    with pytest.raises(KeyboardInterrupt):
        search(tmp_path, Interrupting(), trials=2)
    study = load(tmp_path)
    asked = [t for t in study.trials if t.state.name != "WAITING"]
    assert asked and all(t.state.name == "FAIL" and "interrupted" in t.user_attrs["reason"] for t in asked)


def test_a_study_of_another_shape_is_refused(tmp_path, spy, double):
    from autotune.search.study import StudyMismatchError

    enqueue(storage(tmp_path), "t", [INVALID])
    search(tmp_path, spy, trials=1, max_asks=1)
    with pytest.raises(StudyMismatchError, match="--study t"):
        search(tmp_path, spy, shape=dataclasses.replace(SHAPE, seqlen_q=512), trials=1, max_asks=1)


def test_a_study_recorded_before_causal_alignments_resumes_and_a_lower_right_one_is_another_shape():
    import optuna

    from autotune.search.study import StudyMismatchError, open_study

    storage = optuna.storages.InMemoryStorage()
    causal = space.Shape(batch=1, heads=2, seqlen_q=4, seqlen_k=256, head_dim=128, causal=True)
    old = {k: v for k, v in dataclasses.asdict(causal).items() if k != "causal_align"}  # what such a study holds
    optuna.create_study(study_name="old", storage=storage).set_user_attr("shape", old)
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = open_study("old", storage, sampler, causal, ARCH, "gpu", {}, log=lambda _: None)
    assert study.user_attrs["shape"]["causal_align"] == "upper_left"
    with pytest.raises(StudyMismatchError, match="--study old"):
        open_study("old", storage, sampler, dataclasses.replace(causal, causal_align="lower_right"), ARCH, "gpu", {},
                   log=lambda _: None)


# ---- sampling and telling --------------------------------------------------------------------------------------

def test_search_space_params_round_trip_and_domains():
    import optuna

    ss = SearchSpace(PROBLEM, ARCH)
    params = ss.params(A)
    assert params["family"] == "mma_sync" and params["br"] == 64
    assert ss.suggest(optuna.trial.FixedTrial(params)) == A
    assert ss.config_of(params) == A
    # values no valid config uses are not offered: head_dim 256 never fits br=256
    big = SearchSpace(space.Problem(256, "fp16", False), space.get_arch("sm_90"))
    assert 256 not in big.domains["mma_sync"]["br"] and 256 in ss.domains["mma_sync"]["br"]
    with pytest.raises(ValueError, match="outside the searched domain"):
        big.params(space.default_config(PROBLEM, ARCH).replace(br=256))
    with pytest.raises(ValueError, match="--family"):
        SearchSpace(PROBLEM, ARCH, families=("nope",))


def test_conditional_params_per_family(monkeypatch):
    """Two families: `family` first, then that family's axes; shared names with other domains get a prefix."""
    import optuna

    base = space.get_family("mma_sync")
    other = dataclasses.replace(base, name="other",
                                axes=tuple(dataclasses.replace(a, values=a.values[:2]) if a.name == "bc" else a
                                           for a in base.axes))
    monkeypatch.setitem(space.FAMILIES, "other", other)
    arch = dataclasses.replace(ARCH, families=("mma_sync", "other"))
    ss = SearchSpace(PROBLEM, arch)
    assert ss.families == ("mma_sync", "other")
    assert ss.param_name("mma_sync", "bc") == "mma_sync.bc" and ss.param_name("other", "bc") == "other.bc"
    assert ss.param_name("other", "br") == "br"
    study = optuna.create_study(sampler=make_sampler("tpe", 0), direction="maximize")
    seen = set()
    for _ in range(12):
        t = study.ask()
        config = ss.suggest(t)
        seen.add(config.family)
        assert set(t.params) == {"family", *(ss.param_name(config.family, a) for a in ss.domains[config.family])}
        study.tell(t, 1.0)
    assert seen == {"mma_sync", "other"}


def test_samplers():
    import optuna

    for name in ("tpe", "gp", "random", "brute"):
        assert isinstance(make_sampler(name, 1), optuna.samplers.BaseSampler)
    with pytest.raises(ValueError, match="--sampler"):
        make_sampler("annealing", 0)


def test_brute_force_exhaustion_is_reported_not_raised():
    import optuna

    study = optuna.create_study(sampler=make_sampler("brute", 0), direction="maximize")
    ended = []
    for _ in range(2):
        t = study.ask()
        t.suggest_categorical("x", [1, 2])
        outcome = trial_mod.Outcome("complete", "", {"tflops": 1.0, "config_key": "k"})
        ended.append(trial_mod.tell(study, t, outcome))
    assert ended == [False, True]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def test_trials_left_running_by_a_dead_run_are_failed_on_resume(tmp_path, spy, double):
    import optuna

    enqueue(storage(tmp_path), "t", [])
    orphan = load(tmp_path).ask()  # as if a run was killed between ask and tell
    enqueue(storage(tmp_path), "t", [INVALID])
    _, lines = search(tmp_path, spy, trials=1, max_asks=1)
    assert spy.calls == []
    after = load(tmp_path).trials[orphan.number]
    assert after.state == optuna.trial.TrialState.FAIL
    assert any("left running by an earlier run" in line for line in lines)


# ---- the scheduler on its own ---------------------------------------------------------------------------------

class FakeStages:
    """Stages with sleeps for compile and GPU time; records what happened when."""

    def __init__(self, n: int, build_s: float = 0.3, eval_s: float = 0.08, stop_after: int | None = None):
        self.n, self.asked, self.build_s, self.eval_s, self.stop_after = n, 0, build_s, eval_s, stop_after
        self.events: list[tuple] = []
        self.evaluating: tuple | None = None
        self.building = 0
        self.finished: list[int] = []

    def can_ask(self):
        return self.asked < self.n

    def ask(self):
        self.asked += 1
        self.events.append(("ask", self.asked, self.evaluating is not None))
        return self.asked if self.asked % 4 else None  # every 4th ask is settled on the spot (invalid, repeat)

    def build(self, items):
        self.building += 1
        self.events.append(("build", tuple(items), self.evaluating is not None))
        time.sleep(self.build_s)
        self.building -= 1
        return [f"cubin{i}" for i in items]

    def judge_built(self, item, built):
        assert built == f"cubin{item}"
        if item % 5 == 0:  # e.g. spilled: decided without the GPU
            self.finished.append(item)
            return True
        return False

    def start_eval(self, item, built):
        assert self.evaluating is None, "one evaluation at a time"
        self.evaluating = (item, time.monotonic())
        self.events.append(("eval", item, self.building > 0))

    def poll_eval(self, block_for):
        item, t0 = self.evaluating
        left = t0 + self.eval_s - time.monotonic()
        if left > 0:
            time.sleep(left if block_for is None else min(left, block_for))
        return "done" if time.monotonic() >= t0 + self.eval_s else None

    def finish_eval(self, item, built, result):
        assert result == "done" and self.evaluating[0] == item
        self.evaluating = None
        self.finished.append(item)

    def should_stop(self):
        return self.stop_after is not None and len(self.finished) >= self.stop_after


def test_pipeline_overlaps_asking_building_and_evaluating():
    from autotune.search.pipeline import Pipeline

    stages = FakeStages(24)
    pipeline = Pipeline(stages, batch_size=3)
    assert pipeline.run() == []
    expected = [i for i in range(1, 25) if i % 4]
    assert sorted(stages.finished) == expected                 # every item judged once
    evals = [e[1] for e in stages.events if e[0] == "eval"]
    assert evals == sorted(evals)                              # the GPU takes them in the order asked
    assert any(e[0] == "ask" and e[2] for e in stages.events)  # asking while the GPU works
    assert any(e[0] == "build" and e[2] for e in stages.events)  # compiling while the GPU works
    assert any(e[0] == "eval" and e[2] for e in stages.events)   # evaluating while the compiler works
    assert max(len(e[1]) for e in stages.events if e[0] == "build") == 3
    # the first build cannot overlap anything: the GPU waited for it, and that is charged to the builds
    assert pipeline.idle_for_builds >= stages.build_s * 0.9
    assert pipeline.evaluations == len([i for i in expected if i % 5])


def test_pipeline_lookahead_stays_bounded_when_builds_are_instant():
    """Cached builds take milliseconds: the pipeline must still not ask the whole budget ahead of the GPU (with
    several workers on one study, the first one would hold every trial and the others would sit idle)."""
    from autotune.search.pipeline import Pipeline

    class Counting(FakeStages):
        max_in_flight = 0

        def ask(self):
            item = super().ask()
            pending = len([i for i in range(1, self.asked + 1) if i % 4]) - len(self.finished)
            self.max_in_flight = max(self.max_in_flight, pending)
            return item

    stages = Counting(60, build_s=0.0, eval_s=0.03)
    assert Pipeline(stages, batch_size=2).run() == []
    assert sorted(stages.finished) == [i for i in range(1, 61) if i % 4]
    # evaluating + up to two batches built + one building + one being asked
    assert stages.max_in_flight <= 1 + 4 * 2, stages.max_in_flight


def test_pipeline_records_its_batches_and_what_was_in_flight_at_each_ask():
    # what the summary's "ahead of the GPU" line reports, and benchmarks/ahead_replay.py compares across --ahead
    from autotune.search.pipeline import Pipeline
    from autotune.search.progress import ahead_line

    class Counting(FakeStages):
        in_flight: list = []

        def ask(self):
            # asked and not judged yet: the asks that became items, less those finished
            self.in_flight.append(len([i for i in range(1, self.asked + 1) if i % 4]) - len(self.finished))
            return super().ask()

    stages = Counting(40, build_s=0.05, eval_s=0.02)
    pipeline = Pipeline(stages, batch_size=4)
    assert pipeline.run() == []
    assert sum(pipeline.batch_sizes) == len([i for i in range(1, 41) if i % 4]) and max(pipeline.batch_sizes) == 4
    assert pipeline.in_flight_at_ask == stages.in_flight and max(stages.in_flight) > 4
    assert ahead_line([1, 16, 2, 2, 2], [0, 1, 17, 3, 3, 2]) == (
        "ahead of the GPU: 5 batches of 1-16 configs (median 2); configs in flight at an ask: median 2.5, max 17")


def test_pipeline_stop_lets_the_running_evaluation_finish_and_returns_the_rest():
    from autotune.search.pipeline import Pipeline

    stages = FakeStages(40, build_s=0.05, stop_after=3)
    leftovers = Pipeline(stages, batch_size=4).run()
    assert stages.evaluating is None and len(stages.finished) >= 3
    assert leftovers and not set(leftovers) & set(stages.finished)
    assert len(stages.finished) + len(leftovers) == len([i for i in range(1, stages.asked + 1) if i % 4])


# ---- clean-up after an interrupt ------------------------------------------------------------------------------

def test_abandon_fails_the_trial_even_when_writing_the_reason_fails(tmp_path):
    import optuna

    from autotune.search import coordination as peers

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    study = optuna.create_study(storage=storage)
    t = study.ask()

    def broken(key, value):  # what the first write on a connection cut short by Ctrl-C does
        raise optuna.exceptions.StorageInternalError("connection in transaction status ACTIVE")

    t.set_user_attr = broken
    peers.reset_connections(storage)  # and the storage still works after its pool was dropped
    trial_mod.abandon(study, t, "interrupted")
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    trial_mod.abandon(study, t, "interrupted")  # a finished trial: nothing to do, no error


def test_a_second_ctrl_c_before_the_clean_up_does_not_skip_it():
    from autotune.search.loop import abandon_through_interrupts as _abandon_through_interrupts

    class Loop:
        def __init__(self):
            self.in_flight = {"a": 1, "b": 2}
            self.this_run = Counter()
            self.calls = 0

        def abandon(self, reason):
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt  # landed between the except clause and the critical section
            n = len(self.in_flight)
            self.in_flight.clear()
            self.this_run["cancelled"] += n
            if self.calls == 2:
                raise KeyboardInterrupt  # deferred inside the critical section, raised as it ends
            return n

    loop = Loop()
    assert _abandon_through_interrupts(loop, "interrupted") == 2
    assert loop.in_flight == {} and loop.calls == 2
