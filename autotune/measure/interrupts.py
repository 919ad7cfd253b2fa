"""Ctrl-C and SIGTERM that never land in the middle of a storage write, and children that do not outlive their parent.

`deferred_interrupts()` installs a handler of SIGINT and SIGTERM for the duration of a search: either raises
KeyboardInterrupt, except inside a `critical()` section, where it is remembered and raised when the (outermost)
section ends. The search wraps each group of storage writes that belong together in `critical()`: asking a trial
and registering it as in flight, telling a trial (its user attrs, then its state), failing the trials in flight.
So an interrupt leaves every trial either told, or known to be in flight and then failed as 'interrupted'; never
RUNNING with nobody left to finish it. A second signal during that clean-up is deferred the same way, and then
ends the process with the storage consistent. `cause()` says which signal stopped the search ("Ctrl-C" or
"SIGTERM", for the trials' reasons and the summary) and `exit_code()` the exit status it calls for (130, 143).

SIGTERM is how batch schedulers and container runtimes stop a job, and they follow it with SIGKILL after a grace
period. So SIGTERM also starts a clock: the clean-up gets `term_grace()` seconds ($AUTOTUNE_TERM_GRACE, default
20), after which the process exits at once (status 143) with a line saying so, whatever it was waiting for (a
storage that does not answer). A scheduler should send SIGTERM and wait longer than that before SIGKILL
(docs/distributed.md). A --workers launcher gives its workers WORKER_MARGIN_S less than its own grace, so that it
ends last, after them, and still within its own.

Only the main thread receives signals in Python; elsewhere `deferred_interrupts()` changes nothing (a library
caller running a search in a thread keeps its own interrupt handling), and `critical()` still works as a no-op
counter. A signal that was ignored when we started (SIGINT of a job started in the background by a shell) stays
ignored.

`exit_with_parent(sig)` asks Linux to send `sig` to this process when its parent dies, so that an evaluation
child of a worker killed with SIGKILL does not keep holding the GPU, and worker processes of a launcher killed
with SIGKILL stop (cleanly, with SIGINT) instead of running on unsupervised.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading

TERM_GRACE_ENV = "AUTOTUNE_TERM_GRACE"
DEFAULT_TERM_GRACE = 20.0   # seconds from SIGTERM to exit, at most
WORKER_MARGIN_S = 3.0       # a --workers launcher's workers get this much less (module docstring)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CAUSES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

_depth = 0
_pending = False
_stopped_by: int | None = None  # the first stop signal this process received
_grace_margin = 0.0             # subtracted from term_grace() (a launcher's worker: shorten_grace)
_deadline: threading.Timer | None = None


def term_grace() -> float:
    """Seconds the clean-up after SIGTERM may take ($AUTOTUNE_TERM_GRACE, default 20; this process's share)."""
    value = os.environ.get(TERM_GRACE_ENV, "").strip()
    try:
        grace = float(value) if value else DEFAULT_TERM_GRACE
    except ValueError:
        raise ValueError(f"${TERM_GRACE_ENV}: expected a number of seconds, got {value!r}") from None
    return max(0.5, grace - _grace_margin)


def shorten_grace(seconds: float) -> None:
    """Give this process `seconds` less than term_grace() (a launcher's worker: its launcher ends after it)."""
    global _grace_margin
    _grace_margin = seconds


def cause() -> str:
    """What stopped this process: "Ctrl-C" (SIGINT, the default when nothing was received) or "SIGTERM"."""
    return CAUSES.get(_stopped_by, "Ctrl-C")


def stop_signal() -> int:
    """The signal to pass on to processes of ours that should stop for the same reason (a launcher's workers)."""
    return _stopped_by or signal.SIGINT


def exit_code() -> int:
    """The exit status a search stopped by a signal ends with: 128 + the signal (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(stop_signal())


def _out_of_time(grace: float) -> None:
    print(f"autotune: SIGTERM: the clean-up did not finish within {grace:g} s (${TERM_GRACE_ENV}); exiting now. "
          "Trials still in flight are failed by the next run (or the heartbeat check) and re-queued",
          file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGTERM)


def _start_deadline() -> None:
    global _deadline
    if _deadline is None:
        grace = term_grace()
        _deadline = threading.Timer(grace, _out_of_time, args=(grace,))
        _deadline.daemon = True
        _deadline.start()


def _handler(signum, frame) -> None:
    global _pending, _stopped_by
    if _stopped_by is None:
        _stopped_by = signum
    if signum == signal.SIGTERM:
        _start_deadline()  # a scheduler's SIGKILL follows: bound the clean-up, deferred or not
    if _depth:
        _pending = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts():
    """Within this block, SIGINT and SIGTERM honour critical() sections (main thread only; see the module
    docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, handler)


@contextlib.contextmanager
def critical():
    """Storage writes that must not be separated by a KeyboardInterrupt; one that arrives meanwhile is raised
    when the outermost section ends."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            _pending = False
            raise KeyboardInterrupt


def exit_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux prctl PR_SET_PDEATHSIG; a
    no-op elsewhere). `parent`: the pid that started us, when known; if it is already gone by the time this
    runs, act as if the signal came."""
    if not sys.platform.startswith("linux"):
        return
    parent = parent or os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # orphaned before the request took effect
        os.kill(os.getpid(), sig)


__all__ = ["DEFAULT_TERM_GRACE", "TERM_GRACE_ENV", "WORKER_MARGIN_S", "cause", "critical", "deferred_interrupts",
           "exit_code", "exit_with_parent", "shorten_grace", "stop_signal", "term_grace"]
