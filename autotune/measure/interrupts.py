"""Ctrl-C that never lands in the middle of a storage write, and children that do not outlive their parent.

`deferred_interrupts()` installs a SIGINT handler for the duration of a search: SIGINT raises KeyboardInterrupt
as usual, except inside a `critical()` section, where it is remembered and raised when the (outermost) section
ends. The search wraps each group of storage writes that belong together in `critical()`: asking a trial and
registering it as in flight, telling a trial (its user attrs, then its state), failing the trials in flight. So
an interrupt leaves every trial either told, or known to be in flight and then failed as 'interrupted'; never
RUNNING with nobody left to finish it. A second Ctrl-C during that clean-up is deferred the same way, and then
ends the process with the storage consistent.

Only the main thread receives signals in Python; elsewhere `deferred_interrupts()` changes nothing (a library
caller running a search in a thread keeps its own interrupt handling), and `critical()` still works as a no-op
counter. A SIGINT that was ignored when we started (a job started in the background by a shell) stays ignored.

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

_depth = 0
_pending = False


def _handler(signum, frame) -> None:
    global _pending
    if _depth:
        _pending = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts():
    """Within this block, SIGINT honours critical() sections (main thread only; see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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


__all__ = ["critical", "deferred_interrupts", "exit_with_parent"]
