"""Faults a careless user meets: each protection of the search, tested so that the test fails when that
protection is switched off, driven by events (the double's gates, heartbeats counted as they happen, processes
waited for) rather than by sleeps and luck.

    protection                                  test
    claims / "config already running elsewhere" test_a_config_running_in_another_process_is_deferred_not_timed_again
    running configs count against the budget    test_configs_running_elsewhere_count_against_the_budget
    periodic heartbeats                         test_periodic_heartbeats_keep_a_live_trial_from_being_failed
    stale-trial retry                           test_a_silent_process_trial_is_failed_and_requeued_once
    a measurement outlives a kill in its tell   test_a_retry_killed_while_being_told_is_retold_from_its_measurement,
                                                test_a_silent_process_measured_trial_is_retold_elsewhere_and_keeps_its_claim
    a config killing its process is given up    test_a_config_whose_process_dies_while_evaluating_it_twice_is_given_up,
                                                test_deaths_before_evaluation_requeue_without_counting_and_are_bounded
    late tell                                   test_distributed.py: test_a_result_told_after_another_process_...
    SQLite: one search process per study        test_a_second_search_on_a_sqlite_study_is_refused_until_the_first_dies,
                                                test_one_sqlite_study_reached_through_a_hard_link_is_still_one_search,
                                                test_two_searches_on_one_sqlite_study_time_nothing_twice
    transient storage errors retried            test_a_database_restart_mid_search_is_ridden_out,
                                                test_a_workers_trial_refresh_rides_out_a_database_restart,
                                                test_every_database_operation_of_the_storage_is_retried,
                                                test_a_tell_committed_just_before_its_connection_broke_is_not_told_twice
    FAIL trials labelled by how they failed     test_a_trial_killed_while_being_told_counts_as_died
    SIGTERM handled like Ctrl-C, bounded        test_sigterm_fails_the_trials_in_flight_and_exits_within_the_grace_period,
                                                test_sigterm_ends_a_stuck_clean_up_when_the_grace_period_runs_out,
                                                test_sigterm_to_a_workers_launcher_alone_stops_every_worker_cleanly
    --replay under --workers                    test_replay_with_workers_from_two_launchers_on_one_study

Plus what had no test: COMPLETE trials compared before and after a SIGKILL, separate launchers on one study (the
several-hosts case).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

import search_doubles
from autotune.search import coordination
from autotune.search import verdicts as trial_mod
from autotune.search.loop import run_search
from pg_server import pg_server, postgres_url  # noqa: F401  (pytest fixtures)
from test_distributed import TESTS, cli, double, enqueue, load, no_trial_lost, options  # noqa: F401  (fixture)
from test_search import A, A_Q, ARCH, B, E, PROBLEM, SHAPE

def _env() -> dict:
    """This process's environment now (the double's fixture set its variables), for the search processes."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1"}


def timed_twice(double, study, workers: bool = False) -> dict:
    """Configs the double evaluated more than once for trials: the final re-timing of the winners aside (a single
    search: the study's `retimed`; under --workers: only the workers' evaluations count)."""
    if workers:
        runs = Counter(c["config_key"] for c in double.calls() if c["worker"] is not None)
    else:
        runs = Counter(double.evaluated())
        for r in study.user_attrs.get("retimed", []):
            runs[r["config_key"]] -= len(r.get("rounds_tflops") or [None])  # one evaluation per round
    return {k: n for k, n in runs.items() if n > 1}


def originals(study) -> Counter:
    """Config → trials that judged it themselves (not reusing another's result, not a late re-record)."""
    return Counter(t.user_attrs["config_key"] for t in study.trials
                   if t.state.name in ("COMPLETE", "PRUNED") and t.user_attrs.get("status") not in (None, "invalid")
                   and trial_mod.DUPLICATE_OF not in t.user_attrs and trial_mod.SAME_CUBIN_AS not in t.user_attrs)


