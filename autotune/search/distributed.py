"""`autotune search --workers N`: N worker processes on one study, spread over this host's GPUs.

    launcher (the `autotune search` process; loop.run_search with --workers N)
      │  refuses SQLite (refuse_sqlite); opens or creates the study and queues its first configs (so workers do
      │  not race to); creates the claims table; spawns N workers (run_workers: multiprocessing, spawn), worker i
      │  pinned to CUDA_VISIBLE_DEVICES = GPU i mod #GPUs
      ├── worker 0 ─┐  each runs the search's trial loop (loop.run_worker with a WorkerRole): ask → claim
      ├── worker 1  │  → build → evaluate → tell, with heartbeats and stale-trial retry (coordination.py);
      └── ...      ─┘  the budget (--trials) is the study's, so they stop together
      │  forwards their lines ("[w1] ..."), collects their summaries (merge)
      └  re-times the study's top configs in one session and stores the winner (loop.finale), as a single
         search does

This module is the plumbing (processes, GPUs, locks, summaries); what a worker runs is passed in
(`run_workers(target, ...)`), so it never imports the loop.

Several hosts: run the same command with the same `--storage postgresql://...` on each. The study, the claims
and the heartbeats live in that database, so the workers of all hosts share one budget and never time a config
twice. Each host's launcher re-times and stores at its end; the store keeps the faster row per shape.

More workers than GPUs (e.g. `--workers 4` on one GPU, for build-bound phases): workers share GPUs round-robin.
Their builds overlap, but their evaluations on one GPU take turns through a lock file per GPU (fcntl.flock,
released by the kernel if a worker dies): two kernels timed at once on one GPU would both be timed wrong.

Ctrl-C: the terminal sends SIGINT to every process of the group; each worker fails its in-flight trials as
'interrupted' (loop.py) and reports; the launcher waits for them, prints the summary and exits 130 without
re-timing. A SIGINT sent to the launcher alone is forwarded to the workers. SIGTERM (a scheduler stopping the
job, to the group or to the launcher alone) is the same, forwarded as SIGTERM, exit 143, each process bounded by
its grace period (interrupts.term_grace: the workers' ends WORKER_MARGIN_S before the launcher's). A launcher killed with SIGKILL takes
its workers down with SIGINT (interrupts.exit_with_parent), so nothing runs on unsupervised.
"""
from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.trial import TrialState

from ..measure import interrupts
from ..store import storage_url
from . import coordination
from .options import SearchInterrupted, SearchResult
from .study import StudyMemory, status_counts

LOCK_DIR_ENV = coordination.LOCK_DIR_ENV  # where the per-GPU lock files live (default: the system temp dir)
WORKER_ENV = "AUTOTUNE_WORKER"       # set in each worker (and its evaluation child) to its index


class SqliteWorkersError(ValueError):
    """--workers > 1 on a SQLite storage (see refuse_sqlite)."""


def refuse_sqlite(url: str, workers: int) -> None:
    """SQLite is one process's storage: several writers queue on its single file lock ('database is locked'
    under load), and a file on a network share has no reliable locking between hosts at all. Rather than a
    search that fails an hour in, say so up front and point at the server storage that does work."""
    if not coordination.is_shared(url):
        raise SqliteWorkersError(
            f"--workers {workers}: the storage is SQLite ({storage_url.describe(url)}), which serves one process. "
            "Use a PostgreSQL server for several workers, e.g. --storage postgresql://USER@HOST/autotune "
            "(docs/distributed.md has a one-minute local setup), or leave --workers out")


# -- GPUs -----------------------------------------------------------------------------------------------------

