"""The other processes working on the same study, and what this one owes them.

The storage decides the mode (docs/distributed.md says why):

* **Solo** — SQLite. One search process per study, enforced by StudyLock (a second one is refused). Trials
  found RUNNING when a run starts were left by a run that died (kill -9, power): they are failed at once, then
  re-told from their stored measurement, re-queued or given up (deaths.py). No heartbeat, no claims: the
  search's in-process memory (study.StudyMemory) already keeps a config from being timed twice.

* **Shared** — PostgreSQL, MySQL: any number of processes on any number of hosts.
  - Heartbeat: every trial this process holds (asked and not yet told) gets an Optuna heartbeat every
    `heartbeat` seconds from a background thread, the first one synchronously right after the ask. A process
    killed with SIGKILL stops beating; `grace` seconds later, whichever process refreshes first fails its
    trials (Optuna's fail_stale_trials), and deaths.py decides what becomes of each: a trial that had been
    measured is re-told from its stored measurement; one that had not is re-queued (a WAITING trial with the
    same params, which the next ask anywhere picks up), unless its config's process already died while
    evaluating it once before (then it is given up).
  - Claims (claims.py): before a config is built, its (study, config) row is claimed. A config claimed by a
    running trial elsewhere is not started again; one judged elsewhere reuses that result; one whose owner
    failed is taken over.
  - Refresh (at most every REFRESH_SECONDS): fail stale trials, absorb the results other processes told
    into the memory (so the budget and the reuse see them), and count the configs running elsewhere, which
    count against --trials like this process's own in-flight ones.

Residual window, as in Optuna's own optimize(): a process killed between the INSERT of a new trial and its
first heartbeat (one DB round trip) leaves a RUNNING trial without heartbeat, which no one fails; the claims
are not involved (no config was claimed yet). It holds no config, so it costs the search nothing but this: it
counts as running elsewhere (against --trials, and for a worker waiting on the others) until it has been seen
running for STUCK_SECONDS, after which it is ignored. It stays RUNNING in the database.

Thread use: only the heartbeat thread runs beside the search's main thread; it calls RDBStorage.record_heartbeat
only, which RDBStorage supports from any thread (it is what Optuna's own heartbeat thread does).
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from ..store import tables, transient
from ..store.claims import Claims, Owner

from . import deaths
from . import study as studies
from . import verdicts as trial_mod

DEFAULT_HEARTBEAT = 10   # seconds between heartbeats (Optuna takes an integer)
DEFAULT_GRACE = 60       # seconds without one before a trial counts as dead: long enough for a busy host's GIL
REFRESH_SECONDS = 0.5    # how stale this process's view of the other processes may be
# A trial seen RUNNING elsewhere for longer than this is not waited for (see the residual window below): no trial
# of ours runs that long (nvcc's limit is 10 min, an evaluation's a few), even queued behind a batch.
STUCK_SECONDS = 2 * 3600
SQLITE_WAIT_S = 60       # how long a write waits for SQLite's file lock (other studies' searches on the file)
LOCK_DIR_ENV = "AUTOTUNE_LOCK_DIR"  # this host's lock files (lock_dir): default the system temp dir


def is_shared(url: str) -> bool:
    """True for server databases (many processes, many hosts); False for SQLite (one process)."""
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name() != "sqlite"


# -- storage --------------------------------------------------------------------------------------------------

class _OnStale:
    """Optuna's stale-trial callback, run by the one process whose heartbeat check failed the trial; the same for
    a SQLite run failing the trials its predecessor left running (Solo.start). deaths.after_death decides: re-tell
    the trial's stored measurement, re-queue it, or give its config up. On a shared storage (`url`), a re-told
    config's claim moves to the re-told trial, so that no process takes the claim over from the dead trial and
    times the config again. The log function is attached after the storage is made."""

    def __init__(self, url: str | None = None):
        self.url = url
        self.log: Callable[[str], None] = lambda line: None

    def __call__(self, study, trial) -> None:
        deaths.after_death(study, trial, self.log, on_retold=self._move_claim if self.url else None)

    def _move_claim(self, study, dead, outcome, number: int, trial_id: int) -> None:
        key = outcome.attrs.get("config_key")
        if not key:
            return
        claims = Claims(self.url)
        try:
            # Conditioned on the dead owner: if someone took the claim over meanwhile, theirs stands.
            claims.take_over(study._study_id, key, Owner(dead._trial_id, dead.number, ""), trial_id, number)
        finally:
            claims.close()


def make_storage(url: str, heartbeat: int = DEFAULT_HEARTBEAT, grace: int = DEFAULT_GRACE):
    """Optuna's RDBStorage for `url`, on the one path every storage takes:

    * its tables created through store/tables.py, whoever else creates them at the same moment (launchers of
      several hosts on a fresh PostgreSQL database; several searches started at once on a fresh SQLite file);
    * every operation that can meet a transient error (a server restart, a dropped connection) retried by one
      policy, store/transient.py (retrying_storage; SQLite's errors are never transient, so there it is inert);
    * a shared storage gets heartbeats and the stale-trial callback; a SQLite file a lock wait of SQLITE_WAIT_S
      (searches of other studies in the same file write between our writes)."""
    import inspect

    import optuna

    if is_shared(url):
        params = inspect.signature(optuna.storages.RDBStorage).parameters
        name = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params
                else "failed_trial_callback")
        # pool_pre_ping: a long search outlives server restarts and idle-connection reapers
        kwargs = dict(engine_kwargs={"pool_pre_ping": True}, heartbeat_interval=heartbeat, grace_period=grace,
                      **{name: _OnStale(url)})
    else:
        kwargs = dict(engine_kwargs={"connect_args": {"timeout": SQLITE_WAIT_S}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return transient.call(tables.create_with_others, retrying_storage(), url, **kwargs)


# Methods of RDBStorage that are not retried: each either does not touch the database, or runs inside a session its
# caller opened (those take a `session`, and are left out by that rule too), or must not be repeated blindly. Every
# other method is one unit of work on the database (it opens its own session, or calls methods that do) and goes
# through the retry policy; a method added by a later Optuna is retried unless it is named here.
_NOT_RETRIED = frozenset({
    "__init__", "__getstate__", "__setstate__",  # construction: make_storage retries it as a whole
    "_build_frozen_trial_from_trial_model",      # works on a model its caller read
    "_set_default_engine_kwargs_for_mysql", "_fill_storage_url_template",
    "remove_session", "get_heartbeat_interval", "get_heartbeat_stale_trial_callback",
    "get_head_version", "get_all_versions",      # read alembic's scripts, not the database
    "upgrade",                                   # a schema migration: an operator's step, never repeated blindly
})
_retrying_class = None


def retried_methods(storage_class=None) -> list[str]:
    """The RDBStorage methods the retry policy covers (see _NOT_RETRIED for the rule)."""
    import inspect

    from optuna.storages import RDBStorage

    names = []
    for name, value in vars(storage_class or RDBStorage).items():
        if name in _NOT_RETRIED or not inspect.isfunction(value):
            continue  # staticmethods are helpers of the methods (a unique name, engine kwargs)
        if "session" in inspect.signature(value).parameters:
            continue  # part of its caller's session: the caller is retried
        names.append(name)
    return names


def retrying_storage():
    """RDBStorage whose operations are retried while the server is away (a restart, a dropped connection) for
    store.transient.retry_seconds(), with a note on the process's log (`storage.log`, set by Shared).

    Every database operation is retried, the private ones Optuna's own layers call included (its cached storage,
    which every Study wraps an RDBStorage in, reads trials through `_get_trials` and writes through
    `_create_new_trial` and `_set_trial_param`: left out, a worker's trial refresh died on a server restart).
    A call made while another retried call of the same thread is under way runs plainly: the outer one is the
    unit that is repeated, so an outage is waited out once, not once per level.

    Residual window: a trial created (ask) or popped from the queue whose commit reached the server just before
    the connection broke is created again (or the next queued trial popped) by the retry; the first stays RUNNING
    without a heartbeat, like the one in the module docstring's residual window, and holds no config."""
    global _retrying_class
    if _retrying_class is not None:
        return _retrying_class
    import functools

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import RDBStorage

    def retried(name):
        @functools.wraps(getattr(RDBStorage, name))
        def method(self, *args, **kwargs):
            return self._retry(getattr(RDBStorage, name), self, *args, **kwargs)  # looked up at each call
        return method

    class RetryingRDBStorage(RDBStorage):
        log: Callable[[str], None] | None = None
        _inside = threading.local()  # this thread is in a retried call already: the nested ones run plainly

        def _retry(self, fn, *args, **kwargs):
            if getattr(self._inside, "depth", 0):
                return fn(*args, **kwargs)
            outage = {}

            def note(error, left):
                if not outage and self.log is not None:
                    self.log(f"note: the storage is unreachable ({transient.first_line(error)}) in {fn.__name__}; "
                             f"retrying for up to {left:.0f} s")
                outage.setdefault("since", time.monotonic())

            def once(*a, **kw):
                self._inside.depth = 1
                try:
                    return fn(*a, **kw)
                finally:
                    self._inside.depth = 0
            once.__name__ = fn.__name__
            result = transient.call(once, *args, reset=lambda: reset_connections(self), on_retry=note, **kwargs)
            if outage and self.log is not None:
                self.log(f"note: the storage is back after {time.monotonic() - outage['since']:.1f} s")
            return result

        def set_trial_state_values(self, trial_id, state, values=None):
            tries = []

            def attempt():
                tries.append(1)
                try:
                    return RDBStorage.set_trial_state_values(self, trial_id, state, values)
                except UpdateFinishedTrialError:
                    if len(tries) == 1:
                        raise
                    # An earlier try broke after its commit: the trial holds what this call wrote, so it is done.
                    t = RDBStorage.get_trial(self, trial_id)
                    if t.state == state and (values is None or list(t.values or ()) == list(values)):
                        return True
                    raise
            attempt.__name__ = "set_trial_state_values"
            return self._retry(attempt)

    for name in retried_methods():
        if name != "set_trial_state_values":
            setattr(RetryingRDBStorage, name, retried(name))
    _retrying_class = RetryingRDBStorage
    return RetryingRDBStorage


def reset_connections(rdb) -> None:
    """Drop the storage's pooled connections, so the next operation opens a fresh one.

    A KeyboardInterrupt that lands while the driver waits for the server (psycopg) leaves that connection in
    the middle of a query; SQLAlchemy returns it to the pool as it is, and every later write through it fails
    ("can't change 'autocommit' now: connection in transaction status ACTIVE"). Called before the trials in
    flight are failed after an interrupt, so that clean-up cannot be lost to the interrupted query."""
    registry = getattr(rdb, "scoped_session", None)
    engine = getattr(rdb, "engine", None)
    try:
        if registry is not None:
            registry.remove()
        if engine is not None:
            engine.dispose()
    except Exception:  # noqa: BLE001  (a connection that cannot even be closed: the new pool does not need it)
        pass


# -- SQLite: one search process per study ---------------------------------------------------------------------

class StudyBusyError(ValueError):
    """Another search process holds this SQLite study (StudyLock)."""


class StudyLock:
    """A SQLite study's one search process, enforced: an exclusive flock, taken before the study is touched and
    held until the search ends. The kernel drops it when its holder dies (kill -9, power), so a crashed run never
    blocks the next one, and that next run may fail the dead run's RUNNING trials (Solo.start) knowing nobody is
    finishing them. Without it, two searches on one SQLite study time configs twice, overshoot the budget, fail
    each other's live trials as a dead run's and crash on "database is locked".

    The lock is keyed on the database file's identity (st_dev, st_ino), not on the path it was named by: a hard
    link, a symlink or a bind mount reaches the same study through another path, and a path-keyed lock let two
    searches run on it at once. Two lock files, both named by that identity: one beside the path (seen by every
    host and container that sees the file there) and one in the host's lock directory ($AUTOTUNE_LOCK_DIR or the
    temp dir, where the GPU locks are: seen through every path to the file on this host). A missing database file
    is created empty first (SQLite takes an empty file for an empty database), so that it has an identity."""

    def __init__(self, url: str, study_name: str):
        from ..store.storage_url import describe, sqlite_path

        db = sqlite_path(url).expanduser().resolve()
        os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o666))  # exists now (empty if new), so it has an identity
        identity = os.stat(db)
        safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", study_name)
        name = f".autotune-{identity.st_dev:x}-{identity.st_ino:x}.{safe}.lock"
        self.paths = [db.parent / name, lock_dir() / name.lstrip(".")]
        self.path = self.paths[0]
        self._fds: list[int] = []
        try:
            for path in self.paths:
                self._fds.append(self._take(path, url, study_name, describe))
        except BaseException:
            self.release()
            raise
        for fd in self._fds:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
            except OSError:  # opened read-only (_take): the lock holds; the holder's name is not written
                pass

    @staticmethod
    def _take(path, url: str, study_name: str, describe) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file (a shared temp dir): flock needs only read access
            fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StudyBusyError(
                f"study {study_name} in {describe(url)} is being searched by another process ({holder}); a SQLite "
                "study serves one search process. Wait for it to end, or search with several processes on a "
                "PostgreSQL server: --storage postgresql://USER@HOST/autotune (docs/distributed.md)") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing drops the flock; the files stay (deleting one would race with a new holder)