def wait_until(predicate, timeout: float, what: str, proc=None):
    """Poll `predicate` until it holds (its value is returned); fail after `timeout` s or when `proc` ended."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the search ended (exit {proc.returncode}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


# ---- SQLite: one search process per study (item 2) ---------------------------------------------------------

HOLD = """
import sys
from autotune.search.coordination import StudyLock
lock = StudyLock(sys.argv[1], sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_search_on_a_sqlite_study_is_refused_until_the_first_dies(tmp_path, build_cache_dir, double):
    url = f"sqlite:///{tmp_path / 's.db'}"
    enqueue(url, [A])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url, "d"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(coordination.StudyBusyError, match="PostgreSQL") as refused:
            run_search(options(url, build_cache_dir, trials=1))
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "--storage postgresql://" in message and "\n" not in message
        assert double.calls() == []  # refused before any trial was touched
        os.kill(holder.pid, signal.SIGKILL)  # the holder dies: the kernel drops its lock
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert run_search(options(url, build_cache_dir, trials=1)).evaluated == 1


def test_one_sqlite_study_reached_through_a_hard_link_is_still_one_search(tmp_path, build_cache_dir, double):
    # The same file under two names in two directories: the lock is the file's (st_dev, st_ino), not its path's.
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "s.db", tmp_path / "b" / "linked.db"
    enqueue(f"sqlite:///{first}", [A])
    os.link(first, second)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, f"sqlite:///{first}", "d"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(coordination.StudyBusyError, match=f"pid {holder.pid}"):
            run_search(options(f"sqlite:///{second}", build_cache_dir, trials=1))
        assert double.calls() == []  # refused before any trial was touched
    finally:
        holder.kill()
        holder.wait(30)
    assert run_search(options(f"sqlite:///{second}", build_cache_dir, trials=1)).evaluated == 1


def test_two_searches_on_one_sqlite_study_time_nothing_twice(tmp_path, build_cache_dir, double):
    url = f"sqlite:///{tmp_path / 's.db'}"
    double.plan({A: "gate"})
    args = cli(url, build_cache_dir, "--trials", "3", *[x for c in (A, B, E) for x in ("--enqueue", c.key)])
    first = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        double.wait_for(lambda c: c["config_key"] == A.key)  # the first search is timing A, its trial RUNNING
        second = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=180)
        double.open_gate(A)
        out, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stdout + second.stderr
    assert "being searched by another process" in second.stderr and "postgresql://" in second.stderr, second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert first.returncode == 0, out
    study = load(url)
    no_trial_lost(study, out)
    assert timed_twice(double, study) == {} and max(originals(study).values()) == 1
    a = [t for t in study.trials if t.user_attrs.get("config_key") == A.key]
    assert [t.state.name for t in a] == ["COMPLETE"]  # the first search's A was not failed as a dead run's


# ---- a SIGKILL loses nothing finished -----------------------------------------------------------------------

def _snapshot(study) -> dict:
    return {t.number: (t.params, t.value, dict(t.user_attrs)) for t in study.trials if t.state.name == "COMPLETE"}


def test_complete_trials_are_the_same_before_and_after_a_sigkill(tmp_path, build_cache_dir, double):
    url = f"sqlite:///{tmp_path / 's.db'}"
    double.plan({E: "gate"})
    # the budget leaves room for E's retry (the fresh study's heuristic default is queued first, and C spills)
    args = cli(url, build_cache_dir, "--trials", "6", *[x for c in (A, B, E, A_Q) for x in ("--enqueue", c.key)])
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        double.wait_for(lambda c: c["config_key"] == E.key)  # A and B told, E in flight
        before = _snapshot(load(url))
        os.killpg(proc.pid, signal.SIGKILL)  # the search and its evaluation child, at once
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert before, "nothing was finished before the kill"
    double.plan({})
    again = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    study = load(url)
    no_trial_lost(study, again.stdout)
    after = _snapshot(study)
    assert {n: after.get(n) for n in before} == before  # every finished trial kept, unchanged
    killed = [t for t in study.trials if t.state.name == "FAIL" and t.user_attrs.get("config_key") is None
              and search_doubles_config(t) == E]
    assert len(killed) == 1 and "died" in killed[0].user_attrs["reason"]
    assert any(t.user_attrs.get("config_key") == E.key and t.state.name == "COMPLETE" for t in study.trials), \
        [(t.number, t.state.name, t.user_attrs.get("config_key"), t.system_attrs) for t in study.trials]
    assert timed_twice(double, study) == {E.key: 2} or timed_twice(double, study) == {}  # E's killed try, redone


def search_doubles_config(t):
    from autotune.search.sampling import SearchSpace

    return SearchSpace(PROBLEM, ARCH).config_of(t.params)


# ---- several processes, in one test process: claims, budget, heartbeats, stale retry ------------------------

def _view(url: str, heartbeat: int = 1, grace: int = 2, target: int = 5):
    """One search process's view of study "d" (its own storage, coordination and trial loop), no build or GPU."""
    import optuna

    from autotune.build.spill_policy import SpillPolicy
    from autotune.search.loop import TrialLoop
    from autotune.search.progress import ProgressPrinter
    from autotune.search.sampling import SearchSpace
    from autotune.search.study import StudyMemory, quiet_optuna

    quiet_optuna()
    rdb = coordination.make_storage(url, heartbeat, grace)
    study = optuna.load_study(study_name="d", storage=rdb)
    peers = coordination.Shared(rdb, url, log=lambda line: None)
    ss, memory = SearchSpace(PROBLEM, ARCH), StudyMemory()
    peers.start(study, memory, ss)
    return TrialLoop(study, ss, None, None, SHAPE, SpillPolicy(), memory, ProgressPrinter(target, log=lambda x: None),
                     target, 50, None, coordination=peers)