def visible_devices(requested: tuple[str, ...] | None, device_count: int | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES values to spread workers over: --gpus if given, else this process's own
    CUDA_VISIBLE_DEVICES entries, else 0 .. device_count-1 (at least one)."""
    if requested:
        return [str(d).strip() for d in requested if str(d).strip()]
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        listed = [d.strip() for d in env.split(",") if d.strip()]
        return listed[:device_count] if device_count else listed
    return [str(i) for i in range(max(1, device_count or 1))]


def assign(workers: int, devices: list[str]) -> list[str]:
    """Worker i → devices[i mod len(devices)]."""
    return [devices[i % len(devices)] for i in range(workers)]


class GpuLock:
    """One GPU's evaluation turn, between the processes of this host (an flock on a file per GPU)."""

    def __init__(self, device: str):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
        self.path = coordination.lock_dir() / f"autotune-gpu-{safe}.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another worker times a kernel on this GPU
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the flock


@dataclass
class WorkerRole:
    """What makes a search process one worker among several (loop.run_worker and loop.run_trials read it)."""

    index: int
    device: str | None = None
    lock: GpuLock | None = None
    # The launcher's device query ({gpu_name, arch, device_count}) when every visible GPU is the same model: the
    # worker then needs no answer from its own evaluator before it starts building (loop.open_session).
    device_info: dict | None = None

    @property
    def tag(self) -> str:
        return f"w{self.index}"


# -- the worker process -------------------------------------------------------------------------------------

def _worker_main(conn, target, options, index: int, device: str | None, parent: int,
                 device_info: dict | None = None) -> None:
    interrupts.exit_with_parent(signal.SIGINT, parent)
    interrupts.shorten_grace(interrupts.WORKER_MARGIN_S)  # after a SIGTERM the launcher, waiting for us, ends last
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # inherited by the evaluation child, before any CUDA init
    os.environ[WORKER_ENV] = str(index)
    role = WorkerRole(index, device, GpuLock(device) if device is not None else None, device_info)

    def log(line: str) -> None:
        try:
            conn.send(("log", f"[{role.tag}] {line}"))
        except (BrokenPipeError, OSError):
            pass  # the launcher is gone; the work goes on (and exit_with_parent stops it cleanly)

    kind, payload = "done", None
    try:
        with interrupts.deferred_interrupts():
            result = target(options, role, log)
        payload = _summary(result, device)
    except SearchInterrupted as e:
        kind, payload = "interrupted", _summary(e.result, device)
    except BaseException as e:  # noqa: BLE001  (reported to the launcher, which decides)
        kind, payload = "error", (_picklable(e), traceback.format_exc())
    try:
        conn.send((kind, payload))
    except (BrokenPipeError, OSError):
        pass
    conn.close()


def _picklable(e: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return None


def _summary(result, device: str | None) -> dict:
    return {"this_run": dict(result.this_run), "asks": result.asks, "stop_reason": result.stop_reason,
            "idle_seconds": result.idle_seconds, "idle_other_seconds": result.idle_other_seconds,
            "first_eval_after": result.first_eval_after, "build_seconds": result.build_seconds,
            "eval_seconds": result.eval_seconds, "wall_seconds": result.wall_seconds, "device": device}


# -- the launcher ---------------------------------------------------------------------------------------------

def run_workers(target: Callable, options, devices: list[str], log,
                device_info: dict | None = None) -> tuple[dict, list[str], bool]:
    """Start one worker process per entry of `devices`, each running `target(options, WorkerRole, log)` (a
    module-level function: spawn pickles it by name), and forward their lines until they all end; returns
    ({index: (kind, payload)}, notes on workers that died without reporting, whether Ctrl-C was pressed).
    `device_info` (see WorkerRole) is handed to every worker."""
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], {}
    for index, device in enumerate(devices):
        # One pipe per worker, not a shared Queue: a worker killed while holding a Queue's lock would block
        # every other worker's writes.
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker_main, args=(send, target, options, index, device, os.getpid(), device_info),
                        name=f"autotune-worker-{index}")
        p.start()
        send.close()
        procs.append(p)
        conns[receive] = index
    summaries: dict[int, tuple] = {}
    interrupted = False
    while conns:
        try:
            for conn in multiprocessing.connection.wait(list(conns), timeout=1.0):
                index = conns[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):  # the worker ended (after its summary, or killed)
                    conns.pop(conn)
                    conn.close()
                    continue
                if kind == "log":
                    log(payload)
                    continue
                summaries[index] = (kind, payload)
                interrupted = interrupted or kind == "interrupted"
                if kind == "error":
                    log(f"[w{index}] failed: {payload[1].strip().splitlines()[-1]}")
        except KeyboardInterrupt:
            interrupted = True
            for p in procs:  # the terminal signalled them too; a signal sent to the launcher alone was not
                if p.is_alive():
                    try:
                        os.kill(p.pid, interrupts.stop_signal())  # SIGTERM from a scheduler stays SIGTERM
                    except ProcessLookupError:
                        pass
    for p in procs:
        p.join()
    died = []
    for index, p in enumerate(procs):
        if index not in summaries:
            died.append(f"worker {index} (GPU {devices[index]}) died ({_exit_text(p.exitcode)}); its trials are "
                        "failed by the heartbeat check, then re-told or re-queued")
            log(f"[w{index}] died ({_exit_text(p.exitcode)})")
    return summaries, died, interrupted