def lock_dir():
    """This host's directory of lock files: the study locks' second files and the GPU locks (distributed.GpuLock)."""
    from pathlib import Path
    import tempfile

    directory = Path(os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def lock_study(url: str, study_name: str) -> StudyLock | None:
    """The SQLite study's StudyLock; None where several processes are allowed (server storages) or impossible
    (an in-memory database)."""
    from ..store.storage_url import sqlite_path

    if is_shared(url) or sqlite_path(url) is None:
        return None
    return StudyLock(url, study_name)


# -- heartbeat ------------------------------------------------------------------------------------------------

class Heartbeat:
    """Beats for every trial in `held`, every `interval` seconds, from one daemon thread."""

    def __init__(self, rdb, interval: float):
        self.rdb, self.interval = rdb, interval
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, trial_id: int) -> None:
        self.rdb.record_heartbeat(trial_id)  # now: a trial without any heartbeat is never found stale
        with self._lock:
            self._held.add(trial_id)

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._held.discard(trial_id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                held = list(self._held)
            for trial_id in held:
                try:
                    self.rdb.record_heartbeat(trial_id)
                except Exception:  # a dropped connection: the next beat retries; the grace period covers a few
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# -- claims' verdicts -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    kind: str                   # "mine" (build and evaluate it) | "judged" (reuse outcome) | "running" (skip)
    number: int | None = None   # the owning trial elsewhere
    outcome: object = None      # trial.Outcome, for "judged"


MINE = Verdict("mine")


class Solo:
    """SQLite: this process is the study's only one."""

    shared = False
    running_elsewhere = 0
    waiting = 0

    def __init__(self, rdb, log: Callable[[str], None] = print):
        self.rdb, self.log = rdb, log

    def start(self, study, memory, search_space) -> None:
        on_died = _OnStale()  # what the heartbeat check of a shared storage does with a dead trial
        on_died.log = self.log
        if studies.fail_stale_running(study, log=self.log, on_failed=on_died):
            memory.absorb(study.get_trials(deepcopy=False), search_space.problem)  # the re-told results count

    def held(self, trial) -> None:
        pass

    def released(self, trial) -> None:
        pass

    def claim(self, trial, config) -> Verdict:
        return MINE

    def refresh(self, force: bool = False) -> None:
        pass

    def others_active(self) -> bool:
        return False

    def close(self) -> None:
        pass


class Shared:
    """A server storage: heartbeats, claims and a refreshed view of the other processes (module docstring)."""

    shared = True

    def __init__(self, rdb, url: str, log: Callable[[str], None] = print):

        self.rdb, self.log = rdb, log
        on_stale = getattr(rdb, "heartbeat_stale_trial_callback", None) or getattr(rdb, "failed_trial_callback", None)
        if isinstance(on_stale, _OnStale):
            on_stale.log = log
        if hasattr(rdb, "_retry"):  # retrying_storage: its notes go where this process's lines go
            rdb.log = log
        self.claims = Claims(url, on_retry=lambda error, left: log(
            f"note: the claims table is unreachable ({transient.first_line(error)}); retrying for up to {left:.0f} s"))
        self.heart = Heartbeat(rdb, rdb.heartbeat_interval)
        self.running_elsewhere = 0   # distinct unjudged configs in RUNNING trials of other processes
        self.waiting = 0             # WAITING trials (queued, e.g. retries of dead processes' trials)
        self._mine: set[int] = set()
        self._first_seen: dict[int, float] = {}  # other processes' RUNNING trials: when we first saw them
        self._last = 0.0
        self.study = self.memory = self.space = None

    def start(self, study, memory, search_space) -> None:
        self.study, self.memory, self.space = study, memory, search_space
        self.refresh(force=True)

    def held(self, trial) -> None:
        self.heart.hold(trial._trial_id)
        self._mine.add(trial._trial_id)

    def released(self, trial) -> None:
        self.heart.release(trial._trial_id)
        self._mine.discard(trial._trial_id)

    def claim(self, trial, config) -> Verdict:
        """Claim `config` for `trial` (see claims.py); retried when a take-over races with another taker."""
        from optuna.trial import TrialState

        owner = None
        for _ in range(5):
            owner = self.claims.claim(self.study._study_id, config.key, trial._trial_id, trial.number)
            if owner is None or owner.trial_id == trial._trial_id:
                return MINE
            try:
                frozen = self.rdb.get_trial(owner.trial_id)
            except KeyError:  # the trial is gone (study deleted and recreated): nothing to defer to
                frozen = None
            if frozen is not None and frozen.state == TrialState.RUNNING:
                return Verdict("running", owner.trial_number)
            if frozen is not None and frozen.state in (TrialState.COMPLETE, TrialState.PRUNED):
                outcome = trial_mod.from_trial(frozen)
                if outcome is not None:
                    self.memory.remember(frozen.number, config, self.space.problem, outcome)
                    return Verdict("judged", owner.trial_number, outcome)
            if self.claims.take_over(self.study._study_id, config.key, owner, trial._trial_id, trial.number):
                return MINE  # its owner failed (died, interrupted, cancelled): ours to evaluate now
        return Verdict("running", owner.trial_number if owner else None)

    def refresh(self, force: bool = False) -> None:
        """Fail stale trials, absorb other processes' results, count what runs elsewhere (throttled)."""
        import optuna
        from optuna.trial import TrialState

        now = time.monotonic()
        if not force and now - self._last < REFRESH_SECONDS:
            return
        self._last = now
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        trials = self.study.get_trials(deepcopy=False)
        self.memory.absorb(trials, self.space.problem)
        running: set = set()
        waiting = 0
        for t in trials:
            if t.state == TrialState.WAITING:
                waiting += 1
            if t.state != TrialState.RUNNING or t._trial_id in self._mine:
                continue
            if now - self._first_seen.setdefault(t._trial_id, now) > STUCK_SECONDS:
                continue  # nobody is finishing it (module docstring)
            config = self.space.config_of(t.params)
            if config is None:
                running.add(("trial", t.number))  # still being asked: it will most likely become a config
            elif config.key not in self.memory.by_config:
                running.add(config.key)
        self.running_elsewhere, self.waiting = len(running), waiting

    def others_active(self) -> bool:
        """Something elsewhere may still change what is left to do here (a running trial may finish or die
        and be re-queued; a queued trial waits for an ask)."""
        return self.running_elsewhere > 0 or self.waiting > 0

    def close(self) -> None:
        self.heart.close()
        self.claims.close()


def for_storage(rdb, url: str, log: Callable[[str], None] = print):
    return Shared(rdb, url, log) if is_shared(url) else Solo(rdb, log)


__all__ = ["DEFAULT_GRACE", "DEFAULT_HEARTBEAT", "Heartbeat", "MINE", "REFRESH_SECONDS", "Shared", "Solo",
           "LOCK_DIR_ENV", "StudyBusyError", "StudyLock", "lock_dir", "Verdict", "for_storage", "is_shared", "lock_study", "make_storage",
           "reset_connections", "retried_methods", "retrying_storage"]