def test_a_config_running_in_another_process_is_deferred_not_timed_again(postgres_url):
    enqueue(postgres_url, [A, A])
    here, there = _view(postgres_url), _view(postgres_url)
    try:
        mine = here.ask()
        assert mine is not None and mine.config == A  # claimed here, being built and timed
        assert there.ask() is None                    # the other process pops the same config: it must not time it
        deferred = load(postgres_url).trials[1]
        assert deferred.state.name == "FAIL" and deferred.user_attrs[trial_mod.RUNNING_IN] == mine.trial.number
        assert there.this_run["deferred"] == 1 and not there.in_flight
    finally:
        here.abandon("interrupted: test over")
        here.peers.close(), there.peers.close()


def test_configs_running_elsewhere_count_against_the_budget(postgres_url):
    enqueue(postgres_url, [A])
    here, there = _view(postgres_url, target=1), _view(postgres_url, target=1)
    try:
        assert here.ask() is not None
        there.peers.refresh(force=True)
        assert there.peers.running_elsewhere == 1
        assert not there.can_ask()  # the one config the budget allows is running elsewhere
    finally:
        here.abandon("interrupted: test over")
        here.peers.close(), there.peers.close()


def _count_beats(loop):
    """Count the heartbeats `loop`'s process records, as they happen."""
    beats = []
    cond = threading.Condition()
    real = loop.peers.rdb.record_heartbeat

    def record(trial_id):
        real(trial_id)
        with cond:
            beats.append(time.monotonic())
            cond.notify_all()
    loop.peers.rdb.record_heartbeat = record  # the Heartbeat thread calls it through the storage object
    return beats, cond


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_periodic_heartbeats_keep_a_live_trial_from_being_failed(postgres_url):
    import optuna

    enqueue(postgres_url, [A])
    grace = 2
    here, there = _view(postgres_url, heartbeat=1, grace=grace), _view(postgres_url, heartbeat=1, grace=grace)
    beats, cond = _count_beats(here)
    try:
        held_at = time.monotonic()
        pending = here.ask()  # one beat now, then one a second from the heartbeat thread
        # Wait for beats recorded after the grace period has passed since the ask: only periodic ones can be.
        with cond:
            assert cond.wait_for(lambda: beats and beats[-1] > held_at + grace + 0.5, timeout=30), \
                f"no heartbeat after the first: {len(beats)} recorded"
        optuna.storages.fail_stale_trials(there.study)  # another process's stale-trial check
        assert load(postgres_url).trials[pending.trial.number].state.name == "RUNNING"
    finally:
        here.abandon("interrupted: test over")
        here.peers.close(), there.peers.close()


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_silent_process_trial_is_failed_and_requeued_once(postgres_url):
    import optuna

    enqueue(postgres_url, [A])
    here, there = _view(postgres_url, heartbeat=1, grace=1), _view(postgres_url, heartbeat=1, grace=1)
    pending = here.ask()
    here.peers.heart.close()  # this process goes silent (as if killed): no more heartbeats, nothing told
    try:
        def failed():
            optuna.storages.fail_stale_trials(there.study)
            return load(postgres_url).trials[pending.trial.number].state.name == "FAIL"
        wait_until(failed, 60, "stale trial failed by the other process")
        retries = [t for t in load(postgres_url).trials if t.system_attrs.get("failed_trial") == pending.trial.number]
        assert len(retries) == 1 and retries[0].state.name == "WAITING" and retries[0].params == pending.trial.params
        assert there.ask() is not None  # the retry's config is taken over from the dead owner and timed here
    finally:
        there.abandon("interrupted: test over")
        here.peers.close(), there.peers.close()


# ---- how a dead trial is judged: by how far it got (deaths.py) ----------------------------------------------

def _harness(when: str, victim: str, log, url: str, landscape, trials: int = 3) -> subprocess.CompletedProcess:
    """One replayed search that SIGKILLs itself at `when` of `victim`'s trial (tests/kill_harness.py). Two
    complete configs are queued (after a fresh study's heuristic default), so that the budget is met without
    many random asks (most of them invalid: slow on a loaded machine, and nothing to do with deaths)."""
    from landscape_fixtures import SMALL_SHAPE, fake_tflops, prefill_slice

    import space

    fillers = sorted(prefill_slice(space.valid_configs(SMALL_SHAPE.problem, space.get_arch("sm_90"), ("wgmma",))),
                     key=fake_tflops)
    enqueue = [x for c in fillers[-2:] for x in ("--enqueue", c.key)]  # the best two: complete in small_landscape
    args = [sys.executable, str(TESTS / "kill_harness.py"), when, victim, str(log), "--", "--replay", str(landscape),
            "--storage", url, "--study", "k", "--trials", str(trials), "--sampler", "random", "--seed", "0",
            "--retime", "1", *enqueue]
    return subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=180)