def shared_device_info(info: dict) -> dict | None:
    """The part of a device query every worker can reuse, or None when the visible GPUs are not all one model
    (each worker must then ask its own GPU) or the query did not list them."""
    names, archs = info.get("gpu_names"), info.get("archs")
    if not names or not archs or len(set(names)) != 1 or len(set(archs)) != 1:
        return None
    return {"gpu_name": names[0], "arch": archs[0]}


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def sweep_stale(study, options, log) -> None:
    """A worker of ours died: stay until its trials are found stale (grace period), so that they are failed and
    re-queued now rather than by whichever run comes next."""
    deadline = time.monotonic() + options.grace + 2 * options.heartbeat + 1
    while time.monotonic() < deadline:
        with interrupts.critical():
            optuna.storages.fail_stale_trials(study)
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return
        time.sleep(1.0)
    log("note: trials still running elsewhere after the grace period (other hosts' workers, presumably)")


def merge(session, options, summaries: dict, died: list[str], interrupted: bool) -> SearchResult:
    """One SearchResult for the whole launcher (`session`: its loop.Session): the study's figures, the workers'
    sums."""
    memory = StudyMemory.load(session.study, options.shape.problem)
    this_run: Counter = Counter()
    lines, reasons = [], []
    totals = dict.fromkeys(("idle_seconds", "idle_other_seconds", "build_seconds", "eval_seconds"), 0.0)
    asks = 0
    firsts = []
    for index in sorted(summaries):
        kind, s = summaries[index]
        if kind == "error":
            lines.append(f"worker {index}: failed: {s[1].strip().splitlines()[-1]}")
            continue
        this_run.update(s["this_run"])
        asks += s["asks"]
        for key in totals:
            totals[key] += s[key]
        if s["first_eval_after"] is not None:
            firsts.append(s["first_eval_after"])
        reasons.append(s["stop_reason"])
        lines.append(f"worker {index} (GPU {s['device']}): {sum(s['this_run'].values())} trials told, "
                     f"{s['asks']} asks, evaluating {s['eval_seconds']:.1f} s, building {s['build_seconds']:.1f} s, "
                     f"{s['wall_seconds']:.1f} s; {s['stop_reason']}")
    lines += died
    if interrupted:
        stop = (f"interrupted ({interrupts.cause()}): the trials in flight were marked failed; run the same command "
                "to resume")
    else:
        target = f"reached {options.trials} evaluated trials"
        stop = target if memory.evaluated >= options.trials else (Counter(reasons).most_common(1)[0][0]
                                                                    if reasons else "no worker finished")
    return SearchResult(
        study_name=session.name, storage=storage_url.describe(session.url), gpu_name=session.gpu_name,
        arch=session.arch, shape=options.shape, target=options.trials, evaluated=memory.evaluated,
        this_run=this_run, counts=status_counts(session.study), asks=asks, stop_reason=stop,
        first_eval_after=min(firsts) if firsts else None, interrupted=interrupted, workers=lines, **totals)


__all__ = ["GpuLock", "LOCK_DIR_ENV", "SqliteWorkersError", "WORKER_ENV", "WorkerRole", "assign", "merge",
           "refuse_sqlite", "run_workers", "shared_device_info", "sweep_stale", "visible_devices"]