def _killed(run: subprocess.CompletedProcess) -> None:
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr


def test_a_retry_killed_while_being_told_is_retold_from_its_measurement(tmp_path):
    """A trial killed while evaluating is re-queued; its retry, killed in the middle of its tell, still had its
    measurement stored: the next run re-tells it (COMPLETE, the recorded value) without measuring a third time."""
    from landscape_fixtures import small_landscape

    from autotune.landscapes import landscape_file

    path = small_landscape().save(tmp_path / "small.json")
    recorded = landscape_file.load(path)
    url, log = f"sqlite:///{tmp_path / 'k.db'}", tmp_path / "evaluated.txt"
    _killed(_harness("evaluating", "first", log, url, path))
    victim = log.read_text().split()[0]
    assert recorded.rows[victim].status == "complete", victim
    _killed(_harness("telling", victim, log, url, path))  # the retry: measured, killed while being told
    assert log.read_text().split().count(victim) == 2
    last = _harness("never", "-", log, url, path)
    assert last.returncode == 0, last.stdout + last.stderr
    study = load(url, "k")
    no_trial_lost(study, last.stdout)
    done = [t for t in study.trials if t.user_attrs.get("config_key") == victim and t.state.name == "COMPLETE"]
    assert [t.value for t in done] == [recorded.rows[victim].tflops], last.stdout
    assert log.read_text().split().count(victim) == 2  # re-told, not measured again
    assert "re-told as trial" in last.stdout, last.stdout


def test_a_config_whose_process_dies_while_evaluating_it_twice_is_given_up(tmp_path):
    from landscape_fixtures import ARCH as SM90, SMALL_SHAPE, small_landscape

    from autotune.search import deaths
    from autotune.search.sampling import SearchSpace

    path = small_landscape().save(tmp_path / "small.json")
    url, log = f"sqlite:///{tmp_path / 'k.db'}", tmp_path / "evaluated.txt"
    _killed(_harness("evaluating", "first", log, url, path))
    victim = log.read_text().split()[0]
    _killed(_harness("evaluating", victim, log, url, path))  # its retry kills the process again
    last = _harness("never", "-", log, url, path)
    assert last.returncode == 0, last.stdout + last.stderr
    study = load(url, "k")
    no_trial_lost(study, last.stdout)
    ss = SearchSpace(SMALL_SHAPE.problem, SM90, ("wgmma",))
    dead = [t for t in study.trials if t.state.name == "FAIL" and t.params and ss.config_of(t.params).key == victim]
    assert len(dead) == 2, [(t.number, t.state.name, t.user_attrs) for t in dead]
    assert dead[1].system_attrs["failed_trial"] == dead[0].number  # the first death was re-queued ...
    retries = [t.number for t in study.trials if t.system_attrs.get("failed_trial") == dead[0].number]
    assert retries == [dead[1].number], last.stdout  # ... the second was not: no third try forced on the search
    assert deaths.fate(dead[1]) == "give up" and "given up" in last.stdout


def test_deaths_before_evaluation_requeue_without_counting_and_are_bounded(tmp_path):
    import optuna

    from autotune.search import deaths

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'd.db'}", direction="maximize")
    notes: list[str] = []

    def dies(t, evaluating: bool = False) -> str:
        if evaluating:
            deaths.mark_evaluating(study, t)
        study.tell(t, state=optuna.trial.TrialState.FAIL)  # as the heartbeat check or the next SQLite run does
        return deaths.after_death(study, study._storage.get_trial(t._trial_id), notes.append)

    def asked(x: int):
        t = study.ask()
        assert t.suggest_categorical("x", [1, 2, 3]) == x
        return t

    study.enqueue_trial({"x": 1})
    t = asked(1)
    for _ in range(deaths.MAX_DEATHS - 1):  # killed while asked or built: nothing against the config
        assert dies(t) == "requeue"
        t = asked(1)  # the retry comes back first
    assert dies(t) == "give up" and "died 4 times" in notes[-1]

    study.enqueue_trial({"x": 2})
    t = asked(2)
    assert dies(t, evaluating=True) == "requeue"
    t = asked(2)
    assert dies(t) == "requeue"  # a death before the evaluation does not count toward giving up ...
    t = asked(2)
    assert dies(t, evaluating=True) == "give up"  # ... a second one while evaluating does
    assert "while evaluating it twice" in notes[-1]

    study.enqueue_trial({"x": 3})
    t = asked(3)
    deaths.store_measurement(study, t, trial_mod.Outcome("complete", "", {"tflops": 5.0, "config_key": "x3",
                                                                          "status": "complete"}))
    assert dies(t, evaluating=True) == "retell"
    retold = study.trials[-1]
    assert (retold.state.name, retold.value, retold.params) == ("COMPLETE", 5.0, {"x": 3})
    assert retold.user_attrs[trial_mod.RETOLD_FOR] == t.number
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING))


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_silent_process_measured_trial_is_retold_elsewhere_and_keeps_its_claim(postgres_url):
    """Shared storage: the process died in the middle of telling A. Whoever fails its trial re-tells A's stored
    measurement, and A's claim moves to the re-told trial: a process that asks A again reuses it, never times it."""
    import optuna

    from autotune.search import deaths

    enqueue(postgres_url, [A])
    here, there = _view(postgres_url, heartbeat=1, grace=1), _view(postgres_url, heartbeat=1, grace=1)
    pending = here.ask()
    outcome = trial_mod.Outcome("complete", "", {"tflops": 42.0, "config_key": A.key, "status": "complete"})
    deaths.store_measurement(here.study, pending.trial, outcome)
    pending.trial.set_user_attr("config_key", A.key)  # killed here, half-way through the tell
    here.peers.heart.close()
    try:
        def failed():
            optuna.storages.fail_stale_trials(there.study)
            return load(postgres_url).trials[pending.trial.number].state.name == "FAIL"
        wait_until(failed, 60, "stale trial failed by the other process")
        retold = [t for t in load(postgres_url).trials if t.user_attrs.get(trial_mod.RETOLD_FOR) == pending.trial.number]
        assert [(t.state.name, t.value) for t in retold] == [("COMPLETE", 42.0)]
        assert not any(t.system_attrs.get("failed_trial") == pending.trial.number for t in load(postgres_url).trials)
        enqueue(postgres_url, [A])
        assert there.ask() is None  # A asked again: its result reused, not claimed from the dead trial and timed
        repeat = load(postgres_url).trials[-1]
        assert repeat.user_attrs.get(trial_mod.DUPLICATE_OF) == retold[0].number, repeat.user_attrs
    finally:
        there.abandon("interrupted: test over")
        here.peers.close(), there.peers.close()


# ---- transient storage errors (item 3) -----------------------------------------------------------------------

def test_a_database_restart_mid_search_is_ridden_out(pg_server, postgres_url, build_cache_dir, double, tmp_path):
    double.plan({A: "gate"})
    # --grace 60: the server is down for a few seconds, and this search's own heartbeats with it
    args = cli(postgres_url, build_cache_dir, "--trials", "3", *[x for c in (A, B, E) for x in ("--enqueue", c.key)],
               "--grace", "60")
    log = tmp_path / "search.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        double.wait_for(lambda c: c["config_key"] == A.key)  # A is being timed; its trial RUNNING
        pg_server.pause()                                    # pg_ctl -m fast: every connection terminated
        try:
            double.open_gate(A)                              # A's result arrives while the server is down
            # the search's own thread met the outage (the heartbeat thread's would not tell us the tell did)
            wait_until(lambda: any("unreachable" in line and "in record_heartbeat" not in line
                                   for line in log.read_text().splitlines()), 120, "retry note", proc)
        finally:
            pg_server.resume()
        proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "the storage is back after" in text, text
    study = load(postgres_url)
    no_trial_lost(study, text)
    a = [t for t in study.trials if t.user_attrs.get("config_key") == A.key and t.state.name == "COMPLETE"]
    assert len(a) == 1 and a[0].value == search_doubles.fake_tflops(A), text  # told once, not re-recorded late
    assert timed_twice(double, study) == {}


def test_a_workers_trial_refresh_rides_out_a_database_restart(pg_server, postgres_url, monkeypatch):
    """A worker's refresh reads the study's trials through Optuna's cached storage, whose private `_get_trials`
    the retry once did not cover: a restart there killed both workers of a --workers search. The server is
    stopped exactly when the refresh reaches that read, and started again once the retry says it is waiting."""
    from optuna.storages import RDBStorage

    enqueue(postgres_url, [A])
    here = _view(postgres_url, heartbeat=1, grace=60)
    waiting = threading.Event()
    here.peers.rdb.log = lambda line: waiting.set() if "unreachable" in line else None
    read_trials = RDBStorage._get_trials
    stopped = []

    def stop_the_server_first(self, *args, **kwargs):
        if not stopped:
            stopped.append(1)
            pg_server.pause()  # pg_ctl -m fast: every connection terminated, no new one accepted
        return read_trials(self, *args, **kwargs)
    monkeypatch.setattr(RDBStorage, "_get_trials", stop_the_server_first)
    errors = []

    def refresh():
        try:
            here.peers.refresh(force=True)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    worker = threading.Thread(target=refresh)
    try:
        worker.start()
        wait_until(lambda: waiting.is_set() or not worker.is_alive(), 120, "the refresh waiting for the server")
    finally:
        if stopped:
            pg_server.resume()
    worker.join(120)
    try:
        assert stopped and not errors, f"the refresh died on the restart: {errors!r}"
        assert waiting.is_set() and here.peers.running_elsewhere == 0
    finally:
        here.peers.close()


def test_every_database_operation_of_the_storage_is_retried():
    """The retry policy covers every RDBStorage method that opens a session of its own (read from Optuna's source,
    so a method a later Optuna adds is checked too), not a list that the next private call slips past."""
    import inspect

    from optuna.storages import RDBStorage

    opens_session = {name for name, fn in vars(RDBStorage).items()
                     if inspect.isfunction(fn) and "_create_scoped_session" in inspect.getsource(fn)}
    retrying = coordination.retrying_storage()
    assert opens_session and opens_session <= set(coordination.retried_methods())
    for name in opens_session:
        assert getattr(retrying, name) is not getattr(RDBStorage, name), name  # the class really wraps it


def test_recording_the_best_row_rides_out_a_dropped_connection(tmp_path, monkeypatch):
    """The finale's one write (record_best) goes through the same retry policy as Optuna's calls and the claims."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    from autotune.store import best_table, transient
    from test_best_table import entry

    monkeypatch.setattr(transient, "FIRST_WAIT", 0.01)
    record = best_table.BestStore._record
    tries = []

    def dropped_once(self, *args):
        tries.append(1)
        if len(tries) == 1:
            raise OperationalError("COMMIT", {}, psycopg.errors.AdminShutdown("terminating connection"))
        return record(self, *args)
    monkeypatch.setattr(best_table.BestStore, "_record", dropped_once)
    with best_table.BestStore(f"sqlite:///{tmp_path / 'b.db'}") as store:
        assert store.record_best(entry(500.0)).action == "inserted" and len(tries) == 2
        assert [r.tflops for r in store.all_rows()] == [500.0]


def test_transient_errors_are_retried_for_a_bounded_time(monkeypatch):
    import psycopg
    from sqlalchemy.exc import OperationalError

    from autotune.store import transient

    monkeypatch.setattr(transient, "FIRST_WAIT", 0.01)
    down = OperationalError("SELECT 1", {}, psycopg.errors.AdminShutdown("terminating connection"))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise down
        return "done"
    resets = []
    assert transient.call(flaky, reset=lambda: resets.append(1)) == "done" and len(calls) == 3 and len(resets) == 2

    def broken():
        raise ValueError("not a connection problem")
    with pytest.raises(ValueError):
        transient.call(broken)

    monkeypatch.setenv(transient.RETRY_ENV, "0.3")
    started = time.monotonic()
    with pytest.raises(OperationalError):
        transient.call(lambda: (_ for _ in ()).throw(down))
    assert time.monotonic() - started < 5
    import sqlite3

    locked = OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked"))
    assert transient.is_transient(down) and not transient.is_transient(locked)


def test_a_tell_committed_just_before_its_connection_broke_is_not_told_twice(postgres_url, monkeypatch):
    """The retry of a tell whose commit went through finds the trial finished: that is success, not a late tell."""
    import optuna
    import psycopg
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import OperationalError

    rdb = coordination.make_storage(postgres_url, 1, 10)
    study = optuna.create_study(study_name="t", storage=rdb, direction="maximize")
    t = study.ask()
    t.suggest_categorical("x", [1, 2])
    real = RDBStorage.set_trial_state_values

    def commit_then_break(self, trial_id, state, values=None):
        done = real(self, trial_id, state, values)
        if state.is_finished() and not getattr(self, "_broke", False):
            self._broke = True
            raise OperationalError("COMMIT", {}, psycopg.OperationalError("server closed the connection"))
        return done
    monkeypatch.setattr(RDBStorage, "set_trial_state_values", commit_then_break)
    outcome = trial_mod.Outcome("complete", "", {"tflops": 7.0, "config_key": "k", "status": "complete"})
    trial_mod.tell(study, t, outcome)
    trials = load(postgres_url, "t").trials
    assert [(x.state.name, x.value) for x in trials] == [("COMPLETE", 7.0)]  # no late_for copy


# ---- SIGTERM: a scheduler stopping the job ---------------------------------------------------------------------

def _stopped_by_sigterm(study, out: str) -> list:
    """The trials SIGTERM cut: FAIL as 'interrupted (SIGTERM)', nothing RUNNING."""
    no_trial_lost(study, out)
    return [t for t in study.trials if t.state.name == "FAIL"
            and (t.user_attrs.get("reason") or "").startswith("interrupted (SIGTERM)")]


def test_sigterm_fails_the_trials_in_flight_and_exits_within_the_grace_period(tmp_path, build_cache_dir, double):
    url = f"sqlite:///{tmp_path / 's.db'}"
    double.plan({A: "gate"})
    args = cli(url, build_cache_dir, "--trials", "3", *[x for c in (A, B, E) for x in ("--enqueue", c.key)])
    grace = 20
    proc = subprocess.Popen(args, env={**_env(), "AUTOTUNE_TERM_GRACE": str(grace)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        double.wait_for(lambda c: c["config_key"] == A.key)  # A is being timed: its trial RUNNING
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # as Slurm or a container runtime stops a job: the whole group
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    assert took < grace, (took, out)
    assert "interrupted: nothing was re-timed or stored" in out, out
    cut = _stopped_by_sigterm(load(url), out)
    assert A in {search_doubles_config(t) for t in cut}, out  # (with any other config asked and not yet judged)
    double.open_gate(A)
    again = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=180)  # resumes, as after Ctrl-C
    assert again.returncode == 0, again.stdout + again.stderr
    no_trial_lost(load(url), again.stdout)


HUNG_CLEAN_UP = """
import threading
from autotune.measure import interrupts
with interrupts.deferred_interrupts():
    with interrupts.critical():  # a clean-up whose storage never answers
        print("in a critical section", flush=True)
        threading.Event().wait()
"""


def test_sigterm_ends_a_stuck_clean_up_when_the_grace_period_runs_out():
    proc = subprocess.Popen([sys.executable, "-c", HUNG_CLEAN_UP], env={**_env(), "AUTOTUNE_TERM_GRACE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in a critical section"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "did not finish within 1 s" in err, (proc.returncode, err)
    assert took < 30, took  # 1 s of grace; the rest is a loaded machine's slack


def test_sigterm_to_a_workers_launcher_alone_stops_every_worker_cleanly(postgres_url, build_cache_dir, double,
                                                                       monkeypatch):
    # `docker stop` and Kubernetes signal the container's first process only: the launcher passes SIGTERM on.
    monkeypatch.setenv("AUTOTUNE_DOUBLE_DEVICES", "2")
    # Every evaluation waits at its gate, so each worker holds the first config it times, whichever that is: a
    # worker asks ahead and times its configs as their builds finish, so which worker gets an enqueued config is
    # not fixed (a CI run once had one worker ask both A and B and sit on A while the other timed sampled configs).
    double.plan({}, default="gate")
    args = cli(postgres_url, build_cache_dir, "--workers", "2", "--trials", "8", "--grace", "60",
               *[x for c in (A, B, E) for x in ("--enqueue", c.key)])
    proc = subprocess.Popen(args, env={**_env(), "AUTOTUNE_TERM_GRACE": "20"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = double.wait_for(lambda c: True)
        second = double.wait_for(lambda c: c["worker"] != first["worker"])  # both workers timing: two RUNNING
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    cut = _stopped_by_sigterm(load(postgres_url), out)
    assert {first["config_key"], second["config_key"]} <= {search_doubles_config(t).key for t in cut}, out


# ---- labels (item 7) -----------------------------------------------------------------------------------------

def test_a_trial_killed_while_being_told_counts_as_died(tmp_path):
    import optuna

    from autotune.report.view import record_from_trial
    from autotune.search.study import fail_stale_running, status_counts

    study = optuna.create_study(study_name="k", storage=f"sqlite:///{tmp_path / 'k.db'}", direction="maximize")
    told = []
    for attrs in ({"status": "complete", "tflops": 123.0, "config_key": "a"},
                  {"status": "complete", "tflops": 9.0, "config_key": "b", trial_mod.DUPLICATE_OF: 0},
                  {"status": "wrong", "reason": "max error 1.5", "config_key": "c"},
                  {"status": "complete", "tflops": 9.0, "config_key": "d", trial_mod.DUPLICATE_OF: 0}):
        t = study.ask()
        for k, v in attrs.items():  # the process was killed after these writes, before the state
            t.set_user_attr(k, v)
        told.append(t)
    # On a shared storage the heartbeat check fails such a trial as it stands (no reason of ours) ...
    for t in told[2:]:
        study.tell(t, state=optuna.trial.TrialState.FAIL)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # (and one failed with no attrs at all)
    fail_stale_running(study, log=lambda line: None)  # ... on SQLite, the next run
    abandoned = study.ask()
    abandoned.set_user_attr("reason", "interrupted (Ctrl-C) before it was evaluated")
    study.tell(abandoned, state=optuna.trial.TrialState.FAIL)
    assert status_counts(study) == Counter({"died": 5, "cancelled": 1})
    for t in study.trials:
        record = record_from_trial(t)
        assert record.status != "complete" and record.tflops is None, (t.number, record)


# ---- --replay under --workers, from two launchers (item 4) --------------------------------------------------

def test_replay_with_workers_from_two_launchers_on_one_study(postgres_url, tmp_path):
    from landscape_fixtures import small_landscape

    from autotune.landscapes import landscape_file

    path = small_landscape().save(tmp_path / "small.json")
    recorded = landscape_file.load(path)
    args = [sys.executable, "-m", "autotune.cli", "search", "--replay", str(path), "--workers", "2", "--trials", "10",
            "--storage", postgres_url, "--study", "r", "--sampler", "random", "--heartbeat", "1", "--grace", "30",
            "--jobs", "1"]  # batches of max(2, jobs) = 2 on any host: the overshoot bound below
    launchers = [subprocess.Popen([*args, "--seed", str(seed)], env=_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for seed in (1, 2)]
    outs = [p.communicate(timeout=300)[0] for p in launchers]
    for p, out in zip(launchers, outs):
        assert p.returncode == 0, out
        assert "[w1] " in out and "replayed from" in out, out
    study = load(postgres_url, "r")
    no_trial_lost(study, "\n".join(outs))
    judged = originals(study)
    # Never twice. The budget may be overshot by up to one batch per worker (4 workers × batches of 2): a worker
    # counts other processes' running trials at its (throttled) refresh, so workers that start together, as
    # replayed ones do with instant evaluations, can each ask a batch before seeing the others' (docs/distributed.md).
    assert max(judged.values()) == 1 and 10 <= len(judged) <= 10 + 4 * 2, judged
    for t in study.trials:  # every result is the landscape's: no worker built or timed anything for real
        if t.state.name == "COMPLETE":
            assert t.value == recorded.rows[t.user_attrs["config_key"]].tflops


def test_replay_with_workers_needs_a_shared_storage(tmp_path, capsys):
    from landscape_fixtures import small_landscape

    from autotune.cli import main

    path = small_landscape().save(tmp_path / "small.json")
    assert main(["search", "--replay", str(path), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "--replay with --workers 2" in err and "--storage postgresql://" in err


# ---- separate launchers on one study (several hosts) ---------------------------------------------------------

def test_two_launchers_on_one_study_share_it_like_two_hosts(postgres_url, build_cache_dir, double, monkeypatch):
    # Two "GPUs" per host, so host A's two workers can be timing at once. The hosts share the GPU lock files (one
    # lock dir): host B's evaluations wait until host A's gates open, which is after B's asks were deferred.
    monkeypatch.setenv("AUTOTUNE_DOUBLE_DEVICES", "2")
    double.plan({A: "gate", B: "gate"})
    enqueue(postgres_url, [A, B])
    # host A's budget is those two: once both are running there, its workers ask nothing more
    host_a = subprocess.Popen(cli(postgres_url, build_cache_dir, "--workers", "2", "--trials", "2"), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    host_b = None
    try:
        def running_on_a():
            return {search_doubles_config(t) for t in load(postgres_url).trials if t.state.name == "RUNNING"}
        wait_until(lambda: {A, B} <= running_on_a(), 180, "A and B running on host A", host_a)
        enqueue(postgres_url, [A, B, E, A_Q])  # host B's workers pop A and B first, while host A holds them
        host_b = subprocess.Popen(cli(postgres_url, build_cache_dir, "--workers", "2", "--trials", "4"),
                                  env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: sum(trial_mod.RUNNING_IN in t.user_attrs for t in load(postgres_url).trials) == 2, 180,
                   "A and B deferred by host B", host_b)
        double.open_gate(A), double.open_gate(B)
        out_b, _ = host_b.communicate(timeout=300)
        out_a, _ = host_a.communicate(timeout=300)
    finally:
        for p in (host_a, host_b):
            if p is not None and p.poll() is None:
                p.kill()
    assert host_a.returncode == 0 and host_b.returncode == 0, out_a + out_b
    study = load(postgres_url)
    no_trial_lost(study, out_a + out_b)
    assert timed_twice(double, study, workers=True) == {} and max(originals(study).values()) == 1
    assert {c["config_key"] for c in double.calls() if c["worker"] is not None} == {A.key, B.key, E.key, A_Q.key}
    assert originals(study).keys() == {A.key, B.key, E.key, A_Q.key}  # the budget: 4, shared by both hosts
